"""The fast rule (decode/laws.py) against the reference (sampling.to_probs, sampling.sample, verify.verify).

Where the result is deterministic (greedy, or the same uniforms) the fast path must give the reference's token;
the only differences allowed are float rounding at a CDF step (float32 weights against float64 rows), and the
test says how close to a step each one was. The rule on laws is also checked for exactness by chi-square,
and a wrong residual must be caught.
"""

import numpy as np
import pytest
from stats_util import ALPHA, goodness_of_fit, target_instead_of_residual
from test_verify import DRAFT, TARGET

from edgespec.decode import laws, rule
from edgespec.decode.sampling import SamplingParams, sample, to_probs
from edgespec.decode.verify import residual, verify
from edgespec.drafts.ngram import NgramIndex, lookup

PARAMS = [SamplingParams(0.7), SamplingParams(0.7, top_p=0.95), SamplingParams(1.0, top_p=0.5),
          SamplingParams(0.7, top_k=40, top_p=0.95), SamplingParams(0.7, min_p=0.05),
          SamplingParams(0.7, top_p=0.9, min_p=0.05), SamplingParams(1.3, top_k=3), SamplingParams(0.7, top_k=1)]


class Fixed:
    """A generator whose next uniform is given."""

    def __init__(self, u):
        self.u = u

    def random(self):
        return self.u


def rows(rng, n_vocab, kind):
    """Rows of logits [V] float32 shaped like a flat random-weight model, a spread one, or a trained model's
    (a few tokens far above the rest), with ties."""
    scale = {"flat": 0.5, "spread": 2.0, "peaked": 3.0}[kind]
    row = (rng.standard_normal(n_vocab) * scale).astype(np.float32)
    if kind == "peaked":
        row[rng.integers(n_vocab, size=5)] += rng.uniform(10, 18, size=5).astype(np.float32)
    row[rng.integers(n_vocab, size=4)] = row[rng.integers(n_vocab)]  # exact ties
    return row


def dense_of(law, n_vocab):
    return rule.dense([law], [law.token if isinstance(law, laws.OneHot) else 0], n_vocab)[0]


@pytest.mark.parametrize("n_vocab", [7, 300, 5000, 40000, 152064])
@pytest.mark.parametrize("kind", ["flat", "spread", "peaked"])
def test_laws_give_the_reference_token_for_the_same_uniform(n_vocab, kind):
    rng = np.random.default_rng(n_vocab)
    differ, draws = [], 0
    for params in PARAMS:
        for _ in range(2):
            row = rows(rng, n_vocab, kind)
            ref = to_probs(row, params)  # [V] float64
            law = laws.law(row, params)
            np.testing.assert_allclose(dense_of(law, n_vocab), ref, atol=2e-6)
            cdf = np.cumsum(ref)
            for u in rng.random(25):
                a, b = sample(ref, Fixed(u)), law.sample(Fixed(u))
                draws += 1
                if a != b:  # how far u was from the reference's step between the two tokens, relative
                    differ.append(abs(cdf[min(a, b)] - u * cdf[-1]) / cdf[-1])
    assert len(differ) <= draws // 200 and all(d < 1e-4 for d in differ), (differ, draws)


@pytest.mark.parametrize("n_vocab", [5, 152064])
def test_greedy_is_the_argmax_with_ties_to_the_lowest_id(n_vocab):
    rng = np.random.default_rng(0)
    for _ in range(20):
        row = rows(rng, n_vocab, "spread")
        row[[3, 1]] = row.max() + 1  # a tie at the top
        law = laws.law(row, SamplingParams(0))
        assert isinstance(law, laws.OneHot) and law.token == 1 == int(np.argmax(to_probs(row, SamplingParams(0))))
        assert law.sample(None) == 1  # nothing is drawn


def test_top_p_brackets_its_cut_when_the_sample_misleads_it(monkeypatch):
    """A sample of a handful of logits and a narrow band force the top-p search through its probes, its widening
    and its last resort; the kept set must still be the reference's."""
    rng = np.random.default_rng(1)
    monkeypatch.setattr(laws, "SAMPLE", 8)
    monkeypatch.setattr(laws, "_peaked_nucleus", lambda *args: None)  # the general search, on every row
    monkeypatch.setattr(laws, "_banded", lambda *args: None)  # ... past the band estimated from the sample
    for band in (16, 256, 10**9):
        monkeypatch.setattr(laws, "BAND", band)
        for kind in ("flat", "spread", "peaked"):
            for top_p in (0.3, 0.9, 0.99):
                row = rows(rng, 3000, kind)
                params = SamplingParams(0.8, top_p=top_p)
                np.testing.assert_array_equal(dense_of(laws.law(row, params), 3000) > 0, to_probs(row, params) > 0)


@pytest.mark.parametrize("n_vocab", [32000, 152064])
def test_top_p_deep_in_a_flat_row_sorts_one_band_and_keeps_the_reference_set(monkeypatch, n_vocab):
    """A random-weight model's flat rows keep most of the vocabulary: the cut is found in one band around the
    sample's estimate, and the kept set is the reference's, ties at the cut included (logits on a coarse grid)."""
    rng = np.random.default_rng(5)
    taken = []
    banded = laws._banded

    def counted(*args):
        sums = banded(*args)
        taken.append(sums is not None)
        return sums

    monkeypatch.setattr(laws, "_banded", counted)
    for scale, grid in ((0.5, 0.0), (1.0, 0.0), (2.0, 0.0), (1.0, 1 / 64)):
        row = rng.standard_normal(n_vocab).astype(np.float32) * scale
        if grid:
            row = np.round(row / grid).astype(np.float32) * grid  # many logits tie, at the cut too
        for top_p in (0.5, 0.9, 0.95, 0.99):
            params = SamplingParams(0.7, top_p=top_p)
            np.testing.assert_array_equal(dense_of(laws.law(row, params), n_vocab) > 0, to_probs(row, params) > 0)
    assert sum(taken) >= 0.75 * len(taken)  # the band held the cut on most rows


def test_top_p_leaves_a_row_it_cannot_bound_to_the_general_search():
    """A peaked head over a tail just out of its reach, with top-p set so that the tail's weight decides whether
    the cut takes the third token: the shortcut declines (its bound on the tail leaves two possible cuts) and
    the law is still the reference's. Where the tail cannot move the cut, the shortcut decides, as the reference."""
    n_vocab = 152064
    depth = np.log(n_vocab) + laws.DEPTH  # at temperature 1
    row = np.full(n_vocab, -depth - 1e-3, dtype=np.float32)
    row[:3] = [0.0, -0.1, -0.2]
    head = np.exp(row[:3].astype(np.float64))
    tail = (n_vocab - 3) * np.exp(-depth)
    top_p = float(head[:2].sum() / (head.sum() + tail / 2))  # reached by two tokens unless the tail weighs
    params = SamplingParams(1.0, top_p=top_p)
    assert laws._peaked_nucleus(row, row.max(), 1.0, top_p) is None
    np.testing.assert_array_equal(dense_of(laws.law(row, params), n_vocab) > 0, to_probs(row, params) > 0)
    assert (to_probs(row, params) > 0).sum() == 3  # the tail's weight took the third
    params = SamplingParams(1.0, top_p=0.9)  # a cut the tail's weight cannot move
    assert laws._peaked_nucleus(row, row.max(), 1.0, 0.9) is not None
    np.testing.assert_allclose(dense_of(laws.law(row, params), n_vocab), to_probs(row, params), atol=1e-9)


def test_top_k_takes_the_reference_set_also_with_ties_at_the_kth():
    rng = np.random.default_rng(2)
    for n_vocab, k in ((152064, 40), (152064, 3000), (1000, 40), (100, 99)):
        row = rows(rng, n_vocab, "spread")
        row[np.argsort(row)[-k - 3:-k + 2]] = np.sort(row)[-k]  # ties around the k-th largest
        ids = laws.law(row, SamplingParams(1.0, top_k=k)).ids
        np.testing.assert_array_equal(ids, np.flatnonzero(to_probs(row, SamplingParams(1.0, top_k=k)) > 0))


@pytest.mark.parametrize("draft_kind", ["none", "one-hot", "dense", "sparse"])
def test_residual_is_the_reference_residual(draft_kind):
    rng = np.random.default_rng(3)
    n_vocab = 5000
    for params in PARAMS:
        p_row, q_row = rows(rng, n_vocab, "spread"), rows(rng, n_vocab, "spread")
        p = laws.law(p_row, params)
        token = int(np.argmax(q_row))
        q = {"none": None, "one-hot": laws.OneHot(token), "dense": laws.law(q_row, SamplingParams(0.7)),
             "sparse": laws.law(q_row, SamplingParams(0.7, top_k=50))}[draft_kind]
        q_dense = rule.dense([q], [token], n_vocab)[0]
        expected = residual(to_probs(p_row, params), q_dense)
        np.testing.assert_allclose(dense_of(rule.residual(p, q, token, n_vocab), n_vocab), expected, atol=2e-6)


def test_verify_on_laws_takes_the_reference_steps():
    """Same generator, same rows: the same (accepted, token), round after round, for every kind of draft law."""
    rng_rows = np.random.default_rng(4)
    n_vocab, k = 64, 4
    for seed in range(300):
        params = PARAMS[seed % len(PARAMS)]
        target_logits = (rng_rows.standard_normal((k + 1, n_vocab)) * 2).astype(np.float32)
        draft_logits = target_logits[:k] + rng_rows.standard_normal((k, n_vocab)).astype(np.float32)
        draft_laws = [laws.law(row, params) for row in draft_logits]
        if seed % 3 == 0:
            draft_laws = None  # prompt lookup's proposals
        draw = np.random.default_rng(seed)
        tokens = [int(np.argmax(row)) if draft_laws is None else draft_laws[i].sample(draw)
                  for i, row in enumerate(draft_logits)]
        state = draw.bit_generator.state
        fast = rule.verify(rule.Rows(target_logits, params), rule.as_laws(draft_laws, k), tokens, n_vocab, draw)
        draw.bit_generator.state = state
        reference = verify(to_probs(target_logits, params), rule.dense(draft_laws, tokens, n_vocab),
                           np.array(tokens), draw)
        assert fast == reference, (seed, params)


def test_greedy_verify_on_laws_is_the_reference_outcome_without_draws():
    rng_rows = np.random.default_rng(6)
    greedy = SamplingParams(0)
    for _ in range(200):
        target_logits = rng_rows.standard_normal((4, 16)).astype(np.float32)
        tokens = [int(np.argmax(row)) if rng_rows.random() < 0.7 else int(rng_rows.integers(16))
                  for row in target_logits[:3]]
        draw = np.random.default_rng(0)
        fast = rule.verify(rule.Rows(target_logits, greedy), [None] * 3, tokens, 16, draw)
        assert draw.bit_generator.state == np.random.default_rng(0).bit_generator.state  # nothing drawn
        reference = verify(to_probs(target_logits, greedy), rule.dense(None, tokens, 16), np.array(tokens),
                           np.random.default_rng(0))
        assert fast == reference


@pytest.mark.parametrize("broken", [False, True])
def test_verify_on_laws_emits_the_target_law(monkeypatch, broken):
    """Monte Carlo over the first token, a dense draft and a one-hot one: the target's law; without the residual
    it is not."""
    if broken:
        monkeypatch.setattr(rule, "residual", target_instead_of_residual)
    rng = np.random.default_rng(7)
    target = [laws.Weights(None, row, 1.0) for row in TARGET]
    draws = []
    for i in range(20000):
        if i % 2:
            draft = [laws.Weights(None, row, 1.0) for row in DRAFT]
            tokens = [sample(row, rng) for row in DRAFT]
        else:
            draft, tokens = [None] * 3, [1, 3, 0]
        n_acc, token = rule.verify(target, draft, tokens, 4, rng)
        draws.append(tokens[0] if n_acc else token)
    p = goodness_of_fit(draws, {a: TARGET[0, a] for a in range(4)})
    assert (p < ALPHA) == broken, p


def test_ngram_index_answers_as_the_scan_does():
    rng = np.random.default_rng(5)
    for _ in range(300):
        n_vocab, length = int(rng.integers(2, 6)), int(rng.integers(1, 50))
        text = rng.integers(0, n_vocab, length).tolist()
        index, grown = NgramIndex(3, 1), []
        for token in text:
            grown.append(token)
            for k in (1, 4):
                assert index.lookup(grown, k) == lookup(np.array(grown), k, 3, 1)
        other = text[::-1]  # another text through the same index: indexed afresh
        assert index.lookup(other, 3) == lookup(np.array(other), 3, 3, 1)
        assert index.lookup(list(text), 2) == lookup(np.array(text), 2, 3, 1)  # a copy that extends nothing new
