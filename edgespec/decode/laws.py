"""The rule at device speed: each row of logits becomes a law that answers only what the round asks of it.

sampling.to_probs and verify.verify are the reference: dense float64 rows [V] for every position. On a 152k
vocabulary a row costs milliseconds that way (a float64 copy, a full sort for top-p, a cumsum for one draw),
more than a target pass on the devices edgespec runs on. Here a row is processed once, when the rule first
reads it, into a Law:

- greedy: `OneHot`, the argmax. Acceptance is an index comparison and nothing is drawn.
- sampling: `Weights`, the processed weights (in the logits' float type) over the whole vocabulary, or over
  the ids a filter kept (top-k, min-p: a few hundred), with their total. p(x) is one gathered value; a draw
  is the reference's inverse CDF over ids in ascending order, found through block sums instead of a cumsum
  over the vocabulary. Top-p decides a peaked row's cut from the logits near its largest; elsewhere it sorts
  a sample, then only the band where the cut lies.
- a deterministic draft (prompt lookup) has no law at all: its token has probability 1.

The residual max(0, p - q) is built only at a rejection, over p's support. Every function here gives the
reference's token for the same uniforms, up to float rounding at a CDF boundary (tests/fast/test_laws.py checks it
on random rows), so the guarantee is the one sampling.py states, about the same processed distribution.
"""

from __future__ import annotations

import math

import numpy as np

from edgespec.decode import rows
from edgespec.decode.rows import BLOCK, UNDERFLOW, block_sums
from edgespec.decode.sampling import SamplingParams
from edgespec.errors import EdgespecError

SMALL = 4096  # supports up to this many ids are drawn from with one cumsum
SAMPLE = 4096  # logits the top-p cut is estimated from (a strided sample of the row)
BAND = 16384  # logits top-p sorts at most around its cut, unless the probes fail to bracket it
BAND_SIGMAS = 5.0  # a flat row's band around top-p's cut estimated from the sample: this many sampling noises
DEPTH = 9.2  # log(1e4): top-p's peaked shortcut bounds the weight it does not compute by 1e-4 of the largest
HEAD = 16  # top-p then tries the logits at or above the sample's HEAD-th largest (~HEAD * stride ids)
TOP_K_COLUMNS = 64  # top-k's first bound: the k-th largest of the maxima of V / 64 columns of 64 strided logits


class OneHot:
    """A law with all its mass on one token: greedy decoding's target and draft rows."""

    __slots__ = ("token",)

    def __init__(self, token: int):
        self.token = token

    def prob(self, token: int) -> float:
        return 1.0 if token == self.token else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        return self.token  # nothing to draw: greedy output does not depend on the generator


class Weights:
    """A law as weights: over the vocabulary (ids None, w [V]) or over ascending ids (ids [n], w [n]). sums: the
    weights' sums per BLOCK ids, float64, where they were computed already (a draw needs them)."""

    __slots__ = ("ids", "w", "total", "sums")

    def __init__(self, ids: np.ndarray | None, w: np.ndarray, total: float, sums: np.ndarray | None = None):
        self.ids, self.w, self.total, self.sums = ids, w, float(total), sums

    def prob(self, token: int) -> float:
        if self.ids is None:
            return float(self.w[token]) / self.total
        j = int(np.searchsorted(self.ids, token))
        return float(self.w[j]) / self.total if j < len(self.ids) and self.ids[j] == token else 0.0

    def probs_at(self, ids: np.ndarray | None, n_vocab: int) -> np.ndarray:
        """Probabilities at `ids` ([n]; None: every id, [V]), float64."""
        if self.ids is None:
            w = self.w if ids is None else self.w[ids]
            return w.astype(np.float64) / self.total
        if ids is None:
            out = np.zeros(n_vocab)
            out[self.ids] = self.w / self.total
            return out
        j = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        return np.where(self.ids[j] == ids, self.w[j] / self.total, 0.0)

    def sample(self, rng: np.random.Generator) -> int:
        return self.draw(rng.random())

    def draw(self, u: float) -> int:
        """The id where the cumulative weight in ascending id order first exceeds u times the total: the
        reference sampling.sample for the same uniform u."""
        w = self.w
        if len(w) <= SMALL:
            cdf = np.cumsum(w, dtype=np.float64)
            j = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
            j = j if j < len(w) and w[j] > 0 else int(np.flatnonzero(w)[-1])
        else:
            if self.sums is None:
                self.sums = block_sums(w)
            j = _inverse_cdf(w, self.sums, u)
        return j if self.ids is None else int(self.ids[j])


def _inverse_cdf(w: np.ndarray, sums: np.ndarray, u: float) -> int:
    """Index of the first position where cumsum(w) > u * sum(w) (a zero weight is never chosen), read through
    the block sums: a cumsum over the blocks and over one block."""
    cum = np.cumsum(sums)
    x = u * cum[-1]
    b = min(int(np.searchsorted(cum, x, side="right")), len(cum) - 1)
    while sums[b] <= 0:  # rounding put x past the last block with mass
        b -= 1
    block = w[b * BLOCK:(b + 1) * BLOCK]
    cdf = np.cumsum(block, dtype=np.float64)
    j = int(np.searchsorted(cdf, x - (cum[b - 1] if b else 0.0), side="right"))
    if j >= len(block) or block[j] <= 0:  # the block's sum and its cumsum round differently: its last token
        j = int(np.flatnonzero(block)[-1])
    return b * BLOCK + j


Law = OneHot | Weights


def law(logits: np.ndarray, params: SamplingParams) -> Law:
    """The processed distribution of one row of logits [V] (float32 or float64, not modified): what
    sampling.to_probs computes, filters in the same order (top-k, temperature, top-p, min-p)."""
    row = np.asarray(logits)
    if row.dtype != np.float32 and row.dtype != np.float64:
        row = row.astype(np.float32)
    if params.greedy:
        token = int(row.argmax())  # the first NaN, where the row holds one
        _check(float(row[token]))
        return OneHot(token)
    top, low = rows.extent(row)
    _check(top)
    n_vocab = row.shape[0]
    if 0 < params.top_k < n_vocab:
        ids = _top_k_ids(row, params.top_k)
        return _small(ids, row[ids].astype(np.float64), params)
    if params.min_p > 0 and params.top_p >= 1.0:
        # min-p alone keeps p >= min_p * p_max, logits within T * log(1 / min_p) of the largest: a few ids. The
        # bound is widened a little and the exact test is made on the weights, as the reference makes it.
        ids = np.flatnonzero(row >= top + params.temperature * np.log(params.min_p) - 1e-3)
        if len(ids) <= SMALL:  # a flat row keeps most of the vocabulary: weights over it, below
            return _small(ids, row[ids].astype(np.float64), params)
    return _full(row, top, low, params)


class NoLaw(EdgespecError):
    """A row of logits without a distribution: a NaN or +inf logit, or every logit -inf."""


def _check(top: float) -> None:
    """Refuse a row whose largest logit (NaN where the row holds one) leaves the law undefined: softmax of a NaN
    or of +inf is NaN, and a row masked everywhere (-inf) allows no token."""
    if top == -np.inf:
        raise NoLaw("every token's logit is -inf (masked): no token can be sampled; check the grammar or "
                            "the logit bias")
    if not top < np.inf:
        raise NoLaw(f"the model returned a {'NaN' if top != top else '+inf'} logit: its output is broken "
                            "(an overflow in a float16 model, or a corrupt file); try another quantization or "
                            "check the file with `edgespec doctor`")


def _top_k_ids(row: np.ndarray, k: int) -> np.ndarray:
    """Ascending ids of the logits >= the k-th largest (ties at it kept), as the reference keeps them."""
    n = len(row) // TOP_K_COLUMNS
    if n >= 4 * k:
        # the maxima of n disjoint strided columns are n distinct tokens: at least k logits are >= the k-th
        # largest maximum, so every one of the top k is among the logits >= it
        maxima = row[:n * TOP_K_COLUMNS].reshape(TOP_K_COLUMNS, n).max(axis=0)  # [n]
        ids = np.flatnonzero(row >= np.partition(maxima, n - k)[n - k])
        values = row[ids]
        return ids[values >= np.partition(values, len(values) - k)[len(values) - k]]
    return np.flatnonzero(row >= np.partition(row, len(row) - k)[len(row) - k])


def _small(ids: np.ndarray, values: np.ndarray, params: SamplingParams) -> Weights:
    """A few ids (ascending) and their logits (float64): the reference's steps on them alone."""
    e = np.exp((values - values.max()) / params.temperature)  # [n]
    keep = np.ones(len(ids), dtype=bool)
    if params.top_p < 1.0:
        order = np.argsort(-e, kind="stable")  # ids ascend, so ties stay in id order, as in the reference
        cumulative = np.cumsum(e[order])
        n_keep = int(np.searchsorted(cumulative, params.top_p * cumulative[-1], side="left")) + 1
        keep[:] = False
        keep[order[:n_keep]] = True
    if params.min_p > 0.0:
        keep &= e >= params.min_p  # e of the largest logit is 1: p >= min_p * p_max
    ids, e = ids[keep], e[keep]
    return Weights(ids, e, float(e.sum()))


def _full(row: np.ndarray, top: float, low: float, params: SamplingParams) -> Weights:
    """Weights over the whole vocabulary, in the row's float type (or over the few ids top-p keeps), made by the
    passes of decode/rows.py; then min-p. top, low: the row's largest and smallest logit (finite top).

    Every weight is taken relative to the largest logit's, which weighs 1: the others lie in [0, 1], so no sum
    over the vocabulary (a block's, the total) can overflow, whatever the logits' scale, the temperature or the
    number of ties at the top. Unshifted weights overflow float32 sums: three tied logits whose weights are
    1.5e38 each already make an infinite block sum."""
    t = params.temperature
    if params.top_p < 1.0:
        kept = _peaked_nucleus(row, top, t, params.top_p)
        if kept is not None:
            ids, weights = kept
            return _floored(Weights(ids, weights, float(weights.sum())), params.min_p)  # the largest weighs 1
    floor = top + UNDERFLOW * t  # float32 logits below weigh less than float32's smallest normal number: 0
    floor = floor if row.dtype == np.float32 and low < floor else None
    if params.top_p < 1.0:
        return _floored(_nucleus(row, top, t, params.top_p, floor), params.min_p)
    w, sums = rows.weights(row, t, top, floor)
    return _floored(_whole(w, sums), params.min_p)


def _whole(w: np.ndarray, sums: np.ndarray | None = None) -> Weights:
    """A law over the whole vocabulary from its weights w [V] (sums: w's block sums where known)."""
    sums = block_sums(w) if sums is None else sums
    return Weights(None, w, float(sums.sum()), sums)


def _floored(law: Weights, bound: float) -> Weights:
    """min-p after the other filters: the weights below bound (min_p times the largest's weight) removed."""
    if bound <= 0.0:
        return law
    if law.ids is not None:
        keep = law.w >= bound
        return Weights(law.ids[keep], law.w[keep], float(law.w[keep].sum()))
    law.w *= law.w >= law.w.dtype.type(bound)
    return _whole(law.w)


def _peaked_nucleus(row: np.ndarray, top: float, temperature: float,
                    top_p: float) -> tuple[np.ndarray, np.ndarray] | None:
    """Top-p without a pass of exp over the vocabulary, where the row is peaked (a trained model's usually is):
    (ascending ids, their weights exp((logit - top) / temperature)) of the kept prefix, or None where this
    cannot tell.

    The logits more than DEPTH below the largest (in units of temperature, plus log V) weigh together less than
    10^-4 of the largest's weight, so the total weight lies between the head's and the head's plus that bound.
    Where the prefix that reaches top_p is the same for both totals, it is the reference's prefix, and its
    weights are all the law needs (top-p renormalises over what it keeps)."""
    n = len(row)
    depth = temperature * (math.log(n) + DEPTH)  # a Python float: inf, not an overflow warning, at huge t
    stride = max(1, n // SAMPLE)
    if np.count_nonzero(row[::stride] >= top - depth) * stride > 4 * SMALL:  # plainly not peaked: not even a pass
        return None
    near = row >= top - depth
    if np.count_nonzero(near) > SMALL:  # not peaked enough: a count is cheaper than the ids
        return None
    head = np.flatnonzero(near)
    values = row[head].astype(np.float64)
    order = np.argsort(-values, kind="stable")  # head ascends: ties stay in id order
    cumulative = np.cumsum(np.exp((values[order] - top) / temperature))
    rest = (n - len(head)) * np.exp(-depth / temperature)  # at most this much weight lies outside the head
    cut = int(np.searchsorted(cumulative, top_p * cumulative[-1], side="left"))
    if cut != int(np.searchsorted(cumulative, top_p * (cumulative[-1] + rest), side="left")) or cut >= len(head):
        return None
    kept = np.sort(order[:cut + 1])
    return head[kept], np.exp((values[kept] - top) / temperature)


def _nucleus(row: np.ndarray, shift: float, temperature: float, top_p: float, floor: float | None) -> Weights:
    """Top-p: keep the smallest prefix of the ids ordered by logit (largest first, ties by id) whose weight
    reaches mass = top_p * total (weights exp((row - shift) / temperature) as rows.weights makes them with floor,
    total their sum). The law over the prefix: its ids and weights where it is short; otherwise the weights over
    the vocabulary [V] with the rest zeroed.

    A sorted strided sample of the row estimates where the prefix ends. Where the logits at or above the
    sample's HEAD-th largest carry `mass`, the cut is among them (a peaked row, the common case of a trained
    model). Where it lies deep, one band around the sample's estimate usually holds it (_banded). Otherwise
    exact probes (the weight above a sampled logit, one pass over the row each) bracket the cut, and only the
    logits inside the bracket are sorted. Every bracket is checked against the exact weights; the last resort is
    the whole row."""
    stride = max(1, len(row) // SAMPLE)
    sampled = np.sort(row[::stride])[::-1]  # [n], largest first
    n = len(sampled)
    h = min(HEAD, n - 1)
    sampled_w = np.exp((sampled.astype(np.float64) - shift) / temperature)  # [n]
    walked = np.concatenate(([0.0], np.cumsum(sampled_w)))  # [n + 1]: the sample's weight above rank j
    if walked[h + 1] < top_p * walked[-1] / 2:  # the sample puts the cut deep
        law = _banded(row, sampled, walked, top_p, shift, temperature, floor)
        if law is not None:  # one band around the sample's estimate held it
            return law
    w, sums = rows.weights(row, temperature, shift, floor)
    mass = top_p * float(sums.sum())
    head = np.flatnonzero(row >= sampled[h])
    if len(head) <= SMALL:
        head_w = w[head]
        if float(head_w.sum()) >= mass:
            order = np.argsort(-row[head], kind="stable")  # head ascends: ties stay in id order
            cumulative = np.cumsum(head_w[order], dtype=np.float64)
            kept = np.sort(order[:int(np.searchsorted(cumulative, mass, side="left")) + 1])
            return Weights(head[kept], head_w[kept], float(head_w[kept].sum()))

    def above(j: int) -> float:  # exact weight strictly above sampled[j]
        return float((w * (row > sampled[j])).sum())  # pairwise in w's type: the cut needs its precision

    # exact anchors: the weight above sampled[a] is below mass (a = -1: above every logit), the weight above
    # sampled[b] reaches it (b = n: below every logit). Between them the sample's walk, rescaled to their exact
    # difference, says where mass is reached; one probe a few sampling noises above that point becomes the
    # band's top (or the new b), and the band's sorted weights show whether the cut lies inside it.
    a, above_a, b, above_b = -1, 0.0, n, float(w.sum())
    at_h = float(head_w[row[head] > sampled[h]].sum()) if len(head) <= SMALL else above(h)
    if at_h < mass:
        a, above_a = h, at_h
    else:
        b, above_b = h, at_h
    for attempt in range(4):
        if (b - a) * stride <= BAND or b - a <= 1 or attempt == 3:  # the bracket itself holds the cut
            low = b
        else:
            start = max(a, 0)
            scale = (above_b - above_a) / max(walked[b] - walked[start], 1e-300)
            j = start + int(np.searchsorted((walked[start:b] - walked[start]) * scale + above_a, mass))
            step = max(4, int(2 * np.sqrt(b - a)))
            probe, low = min(max(j - step, a + 1), b - 1), min(j + step, b)
            probe_mass = above(probe)
            if probe_mass >= mass:
                b, above_b = probe, probe_mass
                continue
            a, above_a = probe, probe_mass
        inside = row <= (sampled[a] if a >= 0 else np.inf)
        if low < n:
            inside &= row >= sampled[low]
        values = np.sort(row[np.flatnonzero(inside)])[::-1]  # [m], largest first
        cumulative = above_a + np.cumsum(np.exp((values.astype(np.float64) - shift) / temperature))
        if cumulative[-1] >= mass or low == b:
            break
    cut_at = min(int(np.searchsorted(cumulative, mass, side="left")), len(values) - 1)
    cut = values[cut_at]
    w *= row >= cut
    if cut_at + 1 < len(values) and values[cut_at + 1] == cut:  # ties at the cut: keep the lowest ids
        keep = cut_at + 1 - int(np.searchsorted(-values, -cut, side="left"))
        w[np.flatnonzero(row == cut)[keep:]] = 0
    return _whole(w)


def _banded(row: np.ndarray, sampled: np.ndarray, walked: np.ndarray, top_p: float, shift: float,
            temperature: float, floor: float | None) -> Weights | None:
    """Top-p's cut deep in the row (a flat row keeps most of its vocabulary), bracketed once from the sample: the
    sample's walk says at which of its ranks top_p of the weight is reached, BAND_SIGMAS sampling noises either
    side of it bound a band of logits, rows.band weighs the row and the band, and only the band's logits are
    sorted. The law over the kept prefix; None where the cut is not in the band or the band is wide."""
    n = len(sampled)
    rank = int(np.searchsorted(walked, top_p * walked[-1], side="left")) - 1  # the sample's cut, estimated
    p = min(max(rank / n, 1.0 / n), 1.0 - 1.0 / n)
    margin = int(BAND_SIGMAS * np.sqrt(n * p * (1 - p))) + 2
    if rank - margin < 0:  # the cut is near the top: the head and the probes find it
        return None
    hi = sampled[rank - margin]
    lo = sampled[rank + margin] if rank + margin < n else -np.inf
    w, sums, total, band = rows.band(row, temperature, shift, floor, lo, hi, top_p)  # band: [m] ascending ids
    mass, above = top_p * total, float(sums.sum())  # above: the weight of every logit above the band's
    if above >= mass or len(band) > 4 * BAND:
        return None
    band_values = row[band]  # [m]
    values = np.sort(band_values)[::-1]  # [m], largest first
    cumulative = above + np.cumsum(np.exp((values.astype(np.float64) - shift) / temperature))
    if cumulative[-1] < mass:
        return None
    cut_at = int(np.searchsorted(cumulative, mass, side="left"))
    cut = values[cut_at]
    keep = band_values > cut  # [m], and the logits equal to the cut's that the prefix takes: the lowest ids
    keep[np.flatnonzero(band_values == cut)[:cut_at + 1 - int(np.count_nonzero(keep))]] = True
    w[band[~keep]] = 0
    kept = band[keep]
    sums += np.bincount(kept // BLOCK, weights=w[kept], minlength=len(sums))
    return _whole(w, sums)
