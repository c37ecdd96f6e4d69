"""`edgespec advise`: will speculation pay for this pair, these prompts and this device, and how far to draft?

Calibration: the target answers a sample of prompts on its own (at the user's sampling settings), and the
rows of logits it produced are kept. For every position i of an answer and every draft depth j, the draft
is asked what it would propose in a round starting at i, and the table beta[i, j] holds the probability
that the rule accepts depth j given that depths before it were accepted: sum_x min(p(x), q(x)) of the
target's row and the draft's row there (1 - their total-variation distance, exactly). A draft model is
read teacher-forced (its row at position i+j given the answer so far; at temperature 0 this is exactly what
it drafts while its drafts are accepted), prompt lookup is run on the answer so far, and draft heads are
replayed with the target's hidden states as the loop would hand them over.

Prediction: a walk along each answer replays the loop's rounds for a draft length k (accept depth j with
probability beta, emit the accepted drafts and one token from the target, go on after them; at temperature
0 beta is 0 or 1 and the walk is the loop's own path). With the device's costs of a target pass over n
tokens, of a draft round and of turning a row of logits into probabilities, the walk's time against the
target-only time is the predicted speed ratio; intervals come from resampling prompts (bootstrap). The
costs are timed part by part (how a pass grows with its tokens, a draft round's fixed and per-token work),
then scaled to what a few real answers, target-only and speculative, spend on each part.

`--check` runs real speculative decoding on held-out prompts at every draft length and prints predicted
against measured side by side.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from edgespec.decode.calibrate import measure_pass_costs
from edgespec.decode.sampling import SamplingParams

# calibration and costs live in plan/calibration.py and plan/costs.py; the names tests and the CLI reach
# through advise stay importable from here
from edgespec.plan.calibration import (  # noqa: F401
    GREEDY,
    STATS,
    Answer,
    _HiddenRows,
    builtin_prompts,
    calibrate,
    choose_prompts,
    depth1_stats,
    overlap,
    split_alternate,
    target_answer,
)
from edgespec.plan.costs import (  # noqa: F401
    Costs,
    in_loop,
    measure_row_cost,
    measured_costs,
    roofline_costs,
    speculative_engine,
    target_only_engine,
)
from edgespec.progress import Steps, say

CONFIDENCE_BINS = np.linspace(0.0, 1.0, 11)
BOOTSTRAP = 400  # prompt resamples behind each interval
WALKS = 24  # Monte Carlo walks per answer when acceptance is random (temperature > 0)
INTERVAL = (5, 95)  # percentiles: a 90 % interval


# --- prediction -------------------------------------------------------------------------------------------

@dataclass
class Walk:
    """Totals of the loop's rounds along one answer at one draft length (means over walks if random)."""

    tokens: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0
    rounds_with_draft: float = 0.0
    seconds: float = 0.0

    def add(self, other: Walk, weight: float = 1.0) -> None:
        for name in ("tokens", "drafted", "accepted", "rounds_with_draft", "seconds"):
            setattr(self, name, getattr(self, name) + weight * getattr(other, name))


def walk(beta: np.ndarray, k: int, costs: Costs, max_tokens: int, rng: np.random.Generator | None) -> Walk:
    """Replay the loop's rounds along one answer with draft length k; rng None: beta is 0/1 (greedy)."""
    n, out, i = len(beta), Walk(), 0
    while i < n:
        kk = min(k, max_tokens - i - 1)
        row = beta[i, :max(kk, 0)]
        drafted = int(np.argmax(np.isnan(row))) if np.isnan(row).any() else len(row)
        accepted = 0
        for b in row[:drafted]:
            if not (b >= 0.5 if rng is None else rng.random() < b):
                break
            accepted += 1
        out.drafted += drafted
        out.accepted += accepted
        out.rounds_with_draft += drafted > 0
        out.seconds += costs.round(drafted, kk, accepted)
        out.tokens += accepted + 1
        i += accepted + 1
    out.tokens = min(out.tokens, n)
    return out


def walks(answers: list[Answer], k: int, costs: Costs, max_tokens: int, greedy: bool, t0: bool = False,
          seed: int = 0) -> list[Walk]:
    """One Walk per answer (the mean of WALKS random walks when acceptance is random)."""
    out = []
    for a, answer in enumerate(answers):
        beta = answer.beta_t0 if t0 else answer.beta
        if greedy or t0:
            out.append(walk(beta, k, costs, max_tokens, None))
            continue
        rng, mean = np.random.default_rng([seed, a, k]), Walk()
        for _ in range(WALKS):
            mean.add(walk(beta, k, costs, max_tokens, rng), 1.0 / WALKS)
        out.append(mean)
    return out


def _summary(base: list[Walk], spec: list[Walk], index: np.ndarray) -> tuple[float, float, float]:
    """(acceptance, mean accepted length, speed ratio) pooled over the answers in `index`."""
    drafted = sum(spec[i].drafted for i in index)
    accepted = sum(spec[i].accepted for i in index)
    rounds = sum(spec[i].rounds_with_draft for i in index)
    ratio = sum(base[i].seconds for i in index) / sum(spec[i].seconds for i in index)
    return (accepted / drafted if drafted else 0.0, accepted / rounds if rounds else 0.0, ratio)


def predict(answers: list[Answer], costs: Costs, *, k_max: int, max_tokens: int, greedy: bool,
            seed: int = 0) -> dict:
    """Per draft length 0..k_max: predicted acceptance (and at temperature 0), mean accepted length and speed
    ratio, with bootstrap intervals over answers; the best draft length."""
    base = walks(answers, 0, costs, max_tokens, True)
    rng = np.random.default_rng(seed)
    resamples = rng.integers(0, len(answers), size=(BOOTSTRAP, len(answers)))
    everything = np.arange(len(answers))
    lengths = {}
    for k in range(1, k_max + 1):
        spec = walks(answers, k, costs, max_tokens, greedy, seed=seed)
        acceptance, mean_len, ratio = _summary(base, spec, everything)
        boot = np.array([_summary(base, spec, idx) for idx in resamples])  # [B, 3]
        lo, hi = np.percentile(boot, INTERVAL, axis=0)
        t0 = acceptance if greedy else _summary(base, walks(answers, k, costs, max_tokens, greedy, t0=True),
                                                everything)[0]
        lengths[k] = {"acceptance": round(acceptance, 4), "acceptance_interval": [round(lo[0], 4), round(hi[0], 4)],
                      "acceptance_t0": round(t0, 4), "mean_accepted_length": round(mean_len, 3),
                      "speedup": round(ratio, 3), "speedup_interval": [round(lo[2], 3), round(hi[2], 3)]}
    best = max(lengths, key=lambda k: lengths[k]["speedup"])
    if lengths[best]["speedup"] <= 1.0:
        best = 0
    return {"answers": len(answers), "positions": int(sum(a.n for a in answers)), "draft_lengths": lengths,
            "best_draft_length": best, "best_speedup": lengths[best]["speedup"] if best else 1.0}


def statistics(answers: list[Answer]) -> dict:
    """Means of the depth-1 statistics over positions where the draft proposed something, the share of
    positions it drafted at all, and the calibration of its confidence (reliability bins, ECE)."""
    pooled = {name: np.concatenate([a.stats[name] for a in answers]) for name in STATS}
    drafted = ~np.isnan(pooled["top1"])
    out = {"positions": int(len(drafted)), "drafted_share": round(float(drafted.mean()), 4)}
    for name in STATS:
        values = pooled[name][drafted]
        values = values[np.isfinite(values)]
        out[name] = round(float(values.mean()), 4) if len(values) else None
    confidence, hit = pooled["confidence"][drafted], pooled["top1"][drafted]
    bins = []
    if len(confidence) and not np.all(confidence == 1.0):
        which = np.clip(np.digitize(confidence, CONFIDENCE_BINS) - 1, 0, len(CONFIDENCE_BINS) - 2)
        ece = 0.0
        for b in range(len(CONFIDENCE_BINS) - 1):
            in_bin = which == b
            if in_bin.any():
                bins.append({"confidence": round(float(confidence[in_bin].mean()), 3),
                             "top1_agreement": round(float(hit[in_bin].mean()), 3), "positions": int(in_bin.sum())})
                ece += in_bin.mean() * abs(confidence[in_bin].mean() - hit[in_bin].mean())
        out["calibration_error"] = round(float(ece), 4)
    else:
        out["calibration_error"] = None  # a deterministic draft states no confidence
    out["calibration"] = bins
    return out


# --- the check: real speculative decoding on held-out prompts ---------------------------------------------

def run_check(engine, drafters: dict[str, object], prompts: list[dict], *, k_max: int, max_tokens: int,
              params: SamplingParams, progress: bool = False) -> dict:
    """Measured tokens/s of target-only decoding and of every drafter at every draft length 1..k_max on the same
    prompts; modes rotate per prompt so that none always runs on the warmest cache. {draft: {cat: {k: ...}}}."""
    engines = {None: target_only_engine(engine),
               **{name: speculative_engine(engine, d, k_max) for name, d in drafters.items()}}
    modes = [(None, 0)] + [(name, k) for name in drafters for k in range(1, k_max + 1)]
    totals = defaultdict(lambda: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "prompts": 0,
                                  "per_prompt": []})
    bar = Steps(len(prompts) * len(modes), "checking", progress)
    for i, row in enumerate(prompts):
        shift = i % len(modes)
        for name, k in modes[shift:] + modes[:shift]:
            result = engines[name].generate(row["prompt"], max_tokens=max_tokens, temperature=params.temperature,
                                            top_k=params.top_k, top_p=params.top_p, min_p=params.min_p, seed=i,
                                            draft_max=k)
            for cat in (row["cat"], "overall"):
                t = totals[(name, k, cat)]
                t["tokens"] += result.stats.generated
                t["seconds"] += result.stats.decode_s
                t["drafted"] += result.stats.drafted
                t["accepted"] += result.stats.accepted
                t["prompts"] += 1
                t["per_prompt"].append((result.stats.drafted, result.stats.accepted))
            bar.step()
    bar.finish()
    out: dict = {}
    cats = sorted({cat for (_, _, cat) in totals} - {"overall"}) + ["overall"]
    for name in drafters:
        out[name] = {}
        for cat in cats:
            base = totals[(None, 0, cat)]
            base_tps = base["tokens"] / base["seconds"]
            lengths = {}
            for k in range(1, k_max + 1):
                t = totals[(name, k, cat)]
                lengths[k] = {"acceptance": round(t["accepted"] / t["drafted"], 4) if t["drafted"] else 0.0,
                              "acceptance_interval": pooled_interval(t["per_prompt"]),
                              "speedup": round(t["tokens"] / t["seconds"] / base_tps, 3)}
            best = max(lengths, key=lambda k: lengths[k]["speedup"])
            out[name][cat] = {"prompts": base["prompts"], "tokens": base["tokens"],
                              "target_only_tokens_per_second": round(base_tps, 2), "draft_lengths": lengths,
                              "best_draft_length": best if lengths[best]["speedup"] > 1.0 else 0}
    return out


def pooled_interval(per_prompt: list[tuple[int, int]], seed: int = 0) -> list[float]:
    """90 % bootstrap interval over prompts of accepted / drafted pooled from (drafted, accepted) per prompt:
    how much the measured acceptance itself depends on which prompts were held out."""
    counts = np.array(per_prompt, dtype=float).reshape(-1, 2)  # [prompts, (drafted, accepted)]
    idx = np.random.default_rng(seed).integers(0, len(counts), size=(BOOTSTRAP, len(counts)))
    drafted, accepted = counts[idx, 0].sum(axis=1), counts[idx, 1].sum(axis=1)
    rates = accepted[drafted > 0] / drafted[drafted > 0]
    return [round(float(x), 4) for x in np.percentile(rates, INTERVAL)] if len(rates) else [0.0, 0.0]


def compare(prediction: dict, measured: dict) -> dict:
    """Predicted against measured for one draft and category: acceptance at the recommended draft length (k = 1
    where the advice is not to speculate), the speed there, and how close it comes to the best measured length."""
    k = prediction["best_draft_length"] or 1
    pred, meas = prediction["draft_lengths"][k], measured["draft_lengths"][k]
    measured_at = {0: 1.0, **{j: v["speedup"] for j, v in measured["draft_lengths"].items()}}
    best = max(measured_at, key=measured_at.get)
    chosen = measured_at[prediction["best_draft_length"]]
    return {"draft_length": k, "recommended_draft_length": prediction["best_draft_length"],
            "acceptance_predicted": pred["acceptance"], "acceptance_predicted_interval": pred["acceptance_interval"],
            "acceptance_measured": meas["acceptance"], "acceptance_measured_interval": meas["acceptance_interval"],
            "acceptance_error": round(pred["acceptance"] - meas["acceptance"], 4),
            "speedup_predicted": pred["speedup"], "speedup_interval": pred["speedup_interval"],
            "speedup_measured": meas["speedup"], "best_measured_draft_length": best,
            "best_measured_speedup": measured_at[best], "recommended_measured_speedup": chosen,
            "within_10_percent": chosen >= 0.9 * measured_at[best]}


# --- the command ------------------------------------------------------------------------------------------

@dataclass
class Advice:
    report: dict
    answers: dict[str, list[Answer]] = field(repr=False, default_factory=dict)


def advise(engine, drafters: dict[str, object], calibration: list[dict], *, params: SamplingParams, k_max: int,
           max_tokens: int, device: str | None = None, paths: dict | None = None, profiles=None,
           held_out: list[dict] | None = None, progress: bool = False, seed: int = 0) -> Advice:
    """Calibrate, predict per category and draft length, recommend; with held_out, check against real decoding.

    drafters: {name: drafter} sharing engine.target. device: a profile name other than auto takes the costs
    from its roofline; paths then gives the files ({"target": ..., name: ...}) to read the weights' sizes from."""
    answers = calibrate(engine, drafters, calibration, params=params, k_max=k_max, max_tokens=max_tokens,
                        seed=seed, progress=progress)
    # a context and rows to time on: the last calibration prompt and a short answer
    prompt = engine.prompt_tokens(calibration[-1]["prompt"])
    answer, logits, hidden = target_answer(engine.target, prompt, params, np.random.default_rng(seed), 8)
    context, hidden_row = ([*prompt, *answer[:-1]], hidden[-2] if hidden is not None else None) \
        if len(answer) >= 2 else (prompt, None)
    # passes timed at the calibration's mean context: a pass over a few tokens grows with it (SmolLM2 Q4_1 here,
    # 2 tokens: 15.5 ms after 32 tokens, 17.9 ms after 400)
    first = next(iter(answers.values()))
    mean_context = int(np.mean([a.prompt_tokens + a.n / 2 for a in first]))
    target_costs = measure_pass_costs(engine.target, k_max + 1, reps=5,
                                      context=max(1, min(mean_context, engine.target.n_ctx - k_max - 2)))
    row_cost = measure_row_cost(logits[-1], params)
    firsts = {row["cat"]: row["prompt"] for row in reversed(calibration)}  # the first prompt of each category
    drafts = {}
    for name, drafter in drafters.items():
        # a minute or so without a bar: the parts timed, then a few real answers
        say(progress, f"timing {name} on this device ...")
        costs = in_loop(engine, drafter,
                        measured_costs(engine, drafter, context, hidden_row, target_costs, row_cost, params, k_max),
                        list(firsts.values()), params, k_max, max_tokens)
        if device not in (None, "auto"):
            costs = roofline_costs(costs, paths["target"], paths[name], device, profiles)
        cats = sorted({a.cat for a in answers[name]})
        by_cat = {cat: [a for a in answers[name] if a.cat == cat] for cat in cats}
        by_cat["overall"] = answers[name]
        drafts[name] = {
            "costs": costs.to_dict(),
            "categories": {cat: {"statistics": statistics(items),
                                 **predict(items, costs, k_max=k_max, max_tokens=max_tokens, greedy=params.greedy,
                                           seed=seed)}
                           for cat, items in by_cat.items()},
        }
    report = {"target": engine.target.name, "temperature": params.temperature, "top_p": params.top_p,
              "top_k": params.top_k, "min_p": params.min_p, "max_tokens": max_tokens, "k_max": k_max,
              "calibration_prompts": len(calibration), "drafts": drafts,
              "recommendations": recommend(drafts)}
    if held_out:
        measured = run_check(engine, drafters, held_out, k_max=k_max, max_tokens=max_tokens, params=params,
                             progress=progress)
        report["check"] = {"prompts": len(held_out), "drafts": {
            name: {cat: {**compare(drafts[name]["categories"][cat], m), "prompts": m["prompts"],
                         "target_only_tokens_per_second": m["target_only_tokens_per_second"],
                         "measured": m["draft_lengths"]}
                   for cat, m in measured[name].items() if cat in drafts[name]["categories"]}
            for name in drafters}}
    return Advice(report, answers)


def recommend(drafts: dict) -> dict:
    """Per category: the draft and draft length with the best predicted speed, or not to speculate."""
    cats = sorted({cat for d in drafts.values() for cat in d["categories"]} - {"overall"}) + ["overall"]
    out = {}
    for cat in cats:
        options = [(d["categories"][cat]["best_speedup"], name, d["categories"][cat]["best_draft_length"])
                   for name, d in drafts.items() if cat in d["categories"]]
        speedup, name, k = max(options)
        if k == 0:
            out[cat] = {"draft": None, "draft_length": 0, "speedup": 1.0,
                        "advice": "do not speculate: no draft length is predicted to beat target-only decoding"}
        else:
            interval = drafts[name]["categories"][cat]["draft_lengths"][k]["speedup_interval"]
            sure = "" if interval[0] > 1.0 else " (the interval reaches below 1: a gain is not certain)"
            out[cat] = {"draft": name, "draft_length": k, "speedup": speedup,
                        "advice": f"draft with {name}, --draft-max {k}: predicted {speedup:.2f}x "
                                  f"[{interval[0]:.2f}, {interval[1]:.2f}]{sure}"}
    return out


def format_advice(report: dict) -> str:
    lines = [f"target {report['target']}, temperature {report['temperature']}, max tokens {report['max_tokens']}, "
             f"{report['calibration_prompts']} calibration prompts"]
    for name, d in report["drafts"].items():
        c = d["costs"]
        passes = " ".join(f"{n}:{ms:.1f}" for n, ms in c["target_pass_ms"].items())
        lines += ["", f"draft {name}", f"  costs ({c['source']}): target pass ms by tokens {passes}; draft round "
                  f"{c['draft_round_fixed_ms']:.2f} + {c['draft_per_token_ms']:.2f}/token ms (+"
                  f"{c['draft_all_accepted_ms']:.2f} after all accepted); row {c['row_ms']:.2f} ms; loop "
                  f"{c['overhead_ms']:.2f} ms/round; target-only "
                  f"{c['target_only_tokens_per_second']:.1f} tok/s"]
        k_max = report["k_max"]
        lines.append(f"  {'category':<9}{'pos':>5}{'drafted':>8}{'top1':>6}{'accept':>7}{'TV':>6}{'KL t|d':>7}"
                     f"{'KL d|t':>7}{'H t':>6}{'H d':>6}{'ECE':>6}   " + "".join(f"{'k=' + str(k):>14}"
                                                                             for k in range(1, k_max + 1)))
        for cat, r in d["categories"].items():
            s = r["statistics"]

            def num(x, w=6, f=".2f"):
                return f"{'-':>{w}}" if x is None else f"{x:>{w}{f}}"

            cells = "".join(f"{v['speedup']:>7.2f}x ({v['acceptance']:.2f})"[-14:].rjust(14)
                            for v in r["draft_lengths"].values())
            lines.append(f"  {cat:<9}{s['positions']:>5}{s['drafted_share']:>8.2f}{num(s['top1'])}"
                         f"{num(s['accept'], 7)}{num(s['tv'])}{num(s['kl_target_draft'], 7)}"
                         f"{num(s['kl_draft_target'], 7)}{num(s['entropy_target'])}{num(s['entropy_draft'])}"
                         f"{num(s['calibration_error'])}   {cells}")
        lines.append("  (per draft length: predicted speed over target-only, and acceptance)")
    lines += ["", "advice"]
    for cat, r in report["recommendations"].items():
        lines.append(f"  {cat:<9} {r['advice']}")
    if "check" in report:
        lines += ["", f"check on {report['check']['prompts']} held-out prompts: predicted vs measured at the "
                  "recommended draft length (acceptance at k = 1 where the advice is not to speculate)"]
        for name, cats in report["check"]["drafts"].items():
            lines.append(f"  draft {name}: target-only {cats['overall']['target_only_tokens_per_second']:.1f} tok/s "
                         f"measured, {report['drafts'][name]['costs']['target_only_tokens_per_second']:.1f} predicted")
            lines.append(f"  {'category':<9}{'k':>3}{'accept pred':>12}{'meas':>7}{'meas interval':>15}{'err':>7}"
                         f"{'speed pred':>12}"
                         f"{'interval':>15}{'meas':>7}{'best k':>8}{'best':>7}{'within 10%':>12}")
            for cat, c in cats.items():
                lo, hi = c["speedup_interval"]
                a_lo, a_hi = c["acceptance_measured_interval"]
                lines.append(f"  {cat:<9}{c['recommended_draft_length']:>3}{c['acceptance_predicted']:>12.3f}"
                             f"{c['acceptance_measured']:>7.3f}{f'[{a_lo:.2f}, {a_hi:.2f}]':>15}"
                             f"{c['acceptance_error']:>+7.3f}"
                             f"{c['speedup_predicted']:>12.3f}"
                             f"{f'[{lo:.2f}, {hi:.2f}]':>15}"
                             f"{c['recommended_measured_speedup']:>7.3f}{c['best_measured_draft_length']:>8}"
                             f"{c['best_measured_speedup']:>7.3f}{'yes' if c['within_10_percent'] else 'NO':>12}")
    return "\n".join(lines)


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2)
