"""Passes over one row of logits [V] that the fast rule makes at t > 0: its extent, the ids below a logit, its
weights and their block sums, and top-p's band.

On a 152k vocabulary each pass over the row costs tens of microseconds in memory traffic alone, and numpy makes
each step as one or more passes (a multiply, an exp, a mask, a cast, block sums, a nonzero over 152k flags). The C
module _rows (built with the package where a compiler is present) makes them as one: on x86-64 with AVX2 and FMA
(`wide`), the weights, their block sums and top-p's band in a single pass. Both give the same results to float
rounding (exp within 2 ulp); the numpy passes run where _rows was not built, or for rows that are not
contiguous float32 (tests/fast/test_rows.py compares them). Rows hold no NaN (laws.law refuses them).

Top-p's band, whichever pass makes it (`band`): for a band of logits [lo, hi] that should hold the cut, w is
zeroed below lo (never kept if the cut lies in the band), `sums` [ceil(V / BLOCK)] holds each block's weight above
it (always kept), and `ids` the band's ids, narrowed by the C passes to the ranges of values where the weight from
the top reaches top_p of the total. The caller finds the cut among them in exact weights.
"""

from __future__ import annotations

import numpy as np

try:
    from edgespec.decode import _rows
except ImportError:  # built without a C compiler: the numpy passes below
    _rows = None

BLOCK = 1024  # ids per block sum: a draw's cumsum runs over the block sums, then over one block
UNDERFLOW = -87.0  # exp of less is below float32's smallest normal number
FEW = 4096  # logits below the floor zeroed by index up to this many, by a mask beyond


def fused(*arrays: np.ndarray) -> bool:
    """Whether the C passes take these arrays: float32 and contiguous."""
    return _rows is not None and all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def wide(row: np.ndarray) -> bool:
    """Whether the single-pass weights run for this row (fused, on a CPU with AVX2 and FMA)."""
    return fused(row) and bool(_rows.WIDE)


def kind() -> str:
    """Which passes run here: "avx2" (weights and band in one pass), "sse2" or "c" (the band's passes in C over
    numpy's weights), or "numpy" (the C module was not built)."""
    if _rows is None:
        return "numpy"
    return "avx2" if _rows.WIDE else "sse2" if _rows.SSE2 else "c"


def extent(row: np.ndarray) -> tuple[float, float]:
    """(largest, smallest) logit of row [V]; largest is NaN where the row holds a NaN."""
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


def block_sums(w: np.ndarray) -> np.ndarray:
    """Sums of w [n] per BLOCK ids [ceil(n / BLOCK)], float64 (each block summed pairwise in w's type)."""
    full = len(w) // BLOCK * BLOCK
    # einsum's own summing loop: a third of the time of sum(axis=1) on this shape, as precise (and no BLAS
    # threads, which would contend with llama.cpp's)
    sums = np.einsum("ij->i", w[:full].reshape(-1, BLOCK)).astype(np.float64)
    return np.append(sums, float(w[full:].sum())) if full < len(w) else sums


def _blocks(n: int) -> np.ndarray:
    return np.empty(-(-n // BLOCK))


def _scale(temperature: float, dtype: np.dtype) -> tuple[np.floating, np.floating]:
    """1 / temperature as two numbers of dtype (hi + lo): float32's rounding of 1 / 0.7 alone would move every
    weight's exponent by the same 2e-8 relative, a bias that sums over the vocabulary do not average out."""
    hi = dtype.type(1.0 / temperature)
    return hi, dtype.type(1.0 / temperature - float(hi))


def weights(row: np.ndarray, temperature: float, shift: float, floor: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(w, sums): w [V] = exp((row - shift) / temperature) in row's float type, 0 where row < floor (None: no
    floor), and its block sums. The difference is taken first: for the logits near shift, the ones that weigh, it
    is exact or nearly, where row / temperature would round at the row's magnitude (a logit of 1e4 at temperature
    0.05 is off by 0.01 in the exponent). Weights of logits below floor would be float32 denormals,
    tens of times slower in every operation that touches them (the reference gives them under 1e-38 of the mass),
    as -inf logits are."""
    if wide(row):
        w, sums = np.empty_like(row), _blocks(len(row))
        _rows.weights(row, w, *_scale(temperature, row.dtype), np.float32(shift),
                      -np.inf if floor is None else floor, -np.inf, -np.inf, 1.0, sums, BLOCK, None)
        return w, sums
    d = np.subtract(row, row.dtype.type(shift))  # [V], <= 0
    if floor is not None:  # logits below the floor (masked ones: -inf) made finite, zeroed below: -inf * lo is
        np.maximum(d, row.dtype.type(floor - shift), out=d)  # nan where lo < 0, and nan * 0 stays nan
    hi, lo = _scale(temperature, row.dtype)
    w = np.multiply(d, hi)
    if row.dtype == np.float32:
        w += d * lo
    np.exp(w, out=w)
    if floor is None:
        return w, block_sums(w)
    # a few such logits (a masked token) are zeroed by index; many (a flat row at a low temperature) by a mask
    deep = below(row, floor)
    if len(deep) <= FEW:
        w[deep] = 0
    else:
        w *= row >= floor
    return w, block_sums(w)


def band(row: np.ndarray, temperature: float, shift: float, floor: float | None, lo: float, hi: float,
         top_p: float) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """(w, sums, total, ids): the row's weights as `weights` makes them, their total, and top-p's band over
    [lo, hi] (the module's docstring says what w, sums and ids then hold)."""
    sums = _blocks(len(row))
    if wide(row):
        w, ids = np.empty_like(row), np.empty(len(row) + 8, dtype=np.int64)  # ids: touched as far as the band
        total, m = _rows.weights(row, w, *_scale(temperature, row.dtype), np.float32(shift),
                                 -np.inf if floor is None else floor, lo, hi, top_p, sums, BLOCK, ids)
        return w, sums, total, ids[:m]
    w, _ = weights(row, temperature, shift, floor)
    if fused(row, w):
        ids = np.empty(len(row), dtype=np.int64)
        total, m = _rows.band(row, w, lo, hi, top_p, sums, BLOCK, ids)
        return w, sums, total, ids[:m]
    total = float(w.sum(dtype=np.float64))
    sums[:] = block_sums(w * (row > hi))
    w *= row >= lo
    return w, sums, total, np.flatnonzero((row >= lo) & (row <= hi))
