"""The rule is exact: analytically for one position, by Monte Carlo for several."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stats_util import ALPHA, goodness_of_fit

from edgespec.runtime.sampling import sample
from edgespec.runtime.verify import acceptance_prob, residual, verify


def distributions(n_vocab):
    # strictly positive weights, some tiny, plus exact zeros: the edge cases of min(1, p/q)
    weight = st.one_of(st.just(0.0), st.floats(1e-6, 1.0))
    return st.lists(weight, min_size=n_vocab, max_size=n_vocab).filter(lambda w: sum(w) > 1e-3).map(
        lambda w: np.array(w) / sum(w))


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


TARGET = np.array([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
DRAFT = np.array([[0.1, 0.6, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])


@pytest.mark.parametrize("rule, exact", [(verify, True), (without_residual, False)])
def test_monte_carlo_first_token_matches_target(rule, exact):
    draws = [first for first, _ in run_rule(rule, TARGET, DRAFT, 3, 20000, seed=7)]
    p = goodness_of_fit(draws, first_token_law(TARGET))
    # the exact rule passes at ALPHA; the rule without the residual step is caught
    assert (p > ALPHA) == exact, p


def test_monte_carlo_second_token_given_first_accepted():
    """When the round emits two tokens, the second follows the target's next row."""
    pairs = [pair for pair in run_rule(verify, TARGET, DRAFT, 3, 30000, seed=8) if pair[1] is not None]
    seconds = [b for _, b in pairs]
    assert goodness_of_fit(seconds, {b: TARGET[1, b] for b in range(4)}) > ALPHA


def candidates_law(target, draft, m, rule_residual=residual):
    """Exact law of the token verify_candidates emits with m candidates drawn i.i.d. from draft."""
    if m == 0:
        return target
    accept = np.array([acceptance_prob(target, draft, x) for x in range(len(target))])
    after_reject = candidates_law(rule_residual(target, draft), draft, m - 1, rule_residual)
    return draft * accept + float(np.sum(draft * (1 - accept))) * after_reject


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 6).flatmap(lambda v: st.tuples(distributions(v), distributions(v))), st.integers(1, 4))
def test_several_candidates_emit_the_target_law_analytically(pair, m):
    target, draft = pair
    np.testing.assert_allclose(candidates_law(target, draft, m), target, atol=1e-9)


def test_several_candidates_without_the_residual_update_are_wrong():
    target, draft = np.array([0.6, 0.3, 0.1]), np.array([0.1, 0.2, 0.7])
    keep_target = lambda t, d: t  # noqa: E731  a rule that forgets to update the law after a rejection
    assert np.abs(candidates_law(target, draft, 2, keep_target) - target).max() > 0.05


def test_several_candidates_monte_carlo():
    from edgespec.runtime.verify import verify_candidates

    rng = np.random.default_rng(11)
    target, draft = np.array([0.5, 0.25, 0.15, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])
    draws, accepted_at = [], []
    for _ in range(20000):
        candidates = np.array([sample(draft, rng) for _ in range(3)])
        j, token = verify_candidates(target, draft, candidates, rng)
        assert j is None or candidates[j] == token
        draws.append(token)
        accepted_at.append(j)
    assert goodness_of_fit(draws, dict(enumerate(target))) > ALPHA
    # a second and third candidate do get accepted after a first rejection: that is what a tree buys
    assert accepted_at.count(1) > 1000 and accepted_at.count(2) > 200
