"""`edgespec bench`: target-only and speculative decoding on the same prompts, in one process.

Each prompt runs in both modes back to back, in alternating order so that neither mode always gets
the warmer cache; tokens/s are pooled per category (total tokens over total decode time).
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from edgespec.api import Engine
from edgespec.errors import EdgespecError
from edgespec.plan.bound import chain_bound
from edgespec.plan.calibration import read_prompts  # bench's and advise's prompts alike
from edgespec.progress import Steps


def first_of_each(prompts: list[dict], n: int) -> list[dict]:
    """The first n prompts of each category, categories in the order they first appear, each one's together."""
    by_cat: dict[str, list[dict]] = {}
    for row in prompts:
        rows = by_cat.setdefault(row["cat"], [])
        if len(rows) < n:
            rows.append(row)
    return [row for rows in by_cat.values() for row in rows]


def run_bench(engine: Engine, prompts: list[dict], *, max_tokens: int, temperature: float = 0.0,
              draft_max: int | None = None, progress: bool = False, json_schema: dict | None = None,
              grammar_drafts: bool = True, baseline: Engine | None = None) -> dict:
    """Run every prompt target-only and speculatively; return the report (see format_report).

    baseline: the engine target-only runs on, where the target alone runs differently from the target beside
    a draft (an ONNX target's threads spin on between runs only alone; see runs_as_alone) [default: engine itself].
    json_schema: constrain every answer to it (both modes). grammar_drafts=False: a draft model drafts as if
    there were no grammar (its drafts are cut at the first forbidden token), to measure what drafting under
    the grammar gains."""
    if engine.drafter is None:
        raise EdgespecError("bench compares against a draft: pass --draft FILE.gguf or --draft ngram")
    totals = defaultdict(lambda: {"base": [0, 0.0], "spec": [0, 0.0], "prefill": {"base": 0.0, "spec": 0.0},
                                  "drafted": 0, "accepted": 0, "rejected": 0, "draft_s": 0.0, "target_s": 0.0,
                                  "passes": 0, "rounds_with_draft": 0, "draft_lengths": Counter(), "same": 0, "n": 0,
                                  "lookup_drafted": 0, "lookup_accepted": 0})
    modes = {"base": 0, "spec": draft_max}
    engines = {"base": baseline or engine, "spec": engine}
    aware = engine.drafter.grammar_aware
    if aware and not grammar_drafts:
        engine.drafter.grammar_aware = False  # this engine's drafter, for this bench
    bar = Steps(len(prompts), "bench", progress)
    for i, row in enumerate(prompts):
        order = ["base", "spec"] if i % 2 == 0 else ["spec", "base"]
        outputs = {}
        for mode in order:
            result = engines[mode].generate(row["prompt"], max_tokens=max_tokens, temperature=temperature,
                                     seed=i, draft_max=modes[mode], json_schema=json_schema)
            outputs[mode] = result
        for cat in (row["cat"], "overall"):
            t = totals[cat]
            t["n"] += 1
            for mode in modes:
                t[mode][0] += outputs[mode].stats.generated
                t[mode][1] += outputs[mode].stats.decode_s
                t["prefill"][mode] += outputs[mode].stats.prefill_s
            s = outputs["spec"].stats
            t["draft_s"] += s.draft_s
            t["target_s"] += outputs["base"].stats.target_s
            t["passes"] += outputs["base"].stats.target_passes
            t["drafted"] += s.drafted
            t["accepted"] += s.accepted
            t["rejected"] += s.rejected
            t["lookup_drafted"] += s.lookup_drafted
            t["lookup_accepted"] += s.lookup_accepted
            t["rounds_with_draft"] += sum(s.accept_counts.values())
            t["draft_lengths"].update(s.draft_lengths)
            t["same"] += outputs["spec"].tokens == outputs["base"].tokens
        bar.step()
    bar.finish()
    categories = {}
    for cat, t in totals.items():
        base_tps = t["base"][0] / t["base"][1] if t["base"][1] else 0.0
        spec_tps = t["spec"][0] / t["spec"][1] if t["spec"][1] else 0.0
        categories[cat] = {
            "prompts": t["n"],
            "target_only_tokens_per_second": round(base_tps, 2),
            "speculative_tokens_per_second": round(spec_tps, 2),
            "speedup": round(spec_tps / base_tps, 3) if base_tps else 0.0,
            # prompt processing, reported apart from decode speed: a draft model adds its own prefill
            "target_only_prefill_ms": round(1000 * t["prefill"]["base"] / t["n"], 1),
            "speculative_prefill_ms": round(1000 * t["prefill"]["spec"] / t["n"], 1),
            "acceptance_rate": round(t["accepted"] / t["drafted"], 4) if t["drafted"] else 0.0,
            # of the drafts the verifier judged (up to each round's first rejection): not moved by chain lengths
            "token_acceptance": round(t["accepted"] / judged, 4) if (judged := t["accepted"] + t["rejected"]) else 0.0,
            "mean_accepted_length": round(t["accepted"] / t["rounds_with_draft"], 4) if t["rounds_with_draft"] else 0.0,
            # seconds per drafted token over seconds per target-only step (catching up included); tokens that
            # prompt lookup drafted in front of a draft cost nothing and are not counted
            "draft_step_cost": round(t["draft_s"] / paid / (t["target_s"] / t["passes"]), 3)
            if (paid := t["drafted"] - t["lookup_drafted"]) and t["passes"] and t["target_s"] else 0.0,
            "lookup_drafted": t["lookup_drafted"],
            "lookup_acceptance_rate": round(t["lookup_accepted"] / t["lookup_drafted"], 4) if t["lookup_drafted"]
            else 0.0,
            "draft_length_histogram": {str(k): v for k, v in sorted(t["draft_lengths"].items())},
            "identical_outputs": t["same"],
        }
    overall = categories.pop("overall")
    overall["chain_bound"] = chain_bound_of(engine, overall["token_acceptance"])
    overall["of_bound"] = round(overall["speedup"] / overall["chain_bound"]["speedup"], 3)
    gated = engine.drafter.gated  # drafts chains under a DraftGate unless engine.gate is off
    return {
        "target": engine.target.name,
        "placement": engine.placement(),
        "draft": engine.drafter.name + (" (grammar-unaware)" if json_schema and aware and not grammar_drafts
                                        else "") + (f" (tree {engine.tree_width})" if engine.tree_width > 1 else "")
        + (" (ungated)" if gated and not engine.gate else ""),
        "tree_width": engine.tree_width,
        "gate": engine.gate and gated,
        "json_schema": json_schema is not None,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "draft_max": draft_max,
        "target_only": "the target loaded alone" if baseline is not None else "the same engine, drafting off",
        "categories": categories,
        "overall": overall,
    }


def chain_bound_of(engine: Engine, alpha: float) -> dict:
    """The chain bound (plan/bound.py) from the costs the engine's controller holds after the run (pass costs timed
    at load and moved by every round, the draft's start and step fitted to its rounds) and the acceptance the run
    measured."""
    c = engine.controller
    bound = chain_bound(c.target_costs, c.draft_start, c.draft_cost, alpha, c.k_max)
    return {**bound.to_dict(), "alpha": alpha, "draft_step_s": round(c.draft_cost, 6),
            "draft_start_s": round(c.draft_start, 6),
            "pass_cost_ratios": {str(n): round(s / c.target_costs[1], 3) for n, s in sorted(c.target_costs.items())}}


def runs_as_alone(engine: Engine) -> bool:
    """Whether the engine's target, drafting off, runs as the target loaded alone would. An ONNX session
    beside a draft spins its threads within runs only (or not at all); alone they spin on between runs too
    (experiments/onnx_spinning.py), so its target-only speed may not be what a user without a draft gets."""
    return engine.target.spins_between_runs


def format_report(report: dict) -> str:
    head = (f"target {report['target']}  draft {report['draft']}  max_tokens {report['max_tokens']}  "
            f"temperature {report['temperature']}  draft_max {report['draft_max'] or 'auto'}")
    if report.get("target_only") == "the target loaded alone":
        head += "  (target-only: the target loaded alone)"
    cols = f"{'category':<10}{'prompts':>8}{'target tok/s':>14}{'spec tok/s':>12}{'ratio':>8}{'accept':>8}" \
           f"{'judged':>8}{'mean acc':>10}{'same out':>10}  draft lengths"
    lines = [head, cols]
    overall = report["overall"]
    for name, c in [*sorted(report["categories"].items()), ("overall", overall)]:
        hist = " ".join(f"{k}:{v}" for k, v in c["draft_length_histogram"].items())
        lines.append(f"{name:<10}{c['prompts']:>8}{c['target_only_tokens_per_second']:>14.1f}"
                     f"{c['speculative_tokens_per_second']:>12.1f}{c['speedup']:>8.3f}{c['acceptance_rate']:>8.2f}"
                     f"{c['token_acceptance']:>8.2f}{c['mean_accepted_length']:>10.2f}"
                     f"{c['identical_outputs']:>7}/{c['prompts']:<2}  {hist}")
    if "chain_bound" in overall:
        b = overall["chain_bound"]
        lines.append(f"chain bound at acceptance {b['alpha']:.2f}: {b['speedup']:.3f}x with chains of {b['k']} "
                     f"(pass costs x one-token pass: {' '.join(f'{n}:{r}' for n, r in b['pass_cost_ratios'].items())};"
                     f" draft step {1000 * b['draft_step_s']:.1f} ms, start {1000 * b['draft_start_s']:.1f} ms); "
                     f"measured {overall['speedup']:.3f}x = {overall['of_bound']:.2f} of it")
    return "\n".join(lines)


def format_comparison(reports: list[dict]) -> str:
    """Draft kinds side by side per category: acceptance (of the drafted, and of the judged: see
    Stats.token_acceptance), mean accepted length, draft step cost relative
    to a target step, and speed over target-only (each measured against its own interleaved baseline)."""
    width = 37
    head = f"{'category':<10}" + "".join(f"{r['draft'][:width - 2]:>{width}}" for r in reports)
    sub = f"{'':<10}" + f"{'accept  judged  mean  cost  ratio':>{width}}" * len(reports)
    lines = [f"target {reports[0]['target']}, temperature {reports[0]['temperature']}", head, sub]
    names = sorted(reports[0]["categories"]) + ["overall"]
    for name in names:
        cells = []
        for r in reports:
            c = r["overall"] if name == "overall" else r["categories"][name]
            cells.append(f"{c['acceptance_rate']:.2f}    {c['token_acceptance']:.2f}  "
                         f"{c['mean_accepted_length']:.2f}  {c['draft_step_cost']:.2f}  "
                         f"{c['speedup']:.3f}")
        lines.append(f"{name:<10}" + "".join(f"{cell:>{width}}" for cell in cells))
    return "\n".join(lines)


# --- memory: the planner's total against the peak resident memory of a process that runs the plan -----

_PEAK_CHILD = r"""
import json, resource, sys
import edgespec.api as api
from edgespec.plan.report import to_dict
args = json.loads(sys.argv[1])
engine = api.load(args["target"], args["draft"], n_ctx=args["ctx"], device=args["device"], budget=args["budget"])
# fill the context: the KV cache, the compute buffer and the logits rows all reach their planned size
text = " ".join(p["prompt"] for p in args["prompts"])
tokens = engine.target.tokenize(text, special=False)
while len(tokens) < engine.target.n_ctx:
    tokens += tokens
pieces = engine.target.vocab.pieces
n = engine.target.n_ctx - args["max_tokens"] - 1
text = b"".join(pieces[t] for t in tokens[:n]).decode("utf-8", "replace")
result = engine.generate(text, max_tokens=args["max_tokens"], chat=False, temperature=0.0)
def peak_rss():
    # Linux: VmHWM, the high-water mark of this program's memory. ru_maxrss would also count the parent's
    # memory at fork time (Linux carries it across exec), so a child of a large process reads as large.
    try:
        status = open("/proc/self/status").read()
        return int(status.split("VmHWM:")[1].split()[0]) * 1024
    except (OSError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS
print(json.dumps({"peak": peak_rss(),
                  "plan": to_dict(engine.plan), "prompt_tokens": result.stats.prompt_tokens,
                  "generated": result.stats.generated, "drafted": result.stats.drafted}))
"""


def measure_peak(target: str | Path | None, draft: str | Path, *, ctx: int | None = None, device: str | None = "auto",
                 budget: str | None = None, max_tokens: int = 64) -> dict:
    """Load a pair under a plan in a fresh process, fill its context, generate; return the plan (as JSON)
    and the process's peak resident memory. A fresh process, so nothing else counts in its peak."""
    import subprocess

    args = {"target": target and str(target), "draft": str(draft), "ctx": ctx, "device": device, "budget": budget,
            "max_tokens": max_tokens, "prompts": read_prompts(None)}
    proc = subprocess.run([sys.executable, "-c", _PEAK_CHILD, json.dumps(args)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise EdgespecError(f"the measuring process failed: {proc.stderr.strip().splitlines()[-1]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["ratio"] = round(out["peak"] / out["plan"]["total"], 3)
    return out


def format_memory(rows: list[tuple[str, dict]]) -> str:
    """Planned against measured peak memory, one line per configuration."""
    lines = [f"{'configuration':44}{'planned MiB':>12}{'measured MiB':>13}{'measured/planned':>18}"]
    for name, r in rows:
        lines.append(f"{name:44}{r['plan']['total'] / 2**20:>12.1f}{r['peak'] / 2**20:>13.1f}{r['ratio']:>18.3f}")
    return "\n".join(lines)
