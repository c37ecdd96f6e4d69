"""The rule's bookkeeping on small laws (that it is exact, analytically and by Monte Carlo:
laws/test_verify_laws.py)."""

import numpy as np

from edgespec.decode.verify import acceptance_prob, residual, verify


def test_all_accepted_draws_bonus_from_last_row():
    rng = np.random.default_rng(0)
    target = np.array([[0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0]])
    draft = np.array([[0, 1.0, 0], [0, 0, 1.0]])
    assert verify(target, draft, np.array([1, 2]), rng) == (2, 0)


def test_greedy_is_the_same_rule_on_one_hot_rows():
    rng = np.random.default_rng(0)
    target = np.eye(4)[[2, 3, 1]]  # greedy choices 2, 3, 1
    draft = np.eye(4)[[2, 0]]  # draft agrees once, then proposes 0
    assert verify(target, draft, np.array([2, 0]), rng) == (1, 3)


def test_zero_drafts_samples_from_target():
    rng = np.random.default_rng(0)
    target = np.array([[0.0, 0.0, 1.0]])
    assert verify(target, target[:0], np.array([], dtype=int), rng) == (0, 2)


def candidates_law(target, draft, m, rule_residual=residual):
    """Exact law of the token verify_candidates emits with m distinct candidates drawn one after another
    from draft without replacement."""
    if m == 0 or draft.sum() <= 0:
        return target
    law = np.zeros_like(target)
    for x in np.nonzero(draft > 0)[0]:
        accept = acceptance_prob(target, draft, x)
        law[x] += draft[x] * accept
        rest = draft.copy()
        rest[x] = 0.0
        if accept < 1 and rest.sum() > 0:
            law += draft[x] * (1 - accept) * candidates_law(rule_residual(target, draft), rest / rest.sum(), m - 1,
                                                           rule_residual)
        elif accept < 1:
            law += draft[x] * (1 - accept) * rule_residual(target, draft)
    return law


def _forgetful(target, judged, left, m):
    """Law after a rejection for a rule that keeps judging by the first draft law `judged` while the
    candidates come from `left` (unnormalised: what remains after removing the earlier draws)."""
    if m == 0 or left.sum() <= 0:
        return target
    drawn = left / left.sum()
    law = np.zeros_like(target)
    for x in np.nonzero(drawn > 0)[0]:
        accept = acceptance_prob(target, judged, x)
        law[x] += drawn[x] * accept
        rest = left.copy()
        rest[x] = 0.0
        law += drawn[x] * (1 - accept) * _forgetful(residual(target, judged), judged, rest, m - 1)
    return law


def test_several_candidates_without_the_residual_update_are_wrong():
    target, draft = np.array([0.6, 0.3, 0.1]), np.array([0.1, 0.2, 0.7])
    keep_target = lambda t, d: t  # noqa: E731  a rule that forgets to update the law after a rejection
    assert np.abs(candidates_law(target, draft, 2, keep_target) - target).max() > 0.05


def test_distinct_candidates_judged_by_the_first_draft_law_are_wrong():
    """The draft law must lose each rejected candidate: judged by the full draft law, distinct draws
    (which a tree needs, or its branches repeat) emit another law."""
    target, draft = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    assert np.abs(_forgetful(target, draft, draft, 2) - target).max() > 0.02


def test_greedy_candidates_are_the_top_tokens_of_a_one_hot_law():
    """Greedy drafting names the top m tokens, all but one outside the one-hot draft law: the target's
    argmax is accepted wherever it stands among them, and nothing else is."""
    from edgespec.decode.verify import verify_candidates

    rng = np.random.default_rng(0)
    target, draft = np.eye(5)[3], np.eye(5)[1]
    assert verify_candidates(target, draft, np.array([1, 3, 4]), rng) == (1, 3)
    assert verify_candidates(target, draft, np.array([1, 4]), rng) == (None, 3)
    assert verify_candidates(target, draft, np.array([3, 1]), rng) == (0, 3)


# a target's rows and a draft's for three positions of four ids: the rule's Monte Carlo tests (laws/) and
# test_laws read them
TARGET = np.array([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
DRAFT = np.array([[0.1, 0.6, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
