"""A draft model on several streams: tokens/s of `--streams` requests at a time with the draft length fixed (0..3)
and chosen by the controllers, and how many decodes of the draft carried the streams' steps (joined steps: fewer
decodes than steps).

usage: python experiments/streams_draft.py --target T.gguf --draft D.gguf [--streams 4] [--prompts 16]
       [--max-tokens 96] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from edgespec.bench import read_prompts
    from edgespec.parallel import Parallel

    prompts = [row["prompt"] for row in read_prompts(None)][:args.prompts]
    report = {"target": args.target, "draft": args.draft, "streams": args.streams, "prompts": len(prompts),
              "max_tokens": args.max_tokens, "ways": {}}
    with Parallel(args.target, args.draft, streams=args.streams, n_ctx=1024, threads=args.threads) as p:
        p.generate(prompts[:args.streams], max_tokens=16)  # warm
        for k in (0, 1, 2, 3, None):
            decodes = p.draft.decodes
            t0 = time.perf_counter()
            results = p.generate(prompts, max_tokens=args.max_tokens, draft_max=k)
            seconds = time.perf_counter() - t0
            report["ways"]["chosen" if k is None else f"k={k}"] = {
                "tok_s": round(sum(r.stats.produced for r in results) / seconds, 1),
                "drafted": sum(r.stats.drafted for r in results),
                "accepted": sum(r.stats.accepted for r in results),
                "draft_decodes": p.draft.decodes - decodes}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for way, w in report["ways"].items():
        print(f"{way:7s} {w['tok_s']:6.1f} tok/s  {w['accepted']}/{w['drafted']} accepted  "
              f"{w['draft_decodes']} draft decodes")


if __name__ == "__main__":
    main()
