"""The rejection rule on laws (decode/laws.py): what the loop runs, decode/verify.py's steps on rows that are
processed only when the rule first reads them. Acceptance is min(1, p(x) / q(x)) from gathered probabilities; the
residual max(0, p - q) is built only after a rejection, over p's support; a greedy target accepts by comparing an
index and draws nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.decode.laws import Law, OneHot, Weights, law
from edgespec.decode.rows import block_sums
from edgespec.decode.sampling import SamplingParams


class Rows:
    """The laws of a pass's rows [n, V], each processed when the rule first reads it (a round that rejects its
    first draft never processes the others)."""

    def __init__(self, logits: np.ndarray, params: SamplingParams):
        self.logits, self.params = logits, params
        self._laws: list[Law | None] = [None] * len(logits)

    def __getitem__(self, i: int) -> Law:
        if self._laws[i] is None:
            self._laws[i] = law(self.logits[i], self.params)
        return self._laws[i]


def as_laws(draft_probs: np.ndarray | Sequence[Law] | None, n: int) -> Sequence[Law | None]:
    """A drafter's probabilities as laws: dense rows [k, V] (heads) wrapped as they are, laws kept, None (a
    deterministic proposal: probability 1 for each token) as n Nones."""
    if draft_probs is None:
        return [None] * n
    if isinstance(draft_probs, np.ndarray):
        return [Weights(None, row, 1.0) for row in draft_probs]
    return draft_probs


def dense(draft_probs: np.ndarray | Sequence[Law] | None, tokens: Sequence[int], n_vocab: int) -> np.ndarray:
    """A drafter's probabilities as dense rows [len(tokens), V], float64 (for reference computations)."""
    out = np.zeros((len(tokens), n_vocab))
    for i, (row, token) in enumerate(zip(as_laws(draft_probs, len(tokens)), tokens, strict=True)):
        if row is None or isinstance(row, OneHot):
            out[i, token if row is None else row.token] = 1.0
        else:
            out[i] = row.probs_at(None, n_vocab)
    return out


def acceptance(target: Law, draft: Law | None, token: int) -> float:
    """min(1, p(x) / q(x)) for a drafted token x (q = 1 where draft is None)."""
    q = 1.0 if draft is None else draft.prob(token)
    return min(1.0, target.prob(token) / q) if q > 0 else 0.0


def residual(target: Law, draft: Law | None, token: int, n_vocab: int) -> Law:
    """The law to draw from after the rule rejected `token`: max(0, p - q) normalised, over p's support."""
    if isinstance(target, OneHot):  # max(0, e_a - q) has mass only at a: a rejection emits the argmax
        return target
    if draft is None or isinstance(draft, OneHot):  # max(0, p - e_x): p without the rejected token
        w = target.w.copy()
        if target.ids is None:
            w[token] = 0
        else:
            w[target.ids == token] = 0
        total = float(w.sum())
        return Weights(target.ids, w, total) if total > 0 else target
    if target.ids is None and draft.ids is None and target.w.dtype == draft.w.dtype == np.float32:
        # two laws over the whole vocabulary, as a draft model's and its target's are at t > 0: in their own
        # float32, four passes over [V] (float64 rows and their copies cost 1.5 ms a rejection at 152k ids)
        diff = np.multiply(target.w, np.float32(1.0 / target.total))  # [V]
        diff -= draft.w * np.float32(1.0 / draft.total)
        np.maximum(diff, 0, out=diff)
        sums = block_sums(diff)
        total = float(sums.sum())
        return Weights(None, diff, total, sums) if total > 0 else target
    p = target.probs_at(None, n_vocab) if target.ids is None else target.w / target.total  # [V] or [n]
    diff = np.maximum(p - draft.probs_at(target.ids, n_vocab), 0.0)
    total = float(diff.sum())
    # total == 0 only when p == q, where a rejection has probability zero; float noise gets p itself
    return Weights(target.ids, diff, total) if total > 0 else target


def verify(target: Sequence[Law], draft: Sequence[Law | None], tokens: Sequence[int], n_vocab: int,
           rng: np.random.Generator) -> tuple[int, int]:
    """verify.verify on laws: (n_accepted, next_token). target: k+1 laws (Rows, read lazily); draft: k laws
    (None: the token was proposed with probability 1). Draws one uniform per judged draft and one for the
    token, as the reference does, and none where the target is greedy."""
    for i, token in enumerate(tokens):
        p, q = target[i], draft[i]
        if isinstance(p, OneHot):  # p(x) is 1 or 0: accepted exactly when the draft could propose the argmax
            if token == p.token and (q is None or q.prob(token) > 0):
                continue
            return i, p.token
        if rng.random() >= acceptance(p, q, token):
            return i, residual(p, q, token, n_vocab).sample(rng)
    return len(tokens), target[len(tokens)].sample(rng)


def restrict(laws: Sequence[Law | None], allowed: np.ndarray) -> list[Law | None]:
    """Draft laws masked to `allowed` [k, V] and renormalised (a law with no allowed mass gives every token
    probability 0). A one-hot or deterministic proposal the grammar allows stays as it is."""
    out: list[Law | None] = []
    for law_, mask in zip(laws, allowed, strict=False):
        if law_ is None or isinstance(law_, OneHot):
            out.append(law_)
            continue
        w = np.where(mask if law_.ids is None else mask[law_.ids], law_.w, 0)
        total = float(w.sum())
        out.append(Weights(law_.ids, w, total if total > 0 else 1.0))  # no allowed mass: every p(x) is 0
    return out
