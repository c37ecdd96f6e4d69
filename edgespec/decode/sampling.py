"""Logits to probabilities: one `to_probs` for target and draft alike.

Both models must see the same temperature, top-k, top-p and min-p, otherwise the draft proposes from
a distribution the verification rule does not know about (still exact, but acceptance drops).
Temperature 0 is greedy, expressed as a one-hot distribution so that verification has one path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.errors import EdgespecError

# the smallest temperature above 0: below it 1 / T leaves float32 (under 3e-39) and the logits over T leave float64
# for logits near float32's largest; far above any that differs from greedy decoding in practice
MIN_TEMPERATURE = 1e-6


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off

    def __post_init__(self) -> None:
        # nan fails every comparison here, so the range checks refuse it; inf must be refused by name (it would make
        # every weight nan)
        if not (self.temperature >= 0 and np.isfinite(self.temperature)):
            raise EdgespecError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise EdgespecError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got "
                                f"{self.temperature}")
        if self.top_k < 0:
            raise EdgespecError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise EdgespecError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise EdgespecError(f"min-p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def to_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Turn logits [..., V] into probabilities [..., V] (float64, rows sum to 1).

    Filters apply in llama.cpp's order: top-k, then temperature, then top-p, then min-p.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim == 1:
        return _row_probs(logits, params)
    return np.stack([_row_probs(row, params) for row in logits.reshape(-1, logits.shape[-1])]).reshape(
        logits.shape
    )


def _row_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:  # [V] -> [V]
    n_vocab = logits.shape[0]
    if params.greedy:
        probs = np.zeros(n_vocab)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    keep = np.ones(n_vocab, dtype=bool)
    if 0 < params.top_k < n_vocab:
        kth = np.partition(logits, n_vocab - params.top_k)[n_vocab - params.top_k]
        keep &= logits >= kth
    scaled = np.where(keep, logits / params.temperature, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        mask = np.zeros(n_vocab, dtype=bool)
        mask[_nucleus(probs, params.top_p, np.flatnonzero(keep) if 0 < params.top_k < n_vocab else None)] = True
        probs = np.where(mask, probs, 0.0)
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
    return probs / probs.sum()


NUCLEUS_HEAD = 64  # the likeliest ids looked at first for top-p: a trained model's nucleus is usually fewer


def _nucleus(probs: np.ndarray, top_p: float, kept: np.ndarray | None = None) -> np.ndarray:
    """The ids top-p keeps: the smallest prefix of the ids by falling probability (ties by id) whose mass reaches
    top_p, the id crossing it included. kept: the ascending ids top-k left (None: all).

    Sorts only the likeliest ids first, top-k's or the NUCLEUS_HEAD likeliest with any tied with the last of them:
    where their mass reaches top_p, their prefix is the row's, since every other id is less likely than each of
    them. The whole row only where it does not (docs/results/2026-11-30-top-p-rows.md: a row's law at top-p 0.9 in
    1.1 ms instead of 8 ms, 0.6 ms more where the head falls short)."""
    ids = kept
    if ids is None and len(probs) > 2 * NUCLEUS_HEAD:
        bound = np.partition(probs, len(probs) - NUCLEUS_HEAD)[len(probs) - NUCLEUS_HEAD]
        ids = np.flatnonzero(probs >= bound)  # every id at the bound or above it, ascending
    if ids is not None:
        order, n_keep = _prefix(probs[ids], top_p)
        if n_keep <= len(ids):
            return ids[order[:n_keep]]
    order, n_keep = _prefix(probs, top_p)
    return order[:n_keep]


def _prefix(probs: np.ndarray, top_p: float) -> tuple[np.ndarray, int]:
    """(the ids by falling probability, ties by id; how many of them reach top_p, the crossing one included)."""
    order = np.argsort(-probs, kind="stable")
    return order, int(np.searchsorted(np.cumsum(probs[order]), top_p, side="left")) + 1


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from probabilities [V]."""
    # inverse-CDF on one uniform: cheaper than rng.choice's validation for a 49k vocabulary
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(probs) - 1))


def candidates(logits: np.ndarray, probs: np.ndarray, m: int, params: SamplingParams,
               rng: np.random.Generator) -> np.ndarray:
    """Up to m distinct token ids for one position of a draft tree, in the order the tree rule must test them.

    Sampling: drawn one after another from probs without replacement (fewer where probs has fewer tokens), the
    law decode/verify.verify_candidates assumes. Greedy: the m largest logits, the argmax first (the rule is
    exact for any candidates against a one-hot target row)."""
    if params.greedy:
        top = np.argpartition(-logits, min(m, len(logits) - 1))[:m] if m < len(logits) else np.arange(len(logits))
        return top[np.argsort(-logits[top], kind="stable")]
    law, out = np.array(probs, dtype=np.float64), []
    while len(out) < m and law.sum() > 0:
        token = sample(law, rng)  # sample scales by the remaining mass
        out.append(token)
        law[token] = 0.0
    return np.array(out, dtype=np.int64)
