"""What a draft of another tokenizer buys beside the same draft with the target's tokenizer, side by side.

One target backend is shared by engines that differ only in the draft: `exact` (a draft model with the target's
vocabulary), and a draft of another tokenizer drafting through the token-level intersection (`tli`) or, at t = 0,
string-level (`text`: the draft writes its own tokens, the target's tokenizer spells them); plus target-only.
The other-tokenizer draft is a file of its own (models/vocab_edit.py permute: the same weights under shuffled
ids, some tokens dropped), so acceptance differences are the tokenizations' and the costs the machinery's. Each
built-in prompt is answered by every way in an order that rotates per prompt; ways run with the controller
choosing lengths (`--draft-max N` fixes them).

usage: python experiments/cross_tokenizer.py --target T.gguf --draft D.gguf --other O.gguf [-t 0] [--prompts 6]
       [--max-tokens 96] [--reps 2] [--threads 2] [--draft-max N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True, help="a draft model with the target's vocabulary")
    ap.add_argument("--other", required=True, help="the same draft under another tokenizer")
    ap.add_argument("-t", "--temperature", type=float, default=0.0)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-max", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from edgespec import api
    from edgespec.backends.open import open_model
    from edgespec.bench import read_prompts
    from edgespec.decode.calibrate import agreement, measure_pass_costs
    from edgespec.decode.cost import DraftController
    from edgespec.drafts.cross import CrossDrafter
    from edgespec.drafts.spec import model_drafter

    engine = api.load(args.target, args.draft, n_ctx=2048, threads=args.threads)
    target, costs = engine.target, engine.controller.target_costs
    other = open_model(args.other, n_ctx=engine.draft_backend.n_ctx, threads=args.threads)
    draft_cost = measure_pass_costs(other, 1)[1]

    def controller(prior=None):
        c = DraftController(dict(costs), draft_cost, engine.controller.k_max, read_cost=engine.controller.read_cost)
        if prior is not None:
            c.set_prior(prior)
        return c

    tli = model_drafter(other, target.vocab)
    assert isinstance(tli, CrossDrafter), "--other must be another tokenizer's"
    text = CrossDrafter(other, target.vocab, text_mode=lambda s: target.tokenize(s, special=False))
    prior = agreement(target, engine.draft_backend, target.tokenize("The quick brown fox jumps.", special=True))
    engines = {"target-only": api.Engine(target, None, None), "exact": engine,
               "tli": api.Engine(target, tli, controller(prior), other)}
    if args.temperature == 0:
        engines["text"] = api.Engine(target, text, controller(prior), other)
    ways = list(engines)
    prompts = [row["prompt"] for row in read_prompts(None)][:args.prompts]
    sums = defaultdict(lambda: defaultdict(float))
    outputs = defaultdict(list)
    turn = 0
    for rep in range(args.reps):
        for i, prompt in enumerate(prompts):
            for way in ways[turn % len(ways):] + ways[:turn % len(ways)]:
                t0 = time.perf_counter()
                r = engines[way].generate(prompt, max_tokens=args.max_tokens, temperature=args.temperature, seed=i,
                                          draft_max=0 if way == "target-only" else args.draft_max)
                s, t = r.stats, sums[rep, way]
                t["wall_s"] += time.perf_counter() - t0
                t["tokens"] += s.produced
                t["decode_s"] += s.decode_s
                t["drafted"] += s.drafted
                t["accepted"] += s.accepted
                t["rounds"] += s.target_passes
                outputs[way].append(r.tokens)
            turn += 1
    report = {"target": args.target, "draft": args.draft, "other": args.other, "temperature": args.temperature,
              "prompts": len(prompts), "max_tokens": args.max_tokens, "reps": args.reps,
              "draft_max": args.draft_max, "shared_tokens": tli.map.shared, "draft_tokens": other.vocab.n_vocab,
              "intersection_mass": round(tli.intersection_mass, 4), "ways": {}}
    for way in ways:
        reps = [sums[rep, way] for rep in range(args.reps)]
        ratios = [(r["tokens"] / r["decode_s"]) / (b["tokens"] / b["decode_s"])
                  for r, b in zip(reps, [sums[rep, "target-only"] for rep in range(args.reps)], strict=True)]
        total = {key: sum(r[key] for r in reps) for key in reps[0]}
        report["ways"][way] = {
            "tok_s": round(total["tokens"] / total["decode_s"], 2),
            "x_target_only": round(statistics.median(ratios), 4),
            "x_range": [round(min(ratios), 4), round(max(ratios), 4)],
            "drafted": int(total["drafted"]), "accepted": int(total["accepted"]),
            "acceptance": round(total["accepted"] / total["drafted"], 4) if total["drafted"] else 0.0,
            "tokens_per_round": round(total["tokens"] / total["rounds"], 3),
            "same_output_as_target_only": outputs[way] == outputs["target-only"],
        }
    engine.close()
    other.close()
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"t={args.temperature}, {len(prompts)} prompts x {args.max_tokens} tokens x {args.reps}, shared "
          f"{tli.map.shared} of {other.vocab.n_vocab} draft tokens, intersection mass {tli.intersection_mass:.3f}")
    print(f"{'way':12s}{'tok/s':>8s}{'x target-only':>24s}{'acceptance':>11s}{'tok/round':>10s}{'same':>6s}")
    for way, w in report["ways"].items():
        print(f"{way:12s}{w['tok_s']:8.1f}{w['x_target_only']:>10.3f} ({w['x_range'][0]:.3f}-{w['x_range'][1]:.3f})"
              f"{w['acceptance']:11.3f}{w['tokens_per_round']:10.2f}{str(w['same_output_as_target_only']):>6s}")


if __name__ == "__main__":
    main()
