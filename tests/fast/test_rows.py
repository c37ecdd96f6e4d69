"""The fused passes over a row (decode/_rows.c: SSE2 and portable C; _weights.c: AVX2) against what numpy computes
(decode/rows.py), and the fast rule on every path a machine may take: one AVX2 pass, the SSE2 band over numpy's
weights, numpy alone (where the C module was not built)."""

from pathlib import Path

import numpy as np
import pytest
from conftest import ON_CI
from test_laws import dense_of

from edgespec.decode import laws, rows
from edgespec.decode.sampling import SamplingParams, to_probs

built = pytest.mark.skipif(rows._rows is None, reason="edgespec.decode._rows was not built (no C compiler)")
wide = pytest.mark.skipif(rows._rows is None or not rows._rows.WIDE, reason="no AVX2 pass on this machine")
BLOCK = 16  # small blocks: a band's ids fall in many of them


def flat(rng, n_vocab, ties=True):
    """A flat row [V] float32 with exact ties and a masked token."""
    row = (rng.standard_normal(n_vocab) * 0.5).astype(np.float32)
    if ties:
        row[rng.integers(n_vocab, size=64)] = row[rng.integers(n_vocab)]
        row[rng.integers(n_vocab)] = -np.inf
    return row


def sums_of(w):
    """Block sums of w [n] per BLOCK ids, float64."""
    padded = np.zeros(-(-len(w) // BLOCK) * BLOCK)
    padded[:len(w)] = w
    return padded.reshape(-1, BLOCK).sum(axis=1)


def a_band(rng, row, w):
    """lo <= hi among the row's finite logits, and a top_p that usually puts the cut between them."""
    finite = np.sort(row[np.isfinite(row)])
    lo, hi = np.sort(finite[rng.integers(len(finite), size=2)])
    inside = (row >= lo) & (row <= hi)
    top_p = (w[row > hi].sum(dtype=np.float64) + rng.uniform(0, 1.2) * w[inside].sum(dtype=np.float64)) / w.sum()
    return lo, hi, min(float(top_p), 1.0)


def check_band(row, w, lo, hi, top_p, after, sums, total, ids):
    """What a band pass promises (rows.py's docstring), for the weights w it was given or made."""
    inside = np.flatnonzero((row >= lo) & (row <= hi))
    assert np.isclose(total, w.sum(dtype=np.float64), rtol=1e-6)
    assert np.all(np.diff(ids) > 0) and np.isin(ids, inside).all()
    top, bottom = (row[ids].max(), row[ids].min()) if len(ids) < len(inside) else (hi, lo)
    if len(ids) < len(inside):  # narrowed to the ranges where the mass is reached
        assert sums.sum() < top_p * total <= (sums.sum() + w[ids].sum(dtype=np.float64)) * (1 + 1e-6)
    np.testing.assert_allclose(sums, sums_of(w * (row > top)), rtol=1e-5, atol=1e-9 * total)
    np.testing.assert_array_equal(after, w * (row >= bottom))  # zeroed or kept, never rounded


@built
@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("n_vocab", [5, 1037, 152064])
def test_band_over_given_weights(n_vocab, portable):
    rng = np.random.default_rng(n_vocab)
    for _ in range(20):
        row = flat(rng, n_vocab)
        w = np.exp(row / np.float32(0.7)).astype(np.float32)
        lo, hi, top_p = a_band(rng, row, w)
        after, sums, ids = w.copy(), np.empty(-(-n_vocab // BLOCK)), np.empty(n_vocab, dtype=np.int64)
        total, m = rows._rows.band(row, after, lo, hi, top_p, sums, BLOCK, ids, portable)
        check_band(row, w, lo, hi, top_p, after, sums, total, ids[:m])


@wide
@pytest.mark.parametrize("n_vocab", [5, 1037, 152064])
def test_weights_in_one_pass_are_numpys_and_make_the_band(n_vocab):
    rng = np.random.default_rng(n_vocab + 3)
    for temperature, shift in ((0.7, 0.0), (1.3, 2.0), (0.05, 1.5)):
        row = flat(rng, n_vocab)
        scale = rows._scale(temperature, row.dtype)  # (hi, lo)
        floor = np.float32(shift - 87 * temperature)
        expected = np.exp((row.astype(np.float64) - shift) / temperature) * (row >= floor)
        w, sums, ids = np.empty_like(row), np.empty(-(-n_vocab // BLOCK)), np.empty(n_vocab + 8, dtype=np.int64)
        total, m = rows._rows.weights(row, w, *scale, shift, floor, -np.inf, -np.inf, 1.0, sums, BLOCK, None)
        # the exponent rounds to 1 ulp of up to 87: exp's error is dominated by the argument's, as numpy's is
        np.testing.assert_allclose(w, expected, rtol=2e-5, atol=1e-37)
        assert m == 0 and np.isclose(total, expected.sum(), rtol=1e-5)
        np.testing.assert_allclose(sums, sums_of(w), rtol=1e-5, atol=1e-9 * total)
        lo, hi, top_p = a_band(rng, row, w)
        after = np.empty_like(row)
        total, m = rows._rows.weights(row, after, *scale, shift, floor, lo, hi, top_p, sums, BLOCK, ids)
        check_band(row, w, lo, hi, top_p, after, sums, total, ids[:m])


@built
@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize("n_vocab", [1, 5, 17, 152064])
def test_extent_and_ids_below_are_numpys(n_vocab, portable):
    rng = np.random.default_rng(n_vocab + 2)
    for _ in range(5):
        row = flat(rng, n_vocab, ties=n_vocab > 1)
        row[rng.integers(n_vocab)] = rng.choice([-1e30, 1e30])  # a masked or a forced token
        assert rows._rows.extent(row, portable) == (row.max(), row.min())
        bound = row[rng.integers(n_vocab)]
        ids = np.empty(n_vocab, dtype=np.int64)
        m = rows._rows.between(row, -np.inf, bound, ids, portable)
        np.testing.assert_array_equal(ids[:m], np.flatnonzero(row <= bound))
    row = np.array([0.5, 1.0, 1.0000001, -np.inf], dtype=np.float32)
    for bound in (1.0, 1.00000005, 1.00000015, -np.inf, np.inf):  # compared in float32, as numpy compares
        np.testing.assert_array_equal(rows.below(row, bound), np.flatnonzero(row < bound))


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere)."""
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def test_the_c_passes_are_the_ones_loaded_and_avx2_where_the_cpu_has_it():
    """The production path for rows of 49k-262k ids is the C module. A build that fell back to numpy (no compiler,
    no Python headers) fails here under CI instead of leaving every C test skipped; a CPU with AVX2 and FMA runs
    the AVX2 pass."""
    if rows._rows is None:
        reason = "edgespec.decode._rows was not built: the rows run in numpy (make install needs a C compiler)"
        (pytest.fail if ON_CI else pytest.skip)(reason)
    if {"avx2", "fma"} <= cpu_flags():
        assert rows._rows.WIDE and rows.kind() == "avx2"
    else:
        assert rows.kind() in ("sse2", "c")


def test_kind_names_the_path_the_passes_take(monkeypatch):
    expected = "numpy" if rows._rows is None else "avx2" if rows._rows.WIDE else "sse2" if rows._rows.SSE2 else "c"
    assert rows.kind() == expected
    monkeypatch.setattr(rows, "_rows", None)
    assert rows.kind() == "numpy"


@built
def test_the_passes_refuse_arrays_of_the_wrong_type_or_size():
    row = flat(np.random.default_rng(0), 100)
    w, sums, ids = row.copy(), np.empty(7), np.empty(100, np.int64)  # 100 ids in blocks of 16: 7 sums
    with pytest.raises(TypeError):
        rows._rows.band(row.astype(np.float64), w, 0.0, 1.0, 0.9, sums, 16, ids)
    with pytest.raises(ValueError):
        rows._rows.band(row, w[:50], 0.0, 1.0, 0.9, sums, 16, ids)
    with pytest.raises(ValueError):
        rows._rows.band(row, w, 0.0, 1.0, 0.9, sums[:3], 16, ids)
    with pytest.raises(ValueError):
        rows._rows.band(row, w, 0.0, 1.0, 0.9, sums, 12, ids)  # not a power of two
    with pytest.raises(ValueError):
        rows._rows.band(row[::2], w[::2], 0.0, 1.0, 0.9, np.empty(4), 16, ids)  # not contiguous
    with pytest.raises(ValueError):
        rows._rows.extent(row[:0])
    if rows._rows.WIDE:
        with pytest.raises(ValueError):  # the AVX2 pass stores 8 ids at a time: it needs room for 8 more
            rows._rows.weights(row, w, 1.0, 0.0, 0.0, -np.inf, 0.0, 1.0, 0.9, sums, 16, ids)


@pytest.mark.parametrize("path", ["wide", "band", "numpy"])
@pytest.mark.parametrize("n_vocab", [32000, 152064])
def test_top_p_keeps_the_reference_set_on_every_path(monkeypatch, n_vocab, path):
    """The AVX2 pass, the SSE2 band over numpy's weights, numpy alone: the kept set is the reference's."""
    if path != "numpy" and rows._rows is None or path == "wide" and not rows._rows.WIDE:
        pytest.skip(f"no {path} path on this machine")
    if path == "band":
        monkeypatch.setattr(rows, "wide", lambda row: False)
    if path == "numpy":
        monkeypatch.setattr(rows, "_rows", None)
    rng = np.random.default_rng(9)
    taken = []
    banded = laws._banded
    monkeypatch.setattr(laws, "_banded", lambda *args: taken.append(banded(*args)) or taken[-1])
    for scale, grid in ((0.5, 0.0), (1.0, 1 / 64)):
        row = rng.standard_normal(n_vocab).astype(np.float32) * scale
        if grid:
            row = np.round(row / grid).astype(np.float32) * grid  # many logits tie, at the cut too
        row[7] = -np.inf  # a masked token
        for top_p in (0.5, 0.95):
            params = SamplingParams(0.7, top_p=top_p)
            np.testing.assert_array_equal(dense_of(laws.law(row, params), n_vocab) > 0, to_probs(row, params) > 0)
    assert sum(law is not None for law in taken) >= 0.75 * len(taken)  # the band held the cut
