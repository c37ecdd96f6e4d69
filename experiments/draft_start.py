"""A draft round's cost as a start and a step per draft, against one cost per step: two engines side by side.

The controller fits each drafting round's time as `draft_start + steps * draft_cost` (decode/cost.py). The rule
before priced every step alike (a running average of a round's draft time over its steps), which on short chains
prices every step like a round's first, dearer one. Two engines load the same pair; one runs the rule before.
Per built-in prompt (two per category, the order vs_llama_cpp.py uses), each engine answers target-only and
then speculatively, the engines taking turns to go first. Prints decode tokens/s per category and overall, the
ratio to the engine's own target-only decoding, and the costs each controller ends with. Tokens count the
end-of-generation token, as llama-server counts it.

usage: python experiments/draft_start.py --target target-f32.gguf --draft ngram+draft-qat-q4_0.gguf [-t 0 -t 0.7]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from edgespec.decode import cost


class PerStep(cost.DraftController):
    """The rule before: one cost per draft step, a running average of each round's draft time over its steps."""

    def _fit_cost(self, steps: int, seconds: float) -> None:
        self.draft_start = 0.0
        self.draft_cost = (1 - cost.EMA) * self.draft_cost + cost.EMA * seconds / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("-t", "--temperature", type=float, action="append", help="default: 0 and 0.7")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from edgespec import api
    from edgespec.bench import first_of_each, read_prompts

    prompts = first_of_each(read_prompts(None), args.per_category)
    engines = {name: api.load(args.target, args.draft, threads=args.threads, n_ctx=2048)
               for name in ("start + step", "per step")}
    engines["per step"].controller.__class__ = PerStep
    totals = defaultdict(lambda: [0, 0.0])  # (temperature, engine, mode, category) -> [tokens, seconds]
    try:
        for temperature in args.temperature or [0.0, 0.7]:
            for i, row in enumerate(prompts):
                names = list(engines) if i % 2 == 0 else list(reversed(engines))
                for name in names:
                    for mode, draft_max in (("target-only", 0), ("speculative", None)):
                        stats = engines[name].generate(row["prompt"], max_tokens=args.max_tokens,
                                                       temperature=temperature, seed=i, draft_max=draft_max).stats
                        for cat in (row["cat"], "overall"):
                            totals[temperature, name, mode, cat][0] += stats.produced
                            totals[temperature, name, mode, cat][1] += stats.decode_s
            cats = [*dict.fromkeys(row["cat"] for row in prompts), "overall"]
            print(f"\nt={temperature}: decode tok/s, speculative (x the engine's own target-only)")
            print(f"{'controller':14s}" + "".join(f"{c:>16s}" for c in cats))
            for name in engines:
                cells = []
                for cat in cats:
                    (n, s), (n0, s0) = totals[temperature, name, "speculative", cat], \
                        totals[temperature, name, "target-only", cat]
                    cells.append(f"{n / s:8.1f} ({n / s / (n0 / s0):.2f})")
                print(f"{name:14s}" + "".join(cells))
            for name, engine in engines.items():
                c = engine.controller
                print(f"  {name}: start {c.draft_start * 1e3:.1f} ms, step {c.draft_cost * 1e3:.1f} ms")
    finally:
        for engine in engines.values():
            engine.close()


if __name__ == "__main__":
    main()
