"""Draft trees against chains for one heads draft, side by side in one process: the verify pass's cost per
length (a tree of k depths and width w is k * w + 1 tokens), then `edgespec bench` once per tree width on the
same prompts, each speculative run against its own interleaved target-only run, and one table.

    python experiments/trees.py --target models/smollm2-f32-q4_0/target-f32.gguf --draft H.eagle.npz \\
        [--widths 1 2 3] [--max-tokens 128] [--category code ...] [--json]

Run it alone: nothing else should compete for the machine while it measures.
"""

from __future__ import annotations

import argparse
import json

from edgespec.api import load
from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.bench import format_comparison, read_prompts, run_bench
from edgespec.decode.calibrate import measure_pass_costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True, help="*.eagle.npz or *.medusa.npz")
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", default=None, help="JSONL of prompts [default: the built-in bench set]")
    parser.add_argument("--category", action="append", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    prompts = [p for p in read_prompts(args.prompts) if not args.category or p["cat"] in args.category]
    reports, pass_ms = [], {}
    for width in args.widths:
        engine = load(args.target, args.draft, n_ctx=1024, threads=args.threads, tree_width=width)
        try:
            if not pass_ms:
                costs = measure_pass_costs(engine.target, MAX_OUTPUTS, reps=5)
                pass_ms = {n: round(1000 * s, 2) for n, s in costs.items()}
                if not args.json:
                    print("verify pass, ms by tokens:", " ".join(f"{n}:{ms}" for n, ms in pass_ms.items()), flush=True)
            reports.append(run_bench(engine, prompts, max_tokens=args.max_tokens))
        finally:
            engine.close()
        if not args.json:
            overall = reports[-1]["overall"]
            print(f"width {width}: speedup {overall['speedup']:.3f}, acceptance per depth "
                  f"{overall['acceptance_rate']:.2f}, identical outputs {overall['identical_outputs']}/"
                  f"{len(prompts)}", flush=True)
    if args.json:
        print(json.dumps({"pass_ms": pass_ms, "reports": reports}, indent=2))
    else:
        print(format_comparison(reports))


if __name__ == "__main__":
    main()
