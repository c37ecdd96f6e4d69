"""The chain bound (plan/bound.py): Leviathan et al.'s expected speedup of fixed-length chains, best over lengths."""

import pytest

from edgespec.decode.cost import expected_tokens
from edgespec.plan.bound import chain_bound, chain_speedup


def test_free_verification_gives_the_papers_formula():
    """Leviathan et al. 2023, eq. 1 and theorem 3.8: with a pass of any width costing one token's, a draft step
    costing c of it, the improvement of chains of k is (1 - a^(k+1)) / ((1 - a) (k c + 1))."""
    a, c = 0.8, 0.05
    costs = dict.fromkeys(range(1, 10), 1.0)
    for k in range(1, 9):
        assert chain_speedup(costs, 0.0, c, a, k) == pytest.approx((1 - a ** (k + 1)) / ((1 - a) * (k * c + 1)))
    best = chain_bound(costs, 0.0, c, a)
    assert best.k == max(range(1, 9), key=lambda k: chain_speedup(costs, 0.0, c, a, k))
    assert best.speedup == pytest.approx(chain_speedup(costs, 0.0, c, a, best.k))


def test_a_dear_first_row_and_cheap_later_rows_want_long_chains():
    """The 7B-class widened target on a 2-core CPU: a 2-row pass 1.62x a one-row pass, 8 rows 3.24x (a row past the
    second adds ~0.27); with a 3 % draft step and acceptance 0.9, one draft a round gains ~15 %, chains of 7 far
    more: the bound must find the long chain, not stop at the first that pays."""
    costs = {1: 1.0, 2: 1.62, 3: 1.9, 4: 2.42, 5: 2.6, 6: 2.8, 7: 3.0, 8: 3.12, 9: 3.24}  # a table, no clock
    one_draft = chain_speedup(costs, 0.0, 0.03, 0.9, 1)
    assert one_draft == pytest.approx(expected_tokens(0.9, 1) / (1 * 0.03 + costs[2]))  # eq. 1 by hand
    best = chain_bound(costs, 0.0, 0.03, 0.9)
    assert best.k >= 6
    assert best.tokens / (best.k * 0.03 + costs[best.k + 1]) == pytest.approx(best.speedup)
    assert best.speedup / one_draft > 1.3  # the long chain's formula value against one draft's, both from the table


def test_a_draft_that_cannot_pay_gives_no_chain():
    costs = {n: float(n) for n in range(1, 6)}  # verification as dear as decoding
    best = chain_bound(costs, 0.0, 0.1, 0.9)
    assert (best.k, best.speedup) == (0, 1.0)


def test_chains_are_bounded_by_the_longest_pass_measured_and_by_k_max():
    costs = dict.fromkeys(range(1, 5), 1.0)
    assert chain_bound(costs, 0.0, 0.0, 0.99).k == 3
    assert chain_bound(costs, 0.0, 0.0, 0.99, k_max=2).k == 2
