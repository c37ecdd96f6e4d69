"""What `edgespec advise` times on the device: a target pass over n tokens, a draft round, turning a row of
logits into a law, part by part, then scaled to what real answers spend on each part (edgespec/plan/advise.py uses
them to turn acceptance into time).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.decode.cost import DraftController
from edgespec.decode.sampling import SamplingParams, sample, to_probs
from edgespec.drafts.base import ModelDrafter
from edgespec.plan.calibration import _HiddenRows


@dataclass
class Costs:
    """Seconds: a target pass over n tokens (n rows of logits), a draft round of k tokens (fixed + per token),
    and turning one row of logits into probabilities and running the rule on it. A draft model reads its own
    last draft only after a round that accepted all of them (before, it never needed its logits): one more
    step then, `draft_all_accepted` (what reading one more token in its next pass adds). `overhead`: the loop's
    own work per speculative round (text, bookkeeping), and `plain` a round of target-only decoding, both taken
    from real answers (None: a pass over one token, its row and the overhead)."""

    target: dict[int, float]
    draft_fixed: float
    draft_per_token: float
    row: float
    source: str
    draft_all_accepted: float = 0.0
    overhead: float = 0.0
    plain: float | None = None

    @property
    def target_only(self) -> float:
        """Seconds per token of target-only decoding."""
        return self.plain if self.plain is not None else self.target[1] + self.row + self.overhead

    def round(self, n_drafted: int, k: int, n_accepted: int = 0) -> float:
        """A round that asked for k drafts, got n_drafted and kept n_accepted: the draft's work, the pass, the rows."""
        if k == 0:
            return self.target_only
        draft = self.draft_fixed + self.draft_per_token * n_drafted
        if n_drafted and n_accepted == n_drafted:
            draft += self.draft_all_accepted
        return draft + self.target[n_drafted + 1] + (n_drafted + 1) * self.row + self.overhead

    def to_dict(self) -> dict:
        return {"source": self.source, "target_pass_ms": {str(n): round(1000 * s, 3) for n, s in self.target.items()},
                "draft_round_fixed_ms": round(1000 * self.draft_fixed, 3),
                "draft_per_token_ms": round(1000 * self.draft_per_token, 3),
                "draft_all_accepted_ms": round(1000 * self.draft_all_accepted, 3), "row_ms": round(1000 * self.row, 3),
                "overhead_ms": round(1000 * self.overhead, 3),
                "target_only_tokens_per_second": round(1.0 / self.target_only, 2)}


def _median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[reps // 2]


def measure_row_cost(logits_row: np.ndarray, params: SamplingParams, reps: int = 15) -> float:
    rng = np.random.default_rng(0)
    return _median_time(lambda: sample(to_probs(logits_row[None], params)[0], rng), reps)


def measure_draft_round(drafter, context: list[int], k: int, params: SamplingParams, reps: int = 7,
                        lag: int = 1) -> float:
    """Seconds for one round's drafting of k tokens after `context`, catching up included: a draft model's cache
    first loses the context's last `lag` tokens: 1 after a round that rejected a draft (the drafts it kept are
    cached, the target's own token is not), 2 after one that accepted all."""
    rng = np.random.default_rng(0)

    def one_round():
        if isinstance(drafter, ModelDrafter):
            backend = drafter.backend
            backend.rollback(min(len(backend.tokens), max(len(drafter.visible(context)) - lag, 0)))
        drafter.catch_up(context)
        drafter.propose(context, k, params, rng)

    one_round()  # warm-up: a draft model reads the whole context once
    return _median_time(one_round, reps)


def target_only_engine(engine):
    """An engine decoding with engine's target alone."""
    from edgespec.api import Engine

    return Engine(engine.target, None, None)


def speculative_engine(engine, drafter, k_max: int):
    """An engine drafting with this drafter for engine's target (its loaded models shared)."""
    from edgespec.api import Engine

    backend = drafter.backend if isinstance(drafter, ModelDrafter) else None
    controller = DraftController(dict(engine.controller.target_costs), engine.controller.draft_cost, k_max,
                                 draft_start=engine.controller.draft_start)
    return Engine(engine.target, drafter, controller, backend)


def in_loop(engine, drafter, costs: Costs, prompts: list[str], params: SamplingParams, k_max: int,
            tokens: int) -> Costs:
    """The costs as the loop pays them. Each prompt is answered by the target alone and speculatively (draft
    lengths 1..k_max in turn). Target-only decoding costs what those answers took per token. In the speculative
    answers, the time spent drafting and in target passes (rows included) against what the components timed
    alone predict for the same rounds scales them (here prompt lookup x2.5-3, target passes x0.94-1.19,
    varying between runs), and the rest of each round is the loop's own overhead."""
    alone, spec = target_only_engine(engine), speculative_engine(engine, drafter, k_max)
    plain = {"seconds": 0.0, "tokens": 0}
    spent = {"draft": 0.0, "target": 0.0, "rest": 0.0, "rounds": 0}
    model = {"draft": 0.0, "target": 0.0}
    for i, prompt in enumerate(prompts):
        settings = dict(max_tokens=tokens, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                        min_p=params.min_p, seed=i)
        stats = alone.generate(prompt, **settings).stats
        plain["seconds"] += stats.decode_s
        plain["tokens"] += stats.target_passes
        k = 1 + i % k_max
        stats = spec.generate(prompt, draft_max=k, **settings).stats
        spent["draft"] += stats.draft_s
        spent["target"] += stats.target_s
        spent["rest"] += stats.decode_s - stats.draft_s - stats.target_s
        spent["rounds"] += stats.target_passes
        for n, rounds in stats.draft_lengths.items():
            model["draft"] += rounds * (costs.draft_fixed + costs.draft_per_token * n)
            model["target"] += rounds * (costs.target[n + 1] + (n + 1) * costs.row)
        model["draft"] += stats.accept_counts[k] * costs.draft_all_accepted
    draft_scale = spent["draft"] / model["draft"] if model["draft"] > 0 else 1.0
    target_scale = spent["target"] / model["target"] if model["target"] > 0 else 1.0
    return Costs({n: t * target_scale for n, t in costs.target.items()}, costs.draft_fixed * draft_scale,
                 costs.draft_per_token * draft_scale, costs.row * target_scale,
                 f"{costs.source}, scaled to {len(prompts)} real answers (draft x{draft_scale:.2f}, "
                 f"target x{target_scale:.2f})", costs.draft_all_accepted * draft_scale,
                 max(spent["rest"] / max(spent["rounds"], 1), 0.0),
                 plain["seconds"] / plain["tokens"] if plain["tokens"] else None)


def measured_costs(engine, drafter, context: list[int], hidden_row: np.ndarray | None, target_costs: dict[int, float],
                   row_cost: float, params: SamplingParams, k_max: int) -> Costs:
    """Costs measured on this device: the target's (measured once for every draft) and this drafter's rounds at
    the user's sampling settings, after `context` (heads: from the target's state hidden_row at its end)."""
    drafter.reset()
    if hidden_row is not None:
        drafter.observe_target(_HiddenRows(hidden_row[None]), 0, len(context) - 2)
    one, most = (measure_draft_round(drafter, context, k, params) for k in (1, k_max))
    per_token = max((most - one) / (k_max - 1), 0.0) if k_max > 1 else one
    all_accepted = 0.0
    if isinstance(drafter, ModelDrafter):
        all_accepted = max(measure_draft_round(drafter, context, 1, params, lag=2) - one, 0.0)
    drafter.reset()
    if isinstance(drafter, ModelDrafter):
        drafter.backend.rollback(0)
    return Costs(dict(target_costs), max(one - per_token, 0.0), per_token, row_cost, "measured on this device",
                 all_accepted)


def roofline_costs(measured: Costs, target_path, draft_path, profile_name: str, profiles=None) -> Costs:
    """Costs for a named device profile from its memory bandwidth: every pass reads all of a model's weights
    once and nothing else counts (the memory-bound limit of small batches), so a pass over n <= k_max + 1
    tokens costs what one token does. The row cost and a prompt-lookup round stay as measured here."""
    from edgespec.api import plan_for
    from edgespec.drafts.spec import parse_draft

    plan = plan_for(target_path, draft_path, device=profile_name, profiles=profiles, measure_bandwidth=False)
    bandwidth = plan.profile.bandwidth
    step = plan.target.weights / bandwidth
    if plan.draft is not None:
        fixed, per_token = 0.0, plan.draft.weights / bandwidth
    elif parse_draft(draft_path).heads:
        fixed, per_token = 0.0, Path(draft_path).stat().st_size / bandwidth
    else:
        fixed, per_token = measured.draft_fixed, measured.draft_per_token
    return Costs({n: step for n in measured.target}, fixed, per_token, measured.row,
                 f"roofline of profile {profile_name} ({bandwidth / 1e9:.0f} GB/s; memory-bound passes)",
                 0.0, measured.overhead)
