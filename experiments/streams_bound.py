"""How much can drafting add to several streams on this device? The chain bound of N streams verified together
(plan/bound.chain_bound, streams=N) from a target's pass costs measured here, beside one stream's.

Measures a pass of n rows (n = 1..rows, median of --reps after a warm-up, llama.cpp on --threads threads), a draft
model's step where --draft is given (else --draft-step, a share of a one-row pass), and prints for each acceptance
the best chain of one stream and of --streams streams drafting together, each over the same streams target-only.

usage: python experiments/streams_bound.py --target T.gguf [--draft D.gguf] [--streams 4] [--rows 16] [--json]
"""

from __future__ import annotations

import argparse
import json

from edgespec.backends.llama.backend import LlamaBackend
from edgespec.decode.calibrate import measure_pass_costs
from edgespec.plan.bound import chain_bound


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", help="a draft GGUF whose one-row step is timed here")
    ap.add_argument("--draft-step", type=float, default=0.05, help="without --draft: a step's share of a pass")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--rows", type=int, default=16, help="longest pass timed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--alpha", type=float, nargs="+", default=[0.6, 0.7, 0.8, 0.9])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    target = LlamaBackend(args.target, n_ctx=512, n_threads=args.threads)
    costs = measure_pass_costs(target, args.rows, reps=args.reps)
    target.close()
    if args.draft:
        draft = LlamaBackend(args.draft, n_ctx=512, n_threads=args.threads)
        step = measure_pass_costs(draft, 1, reps=args.reps)[1]
        draft.close()
    else:
        step = args.draft_step * costs[1]
    rows = {n: round(c / costs[1], 3) for n, c in costs.items()}
    out = {"target": args.target, "one_row_s": round(costs[1], 4), "rows": rows,
           "draft_step": round(step / costs[1], 4), "streams": args.streams, "bounds": []}
    for alpha in args.alpha:
        one = chain_bound(costs, 0.0, step, alpha)
        several = chain_bound(costs, 0.0, step, alpha, streams=args.streams)
        out["bounds"].append({"alpha": alpha, "one_stream": one.to_dict(),
                              f"{args.streams}_streams": several.to_dict()})
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"one-row pass {costs[1] * 1e3:.1f} ms; n rows over one: "
          + ", ".join(f"{n}: {r:.2f}" for n, r in rows.items()))
    print(f"draft step {out['draft_step']:.3f} of a pass")
    print(f"| acceptance | one stream: k, x target-only | {args.streams} streams: k, x {args.streams} target-only |")
    print("|--:|--:|--:|")
    for b in out["bounds"]:
        one, several = b["one_stream"], b[f"{args.streams}_streams"]
        print(f"| {b['alpha']} | {one['k']}, {one['speedup']:.2f}x | {several['k']}, {several['speedup']:.2f}x |")


if __name__ == "__main__":
    main()
