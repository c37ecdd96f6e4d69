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
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import click
import numpy as np

from edgespec.errors import EdgespecError
from edgespec.runtime.backend import sync
from edgespec.runtime.cost import DraftController, measure_pass_costs
from edgespec.runtime.drafts import ModelDrafter, PromptLookupDrafter, catch_up
from edgespec.runtime.laws import dense
from edgespec.runtime.sampling import SamplingParams, sample, to_probs

GREEDY = SamplingParams()
RAW = SamplingParams(temperature=1.0)  # the model's own distribution, for KL, entropy and calibration
TF_ROWS = 16  # rows of logits per teacher-forced pass: within every backend's output cap
BOOTSTRAP = 400  # prompt resamples behind each interval
WALKS = 24  # Monte Carlo walks per answer when acceptance is random (temperature > 0)
INTERVAL = (5, 95)  # percentiles: a 90 % interval
CONFIDENCE_BINS = np.linspace(0.0, 1.0, 11)
STATS = ("accept", "accept_t0", "top1", "tv", "kl_target_draft", "kl_draft_target", "entropy_target",
         "entropy_draft", "confidence")


# --- prompts ----------------------------------------------------------------------------------------------

def builtin_prompts(name: str) -> list[dict]:
    """The built-in prompt sets: 'train' (480, by category: calibration) and 'bench' (20: held out)."""
    from edgespec.bench import read_prompts

    if name == "bench":
        return read_prompts(None)
    path = resources.files("edgespec").joinpath("data/train_prompts.jsonl")
    with resources.as_file(path) as p:
        return read_prompts(p)


def split_alternate(prompts: list[dict], per_cat: int | None = None,
                    check_per_cat: int | None = None) -> tuple[list[dict], list[dict]]:
    """(calibration, held out): within each category the prompts alternate between the two, so a run of prompts
    written from one template (a file often holds them in blocks) lands on both sides; at most per_cat and
    check_per_cat of each category (None: all)."""
    by_cat: dict[str, list[dict]] = defaultdict(list)
    for row in prompts:
        by_cat[row["cat"]].append(row)
    calibration = [row for rows in by_cat.values() for row in rows[0::2][:per_cat]]
    held_out = [row for rows in by_cat.values() for row in rows[1::2][:check_per_cat]]
    return calibration, held_out


def choose_prompts(prompts_file: str | Path | None, per_cat: int, check_per_cat: int,
                   check_file: str | Path | None = None) -> tuple[list[dict], list[dict]]:
    """(calibration prompts, held-out prompts). Built-in: the training prompts of each category alternate between
    calibration (per_cat of them) and held out (check_per_cat), none used twice. A user's file: all its prompts
    alternate between the two within each category. check_file: held-out prompts of your own (e.g. the bench
    set, to see how far a calibration carries to other prompts)."""
    from edgespec.bench import read_prompts

    if prompts_file is None:
        calibration, held_out = split_alternate(builtin_prompts("train"), per_cat, check_per_cat)
    else:
        calibration, held_out = split_alternate(read_prompts(prompts_file))
    if check_file is not None:
        held_out = read_prompts(check_file)
    return calibration, held_out


# --- calibration ------------------------------------------------------------------------------------------

@dataclass
class Answer:
    """One calibration answer and what one draft would do along it."""

    cat: str
    beta: np.ndarray  # [n, k_max]: acceptance probability at depth j of a round starting at i; NaN: not drafted
    beta_t0: np.ndarray  # [n, k_max]: the same at temperature 0 (== beta when the user's temperature is 0)
    stats: dict[str, np.ndarray]  # name -> [n] depth-1 statistics (NaN where the draft proposes nothing)
    prompt_tokens: int = 0

    @property
    def n(self) -> int:
        return len(self.beta)


class _HiddenRows:
    """Stands in for the target after a verify pass: what a heads drafter's observe_target reads."""

    def __init__(self, rows: np.ndarray):
        self.last_hidden = rows


def target_answer(target, prompt: list[int], params: SamplingParams, rng: np.random.Generator,
                  max_tokens: int) -> tuple[list[int], np.ndarray, np.ndarray | None]:
    """The target alone answers: (tokens, their rows of logits [n, V], the hidden rows [n, E] that produced them
    if the target returns hidden states). The answer ends with an end token, or after max_tokens."""
    eog = target.vocab.eog_ids
    sync(target, prompt[:-1], 0)
    last, tokens, rows, hidden = prompt[-1], [], [], []
    for _ in range(max_tokens):
        logits = target.forward([last], 1)[0]
        rows.append(np.asarray(logits, dtype=np.float32))
        if getattr(target, "last_hidden", None) is not None:
            hidden.append(target.last_hidden[0].copy())
        last = sample(to_probs(logits, params), rng)
        tokens.append(last)
        if last in eog:
            break
    target.rollback(0)
    return tokens, np.stack(rows), np.stack(hidden) if hidden else None


def teacher_forced(backend, prompt: list[int], answer: list[int]) -> np.ndarray:
    """A model's rows of logits [n, V] along prompt + answer: row i is its guess at answer[i]."""
    sync(backend, prompt[:-1], 0)
    feed = [prompt[-1], *answer[:-1]]
    rows = [backend.forward(feed[s:s + TF_ROWS], len(feed[s:s + TF_ROWS])) for s in range(0, len(feed), TF_ROWS)]
    backend.rollback(0)
    return np.concatenate(rows).astype(np.float32)


def overlap(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """sum_x min(p, q) per row: the probability that the rule accepts a draft drawn from q against p."""
    return np.minimum(p, q).sum(axis=-1)


def _entropy(p: np.ndarray) -> np.ndarray:
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def _kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """KL(p || q) per row, in nats; inf where q misses mass of p."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - np.log(q)), 0.0)
    return terms.sum(axis=-1)


def depth1_stats(p_raw: np.ndarray, q_raw: np.ndarray | None, guess: np.ndarray, beta1: np.ndarray,
                 beta1_t0: np.ndarray) -> dict[str, np.ndarray]:
    """Per-position statistics of the first draft token: p_raw [n, V] the target's own distribution; q_raw
    [n, V] the draft's (None for a deterministic draft); guess [n] its greedy token (-1: no draft)."""
    n = len(p_raw)
    drafted = guess >= 0
    nan = np.full(n, np.nan)
    out = {"accept": beta1, "accept_t0": beta1_t0,
           "top1": np.where(drafted, (p_raw.argmax(axis=1) == guess).astype(float), np.nan),
           "entropy_target": _entropy(p_raw)}
    if q_raw is None:  # a one-hot draft: it has no spread, and KL(target || draft) is infinite
        picked = p_raw[np.arange(n), np.maximum(guess, 0)]
        out.update(tv=np.where(drafted, 1 - picked, np.nan), kl_target_draft=nan,
                   kl_draft_target=np.where(drafted, -np.log(np.maximum(picked, 1e-300)), np.nan),
                   entropy_draft=np.where(drafted, 0.0, np.nan), confidence=np.where(drafted, 1.0, np.nan))
    else:
        out.update(tv=np.where(drafted, 1 - overlap(p_raw, q_raw), np.nan),
                   kl_target_draft=np.where(drafted, _kl(p_raw, q_raw), np.nan),
                   kl_draft_target=np.where(drafted, _kl(q_raw, p_raw), np.nan),
                   entropy_draft=np.where(drafted, _entropy(q_raw), np.nan),
                   confidence=np.where(drafted, q_raw.max(axis=1), np.nan))
    return out


def draft_tables(drafter, target, prompt: list[int], answer: list[int], logits: np.ndarray,
                 hidden: np.ndarray | None, params: SamplingParams, k_max: int, rng: np.random.Generator):
    """(beta [n, k_max], beta at temperature 0 [n, k_max], depth-1 statistics) of one drafter along one answer."""
    n = len(answer)
    p = to_probs(logits, params)  # [n, V]
    p_t0 = p if params.greedy else to_probs(logits, GREEDY)
    p_raw = to_probs(logits, RAW)
    beta, beta_t0 = np.full((n, k_max), np.nan), np.full((n, k_max), np.nan)

    if isinstance(drafter, ModelDrafter):
        q_logits = teacher_forced(drafter.backend, prompt, answer)  # [n, V]
        q, q_raw = to_probs(q_logits, params), to_probs(q_logits, RAW)
        q_t0 = q if params.greedy else to_probs(q_logits, GREEDY)
        per_row, per_row_t0 = overlap(p, q), overlap(p_t0, q_t0)  # [n]
        guess = q_logits.argmax(axis=1)
        ends = np.isin(guess, list(target.vocab.eog_ids))  # a draft model stops drafting after an end token
        stopped = np.zeros(n, dtype=bool)  # [i]: the greedy draft ended before this depth of a round at i
        for j in range(k_max):  # depth j+1 of a round at i reads row i+j
            if j:
                stopped[:n - j] |= ends[j - 1:n - 1]
            beta[:n - j, j], beta_t0[:n - j, j] = per_row[j:], per_row_t0[j:]
            beta_t0[:n - j, j][stopped[:n - j]] = np.nan
            if params.greedy:  # at a temperature the draft ends where it samples an end token: rare, not modelled
                beta[:n - j, j][stopped[:n - j]] = np.nan
    else:
        q_raw = None if isinstance(drafter, PromptLookupDrafter) else np.zeros_like(p_raw)
        guess = np.full(n, -1)
        if hasattr(drafter, "reset"):
            drafter.reset()
        for i in range(n):
            context = [*prompt, *answer[:i]]
            if i > 0 and hasattr(drafter, "observe_target"):  # the row that produced answer[i-1], at its place
                drafter.observe_target(_HiddenRows(hidden[i - 1:i]), 0, len(prompt) + i - 2)
            catch_up(drafter, context)
            for table, rows, settings in ((beta, p, params), (beta_t0, p_t0, GREEDY)):
                if table is beta_t0 and params.greedy:
                    break
                drafts, q = drafter.propose(context, k_max, settings, rng)
                depth = min(len(drafts), n - i)
                if depth:
                    q = dense(q, drafts, rows.shape[1])  # [len(drafts), V]
                    table[i, :depth] = overlap(rows[i:i + depth], q[:depth])
            if params.greedy:
                beta_t0[i] = beta[i]
            first, _ = drafter.propose(context, 1, GREEDY, rng)
            if first:
                guess[i] = first[0]
                if q_raw is not None:
                    raw_tokens, raw_q = drafter.propose(context, 1, RAW, rng)
                    q_raw[i] = dense(raw_q, raw_tokens, q_raw.shape[1])[0]
        if q_raw is not None:
            q_raw[guess < 0] = p_raw[guess < 0]  # no draft there: masked below, any row will do
    return beta, beta_t0, depth1_stats(p_raw, q_raw, guess, beta[:, 0], beta_t0[:, 0])


def calibrate(engine, drafters: dict[str, object], prompts: list[dict], *, params: SamplingParams, k_max: int,
              max_tokens: int, seed: int = 0, progress: bool = False) -> dict[str, list[Answer]]:
    """Answers of the target to `prompts`, scored for every drafter: {draft name: [Answer]}."""
    target = engine.target
    limit = min([target.n_ctx] + [d.backend.n_ctx for d in drafters.values() if isinstance(d, ModelDrafter)])
    out: dict[str, list[Answer]] = {name: [] for name in drafters}
    bar = click.progressbar(length=len(prompts), label="calibrating", file=sys.stderr) if progress else None
    for i, row in enumerate(prompts):
        prompt = engine.prompt_tokens(row["prompt"])
        room = min(max_tokens, limit - len(prompt) - k_max - 1)
        if room >= 1:  # a prompt that leaves no room in the smallest context is skipped
            rng = np.random.default_rng([seed, i])
            answer, logits, hidden = target_answer(target, prompt, params, rng, room)
            for name, drafter in drafters.items():
                beta, beta_t0, stats = draft_tables(drafter, target, prompt, answer, logits, hidden, params, k_max, rng)
                out[name].append(Answer(row["cat"], beta, beta_t0, stats, len(prompt)))
        if bar:
            bar.update(1)
    if bar:
        bar.render_finish()
    if not any(out.values()):
        raise EdgespecError("no calibration prompt fits the context: use shorter prompts or a larger --ctx")
    return out


# --- costs ------------------------------------------------------------------------------------------------

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
        catch_up(drafter, context)
        drafter.propose(context, k, params, rng)

    one_round()  # warm-up: a draft model reads the whole context once
    return _median_time(one_round, reps)


def _target_only(engine):
    """An engine decoding with engine's target alone."""
    from edgespec.api import Engine

    return Engine(engine.target, None, None)


def _speculative(engine, drafter, k_max: int):
    """An engine drafting with this drafter for engine's target (its loaded models shared)."""
    from edgespec.api import Engine

    backend = drafter.backend if isinstance(drafter, ModelDrafter) else None
    controller = DraftController(dict(engine.controller.target_costs), engine.controller.draft_cost, k_max)
    return Engine(engine.target, drafter, controller, backend)


def in_loop(engine, drafter, costs: Costs, prompts: list[str], params: SamplingParams, k_max: int,
            tokens: int) -> Costs:
    """The costs as the loop pays them. Each prompt is answered by the target alone and speculatively (draft
    lengths 1..k_max in turn). Target-only decoding costs what those answers took per token. In the speculative
    answers, the time spent drafting and in target passes (rows included) against what the components timed
    alone predict for the same rounds scales them (here prompt lookup x2.5-3, target passes x0.94-1.19,
    varying between runs), and the rest of each round is the loop's own overhead."""
    alone, spec = _target_only(engine), _speculative(engine, drafter, k_max)
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
    if hasattr(drafter, "reset"):
        drafter.reset()
    if hidden_row is not None and hasattr(drafter, "observe_target"):
        drafter.observe_target(_HiddenRows(hidden_row[None]), 0, len(context) - 2)
    one, most = (measure_draft_round(drafter, context, k, params) for k in (1, k_max))
    per_token = max((most - one) / (k_max - 1), 0.0) if k_max > 1 else one
    all_accepted = 0.0
    if isinstance(drafter, ModelDrafter):
        all_accepted = max(measure_draft_round(drafter, context, 1, params, lag=2) - one, 0.0)
    if hasattr(drafter, "reset"):
        drafter.reset()
    if isinstance(drafter, ModelDrafter):
        drafter.backend.rollback(0)
    return Costs(dict(target_costs), max(one - per_token, 0.0), per_token, row_cost, "measured on this device",
                 all_accepted)


def roofline_costs(measured: Costs, target_path, draft_path, profile_name: str, profiles=None) -> Costs:
    """Costs for a named device profile from its memory bandwidth: every pass reads all of a model's weights
    once and nothing else counts (the memory-bound limit of small batches), so a pass over n <= k_max + 1
    tokens costs what one token does. The row cost and a prompt-lookup round stay as measured here."""
    from edgespec.api import heads_kind, plan_for

    plan = plan_for(target_path, draft_path, device=profile_name, profiles=profiles, measure_bandwidth=False)
    bandwidth = plan.profile.bandwidth
    step = plan.target.weights / bandwidth
    if plan.draft is not None:
        fixed, per_token = 0.0, plan.draft.weights / bandwidth
    elif heads_kind(draft_path):
        fixed, per_token = 0.0, Path(draft_path).stat().st_size / bandwidth
    else:
        fixed, per_token = measured.draft_fixed, measured.draft_per_token
    return Costs({n: step for n in measured.target}, fixed, per_token, measured.row,
                 f"roofline of profile {profile_name} ({bandwidth / 1e9:.0f} GB/s; memory-bound passes)",
                 0.0, measured.overhead)


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
    engines = {None: _target_only(engine), **{name: _speculative(engine, d, k_max) for name, d in drafters.items()}}
    modes = [(None, 0)] + [(name, k) for name in drafters for k in range(1, k_max + 1)]
    totals = defaultdict(lambda: {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0, "prompts": 0,
                                  "per_prompt": []})
    bar = click.progressbar(length=len(prompts) * len(modes), label="checking", file=sys.stderr) if progress else None
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
            if bar:
                bar.update(1)
    if bar:
        bar.render_finish()
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
        if progress:  # a minute or so without a bar: the parts timed, then a few real answers
            click.echo(f"timing {name} on this device ...", err=True)
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
