"""How fast a corpus's answers come: one prompt at a time through edgespec's engine (what ONNX models and
--answer-draft do) against a GGUF model answering several prompts at once (LlamaBackend.answer_many, what
build_corpus does by default), side by side on the same training prompts, greedy. Also counts the answers
that differ from the engine's and the largest logit gap at which one differs (streams round near-ties apart).

    python experiments/answer_many.py --target models/smollm2-f32-q4_0/target-f32.gguf \\
        [--prompts 16] [--max-tokens 160] [--streams 4 8 16] [--draft ngram] [--json]

Run it alone: nothing else should compete for the machine while it measures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections import defaultdict

import numpy as np

from edgespec.api import load, prompt_tokens
from edgespec.backends.llama.backend import LlamaBackend
from edgespec.train.prompts import read_train_prompts


def balanced(n: int) -> list[dict]:
    """The first n training prompts taken round robin over the categories."""
    by_cat = defaultdict(list)
    for row in read_train_prompts():
        by_cat[row["cat"]].append(row)
    rows = [r for group in itertools.zip_longest(*by_cat.values()) for r in group if r is not None]
    return rows[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--streams", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--draft", default="ngram", help="the one-at-a-time engine's draft [default: ngram]")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    rows = balanced(args.prompts)
    engine = load(args.target, args.draft, n_ctx=1024)
    prompts = [prompt_tokens(engine.target, r["prompt"]) for r in rows]
    engine.generate(rows[0]["prompt"], max_tokens=16)  # pages the weights in before anything is timed
    t0 = time.perf_counter()
    reference = [engine.generate(r["prompt"], max_tokens=args.max_tokens, temperature=0.0).tokens for r in rows]
    one_s = time.perf_counter() - t0
    report = {"prompts": len(rows), "answer_tokens": sum(map(len, reference)),
              "one_at_a_time_s": round(one_s, 2), "streams": {}}
    room = max(map(len, prompts)) + args.max_tokens
    for streams in args.streams:
        backend = LlamaBackend(args.target, n_ctx=streams * room)
        t0 = time.perf_counter()
        answers = backend.answer_many(prompts, args.max_tokens, lambda i, logits: int(np.argmax(logits)),
                                      streams=streams)
        seconds = time.perf_counter() - t0
        backend.close()
        differ, widest = 0, 0.0
        for prompt, (answer, _), ref in zip(prompts, answers, reference, strict=True):
            if answer == ref:
                continue
            differ += 1
            at = next(j for j, (a, b) in enumerate(zip(answer, ref, strict=False)) if a != b)
            engine.target.rollback(0)
            row = engine.target.forward(prompt + answer[:at], 1)[0]
            widest = max(widest, float(row.max() - row[answer[at]]))
        report["streams"][streams] = {"seconds": round(seconds, 2), "speedup": round(one_s / seconds, 2),
                                      "answers_differ": differ, "widest_gap": round(widest, 4)}
    engine.close()
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['prompts']} prompts, {report['answer_tokens']} answer tokens; one at a time "
          f"({args.draft}): {one_s:.1f} s")
    for streams, r in report["streams"].items():
        print(f"{streams:>3} streams: {r['seconds']:6.1f} s  {r['speedup']:.2f}x  answers that differ "
              f"{r['answers_differ']}/{report['prompts']} (widest logit gap where one did: {r['widest_gap']})")


if __name__ == "__main__":
    main()
