"""What top-p costs a row of real logits: decode/sampling.to_probs, which sorts the likeliest ids where their mass
reaches top_p, against the same law by the definition (the whole row sorted), on the rows a model gives along its own
answers. Heads and trees pay it per draft step, and a tree's verify pass per row of it.

    python benchmarks/top_p_rows.py [--model FILE.gguf] [--answers 4] [--tokens 48] [--reps 5] [--json]

The rows are the target's logits at each position of its greedy answers to the built-in prompts (float32, as the
backend returns them). Per setting, both ways run over every row, alternately, `reps` times; the medians per row are
printed with their ratio, and the two laws are checked equal on every row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from edgespec.decode import sampling
from edgespec.decode.sampling import SamplingParams, to_probs

SETTINGS = [SamplingParams(0.7, top_p=0.9), SamplingParams(1.0, top_p=0.95), SamplingParams(0.8, top_k=40, top_p=0.95),
            SamplingParams(1.0, top_p=0.5)]


def by_definition(probs: np.ndarray, top_p: float, kept=None) -> np.ndarray:
    """The nucleus from the whole row sorted: sampling's own fallback, for every row."""
    order, n_keep = sampling._prefix(probs, top_p)
    return order[:n_keep]


def answer_rows(model: str, answers: int, tokens: int) -> np.ndarray:
    """[n, V] float32: the model's logits along its greedy answers to the first built-in prompts."""
    import edgespec
    from edgespec.backends.protocol import forward_rows
    from edgespec.bench import read_prompts

    engine = edgespec.load(model, "none", n_ctx=1024)
    rows = []
    for row in read_prompts(None)[:answers]:
        context = engine.prompt_tokens(row["prompt"])
        answer = engine.generate(row["prompt"], max_tokens=tokens).tokens
        engine.target.rollback(0)
        rows.extend(np.concatenate(list(forward_rows(engine.target, context + answer)))[len(context) - 1:])
    engine.close()
    return np.array(rows, dtype=np.float32)


def per_row(rows: np.ndarray, params: SamplingParams) -> float:
    t0 = time.perf_counter()
    for row in rows:
        to_probs(row, params)
    return (time.perf_counter() - t0) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a GGUF (default: the default model)")
    parser.add_argument("--answers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.model is None:
        from edgespec.models.default import default_target

        args.model = str(default_target())
    rows = answer_rows(args.model, args.answers, args.tokens)
    fast = sampling._nucleus
    results = []
    for params in SETTINGS:
        times = {"head first": [], "whole row": []}
        for _ in range(args.reps):
            for name, nucleus in (("head first", fast), ("whole row", by_definition)):
                sampling._nucleus = nucleus
                times[name].append(per_row(rows, params))
        sampling._nucleus = by_definition
        reference = [to_probs(row, params) for row in rows]
        sampling._nucleus = fast
        assert all(np.array_equal(to_probs(row, params), law) for row, law in zip(rows, reference, strict=True))
        kept = [int(np.count_nonzero(law)) for law in reference]
        head, whole = (statistics.median(times[k]) for k in ("head first", "whole row"))
        results.append({"params": repr(params), "rows": len(rows), "vocab": rows.shape[1],
                        "median_kept": statistics.median(kept), "kept_over_64": sum(k > 64 for k in kept),
                        "head_first_ms": round(head * 1e3, 3), "whole_row_ms": round(whole * 1e3, 3),
                        "speedup": round(whole / head, 2)})
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{len(rows)} rows of {rows.shape[1]} ids from {args.model}; ms a row, median of {args.reps}")
    print(f"{'setting':62}{'kept (median)':>14}{'>64 kept':>10}{'head first':>12}{'whole row':>11}{'x':>7}")
    for r in results:
        print(f"{r['params']:62}{r['median_kept']:>14}{r['kept_over_64']:>10}{r['head_first_ms']:>12.3f}"
              f"{r['whole_row_ms']:>11.3f}{r['speedup']:>7.2f}")


if __name__ == "__main__":
    main()
