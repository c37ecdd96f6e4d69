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


def test_one_stream_is_the_chain_bound():
    costs = {1: 1.0, 2: 1.1, 3: 1.25, 4: 1.5, 5: 1.9}  # a table, no clock
    for alpha in (0.6, 0.9):
        assert chain_bound(costs, 0.0, 0.05, alpha, streams=1) == chain_bound(costs, 0.0, 0.05, alpha)


def test_streams_that_fill_the_compute_leave_drafting_little():
    """The 2B-class widened target on a 2-core CPU (a table of pass costs measured there, no clock here: 4 rows 1.78x
    one row, 8 rows 2.85x, 12 3.9x): one stream drafting 2 a round gains 1.7x at acceptance 0.8, four streams
    together at most ~1.1x over four streams target-only, since four rows already fill the compute a stream's
    drafts would have used; on a device whose passes stay flat to 16 rows four streams keep the whole gain. Every
    figure below is eq. 1 computed from the table."""
    cpu = {1: 1.0, 2: 1.01, 3: 1.2, 4: 1.78, 8: 2.85, 12: 3.9, 16: 4.9}
    one = chain_bound(cpu, 0.0, 0.035, 0.8, k_max=2)
    four = chain_bound(cpu, 0.0, 0.035, 0.8, streams=4)
    assert one.k == 2 and one.speedup == pytest.approx(expected_tokens(0.8, 2) / (2 * 0.035 + 1.2))
    assert one.speedup > 1.6  # 2.44 tokens for 1.27 passes: the table's, not a timing
    assert four.k == 1 and four.speedup == pytest.approx(expected_tokens(0.8, 1) * 1.78 / (0.035 + 2.85))
    assert four.speedup < 1.3  # 1.8 tokens a stream for 2.885 where target-only spends 1.78: the table's
    flat = dict.fromkeys((1, 4, 8, 12, 16), 1.0)
    assert chain_bound(flat, 0.0, 0.035, 0.8, streams=4).speedup == pytest.approx(
        chain_bound(flat | {2: 1.0, 3: 1.0}, 0.0, 0.035, 0.8, k_max=3).speedup)


def test_a_bound_needs_the_pass_of_its_streams_rows():
    with pytest.raises(ValueError, match="4 rows"):
        chain_bound({1: 1.0, 2: 1.1}, 0.0, 0.05, 0.8, streams=4)
    with pytest.raises(ValueError, match="1 row"):
        chain_bound({2: 1.1}, 0.0, 0.05, 0.8)
