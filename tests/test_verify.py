"""The rule is exact: analytically for one position, by Monte Carlo for several."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stats_util import ALPHA, goodness_of_fit

from edgespec.decode.sampling import sample
from edgespec.decode.verify import acceptance_prob, residual, verify


def distributions(n_vocab):
    # strictly positive weights, some tiny, plus exact zeros: the edge cases of min(1, p/q)
    weight = st.one_of(st.just(0.0), st.floats(1e-6, 1.0))
    return st.lists(weight, min_size=n_vocab, max_size=n_vocab).filter(lambda w: sum(w) > 1e-3).map(
        lambda w: np.array(w) / sum(w))


@pytest.mark.laws
@settings(max_examples=300, deadline=None)
@given(st.integers(2, 8).flatmap(lambda v: st.tuples(distributions(v), distributions(v))))
def test_first_token_law_equals_target_analytically(pair):
    target, draft = pair
    accept = np.array([acceptance_prob(target, draft, x) for x in range(len(target))])
    reject_mass = float(np.sum(draft * (1 - accept)))
    law = draft * accept + reject_mass * residual(target, draft)
    np.testing.assert_allclose(law, target, atol=1e-9)


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


def run_rule(rule, target, draft_law, k, n, seed):
    """Emitted sequences (first two tokens) from n rounds of `rule` with a draft sampled from draft_law."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tokens = np.array([sample(draft_law[i], rng) for i in range(k)])
        n_acc, nxt = rule(target, draft_law, tokens, rng)
        emitted = [*tokens[:n_acc], nxt]
        out.append(tuple(int(t) for t in emitted[:2]) if len(emitted) >= 2 else (int(emitted[0]), None))
    return out


def first_token_law(target):
    return {a: target[0, a] for a in range(target.shape[1])}


def without_residual(target_probs, draft_probs, draft_tokens, rng):
    """A wrong rule: on rejection, resample from the target instead of the residual."""
    for i, token in enumerate(draft_tokens):
        if rng.random() >= acceptance_prob(target_probs[i], draft_probs[i], token):
            return i, sample(target_probs[i], rng)
    return len(draft_tokens), sample(target_probs[-1], rng)


def target_instead_of_residual(target, draft, token, n_vocab):
    """The same wrong rule on laws (decode/rule.residual's place): after a rejection, the target's own law."""
    return target


TARGET = np.array([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
DRAFT = np.array([[0.1, 0.6, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])


@pytest.mark.laws
@pytest.mark.parametrize("rule, exact", [(verify, True), (without_residual, False)])
def test_monte_carlo_first_token_matches_target(rule, exact):
    draws = [first for first, _ in run_rule(rule, TARGET, DRAFT, 3, 20000, seed=7)]
    p = goodness_of_fit(draws, first_token_law(TARGET))
    # the exact rule passes at ALPHA; the rule without the residual step is caught
    assert (p > ALPHA) == exact, p


@pytest.mark.laws
def test_monte_carlo_second_token_given_first_accepted():
    """When the round emits two tokens, the second follows the target's next row."""
    pairs = [pair for pair in run_rule(verify, TARGET, DRAFT, 3, 30000, seed=8) if pair[1] is not None]
    seconds = [b for _, b in pairs]
    assert goodness_of_fit(seconds, {b: TARGET[1, b] for b in range(4)}) > ALPHA


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


@pytest.mark.laws
@settings(max_examples=200, deadline=None)
@given(st.integers(2, 6).flatmap(lambda v: st.tuples(distributions(v), distributions(v))), st.integers(1, 4))
def test_several_candidates_emit_the_target_law_analytically(pair, m):
    target, draft = pair
    np.testing.assert_allclose(candidates_law(target, draft, m), target, atol=1e-9)


def test_several_candidates_without_the_residual_update_are_wrong():
    target, draft = np.array([0.6, 0.3, 0.1]), np.array([0.1, 0.2, 0.7])
    keep_target = lambda t, d: t  # noqa: E731  a rule that forgets to update the law after a rejection
    assert np.abs(candidates_law(target, draft, 2, keep_target) - target).max() > 0.05


def test_distinct_candidates_judged_by_the_first_draft_law_are_wrong():
    """The draft law must lose each rejected candidate: judged by the full draft law, distinct draws
    (which a tree needs, or its branches repeat) emit another law."""
    target, draft = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    assert np.abs(_forgetful(target, draft, draft, 2) - target).max() > 0.02


def draw_distinct(law, m, rng):
    """m distinct tokens drawn one after another from law without replacement (fewer if its support is)."""
    law, out = law.copy(), []
    while len(out) < m and law.sum() > 0:
        token = sample(law / law.sum(), rng)
        out.append(token)
        law[token] = 0.0
    return np.array(out, dtype=np.int64)


@pytest.mark.laws
def test_several_candidates_monte_carlo():
    from edgespec.decode.verify import verify_candidates

    rng = np.random.default_rng(11)
    target, draft = np.array([0.5, 0.25, 0.15, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])
    draws, accepted_at = [], []
    for _ in range(20000):
        candidates = draw_distinct(draft, 3, rng)
        j, token = verify_candidates(target, draft, candidates, rng)
        assert j is None or candidates[j] == token
        draws.append(token)
        accepted_at.append(j)
    assert goodness_of_fit(draws, dict(enumerate(target))) > ALPHA
    # a second and third candidate do get accepted after a first rejection: that is what a tree buys
    assert accepted_at.count(1) > 1000 and accepted_at.count(2) > 200


def test_greedy_candidates_are_the_top_tokens_of_a_one_hot_law():
    """Greedy drafting names the top m tokens, all but one outside the one-hot draft law: the target's
    argmax is accepted wherever it stands among them, and nothing else is."""
    from edgespec.decode.verify import verify_candidates

    rng = np.random.default_rng(0)
    target, draft = np.eye(5)[3], np.eye(5)[1]
    assert verify_candidates(target, draft, np.array([1, 3, 4]), rng) == (1, 3)
    assert verify_candidates(target, draft, np.array([1, 4]), rng) == (None, 3)
    assert verify_candidates(target, draft, np.array([3, 1]), rng) == (0, 3)


# A two-level text: the target's law of the first token P0 and of the second given the first P1[first];
# the draft's Q0 and Q1. The tree: two distinct children of the root; the first drawn has two children.
P0 = np.array([0.4, 0.3, 0.2, 0.1])
P1 = np.array([[0.1, 0.6, 0.2, 0.1], [0.5, 0.1, 0.1, 0.3], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
Q0 = np.array([0.1, 0.2, 0.3, 0.4])
Q1 = np.array([[0.4, 0.1, 0.1, 0.4], [0.1, 0.1, 0.7, 0.1], [0.3, 0.3, 0.2, 0.2], [0.1, 0.2, 0.3, 0.4]])


def two_tokens_through_a_tree(rng):
    """The first two tokens of a text whose first round verifies a draft tree; when the round emits one
    token, the second comes from the target as the next round would."""
    from edgespec.decode.verify import verify_tree

    first = draw_distinct(Q0, 2, rng)
    second = draw_distinct(Q1[first[0]], 2, rng)
    tokens, parents = np.array([*first, *second]), np.array([-1, -1, 0, 0])
    target_rows = np.stack([P0, P1[first[0]], P1[first[1]], np.eye(4)[0], np.eye(4)[0]])  # leaves' rows unused
    draft_rows = np.stack([Q0, Q1[first[0]], np.zeros(4), np.zeros(4), np.zeros(4)])
    path, token = verify_tree(target_rows, draft_rows, tokens, parents, rng)
    emitted = [int(tokens[i]) for i in path] + [token]
    if len(emitted) == 1:
        emitted.append(sample(P1[emitted[0]], rng))
    return tuple(emitted[:2])


def judged_with_replacement(target_row, draft_row, candidates, rng):
    """A wrong rule for distinct candidates: the rule for i.i.d. ones, which judges every candidate by the full
    draft law. The tree tests patch it in for verify_candidates to show they catch it."""
    law = target_row
    for j, token in enumerate(candidates):
        if rng.random() < acceptance_prob(law, draft_row, token):
            return j, int(token)
        law = residual(law, draft_row)
    return None, sample(law, rng)


@pytest.mark.laws
@pytest.mark.parametrize("broken", [False, True])
def test_a_draft_tree_emits_the_target_law_of_two_tokens(monkeypatch, broken):
    """Monte Carlo over the joint law of two tokens; judging distinct candidates by the full draft law (the
    rule for i.i.d. candidates) is caught."""
    from edgespec.decode import verify as verify_module

    if broken:
        monkeypatch.setattr(verify_module, "verify_candidates", judged_with_replacement)
    rng = np.random.default_rng(21)
    draws = [two_tokens_through_a_tree(rng) for _ in range(30000)]
    law = {(a, b): P0[a] * P1[a, b] for a in range(4) for b in range(4)}
    p = goodness_of_fit(draws, law)
    assert (p < ALPHA) == broken, p
