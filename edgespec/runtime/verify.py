"""The speculative-sampling rule (Leviathan et al. 2023; Chen et al. 2023), as one pure function.

Given k draft tokens with the draft's probabilities and the target's probabilities at the k+1
positions, accept draft token i with probability min(1, target/draft); at the first rejection draw
from the normalised residual max(0, target - draft); when all k are accepted draw a bonus token from
the target's last row. The emitted tokens are then distributed exactly as the target's. Greedy
decoding is the same rule on one-hot distributions. No backend knowledge, randomness from `rng` only.
"""

from __future__ import annotations

import numpy as np

from edgespec.runtime.sampling import sample


def acceptance_prob(target_row: np.ndarray, draft_row: np.ndarray, token: int) -> float:
    """min(1, target/draft) for a token the draft proposed (rows [V])."""
    p_draft = draft_row[token]
    return min(1.0, target_row[token] / p_draft) if p_draft > 0 else 0.0


def residual(target_row: np.ndarray, draft_row: np.ndarray) -> np.ndarray:
    """The law to sample from after a rejection: normalised max(0, target - draft) [V]."""
    diff = np.maximum(target_row - draft_row, 0.0)
    total = diff.sum()
    # total == 0 only when target == draft, where a rejection has probability zero; if float noise
    # gets here anyway, the target row is the right law.
    return diff / total if total > 0 else target_row


def verify(
    target_probs: np.ndarray,  # [k+1, V]
    draft_probs: np.ndarray,  # [k, V]
    draft_tokens: np.ndarray,  # [k]
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Return (n_accepted, next_token): the first n_accepted draft tokens stand, then next_token."""
    k = len(draft_tokens)
    assert target_probs.shape[0] == k + 1 and draft_probs.shape[0] == k
    for i, token in enumerate(draft_tokens):
        if rng.random() >= acceptance_prob(target_probs[i], draft_probs[i], token):
            return i, sample(residual(target_probs[i], draft_probs[i]), rng)
    return k, sample(target_probs[k], rng)


def verify_candidates(
    target_row: np.ndarray,  # [V]
    draft_row: np.ndarray,  # [V]
    candidates: np.ndarray,  # [m], drawn independently from draft_row
    rng: np.random.Generator,
) -> tuple[int | None, int]:
    """Several candidates for one position (the children of a draft-tree node): return (index of the
    accepted candidate, its token), or (None, a token from the last residual) when all are rejected.

    Recursive rejection sampling (SpecInfer's multi-step speculative sampling): each candidate meets the
    rule above against the current target law, and each rejection replaces that law by its residual.
    With candidates drawn independently from draft_row, the token is distributed exactly as target_row;
    the chain rule `verify` is the case of one candidate per position.
    """
    law = target_row
    for j, token in enumerate(candidates):
        if rng.random() < acceptance_prob(law, draft_row, token):
            return j, int(token)
        law = residual(law, draft_row)
    return None, sample(law, rng)
