"""The fast rule (decode/laws.py and the C passes of this build) at the extremes of a float32 row, against the
float64 reference (sampling.to_probs, sampling.sample).

A row of 49k-262k float32 logits can hold near-ties at float32's exp limit (a soft-capped Gemma-2 row reaches 30;
at temperature 0.34 three such logits weigh 1.5e38 each), logits near float32's largest, grammar masks (-inf),
rows where almost everything is masked. Which rows break a pass depends on how it happens to sum them, so
besides the reproducers, hypothesis searches rows and sampling parameters for the next one: every probability and
every draw for the same uniform must be the reference's, up to float32 rounding at a filter's edge or a CDF step
(the test says how close to it each difference was).
"""

from contextlib import contextmanager, nullcontext
from unittest import mock

import numpy as np
import pytest

from edgespec.decode import laws, rows
from edgespec.decode.sampling import SamplingParams, sample, to_probs
from edgespec.errors import EdgespecError

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # an overflow or a nan on the way is a failure

EDGE = 1e-5  # a filter's decision or a draw may differ where the reference is this close (relative) to its edge
RTOL = 2e-5  # float32 exponents round to an ulp of up to 87: the weights' relative error
TINY = 1e-30  # probabilities below: float32 weights of e^-87 of the largest and less are 0 (V of them weigh < 1e-24)


class Fixed:
    """A generator whose next uniform is given."""

    def __init__(self, u):
        self.u = u

    def random(self):
        return self.u


PATHS = ["wide", "band", "numpy"]  # the AVX2 pass; the band's C passes over numpy's weights; numpy alone
HERE = [path for path in PATHS if path == "numpy" or rows._rows is not None and (path != "wide" or rows._rows.WIDE)]


@contextmanager
def on_path(path):
    """Run the row passes a machine of another kind runs (skipped where this build lacks them)."""
    if path not in HERE:
        pytest.skip(f"no {path} passes on this machine")
    patch = {"band": {"wide": lambda row: False}, "numpy": {"_rows": None}}.get(path)
    with mock.patch.multiple(rows, **patch) if patch else nullcontext():
        yield


def dense(law, n_vocab):
    if isinstance(law, laws.OneHot):
        out = np.zeros(n_vocab)
        out[law.token] = 1.0
        return out
    return law.probs_at(None, n_vocab)


def at_an_edge(row64, params, ids):
    """Whether each of ids is at the edge of top-p or min-p in the reference: its decision rests on a margin
    below EDGE (relative), which float32 weights cannot settle."""
    x = np.where(np.isfinite(row64), row64, -np.inf)
    if 0 < params.top_k < len(x):
        x = np.where(x >= np.partition(x, len(x) - params.top_k)[len(x) - params.top_k], x, -np.inf)
    p = np.exp((x - x.max()) / params.temperature)
    p /= p.sum()
    near = np.zeros(len(ids), dtype=bool)
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        rank = np.empty(len(p), dtype=np.int64)
        rank[order] = np.arange(len(p))
        before = np.concatenate(([0.0], np.cumsum(p[order])))[rank[ids]]  # the mass ranked above each id
        near |= np.abs(before - params.top_p) < EDGE
    if params.min_p > 0:
        near |= np.abs(p[ids] / p.max() - params.min_p) < EDGE * params.min_p + 1e-300
    return near


def check(row, params, uniforms=()):
    """The law of row (float32 [V]) equals the reference's, and so does each draw for the same uniforms; the same
    row in float64 gives the same law. Returns the law."""
    n_vocab = len(row)
    row64 = row.astype(np.float64)
    ref = to_probs(row64, params)  # [V]
    law = laws.law(row, params)
    got = dense(law, n_vocab)
    assert np.all(np.isfinite(got)) and abs(got.sum() - 1) < 1e-6, (got.sum(), params)
    differ = np.flatnonzero(((got > 0) != (ref > 0)) & (np.maximum(got, ref) > TINY))  # kept by one side only
    edge = at_an_edge(row64, params, differ)
    assert edge.all(), (params, differ[~edge][:5], got[differ[~edge][:5]], ref[differ[~edge][:5]])
    both = (got > 0) & (ref > 0)
    np.testing.assert_allclose(got[both] / got[both].sum(), ref[both] / ref[both].sum(), rtol=RTOL, atol=1e-12)
    if len(differ) == 0:
        cdf = np.cumsum(ref)
        for u in uniforms:
            a, b = sample(ref, Fixed(u)), law.sample(Fixed(u))
            if a != b:  # how far u was from the reference's step between the two tokens, relative
                assert abs(cdf[min(a, b)] - u * cdf[-1]) / cdf[-1] < EDGE, (a, b, u, params)
    again = dense(laws.law(row64, params), n_vocab)
    differ64 = np.flatnonzero(((again > 0) != (got > 0)) & (np.maximum(again, got) > TINY))
    assert at_an_edge(row64, params, differ64).all()
    both = (got > 0) & (again > 0)
    np.testing.assert_allclose(again[both] / again[both].sum(), got[both] / got[both].sum(), rtol=RTOL, atol=1e-12)
    return law


def standard(n_vocab, seed=0):
    return np.random.default_rng(seed).standard_normal(n_vocab).astype(np.float32)


# the issue's reproducer: three near-tied logits just under float32's exp limit at this temperature (29.9 / 0.34 =
# 87.94), in one block of 1,024 ids, whose unshifted weights summed to inf; and its relatives
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("values, temperature", [
    ((29.9, 29.899, 29.898), 0.34),
    ((29.9, -9, -9, -9, -9, -9, -9, -9, 29.899, -9, -9, -9, -9, -9, -9, -9, 29.898), 0.34),  # one AVX2 lane
    ((29.9, 29.899, 29.898), 0.35),
    ((17.55,) * 4, 0.2),
    ((88.0, 88.0), 1.0),
    ((87.9,) * 64, 1.0),  # 64 ties: a sum of weights near float32's largest, times 64
    ((1e4, 1e4 - 0.01), 0.05),  # the exponent's magnitude, 2e5, rounds by 0.01 when divided first
    ((3e38, 3e38), 0.05),  # near float32's largest: row / temperature overflows
    ((-80.0, -80.5), 0.5),  # every logit deep below zero
])
def test_near_ties_at_the_float32_limits(values, temperature, path):
    row = standard(152064)
    row[1000:1000 + len(values)] = values
    with on_path(path):
        for top_p in (1.0, 0.9):
            law = check(row, SamplingParams(temperature, top_p=top_p), np.random.default_rng(0).random(41))
            assert np.isfinite(law.total)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("stride", [1, 8])
def test_the_reproducer_draws_the_references_tokens(path, stride):
    row = standard(152064)
    row[500:500 + 3 * stride:stride] = (29.9, 29.899, 29.898)
    params = SamplingParams(0.34)
    ref = to_probs(row, params)
    with on_path(path):
        law = laws.law(row, params)
    assert abs(law.probs_at(None, len(row)) - ref).max() < 1e-6
    uniforms = np.random.default_rng(1).random(41)
    assert [law.draw(u) for u in uniforms] == [sample(ref, Fixed(u)) for u in uniforms]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("params", [SamplingParams(0.7), SamplingParams(0.7, top_p=0.9),
                                    SamplingParams(0.7, top_k=40), SamplingParams(0.7, min_p=0.1),
                                    SamplingParams(1.3), SamplingParams(0.34, top_p=0.9)])
def test_masked_rows(params, path):
    """Grammar masks: most of the row -inf (more than rows.FEW ids: zeroed by a mask, not by index), or all but
    one id. At these temperatures float32's 1 / T rounds up, so its low part is negative: -inf times it is +inf."""
    row = standard(152064, 3)
    allowed = np.random.default_rng(4).choice(len(row), size=300, replace=False)
    masked = np.full_like(row, -np.inf)
    masked[allowed] = row[allowed]
    one = np.full_like(row, -np.inf)
    one[77] = -3.0
    with on_path(path):
        law = check(masked, params, np.random.default_rng(5).random(25))
        assert set(np.flatnonzero(dense(law, len(row)))) <= set(allowed)
        assert laws.law(one, params).sample(np.random.default_rng(0)) == 77


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("bad, says", [(np.nan, "NaN"), (np.inf, r"\+inf"), (None, "masked")])
@pytest.mark.parametrize("n_vocab", [7, 152064])
def test_rows_without_a_law_are_refused(temperature, bad, says, n_vocab):
    row = standard(n_vocab)
    if bad is None:
        row[:] = -np.inf
    else:
        row[n_vocab // 2] = bad
    for r in (row, row.astype(np.float64)):
        for params in (SamplingParams(temperature), SamplingParams(temperature, top_k=3),
                       SamplingParams(temperature, min_p=0.1), SamplingParams(temperature, top_p=0.5)):
            with pytest.raises(EdgespecError, match=says):
                laws.law(r, params)


@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("at", [0, 5, 16, 17, 1000, 152063])
def test_extent_reports_a_nan_wherever_it_lies(portable, at):
    if rows._rows is None:
        pytest.skip("the C passes were not built")
    row = standard(152064)
    row[at] = np.nan
    top, low = rows._rows.extent(row, portable)
    assert np.isnan(top)
    top, low = rows._rows.extent(standard(152064), portable)
    assert not np.isnan(top)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("temperature", [1e-6, 1e-3])
def test_the_smallest_temperatures(temperature, path):
    """At the smallest temperatures allowed, ties at the top split the mass (top-p keeps the lowest ids of a tie)
    and a logit a float32 step or two below them weighs as the reference says."""
    row = standard(152064) * np.float32(30)
    row[[10, 5000, 90000]] = row.max() + 1
    row[11] = np.nextafter(np.nextafter(row[10], np.float32(-np.inf)), np.float32(-np.inf))
    with on_path(path):
        law = check(row, SamplingParams(temperature), np.random.default_rng(0).random(25))
        assert len(set(dense(law, len(row))[[10, 5000, 90000]])) == 1
        law = check(row, SamplingParams(temperature, top_p=0.5), np.random.default_rng(0).random(25))
        assert set(np.flatnonzero(dense(law, len(row)))) == {10, 5000}


@pytest.mark.parametrize("temperature", [1e-320, 1e-30, 9e-7])
def test_temperatures_below_the_smallest_are_refused(temperature):
    with pytest.raises(EdgespecError, match="0 \\(greedy\\) or at least"):
        SamplingParams(temperature)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_draft_row_without_a_law_ends_its_chain_and_a_target_row_stops_generation(temperature):
    """A draft costs speed, never the answer: a NaN in the draft's row ends the chain it was drafting, and the
    text is the one target-only decoding gives. A NaN in the target's row is an error that names it."""
    from fake import FakeBackend, deterministic_table

    from edgespec.decode.cost import DraftController
    from edgespec.decode.loop import Stats, speculate
    from edgespec.drafts.base import ModelDrafter

    chain = {1: 2, 2: 3, 3: 4, 4: 1}
    target_table = deterministic_table(chain, 6)
    draft_table = target_table.copy()
    draft_table[3, 2] = np.nan  # the draft's row after token 3
    target = FakeBackend(target_table)

    def tokens(drafter, table=None):
        events = speculate(FakeBackend(target_table if table is None else table), drafter,
                           DraftController({n: 1.0 for n in range(1, 9)}, 0.01, 4), [1], SamplingParams(temperature),
                           np.random.default_rng(0), max_tokens=12, draft_max=4, stats=Stats())
        return [e.token for e in events if e.token is not None]

    assert tokens(ModelDrafter(FakeBackend(draft_table), target.vocab)) == tokens(None)
    broken = target_table.copy()
    broken[2, 4] = np.nan
    with pytest.raises(EdgespecError, match="NaN"):
        tokens(None, broken)
