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
        p_target = target_probs[i, token]
        p_draft = draft_probs[i, token]
        # p_draft > 0 always holds for a token the draft sampled; guard anyway against a bad draft
        if p_draft > 0 and rng.random() * p_draft < p_target:
            continue
        residual = np.maximum(target_probs[i] - draft_probs[i], 0.0)
        total = residual.sum()
        # total == 0 only when target == draft on this row, where rejection has probability zero;
        # floating-point noise can still get here, and then the target row is the right law.
        return i, sample(residual / total if total > 0 else target_probs[i], rng)
    return k, sample(target_probs[k], rng)
