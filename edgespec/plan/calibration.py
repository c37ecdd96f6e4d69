"""What `edgespec advise` reads before it predicts: the prompts it calibrates and checks on, and the calibration
itself, the target's answers with, for every position and draft depth, the probability beta[i, j] that the
rule accepts that depth (edgespec/plan/advise.py explains how the prediction uses them).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from edgespec.backends.protocol import forward_rows, sync
from edgespec.decode.loop import Stats, speculate, verified_length
from edgespec.decode.rule import dense
from edgespec.decode.sampling import SamplingParams, to_probs
from edgespec.drafts.base import ModelDrafter, PromptLookupDrafter
from edgespec.errors import EdgespecError
from edgespec.progress import Steps

GREEDY = SamplingParams()
RAW = SamplingParams(temperature=1.0)  # the model's own distribution, for KL, entropy and calibration
STATS = ("accept", "accept_t0", "top1", "tv", "kl_target_draft", "kl_draft_target", "entropy_target",
         "entropy_draft", "confidence")

# --- prompts ----------------------------------------------------------------------------------------------

def read_prompts(path: str | Path | None) -> list[dict]:
    """[{'cat': ..., 'prompt': ...}] from a JSONL file, or the built-in set."""
    text = (Path(path).read_text() if path
            else resources.files("edgespec").joinpath("data/prompts.jsonl").read_text())
    prompts = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompts.append({"cat": str(row.get("cat", "all")), "prompt": str(row["prompt"])})
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise EdgespecError(f"{path}:{i}: expected a JSON object with a 'prompt' field") from None
    if not prompts:
        raise EdgespecError(f"{path}: no prompts")
    return prompts


def builtin_prompts(name: str) -> list[dict]:
    """The built-in prompt sets: 'train' (480, by category: calibration) and 'bench' (20: held out)."""
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
    """The target alone answers, through the loop as every decode does: (tokens, the end token last where one ended
    the answer; their rows of logits [n, V]; the hidden rows [n, E] that produced them if the target returns hidden
    states), the rows read back in teacher-forced passes over the answer. The answer ends with an end token, or
    after max_tokens."""
    stats = Stats()
    tokens = [event.token for event in speculate(target, None, None, prompt, params, rng, max_tokens=max_tokens,
                                                 stats=stats) if event.token is not None]
    if stats.end_token is not None:
        tokens.append(stats.end_token)
    sync(target, prompt[:-1], 0)
    rows, hidden = [], []
    for chunk in forward_rows(target, [prompt[-1], *tokens[:-1]]):  # row i: the target's guess at tokens[i]
        rows.append(np.array(chunk, dtype=np.float32))
        if target.last_hidden is not None:
            hidden.append(target.last_hidden.copy())
    target.rollback(0)
    return tokens, np.concatenate(rows), np.concatenate(hidden) if hidden else None


def teacher_forced(backend, prompt: list[int], answer: list[int]) -> np.ndarray:
    """A model's rows of logits [n, V] along prompt + answer: row i is its guess at answer[i]."""
    sync(backend, prompt[:-1], 0)
    feed = [prompt[-1], *answer[:-1]]
    rows = list(forward_rows(backend, feed))
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
        drafter.reset()
        for i in range(n):
            context = [*prompt, *answer[:i]]
            if i > 0 and hidden is not None:  # the row that produced answer[i-1], at its place (heads read it)
                drafter.observe_target(_HiddenRows(hidden[i - 1:i]), 0, len(prompt) + i - 2)
            drafter.catch_up(context)
            for table, rows, settings in ((beta, p, params), (beta_t0, p_t0, GREEDY)):
                if table is beta_t0 and params.greedy:
                    break
                drafts, q = drafter.propose(context, k_max, settings, rng)
                depth = min(verified_length(drafts, target.vocab.eog_ids), n - i)  # as the loop verifies them
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
    bar = Steps(len(prompts), "calibrating", progress)
    for i, row in enumerate(prompts):
        prompt = engine.prompt_tokens(row["prompt"])
        room = min(max_tokens, limit - len(prompt) - k_max - 1)
        if room >= 1:  # a prompt that leaves no room in the smallest context is skipped
            rng = np.random.default_rng([seed, i])
            answer, logits, hidden = target_answer(target, prompt, params, rng, room)
            for name, drafter in drafters.items():
                beta, beta_t0, stats = draft_tables(drafter, target, prompt, answer, logits, hidden, params, k_max, rng)
                out[name].append(Answer(row["cat"], beta, beta_t0, stats, len(prompt)))
        bar.step()
    bar.finish()
    if not any(out.values()):
        raise EdgespecError("no calibration prompt fits the context: use shorter prompts or a larger --ctx")
    return out
