"""The speculative-sampling rule (Leviathan et al. 2023; Chen et al. 2023), as one pure function.

Given k draft tokens with the draft's probabilities and the target's probabilities at the k+1
positions, accept draft token i with probability min(1, target/draft); at the first rejection draw
from the normalised residual max(0, target - draft); when all k are accepted draw a bonus token from
the target's last row. The emitted tokens are then distributed exactly as the target's. Greedy
decoding is the same rule on one-hot distributions. No backend knowledge, randomness from `rng` only.
"""

from __future__ import annotations

import numpy as np

from edgespec.decode.sampling import sample


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
    candidates: np.ndarray,  # [m], distinct, drawn one after another from draft_row without replacement
    rng: np.random.Generator,
) -> tuple[int | None, int]:
    """Several candidates for one position (the children of a draft-tree node): return (index of the
    accepted candidate, its token), or (None, a token from the last residual) when all are rejected.

    Recursive rejection sampling without replacement (SpecInfer's rule as Sequoia states it for distinct
    candidates): candidate j meets the chain rule against the current target law and the draft law it was
    drawn from, draft_row with the earlier candidates removed and renormalised; each rejection replaces the
    target law by its residual against that draft law. Given the earlier rejections, candidate j is a draw
    from that draft law, so each step emits the current target law exactly and the token is distributed
    exactly as target_row. The chain rule `verify` is the case of one candidate.

    A candidate the draft law gives no mass (greedy drafting names the top m tokens of a one-hot law) is
    accepted where the target law gives it any: exact when the target law is one-hot (greedy decoding),
    which is the only place a drafter may propose such candidates.
    """
    law, draft = target_row, draft_row
    for j, token in enumerate(candidates):
        if draft[token] > 0:
            accept = rng.random() < acceptance_prob(law, draft, token)
        else:
            accept = law[token] > 0
        if accept:
            return j, int(token)
        law = residual(law, draft)
        draft = draft.copy()
        draft[token] = 0.0
        total = draft.sum()
        draft = draft / total if total > 0 else draft
    return None, sample(law, rng)


def verify_tree(
    target_probs: np.ndarray,  # [n+1, V]: row 0 at the root (the last committed token), row i+1 at node i
    draft_probs: np.ndarray,  # [n+1, V]: the law each node's children were drawn from (rows of leaves unused)
    tokens: np.ndarray,  # [n]
    parents: np.ndarray,  # [n]: -1 for a child of the root, else the index of an earlier node
    rng: np.random.Generator,
) -> tuple[list[int], int]:
    """A draft tree under the target: return (the accepted nodes, root to leaf, and the next token).

    From the root, the children of the current node (in the order they were drawn) meet
    `verify_candidates`; the accepted child becomes the current node, until no child is accepted (the token
    comes from the last residual) or a leaf is reached (the token is drawn from the target's row there).
    Every step emits the target's law given the text so far, so the tokens are distributed exactly as the
    target's, whatever the tree's shape, as long as the shape does not depend on the target's rows.
    """
    children: list[list[int]] = [[] for _ in range(len(tokens) + 1)]  # by row: 0 = the root
    for i, parent in enumerate(parents):
        assert -1 <= parent < i, "nodes must follow their parents"
        children[parent + 1].append(i)
    path: list[int] = []
    row = 0
    while children[row]:
        kids = children[row]
        j, token = verify_candidates(target_probs[row], draft_probs[row], np.asarray(tokens)[kids], rng)
        if j is None:
            return path, token
        path.append(kids[j])
        row = kids[j] + 1
    return path, sample(target_probs[row], rng)
