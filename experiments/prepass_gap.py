"""The host's work between a target pass and the start of the next one, with prompt lookup declined and without it.

On a backend that starts passes ahead (llama.cpp on a GPU), what the loop does after a pass's row is read and
before the next pass starts is time the device waits; what it does after the start is hidden. This script wraps a
`LlamaBackend(overlap=True)`'s forward/collect (the row read) and prefetch (the next pass started) and reports, per
round, the time between them for target-only decoding and for prompt lookup with a controller that declines it
(costs of a GPU-like target: a pass of n tokens about n one-token passes). On a CPU the pass itself does not
overlap, but the gap is the same host work a GPU would wait for.

usage: python experiments/prepass_gap.py TARGET.gguf [-t 1] [--reps 3] [--prompts 3] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("-t", "--temperature", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    from edgespec import api
    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.bench import read_prompts
    from edgespec.decode.cost import DraftController
    from edgespec.drafts.base import PromptLookupDrafter

    target = LlamaBackend(args.target, n_ctx=1024, n_threads=1, overlap=True)
    read_at, gaps = [0.0], []
    forward, collect, prefetch = target.forward, target.collect, target.prefetch

    def timed_forward(*a, **kw):
        rows = forward(*a, **kw)
        read_at[0] = time.perf_counter()
        return rows

    def timed_collect():
        rows = collect()
        read_at[0] = time.perf_counter()
        return rows

    def timed_prefetch(tokens):
        gaps.append(time.perf_counter() - read_at[0])
        return prefetch(tokens)

    target.forward, target.collect, target.prefetch = timed_forward, timed_collect, timed_prefetch
    costs = {n: 0.006 * n for n in range(1, 10)}  # a 2-token pass costs 2 one-token ones: lookup rarely pays
    ways = {"target-only": api.Engine(target, None, None),
            "lookup": api.Engine(target, PromptLookupDrafter(target.vocab.n_vocab), DraftController(costs, 0.0, 8))}
    prompts = [row["prompt"] for row in read_prompts(None)][:args.prompts]
    ways["target-only"].generate(prompts[0], max_tokens=8)  # warm up
    per_way = {way: [] for way in ways}
    drafted = dict.fromkeys(ways, 0)
    for _ in range(args.reps):
        for i, prompt in enumerate(prompts):
            for way, engine in ways.items():
                gaps.clear()
                stats = engine.generate(prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                                        seed=i).stats
                per_way[way] += gaps[1:]  # the first follows the prefill
                drafted[way] += stats.drafted
    for way, values in per_way.items():
        values.sort()
        print(f"{way:12s} rounds {len(values):5d}  row read -> next pass started: median "
              f"{1e6 * statistics.median(values):6.1f} us, mean {1e6 * statistics.mean(values):6.1f} us, "
              f"p90 {1e6 * values[int(0.9 * len(values))]:6.1f} us; drafted {drafted[way]}")


if __name__ == "__main__":
    main()
