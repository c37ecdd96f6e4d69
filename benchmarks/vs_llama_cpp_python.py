"""edgespec target-only against llama-cpp-python's own generate on the same GGUF, interleaved in one run.

llama-cpp-python's `Llama.generate` is the loop under its `create_completion`: llama.cpp decodes a token and
samples it with llama.cpp's sampler chain in C, on llama.cpp's own logits buffer. edgespec decodes the same
token through the same llama.cpp build and samples in Python (decode/laws.py). Both run the same file, the
same chat-templated prompts, the same threads, context and batch sizes, one after the other per prompt (which
goes first alternates), so their decode speeds are compared under the same machine state. Decode speed is
measured from each answer's first token to its last, over (tokens - 1), so prompt processing is left out.

Sampling: greedy, and t=0.7 top-p 0.95 (top-k and min-p off, no repetition penalty). At greedy both should
write the same tokens, which is checked and printed. The ratio is edgespec's tokens per second over
llama-cpp-python's, summed over all prompts.

usage: python benchmarks/vs_llama_cpp_python.py [--model FILE.gguf] [--prompts 8] [--max-tokens 128]
       [--threads 2] [--gpu-layers 0] [--flash-attn on|off] [--reps 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

SAMPLINGS = {"greedy": dict(temperature=0.0, top_p=1.0), "t=0.7 top-p 0.95": dict(temperature=0.7, top_p=0.95)}


def edgespec_answer(target, tokens: list[int], max_tokens: int, sampling: dict, seed: int) -> tuple[list[int], float]:
    """edgespec's target-only answer to prompt tokens and the seconds from its first token to its last."""
    import numpy as np

    from edgespec.decode.loop import speculate
    from edgespec.decode.sampling import SamplingParams

    params = SamplingParams(temperature=sampling["temperature"], top_p=sampling["top_p"])
    out, first = [], None
    for event in speculate(target, None, None, tokens, params, np.random.default_rng(seed),
                           max_tokens=max_tokens):
        if event.token is None:
            continue
        out.append(event.token)
        if first is None:
            first = time.perf_counter()
    return out, time.perf_counter() - first


def llama_answer(llm, tokens: list[int], max_tokens: int, sampling: dict, seed: int) -> tuple[list[int], float]:
    """llama-cpp-python's generate on the same prompt tokens, stopped as create_completion stops it."""
    import llama_cpp

    llm.set_seed(seed)
    out, first = [], None
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    for token in llm.generate(tokens, top_k=0, top_p=sampling["top_p"], min_p=0.0, temp=sampling["temperature"],
                              repeat_penalty=1.0, reset=True):
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            break
        out.append(token)
        if first is None:
            first = time.perf_counter()
        if len(out) >= max_tokens:
            break
    return out, time.perf_counter() - first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF (default: the default model)")
    ap.add_argument("--prompts", type=int, default=8, help="how many built-in prompts (spread over categories)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--sequences", type=int, default=16, help="edgespec's cache: 16 sequences (its default, for "
                    "draft trees) or 1 (llama-cpp-python's)")
    ap.add_argument("--flash-attn", choices=("on", "off"), default="on",
                    help="llama-cpp-python's setting; match what llama.cpp's auto picks for edgespec on this build "
                         "(on for the CPU, off for a CUDA build without its flash-attention kernels)")
    ap.add_argument("--reps", type=int, default=2, help="passes over the prompts (the order flips each pass)")
    ap.add_argument("--sampling", action="append", choices=list(SAMPLINGS), help="default: both")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import llama_cpp  # before numpy: a CUDA image was seen to crash loading a model when numpy came first

    from edgespec.api import prompt_tokens
    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.bench import read_prompts
    from edgespec.models.default import default_target

    model = args.model or str(default_target())
    target = LlamaBackend(model, n_ctx=args.ctx, n_threads=args.threads, n_gpu_layers=args.gpu_layers,
                          sequences=args.sequences)
    llm = llama_cpp.Llama(model_path=model, n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads,
                          n_batch=512, n_ubatch=512, n_gpu_layers=args.gpu_layers, verbose=False,
                          flash_attn=args.flash_attn == "on")
    rows = read_prompts(None)
    step = max(1, len(rows) // args.prompts)
    prompts = [prompt_tokens(target, r["prompt"]) for r in rows[::step][:args.prompts]]
    report = {"model": model, "machine": platform.processor() or platform.machine(), "threads": args.threads,
              "sequences": args.sequences,
              "gpu_layers": args.gpu_layers, "max_tokens": args.max_tokens, "results": []}
    for name in args.sampling or SAMPLINGS:
        sampling = SAMPLINGS[name]
        totals = {"edgespec": [0, 0.0], "llama-cpp-python": [0, 0.0]}
        same = 0
        for rep in range(args.reps):
            for i, tokens in enumerate(prompts):
                order = ("edgespec", "llama-cpp-python") if (i + rep) % 2 == 0 else ("llama-cpp-python", "edgespec")
                answers = {}
                for who in order:
                    run = edgespec_answer if who == "edgespec" else llama_answer
                    answer, seconds = run(target if who == "edgespec" else llm, tokens, args.max_tokens, sampling,
                                          seed=1000 * rep + i)
                    answers[who] = answer
                    totals[who][0] += len(answer) - 1
                    totals[who][1] += seconds
                same += answers["edgespec"] == answers["llama-cpp-python"]
        speed = {who: n / s for who, (n, s) in totals.items()}
        result = {"sampling": name, "edgespec_tok_s": round(speed["edgespec"], 2),
                  "llama_cpp_python_tok_s": round(speed["llama-cpp-python"], 2),
                  "ratio": round(speed["edgespec"] / speed["llama-cpp-python"], 4),
                  "same_tokens": f"{same}/{args.reps * len(prompts)}"}
        report["results"].append(result)
        if not args.json:
            print(f"{name:18s} edgespec {result['edgespec_tok_s']:8.2f} tok/s   llama-cpp-python "
                  f"{result['llama_cpp_python_tok_s']:8.2f} tok/s   ratio {result['ratio']:.3f}   same tokens "
                  f"{result['same_tokens']}", file=sys.stderr)
    target.close()
    if args.json:
        print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
