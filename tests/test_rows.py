"""The fused passes over a row (decode/_rows.c, SSE2 and portable C) against numpy's (decode/rows.py), and the
fast rule on the numpy passes alone, as it runs where the C module was not built."""

import numpy as np
import pytest
from test_laws import dense_of

from edgespec.decode import laws, rows
from edgespec.decode.sampling import SamplingParams, to_probs

built = pytest.mark.skipif(rows._rows is None, reason="edgespec.decode._rows was not built (no C compiler)")


def flat(rng, n_vocab, ties=True):
    """A flat row [V] float32 with exact ties and a masked token, and its weights at temperature 0.7."""
    row = (rng.standard_normal(n_vocab) * 0.5).astype(np.float32)
    if ties:
        row[rng.integers(n_vocab, size=64)] = row[rng.integers(n_vocab)]
        row[rng.integers(n_vocab)] = -np.inf
    return row, np.exp(row / np.float32(0.7)).astype(np.float32)


@built
@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("n_vocab", [5, 1037, 152064])
def test_band_keeps_the_ranges_where_the_mass_is_reached(n_vocab, portable):
    rng = np.random.default_rng(n_vocab)
    for _ in range(20):
        row, w = flat(rng, n_vocab)
        finite = np.sort(row[np.isfinite(row)])
        lo, hi = finite[rng.integers(len(finite), size=2)]
        lo, hi = min(lo, hi), max(lo, hi)
        inside = np.flatnonzero((row >= lo) & (row <= hi))
        exact_above = float(w[row > hi].sum(dtype=np.float64))
        exact_total = float(w.sum(dtype=np.float64))
        top_p = (exact_above + rng.uniform(0, 1.2) * float(w[inside].sum(dtype=np.float64))) / exact_total
        ids = np.empty(n_vocab, dtype=np.int64)
        above, total, m = rows._rows.band(row, w, lo, hi, top_p, ids, portable)
        ids, mass = ids[:m], top_p * total
        assert np.isclose(total, exact_total, rtol=1e-6)
        assert np.all(np.diff(ids) > 0) and np.isin(ids, inside).all()
        if len(ids) < len(inside):  # narrowed: a run of values, everything larger weighed in `above`
            top = row[ids].max()
            assert np.isclose(above, float(w[row > top].sum(dtype=np.float64)), rtol=1e-5)
            assert above < mass <= above + float(w[ids].sum(dtype=np.float64)) * (1 + 1e-5)
            left = np.setdiff1d(inside, ids)
            assert np.all((row[left] > top) | (row[left] < row[ids].min()))
        else:
            assert np.isclose(above, exact_above, rtol=1e-5)


@built
@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("n_vocab", [1, 5, 17, 152064])
def test_extent_and_ids_below_are_numpys(n_vocab, portable):
    rng = np.random.default_rng(n_vocab + 2)
    for _ in range(5):
        row, _ = flat(rng, n_vocab, ties=n_vocab > 1)
        row[rng.integers(n_vocab)] = rng.choice([-1e30, 1e30])  # a masked or a forced token
        assert rows._rows.extent(row, portable) == (row.max(), row.min())
        bound = row[rng.integers(n_vocab)]
        ids = np.empty(n_vocab, dtype=np.int64)
        m = rows._rows.between(row, -np.inf, bound, ids, portable)
        np.testing.assert_array_equal(ids[:m], np.flatnonzero(row <= bound))
    row = np.array([0.5, 1.0, 1.0000001, -np.inf], dtype=np.float32)
    for bound in (1.0, 1.00000005, 1.00000015, -np.inf, np.inf):  # compared in float32, as numpy compares
        np.testing.assert_array_equal(rows.below(row, bound), np.flatnonzero(row < bound))


@built
@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("n_vocab", [5, 1037, 152064])
def test_keep_from_zeroes_below_the_cut_and_sums_each_block(n_vocab, portable):
    rng = np.random.default_rng(n_vocab + 1)
    for block in (16, 1024):
        row, w = flat(rng, n_vocab)
        cut = row[rng.integers(n_vocab)] if n_vocab > 5 else row.max()
        expected = w * (row >= cut)
        sums = np.empty(-(-n_vocab // block))
        rows._rows.keep_from(row, w, cut, sums, block, portable)
        np.testing.assert_array_equal(w, expected)  # a weight is kept or zeroed, never rounded
        padded = np.concatenate([expected, np.zeros(len(sums) * block - n_vocab, np.float32)]).astype(np.float64)
        np.testing.assert_allclose(sums, padded.reshape(-1, block).sum(axis=1), rtol=1e-6)


@built
def test_the_passes_refuse_arrays_of_the_wrong_type_or_size():
    row, w = flat(np.random.default_rng(0), 100)
    with pytest.raises(TypeError):
        rows._rows.band(row.astype(np.float64), w, 0.0, 1.0, 0.9, np.empty(100, np.int64))
    with pytest.raises(ValueError):
        rows._rows.band(row, w[:50], 0.0, 1.0, 0.9, np.empty(100, np.int64))
    with pytest.raises(ValueError):
        rows._rows.extent(row[:0])
    with pytest.raises(ValueError):
        rows._rows.keep_from(row, w, 0.0, np.empty(3), 16)  # 100 ids in blocks of 16 need 7 sums
    with pytest.raises(ValueError):
        rows._rows.keep_from(row[::2], w[::2], 0.0, np.empty(4), 16)  # not contiguous


@pytest.mark.parametrize("n_vocab", [32000, 152064])
def test_top_p_on_numpy_passes_keeps_the_reference_set(monkeypatch, n_vocab):
    """Where _rows was not built, the same rule on numpy's passes: the kept set is the reference's."""
    monkeypatch.setattr(rows, "_rows", None)
    rng = np.random.default_rng(9)
    for scale, grid in ((0.5, 0.0), (1.0, 1 / 64)):
        row = rng.standard_normal(n_vocab).astype(np.float32) * scale
        if grid:
            row = np.round(row / grid).astype(np.float32) * grid
        for top_p in (0.5, 0.95):
            params = SamplingParams(0.7, top_p=top_p)
            np.testing.assert_array_equal(dense_of(laws.law(row, params), n_vocab) > 0, to_probs(row, params) > 0)
