"""Does onnxruntime's thread spinning pay for an ONNX target, alone and with each draft beside it?

For each draft (default: none, prompt lookup, prompt lookup with the shipped EAGLE head), decode the built-in
prompts (every second one) with the target's threads spinning between ops and on between runs (onnxruntime's
default), spinning within runs only (stopped at the end of each), and not spinning, each setting in a fresh
process (a spinning pool left in the process would slow the next setting), the three alternating `--rounds`
times; prints tokens/s per run and each setting's mean over the not-spinning one's. api.load spins on between
runs only where nothing runs beside the target (no draft, prompt lookup), and within runs only beside a draft
model or heads: this checks that rule on the machine at hand.

usage: python experiments/onnx_spinning.py --target smollm2-onnx-fp32 [--draft none --draft ngram+eagle]
       [--rounds 2] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

# a setting's name: what api.load's spin gets (backends/onnx/folder.open_session)
SETTINGS = {"between runs": True, "within runs": "runs", "off": False}


def one_run(target: str, draft: str, spin: bool | str, max_tokens: int) -> dict:
    from edgespec.api import load
    from edgespec.bench import read_prompts

    engine = load(target, draft, n_ctx=1024, spin=spin)
    prompts = [row["prompt"] for row in read_prompts(None)][::2]
    engine.generate(prompts[0], max_tokens=16)  # warm up
    tokens, seconds = 0, 0.0
    for prompt in prompts:
        t = time.perf_counter()
        result = engine.generate(prompt, max_tokens=max_tokens)
        seconds += time.perf_counter() - t
        tokens += len(result.tokens)
    engine.close()
    return {"tokens": tokens, "tok_s": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="An ONNX export folder")
    parser.add_argument("--draft", action="append", help="Drafts to run (repeatable) [default: none, ngram, "
                                                         "ngram+eagle]")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: "DRAFT,SETTING"
    args = parser.parse_args()
    if args.one:
        draft, setting = args.one.rsplit(",", 1)
        print(json.dumps(one_run(args.target, draft, SETTINGS[setting], args.max_tokens)))
        return
    print(f"target {args.target}, {args.max_tokens} tokens a prompt, tokens/s per run (fresh process each), "
          "and each setting's mean over not spinning's")
    print(f"{'draft':<24}" + "".join(f"{name:>26}" for name in SETTINGS))
    for draft in args.draft or ["none", "ngram", "ngram+eagle"]:
        speeds = {name: [] for name in SETTINGS}
        for _ in range(args.rounds):
            for name in SETTINGS:
                child = subprocess.run([sys.executable, __file__, "--target", args.target, "--max-tokens",
                                        str(args.max_tokens), "--one", f"{draft},{name}"],
                                       capture_output=True, text=True, check=True)
                speeds[name].append(json.loads(child.stdout.strip().splitlines()[-1])["tok_s"])
        base = sum(speeds["off"]) / len(speeds["off"])
        cells = [" ".join(f"{v:.1f}" for v in speeds[name]) + f"  {sum(speeds[name]) / len(speeds[name]) / base:.3f}"
                 for name in SETTINGS]
        print(f"{draft.rsplit('/', 1)[-1]:<24}" + "".join(f"{cell:>26}" for cell in cells))


if __name__ == "__main__":
    main()
