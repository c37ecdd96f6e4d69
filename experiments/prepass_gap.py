"""The host's work between a target pass and the start of the next one, with prompt lookup declined and without it.

On a backend that starts passes ahead (llama.cpp on a GPU), what the loop does after a pass's row is read and
before the next pass starts is time the device waits; what it does after the start is hidden. This script wraps a
`LlamaBackend(overlap=True)`'s forward/collect (the row read) and forward/prefetch (the next pass started:
PassGaps) and reports, per round, the time between them for target-only decoding and for prompt lookup with a
controller that declines it (costs of a GPU-like target: a pass of n tokens about n one-token passes). On a CPU
the pass itself does not overlap, but the gap is the same host work a GPU would wait for.

usage: python experiments/prepass_gap.py TARGET.gguf [-t 1] [--reps 3] [--prompts 3] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import time


class PassGaps:
    """Times the host's work between a target's passes: from the return of the call that handed out a pass's rows
    (forward, collect) to the call that starts the next (forward, prefetch), each such gap in `gaps`. Wraps the
    backend's methods in place (experiments/declined_draft.py uses it too)."""

    def __init__(self, target):
        self.gaps: list[float] = []
        self._ready = None
        for name in ("forward", "prefetch", "collect"):
            setattr(target, name, self._timed(getattr(target, name), starts=name != "collect",
                                              hands_out=name != "prefetch"))

    def _timed(self, call, starts: bool, hands_out: bool):
        def timed(*args, **kwargs):
            if starts and self._ready is not None:
                self.gaps.append(time.perf_counter() - self._ready)
                self._ready = None
            out = call(*args, **kwargs)
            if hands_out:
                self._ready = time.perf_counter()
            return out
        return timed

    def take(self) -> list[float]:
        """The gaps of the generation since the last take but its first (after the prompt's pass: the controller's
        start and a draft's reading, not a round's work); the next pass starts a new count."""
        out, self.gaps, self._ready = self.gaps[1:], [], None
        return out


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
    gaps = PassGaps(target)
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
                gaps.take()
                stats = engine.generate(prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                                        seed=i).stats
                per_way[way] += gaps.take()
                drafted[way] += stats.drafted
    for way, values in per_way.items():
        values.sort()
        print(f"{way:12s} rounds {len(values):5d}  row read -> next pass started: median "
              f"{1e6 * statistics.median(values):6.1f} us, mean {1e6 * statistics.mean(values):6.1f} us, "
              f"p90 {1e6 * values[int(0.9 * len(values))]:6.1f} us; drafted {drafted[way]}")


if __name__ == "__main__":
    main()
