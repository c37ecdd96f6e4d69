"""Each round of a generation as the controller saw it: the drafts verified, how many the target kept, the
acceptance estimate before the round, and in a round prompt lookup sat out its guess's score; beside the same
prompts decoded target-only. For finding out why speculation on a real device ran slower than target-only where
the simulation (controller_sim.py) does not.

usage: python experiments/controller_trace.py --target T.gguf [--draft ngram|D.gguf] [--prompt TEXT ...]
       [--max-tokens 96] [--gpu-layers N|all] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

PROMPTS = ("Explain how vaccines train the immune system.", "Write a short story about a lighthouse keeper.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", default="ngram")
    ap.add_argument("--prompt", action="append")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--gpu-layers", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import llama_cpp  # noqa: F401 (before numpy: a CUDA image was seen to crash loading a model when numpy came first)

    from edgespec import api

    engine = api.load(args.target, args.draft, gpu_layers=args.gpu_layers)
    controller, rounds = engine.controller, []
    observe, shadow = controller.observe, controller.observe_shadow

    def traced_observe(n_drafted, n_accepted, draft_s, target_s, **kwargs):
        rounds.append({"proposed": n_drafted, "accepted": n_accepted, "alpha_before": round(controller.alpha, 3),
                       "pass_ms": round(target_s * 1e3, 3)})
        return observe(n_drafted, n_accepted, draft_s, target_s, **kwargs)

    def traced_shadow(p_accept):  # a round lookup sat out: its guess's score, learnt after the round's observe
        if rounds:
            rounds[-1]["shadow"] = round(p_accept, 3)
        return shadow(p_accept)

    controller.observe, controller.observe_shadow = traced_observe, traced_shadow
    report = {"target": args.target, "draft": args.draft, "placement": engine.placement(),
              "pass_costs_ms": {n: round(s * 1e3, 3) for n, s in controller.target_costs.items()}, "prompts": []}
    for prompt in args.prompt or PROMPTS:
        runs = {}
        for mode, draft_max in (("target-only", 0), ("speculative", None)):
            del rounds[:]
            stream = engine.stream(prompt, max_tokens=args.max_tokens, draft_max=draft_max)
            for _ in stream:
                pass
            runs[mode] = {"tok_s": round(stream.stats.tokens_per_second, 2), "text": stream.text[:300],
                          "rounds": list(rounds) if draft_max is None else None}
        runs["ratio"] = round(runs["speculative"]["tok_s"] / runs["target-only"]["tok_s"], 4)
        report["prompts"].append({"prompt": prompt, **runs})
        if not args.json:
            print(f"{runs['ratio']:.3f}  {prompt[:50]}", file=sys.stderr)
    engine.close()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
