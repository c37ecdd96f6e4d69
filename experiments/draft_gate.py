"""Does ending each chain by the draft's confidence pay? Target-only, ungated and gated speculative decoding on
the same prompts, side by side in one process, per category.

    python experiments/draft_gate.py --target target-f32.gguf --draft f32-1800-own.eagle.npz [--also draft-q4_0.gguf]

Each draft loads once; its gated and ungated runs share the models but keep controllers of their own (what one
learns about acceptance would steer the other), and the three runs of a prompt go in turn, the order rotating
by prompt. Greedy: the three outputs must be the same tokens (counted). Also prints the gate's calibration at
the end (acceptance per tenth of confidence, learned over the run).
"""

from __future__ import annotations

import argparse
import copy
import json
from collections import defaultdict

from edgespec.api import Engine, load
from edgespec.bench import read_prompts

MODES = ("target", "ungated", "gated")


def compare(target: str, draft: str, prompts: list[dict], max_tokens: int, threads: int | None) -> dict:
    gated = load(target, draft, threads=threads, gate=True)
    ungated = Engine(gated.target, gated.drafter, copy.deepcopy(gated.controller), gated.draft_backend, gate=False)
    engines = {"target": gated, "ungated": ungated, "gated": gated}
    totals = defaultdict(lambda: {m: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0} for m in MODES})
    same = defaultdict(int)
    try:
        for i, row in enumerate(prompts):
            outputs = {}
            for mode in MODES[i % 3:] + MODES[:i % 3]:
                result = engines[mode].generate(row["prompt"], max_tokens=max_tokens, seed=i,
                                                draft_max=0 if mode == "target" else None)
                outputs[mode] = result.tokens
                for cat in (row["cat"], "overall"):
                    t = totals[cat][mode]
                    t["tokens"] += result.stats.generated
                    t["seconds"] += result.stats.decode_s
                    t["drafted"] += result.stats.drafted
                    t["accepted"] += result.stats.accepted
            for cat in (row["cat"], "overall"):
                same[cat] += outputs["gated"] == outputs["ungated"] == outputs["target"]
    finally:
        gated.close()
    learned = gated.controller
    report = {"categories": {}, "calibration": [
        round(a / (a + r), 3) for a, r in zip(learned.bin_accepted, learned.bin_rejected, strict=True)]}
    for cat, t in totals.items():
        base = t["target"]["tokens"] / t["target"]["seconds"]
        report["categories"][cat] = row = {"same_outputs": same[cat]}
        for mode in ("ungated", "gated"):
            m = t[mode]
            row[mode] = {"ratio": round(m["tokens"] / m["seconds"] / base, 3),
                                 "acceptance": round(m["accepted"] / m["drafted"], 3) if m["drafted"] else 0.0,
                                 "drafted": m["drafted"]}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="models/smollm2-f32-q4_0/target-f32.gguf")
    parser.add_argument("--draft", default="models/smollm2-f32-q4_0/draft-q4_0.gguf")
    parser.add_argument("--also", action="append", default=[], help="another draft (repeatable)")
    parser.add_argument("--prompts", default=None, help="JSONL of {cat, prompt} [default: the built-in set]")
    parser.add_argument("-n", "--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    prompts = read_prompts(args.prompts)
    reports = {draft: compare(args.target, draft, prompts, args.max_tokens, args.threads)
               for draft in (args.draft, *args.also)}
    if args.json:
        print(json.dumps(reports, indent=2))
        return
    print("ratio = speculative / target-only tokens per second; accept = acceptance rate; drafted = draft tokens")
    for draft, report in reports.items():
        print(f"\n{draft}\n{'category':10} {'ungated ratio':>13} {'accept':>7} {'drafted':>8}"
              f" {'gated ratio':>12} {'accept':>7} {'drafted':>8} {'same':>5}")
        for cat in sorted(report["categories"], key=lambda c: (c == "overall", c)):
            r = report["categories"][cat]
            u, g = r["ungated"], r["gated"]
            print(f"{cat:10} {u['ratio']:13.3f} {u['acceptance']:7.2f} {u['drafted']:8d}"
                  f" {g['ratio']:12.3f} {g['acceptance']:7.2f} {g['drafted']:8d} {r['same_outputs']:5d}")
        print("gate calibration, acceptance per tenth of confidence:",
              " ".join(f"{a:.2f}" for a in report["calibration"]))


if __name__ == "__main__":
    main()
