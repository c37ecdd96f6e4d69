"""Where a decoded token's time goes, from llama.cpp's decode to edgespec's loop, on one GGUF.

Ways to decode the same number of tokens one at a time, each from an empty cache, timed per token:
1. bare decode, llama-bench's context: llama_decode of one token and a wait for it, on a context of one
   sequence (what llama-bench's tg test measures);
2. bare decode, edgespec's context: the same calls on a context made as LlamaBackend makes it (16 sequences
   in a unified cache for draft trees, 16 output rows); 2b: through LlamaBackend's own batch (built in Python,
   positions, sequence and output flags given), and a wait;
3. LlamaBackend.forward: 2b, plus the rows handed back: copied out (3), or read in place (3c: copy=False, as
   the loop reads them), then with the argmax every greedy token needs (3d); 3b: 3 on a context of one
   sequence, as 1;
4. edgespec's loop, target-only greedy: 3d, plus the rule, the stats and the text; on a GPU each pass starts
   before the token before it is handed out (LlamaBackend.prefetch), so the stats and the text overlap the
   device (4b: the same loop with that off).
The differences between ways are what each layer costs. Runs are interleaved (1 2 2b 3 ..., repeated) and the
median per way is reported.

usage: python benchmarks/decode_overhead.py --model FILE.gguf [--gpu-layers 99] [--threads 8] [--tokens 128]
       [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time


def bare_context(lib, model, n_ctx: int, threads: int, like_edgespec: bool):
    """A context as llama-bench makes one, or with LlamaBackend's sequence and output settings."""
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = cparams.n_ubatch = min(512, n_ctx)
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.no_perf = True
    if like_edgespec:
        cparams.n_seq_max, cparams.kv_unified, cparams.n_outputs_max = 16, True, 16
    return lib.llama_init_from_model(model, cparams)


def bare_decode(lib, ctx, n_vocab: int, tokens: int) -> float:
    """Seconds per token of llama_decode of one token (its logits asked for) and a wait, from an empty cache."""
    lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
    token = (ctypes.c_int32 * 1)(1)
    lib.llama_decode(ctx, lib.llama_batch_get_one(token, 1))
    lib.llama_synchronize(ctx)
    t0 = time.perf_counter()
    for i in range(tokens):
        token[0] = (i * 7919 + 13) % n_vocab
        if lib.llama_decode(ctx, lib.llama_batch_get_one(token, 1)) != 0:
            raise RuntimeError("llama_decode failed")
        lib.llama_synchronize(ctx)
    return (time.perf_counter() - t0) / tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import llama_cpp  # noqa: F401 (before numpy: a CUDA image was seen to crash loading a model when numpy came first)
    import numpy as np

    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.backends.llama.lib import lib as _lib
    from edgespec.decode.loop import Stats, speculate
    from edgespec.decode.sampling import SamplingParams

    lib = _lib()
    n_ctx = args.tokens + 16
    backend = LlamaBackend(args.model, n_ctx=n_ctx, n_threads=args.threads, n_gpu_layers=args.gpu_layers)
    n_vocab = backend.vocab.n_vocab
    contexts = {"bench": bare_context(lib, backend._model, n_ctx, args.threads, False),
                "edgespec": bare_context(lib, backend._model, n_ctx, args.threads, True)}

    single = LlamaBackend(args.model, n_ctx=n_ctx, n_threads=args.threads, n_gpu_layers=args.gpu_layers,
                          sequences=1)

    def forward(b=backend, copy: bool = True, pick: bool = False) -> float:
        b.rollback(0)
        b.forward([1], 1)
        t0 = time.perf_counter()
        for i in range(args.tokens):
            rows = b.forward([(i * 7919 + 13) % n_vocab], 1, copy=copy)
            if pick:
                int(rows[0].argmax())
        return (time.perf_counter() - t0) / args.tokens

    def own_batch() -> float:  # LlamaBackend's batch, no rows read
        backend.rollback(0)
        t0 = time.perf_counter()
        for i in range(args.tokens):
            backend._decode([((i * 7919 + 13) % n_vocab, i, 0, True)])
            lib.llama_synchronize(backend._ctx)
        backend.tokens[:] = [0] * args.tokens  # what the cache holds, for the rollback that follows
        return (time.perf_counter() - t0) / args.tokens

    prompt = backend.tokenize("The", special=False)

    def loop(overlap: bool = backend.overlap) -> float:
        backend.rollback(0)
        backend.overlap, was = overlap, backend.overlap
        stats = Stats()
        try:
            for _ in speculate(backend, None, None, prompt, SamplingParams(0.0), np.random.default_rng(0),
                               max_tokens=args.tokens, stats=stats):
                pass
        finally:
            backend.overlap = was
        return stats.decode_s / max(stats.generated, 1)

    ways = {"1 bare decode, llama-bench's context": lambda: bare_decode(lib, contexts["bench"], n_vocab, args.tokens),
            "2 bare decode, edgespec's context": lambda: bare_decode(lib, contexts["edgespec"], n_vocab, args.tokens),
            "2b bare decode, LlamaBackend's batch": own_batch,
            "3 LlamaBackend.forward": forward,
            "3b LlamaBackend.forward, one sequence": lambda: forward(single),
            "3c LlamaBackend.forward, rows in place": lambda: forward(copy=False),
            "3d LlamaBackend.forward, rows in place, argmax": lambda: forward(copy=False, pick=True),
            "4 edgespec loop, greedy": loop,
            "4b edgespec loop, greedy, no pass started ahead": lambda: loop(False)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for way in ways.values():  # warm-up
        way()
    for _ in range(args.reps):
        for name, way in ways.items():
            times[name].append(way())
    base = statistics.median(times[next(iter(ways))])
    report = {"model": args.model, "gpu_layers": args.gpu_layers, "threads": args.threads, "tokens": args.tokens,
              "ways": [{"way": name, "ms_per_token": round(statistics.median(t) * 1e3, 4),
                        "tok_s": round(1 / statistics.median(t), 2),
                        "vs_bench": round(base / statistics.median(t), 4)} for name, t in times.items()]}
    for ctx in contexts.values():
        lib.llama_free(ctx)
    backend.close()
    single.close()
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for w in report["ways"]:
        print(f"{w['way']:40s} {w['ms_per_token']:8.3f} ms/token {w['tok_s']:9.2f} tok/s  {w['vs_bench']:.3f}x",
              file=sys.stderr)


if __name__ == "__main__":
    main()
