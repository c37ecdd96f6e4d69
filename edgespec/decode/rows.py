"""Passes over one float32 row of logits [V] that the fast rule makes on a 152k vocabulary: its extent, the ids
below a logit, top-p's band (the weight above it and its ids, in one pass) and the weights below a cut zeroed
with their block sums (another).

numpy makes each of these as several passes (a mask, a cast, a multiply, a nonzero over 152k flags), each
reading the row again; the C module _rows (built with the package where a compiler is present) makes each as
one. Both give the same results (sums to float rounding); the numpy ones run where _rows was not built, or for
rows that are not float32 (tests/test_rows.py compares them). Rows hold no NaN.
"""

from __future__ import annotations

import numpy as np

try:
    from edgespec.decode import _rows
except ImportError:  # built without a C compiler: the numpy passes below
    _rows = None


def fused(*arrays: np.ndarray) -> bool:
    """Whether the C passes take these arrays: float32 and contiguous."""
    return _rows is not None and all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def extent(row: np.ndarray) -> tuple[float, float]:
    """(largest, smallest) logit of row [V]."""
    if fused(row):
        return _rows.extent(row)
    return float(row.max()), float(row.min())


def below(row: np.ndarray, bound: float) -> np.ndarray:
    """Ascending ids where row [V] < bound."""
    if not fused(row):
        return np.flatnonzero(row < bound)
    # numpy compares a float32 row with bound in float32: row < float32(bound) is row <= the float32 below it
    bound = np.float32(bound)
    if bound == -np.inf:
        return np.empty(0, dtype=np.int64)
    at_most = np.nextafter(bound, np.float32(-np.inf))
    ids = np.empty(len(row), dtype=np.int64)  # [V]: pages are touched only as far as the ids go
    return ids[:_rows.between(row, -np.inf, at_most, ids)]


def band(row: np.ndarray, w: np.ndarray, lo: float, hi: float, top_p: float) -> tuple[float, float, np.ndarray]:
    """(above, total, ids) for row, w [V]: total, the sum of w; ids [m], ascending, of logits in [lo, hi]; above,
    the weight of the logits larger than every one of them. The C pass narrows the band to the few sixty-fourths
    of [lo, hi] around where the weight from the top reaches top_p * total (where the band reaches it): the cut
    must still be found in exact weights."""
    if fused(row, w):
        ids = np.empty(len(row), dtype=np.int64)
        above, total, m = _rows.band(row, w, lo, hi, top_p, ids)
        return above, total, ids[:m]
    above = float(np.multiply(w, row > hi).sum(dtype=np.float64))
    return above, float(w.sum(dtype=np.float64)), np.flatnonzero((row >= lo) & (row <= hi))


def keep_from(row: np.ndarray, w: np.ndarray, cut: float, block: int) -> np.ndarray:
    """Zero w [V] where row [V] < cut, in place; returns the kept weight per `block` ids [ceil(V / block)]."""
    sums = np.empty(-(-len(row) // block))
    if fused(row, w):
        _rows.keep_from(row, w, cut, sums, block)
        return sums
    w *= row >= cut
    full = len(w) // block * block
    sums[:full // block] = w[:full].reshape(-1, block).sum(axis=1, dtype=np.float64)
    if full < len(w):
        sums[-1] = w[full:].sum(dtype=np.float64)
    return sums
