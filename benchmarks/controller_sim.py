"""Is the draft-length controller never slower than target-only decoding, whatever the device? The loop on
simulated devices (plan/sim.py): passes cost what a device's table says, on a virtual clock, at a set
acceptance, so each cell takes a second of real time and gives the same figures on every run.

    python benchmarks/controller_sim.py [--device h200-3b-f16 ...] [--draft lookup ...] [--tree-width 3] [--json]

Per device, draft (prompt lookup, a draft model, EAGLE-like heads) and acceptance: target-only, the controller,
and every fixed draft length 1..8, over the same texts (4 answers of 256 tokens, greedy, one controller across
them as an Engine keeps one). Goals: the controller >= 0.97x target-only in every cell, and >= 0.90x the best
fixed length wherever that beats target-only.

--tree-width W: heads draft trees of up to W guesses a node, the later guesses holding the token the first missed
as often as the reference pair's draft's did (plan/sim.draft_ranks); the controller plans each round's shape,
a fixed length k drafts k depths of W each, and each cell also gives the chain controller's speedup and the tree
bound (plan/bound.tree_bound, from the device's table, a head step per depth and those guesses' acceptance).

The devices. Figures are seconds per pass of n tokens; lengths a table lacks are interpolated, and past its
longest extrapolated along its last slope (plan/sim.pass_seconds). `draft_read` is what each further
token of a draft model's pass costs (catching up on text it skipped), `head` a head step.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.decode.shape import RankAcceptance
from edgespec.plan.bound import tree_bound
from edgespec.plan.sim import DRAFTS, Device, pass_seconds, simulate


def ms(table: dict[int, float]) -> dict[int, float]:
    return {n: t / 1e3 for n, t in table.items()}


def per_token_ms(tokens_per_second: dict[int, float]) -> dict[int, float]:
    """llama-bench's pp<n> (or pp512 at microbatch n) t/s -> seconds for a pass of n tokens."""
    return {n: n / ts for n, ts in tokens_per_second.items()}


DEVICES = {d.name: d for d in (
    # the figures: an H200, a 3B-shaped f16 target (Llama-3.2-3B widths), llama.cpp through edgespec
    # (docs/results/2026-11-26-h200); a 135M draft step 1.7 ms in edgespec (1.25 in llama.cpp). Assumed: the
    # draft reads skipped text at 50k tokens/s, a head step costs a tenth of a target step.
    Device("h200-3b-f16", ms({1: 3.29, 2: 4.02, 4: 4.30, 5: 4.43, 8: 4.92}), draft_step=1.7e-3, draft_read=2e-5,
           head_token=0.35e-3, source="issue figures (H200, edgespec on llama.cpp)"),
    # this CPU (2-core x86), the default model SmolLM2-135M-Instruct Q4_1: docs/controller.md (1, 2, 5 tokens);
    # its Q4_0 export as the draft: 7.9 ms a step, 11.5 ms for two tokens (drafts/base.py, catch_up); the
    # EAGLE head 1.1 ms a step after a verify pass (docs/drafts.md, experiments/eagle_runners.py). Taken from the
    # docs: measure_pass_costs here during this session moved by 2-60x with another benchmark on the cores.
    Device("cpu-default-q4_1", ms({1: 10.5, 2: 14.5, 5: 27.0}), draft_step=7.9e-3, draft_read=3.6e-3,
           head_token=1.1e-3, source="docs/controller.md, drafts/base.py, docs/drafts.md"),
    # this CPU, the same model in f32 (make pair), measure_pass_costs after 200 tokens, median of 7, default
    # build (docs/results/2026-11-26-from-the-readme.md); its Q4_0 draft 6.8 ms a step (same run)
    Device("cpu-f32", ms({1: 18.6, 2: 25.9, 4: 30.1, 8: 42.7}), draft_step=6.8e-3, draft_read=3.6e-3,
           head_token=1.1e-3, source="docs/results/2026-11-26-from-the-readme.md"),
    # the CPU with a 2-layer f16 model, a 2-token pass 2x a 1-token pass (every token a full pass:
    # nothing can pay); 2 ms a token, a draft at half of it and a head at a tenth, assumed
    Device("cpu-2x", ms({1: 2.0, 2: 4.0}), draft_step=1.0e-3, draft_read=1.0e-3, head_token=0.2e-3,
           source="issue figures (2-token pass 2x a 1-token pass)"),
    # RTX 3090, llama 8B Q4_0, llama.cpp CUDA, pp512 at microbatch 1..8 (github.com/ggml-org/llama.cpp/pull/15802,
    # the PR's column). The draft: llama 1B Q4_0, 2,655 t/s at microbatch 8 in the same table (3.0 ms a pass of 8);
    # a step taken as 2.0 ms, skipped text read at 10k tokens/s, a head step at a tenth of a target step: assumed.
    Device("rtx3090-8b-q4_0", per_token_ms({1: 156.56, 2: 279.89, 3: 390.96, 4: 470.48, 5: 509.70, 6: 541.57,
                                            7: 559.30, 8: 583.77}),
           draft_step=2.0e-3, draft_read=1e-4, head_token=0.64e-3,
           source="llama.cpp PR 15802 (RTX 3090, llama 8B Q4_0, microbatch 1-8)"),
    # Apple M1 Pro, llama 13B Q4_0, llama.cpp Metal, pp1..pp4 after the mat-vec kernels for batches <= 4
    # (github.com/ggml-org/llama.cpp/pull/10491); the draft: llama 1B Q4_0 from the same table (pp1 140.13 t/s);
    # skipped text read at 1.5k tokens/s and a head step at a tenth of a target step, assumed.
    # this CPU (2-core AMD EPYC), SmolLM2-135M widened with zero weights (models/widen.py, make big-pair) to a
    # 2B-class f16 and a 7B-class Q8_0 target: the pass costs (n rows over one row, median of 4: 2B 1.54,
    # 2.05, 2.56, 2.69 at 2, 4, 8, 12 rows of 101 ms; 7B 1.62, 2.42, 3.24 at 2, 4, 8 of 214 ms); the f32 target's
    # Q4_0 as the draft, 6 ms a step, skipped text read as cpu-f32's; a head step at 0.05 of a pass, assumed.
    Device("cpu-2b-f16-widened", ms({1: 101.0, 2: 155.5, 4: 207.1, 8: 258.6, 12: 271.7}), draft_step=6e-3,
           draft_read=3.6e-3, head_token=5.05e-3, source="issue 56 figures (2-core AMD EPYC, widened 2B f16)"),
    Device("cpu-7b-q8_0-widened", ms({1: 214.0, 2: 346.7, 4: 517.9, 8: 693.4}), draft_step=6e-3,
           draft_read=3.6e-3, head_token=10.7e-3, source="issue 56 figures (2-core AMD EPYC, widened 7B Q8_0)"),
    # an H200, Qwen2.5-1.5B's widths at f16 with 152k ids (random weights), every pass length 1-16 measured
    # (docs/results/2026-11-27-h200/run1/pass-costs.json), the 135M draft's passes likewise (a step 1.49 ms, 0.56
    # of a target pass: launch-bound); a head step at 0.05 of a target pass, assumed (a one-layer head)
    Device("h200-1.5b-f16", ms({1: 2.673, 2: 3.261, 3: 3.457, 4: 3.455, 5: 3.574, 6: 3.622, 7: 3.675, 8: 3.722,
                                9: 3.86, 10: 3.879, 11: 4.185, 12: 4.201, 13: 4.218, 14: 4.284, 15: 4.271,
                                16: 4.333}),
           draft_step=1.495e-3, draft_read=(2.463e-3 - 1.495e-3) / 15, head_token=0.134e-3,
           source="docs/results/2026-11-27-h200/run1/pass-costs.json"),
    Device("m1pro-13b-q4_0", per_token_ms({1: 21.24, 2: 23.90, 3: 25.05, 4: 25.55}), draft_step=1 / 140.13,
           draft_read=0.67e-3, head_token=4.7e-3, source="llama.cpp PR 10491 (M1 Pro, llama 13B and 1B Q4_0)"),
)}
ALPHAS = (0.0, 0.3, 0.6, 0.9)
K_MAX = 8
RATIO_GOAL = 0.97  # the controller against target-only, every cell
BEST_GOAL = 0.90  # the controller against the best fixed length, where that beats target-only


def cell(device: Device, draft: str, alpha: float, **options) -> dict:
    """One device, draft and acceptance: target-only, the controller and each fixed length, on the same texts."""
    width = options.get("tree_width", 1)
    if width > 1 and draft != "heads":
        options = {**options, "tree_width": 1}  # trees are the heads' (the others draft chains)
    base = simulate(device, draft, alpha, draft_max=0, k_max=K_MAX, **options)
    ctl = simulate(device, draft, alpha, k_max=K_MAX, **options)
    fixed = {k: simulate(device, draft, alpha, draft_max=k, k_max=K_MAX, **options).tokens_per_virtual_second
             for k in range(1, K_MAX + 1)}
    best_k = max(fixed, key=fixed.get)
    ratio = ctl.tokens_per_virtual_second / base.tokens_per_virtual_second
    of_best = ctl.tokens_per_virtual_second / fixed[best_k]
    pays = fixed[best_k] > base.tokens_per_virtual_second
    return {"device": device.name, "draft": draft, "alpha": alpha,
            "controller_tps": round(ctl.tokens_per_virtual_second, 2),
            "target_tps": round(base.tokens_per_virtual_second, 2),
            "ratio": round(ratio, 3), "best_k": best_k, "best_tps": round(fixed[best_k], 2),
            "best_ratio": round(fixed[best_k] / base.tokens_per_virtual_second, 3), "of_best": round(of_best, 3),
            "pays": pays, "drafting_rounds": round(ctl.drafting_rounds / ctl.rounds, 3),
            "acceptance": round(ctl.accepted / ctl.drafted, 3) if ctl.drafted else None,
            "met": ratio >= RATIO_GOAL and (not pays or of_best >= BEST_GOAL),
            **(trees(device, alpha, width, ctl, base, **options) if width > 1 and draft == "heads" else {})}


def trees(device: Device, alpha: float, width: int, ctl, base, **options) -> dict:
    """A tree cell's additions: the chain controller's speedup on the same texts and the tree bound."""
    chain = simulate(device, "heads", alpha, k_max=K_MAX, **{**options, "tree_width": 1})
    nodes = MAX_OUTPUTS - 1
    costs = {n: pass_seconds(device.target, n) for n in range(1, nodes + 2)}
    bound = tree_bound(costs, 0.0, device.head_token, RankAcceptance().kept(alpha), width=width, max_nodes=nodes,
                       max_depth=K_MAX)
    speedup = ctl.tokens_per_virtual_second / base.tokens_per_virtual_second
    return {"chain_ratio": round(chain.tokens_per_virtual_second / base.tokens_per_virtual_second, 3),
            "tree_bound": bound.to_dict(), "of_tree_bound": round(speedup / bound.speedup, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", action="append", choices=sorted(DEVICES), help="default: all")
    parser.add_argument("--draft", action="append", choices=DRAFTS, help="default: all")
    parser.add_argument("--alpha", action="append", type=float, help=f"default: {ALPHAS}")
    parser.add_argument("--answers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256, help="per answer")
    parser.add_argument("--jitter", type=float, default=0.0, help="sigma of a lognormal factor on every pass")
    parser.add_argument("--prior", type=float, help="a draft model's acceptance prior (default: the cell's)")
    parser.add_argument("--burst", type=float, default=0.0,
                        help="prompt lookup right in runs: 0 independent, towards 1 longer runs (copy_script)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tree-width", type=int, default=1, help="heads draft trees of up to this many guesses a node")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    options = {"answers": args.answers, "n_new": args.tokens, "jitter": args.jitter, "seed": args.seed,
               "prior": args.prior, "burst": args.burst, "tree_width": args.tree_width}
    rows = [cell(DEVICES[d], draft, alpha, **options) for d in args.device or DEVICES
            for draft in args.draft or DRAFTS for alpha in args.alpha or ALPHAS]
    if args.json:
        print(json.dumps({"options": options, "devices": {d: asdict(DEVICES[d]) for d in args.device or DEVICES},
                          "cells": rows}, indent=1, default=str))
    else:
        print(f"{'device':18} {'draft':6} {'alpha':>5} {'ctl tok/s':>9} {'target':>8} {'ratio':>6} {'best k':>6} "
              f"{'best':>8} {'best/t':>6} {'ctl/best':>8} {'drafting':>8}  met")
        for r in rows:
            print(f"{r['device']:18} {r['draft']:6} {r['alpha']:5.1f} {r['controller_tps']:9.1f} "
                  f"{r['target_tps']:8.1f} {r['ratio']:6.3f} {r['best_k']:6d} {r['best_tps']:8.1f} "
                  f"{r['best_ratio']:6.3f} "
                  f"{r['of_best'] if r['pays'] else float('nan'):8.3f} {r['drafting_rounds']:8.2f}  "
                  f"{'yes' if r['met'] else 'NO'}" + (f"  chain {r['chain_ratio']:.3f}, tree bound "
                                                      f"{r['tree_bound']['speedup']:.3f} ({r['tree_bound']['nodes']} "
                                                      f"nodes), of it {r['of_tree_bound']:.3f}"
                                                      if "tree_bound" in r else ""))
        print(f"met {sum(r['met'] for r in rows)}/{len(rows)}; worst ratio {min(r['ratio'] for r in rows):.3f}; worst "
              f"of best where drafting pays {min((r['of_best'] for r in rows if r['pays']), default=float('nan')):.3f}")
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
