import itertools

import numpy as np
import pytest

from edgespec.decode import sampling
from edgespec.decode.sampling import SamplingParams, sample, to_probs
from edgespec.errors import EdgespecError

LOGITS = np.log(np.array([0.05, 0.4, 0.3, 0.15, 0.1]))


def test_greedy_is_one_hot_on_argmax():
    probs = to_probs(LOGITS, SamplingParams(temperature=0))
    assert probs.tolist() == [0, 1, 0, 0, 0]


def test_temperature_one_is_softmax():
    np.testing.assert_allclose(to_probs(LOGITS, SamplingParams(temperature=1)), np.exp(LOGITS), rtol=1e-12)


def test_temperature_sharpens():
    hot = to_probs(LOGITS, SamplingParams(temperature=2))
    cold = to_probs(LOGITS, SamplingParams(temperature=0.5))
    assert cold[1] > 0.4 > hot[1]


def test_top_k_keeps_k_largest():
    probs = to_probs(LOGITS, SamplingParams(temperature=1, top_k=2))
    np.testing.assert_allclose(probs, [0, 0.4 / 0.7, 0.3 / 0.7, 0, 0])


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = to_probs(LOGITS, SamplingParams(temperature=1, top_p=0.7))
    np.testing.assert_allclose(probs, [0, 0.4 / 0.7, 0.3 / 0.7, 0, 0])
    probs = to_probs(LOGITS, SamplingParams(temperature=1, top_p=0.71))
    np.testing.assert_allclose(probs, [0, 0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0])


def nucleus_by_definition(probs: np.ndarray, top_p: float, kept=None) -> np.ndarray:
    """The ids top-p keeps as the definition reads: the whole row sorted by falling probability, ties by id."""
    order = np.argsort(-probs, kind="stable")
    return order[:int(np.searchsorted(np.cumsum(probs[order]), top_p, side="left")) + 1]


@pytest.mark.parametrize("n_vocab", [200, 49152])
def test_top_p_on_wide_rows_keeps_the_prefix_of_the_whole_sorted_row(n_vocab, monkeypatch):
    """to_probs sorts only the likeliest ids where their mass reaches top_p: the same law as sorting the row, on
    peaked and flat rows, rows of many ties (at the cut too) and after top-k, whichever path it takes."""
    rng = np.random.default_rng(n_vocab)
    rows = [rng.normal(size=n_vocab) * 6, rng.normal(size=n_vocab) * 0.5, np.round(rng.normal(size=n_vocab) * 2),
            np.where(rng.random(n_vocab) < 0.001, 8.0, 0.0), rng.standard_t(2, size=n_vocab) * 3]
    settings = [SamplingParams(0.7, top_p=0.9), SamplingParams(1.0, top_k=40, top_p=0.95),
                SamplingParams(1.0, top_p=0.3), SamplingParams(1.3, top_k=1000, top_p=0.99)]
    laws = [to_probs(row, params) for row, params in itertools.product(rows, settings)]
    monkeypatch.setattr(sampling, "_nucleus", nucleus_by_definition)
    for law, (row, params) in zip(laws, itertools.product(rows, settings), strict=True):
        np.testing.assert_array_equal(law, to_probs(row, params))


def test_min_p_drops_tokens_below_fraction_of_max():
    probs = to_probs(LOGITS, SamplingParams(temperature=1, min_p=0.3))  # threshold 0.12
    np.testing.assert_allclose(probs, [0, 0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0])


def test_rows_are_processed_independently():
    batch = np.stack([LOGITS, LOGITS[::-1]])
    probs = to_probs(batch, SamplingParams(temperature=1, top_k=1))
    assert probs[0].argmax() == 1 and probs[1].argmax() == 3 and probs.sum(axis=1).tolist() == [1, 1]


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_k=-1), dict(top_p=0), dict(top_p=1.5),
                                    dict(min_p=1), dict(temperature=float("nan"))])
def test_invalid_params_raise_user_error(kwargs):
    with pytest.raises(EdgespecError):
        SamplingParams(**kwargs)


def test_sample_never_draws_zero_probability_tokens():
    rng = np.random.default_rng(0)
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    draws = {sample(probs, rng) for _ in range(2000)}
    assert draws == {1, 3}


def test_sample_frequencies_follow_probs():
    rng = np.random.default_rng(1)
    probs = np.array([0.1, 0.2, 0.7])
    counts = np.bincount([sample(probs, rng) for _ in range(20000)], minlength=3)
    np.testing.assert_allclose(counts / counts.sum(), probs, atol=0.015)
