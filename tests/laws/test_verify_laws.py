"""The rule is exact, by analysis and Monte Carlo, and its wrong variants fail the same tests."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stats_util import ALPHA, goodness_of_fit, judged_with_replacement, without_residual
from test_verify import DRAFT, TARGET, candidates_law

from edgespec.decode.sampling import sample
from edgespec.decode.verify import acceptance_prob, residual, verify


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


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 6).flatmap(lambda v: st.tuples(distributions(v), distributions(v))), st.integers(1, 4))
def test_several_candidates_emit_the_target_law_analytically(pair, m):
    target, draft = pair
    np.testing.assert_allclose(candidates_law(target, draft, m), target, atol=1e-9)


def draw_distinct(law, m, rng):
    """m distinct tokens drawn one after another from law without replacement (fewer if its support is)."""
    law, out = law.copy(), []
    while len(out) < m and law.sum() > 0:
        token = sample(law / law.sum(), rng)
        out.append(token)
        law[token] = 0.0
    return np.array(out, dtype=np.int64)


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
