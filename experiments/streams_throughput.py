"""Aggregate tokens/s of several requests answered one at a time (api.Engine) and four at a time (parallel.Parallel),
on the same target and draft, interleaved by repetition: what joining the streams' passes into one decode buys;
and one at a time on the four streams (what one client of `edgespec serve --parallel 4` gets).

usage: python experiments/streams_throughput.py --target T.gguf [--draft D.gguf] [--prompts 8] [--max-tokens 96]
       [--streams 4] [--reps 2] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time


def answer_each(engine, prompts: list[str], max_tokens: int) -> list:
    return [engine.generate(p, max_tokens=max_tokens) for p in prompts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", default=None, help="a draft model (besides none and prompt lookup)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from edgespec import api
    from edgespec.backends.llama.streams import DECODER
    from edgespec.bench import read_prompts
    from edgespec.parallel import Parallel

    prompts = [row["prompt"] for row in read_prompts(None)][:args.prompts]
    drafts = ["none", "ngram"] + ([args.draft] if args.draft else [])
    report = {"target": args.target, "prompts": len(prompts), "max_tokens": args.max_tokens, "streams": args.streams,
              "reps": args.reps, "threads": args.threads, "ways": {}}
    for draft in drafts:
        # the one-at-a-time engine loads and decodes on the thread Parallel decodes on: on a CPU, a second decoding
        # thread makes every pass 1.5x slower (backends/llama/streams.py, _DecodeThread), and a server decodes
        # from one thread too (server.loading_thread)
        one = DECODER.call(functools.partial(api.load, args.target, draft, n_ctx=1024, threads=args.threads))
        many = Parallel(args.target, draft, streams=args.streams, n_ctx=1024, threads=args.threads)
        alone = f"one at a time on {args.streams} streams"  # one client of a --parallel server
        times = {"one at a time": [], alone: [], f"{args.streams} at a time": []}
        tokens = {}
        for _ in range(args.reps):
            t0 = time.perf_counter()
            results = DECODER.call(functools.partial(answer_each, one, prompts, args.max_tokens))
            times["one at a time"].append(time.perf_counter() - t0)
            tokens["one at a time"] = sum(r.stats.produced for r in results)
            t0 = time.perf_counter()
            results = [r for p in prompts for r in many.generate([p], max_tokens=args.max_tokens)]
            times[alone].append(time.perf_counter() - t0)
            tokens[alone] = sum(r.stats.produced for r in results)
            t0 = time.perf_counter()
            results = many.generate(prompts, max_tokens=args.max_tokens)
            times[f"{args.streams} at a time"].append(time.perf_counter() - t0)
            tokens[f"{args.streams} at a time"] = sum(r.stats.produced for r in results)
        one.close()
        many.close()
        name = draft if draft in ("none", "ngram") else "draft model"
        report["ways"][name] = {way: {"tok_s": round(tokens[way] / statistics.median(t), 2),
                                      "seconds": [round(x, 2) for x in t]} for way, t in times.items()}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for name, ways in report["ways"].items():
        cells = ", ".join(f"{way} {w['tok_s']} tok/s" for way, w in ways.items())
        print(f"{name:12s} {cells}")


if __name__ == "__main__":
    main()
