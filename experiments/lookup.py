"""How good prompt lookup's guesses are by the n-gram they come from, and what its shortest trusted n-gram is
worth in speed, on one target.

1. On the target's own greedy answers to the built-in prompts: at every answer position, the longest n-gram
   (up to 4) of the text so far that occurred before, and how many of the 8 tokens that followed it the answer
   goes on with; acceptance per depth by the order of the match (greedy acceptance of a one-hot draft is
   whether the target's token is the draft's).
2. `edgespec bench`'s side-by-side run for prompt lookup with each --orders range (shortest-longest n-gram),
   the target loaded once, each variant with a fresh controller.

usage: python experiments/lookup.py --target target-f32.gguf [--orders 1-3 --orders 3-4] [--max-tokens 128]
       [--no-bench: part 1 only]
"""

from __future__ import annotations

import argparse
import copy
from collections import defaultdict

import numpy as np

from edgespec.api import load
from edgespec.bench import format_comparison, read_prompts, run_bench
from edgespec.drafts.base import PromptLookupDrafter
from edgespec.drafts.ngram import lookup

DEPTH = 8


def acceptance_by_order(engine, prompts: list[dict], max_tokens: int) -> dict[int, dict]:
    """Per order of the longest match: rounds, mean tokens accepted, acceptance per depth [DEPTH]."""
    rows = defaultdict(lambda: {"rounds": 0, "accepted": 0, "kept": np.zeros(DEPTH), "judged": np.zeros(DEPTH)})
    for row in prompts:
        prompt = engine.prompt_tokens(row["prompt"])
        text = [*prompt, *engine.generate(row["prompt"], max_tokens=max_tokens, draft_max=0).tokens]
        for i in range(len(prompt), len(text) - 1):
            context = np.asarray(text[:i])
            order = next((n for n in (4, 3, 2, 1) if lookup(context, 1, n, n)), None)
            if order is None:
                continue
            guess = lookup(context, DEPTH, order, order)
            accepted = 0
            while accepted < len(guess) and i + accepted < len(text) and guess[accepted] == text[i + accepted]:
                accepted += 1
            r = rows[order]
            r["rounds"] += 1
            r["accepted"] += accepted
            judged = min(len(guess), accepted + 1, len(text) - i)  # depths up to the first rejection, in the text
            r["judged"][:judged] += 1
            r["kept"][:accepted] += 1
    return {order: {"rounds": r["rounds"], "mean_accepted": r["accepted"] / r["rounds"],
                    "per_depth": np.divide(r["kept"], r["judged"], out=np.zeros(DEPTH), where=r["judged"] > 0)}
            for order, r in sorted(rows.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--orders", action="append", default=None, help="shortest-longest n-gram, e.g. 3-4")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-bench", action="store_true", help="only the acceptance by order (part 1)")
    args = ap.parse_args()
    prompts = read_prompts(None)
    engine = load(args.target, "ngram", threads=args.threads)
    try:
        print("prompt lookup on the target's own greedy answers, by the order of the longest match")
        print(f"{'order':>5} {'rounds':>7} {'mean acc':>9}  acceptance at depth 1..{DEPTH}")
        for order, r in acceptance_by_order(engine, prompts, args.max_tokens).items():
            print(f"{order:5d} {r['rounds']:7d} {r['mean_accepted']:9.2f}  "
                  + " ".join(f"{a:.2f}" for a in r["per_depth"]))
        if args.no_bench:
            return
        prior = copy.deepcopy(engine.controller)
        reports = []
        for spec in args.orders or ["1-3", "2-4", "3-4"]:
            shortest, longest = map(int, spec.split("-"))
            engine.drafter = PromptLookupDrafter(engine.target.vocab.n_vocab, max_ngram=longest, min_ngram=shortest)
            engine.drafter.name = f"ngram {spec}"
            engine.controller = copy.deepcopy(prior)
            reports.append(run_bench(engine, prompts, max_tokens=args.max_tokens))
        print()
        print(format_comparison(reports))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
