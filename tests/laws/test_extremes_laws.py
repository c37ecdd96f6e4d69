"""The fast row passes are the reference on any row (hypothesis over extreme rows)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_extremes import HERE, check, on_path

from edgespec.decode import laws
from edgespec.decode.sampling import SamplingParams

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # an overflow or a nan on the way is a failure


# the search: rows of 1k-262k float32 logits with ties, extremes and masks, under every sampling combination
VOCABS = [1024, 4099, 32000, 49152, 151936, 152064, 262144]


TOPS = [0.0, 5.0, 29.9, 88.0, 1e3, 1e4, 3e38, -50.0, -1e4, -3e38]


@st.composite
def cases(draw):
    n_vocab = draw(st.sampled_from(VOCABS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    row = (rng.standard_normal(n_vocab) * draw(st.sampled_from([0.01, 0.5, 2.0, 10.0]))).astype(np.float32)
    temperature = draw(st.floats(0.05, 5.0))
    top = draw(st.sampled_from(TOPS + ["exp limit"]))
    if top == "exp limit":  # just under where exp(logit / temperature) leaves float32
        top = 88.0 * temperature * draw(st.floats(0.99, 1.0))
    row += np.float32(top)  # the whole row moved: its largest near top
    ties = draw(st.integers(0, 8))  # near-ties at the largest, in one block or spread
    gap = draw(st.sampled_from([0.0, 1e-3, 0.1]))
    spread = draw(st.booleans())
    at = rng.choice(n_vocab, ties, replace=False) if spread else (rng.integers(n_vocab - 8) + np.arange(ties))
    row[at] = np.float32(top) + np.float32(abs(top) * 1e-6 + 3.0) - gap * np.arange(ties, dtype=np.float32)
    masked = draw(st.sampled_from([0.0, 0.001, 0.5, 0.999]))  # share of ids masked with -inf
    if masked:
        row[rng.random(n_vocab) < masked] = -np.inf
        row[at[:1] if ties else rng.integers(n_vocab, size=1)] = np.float32(top)  # at least one id allowed
    if draw(st.booleans()):  # extremes among the rest: logits near float32's smallest and largest magnitude
        row[rng.integers(n_vocab, size=3)] = np.float32(-3.4e38)
    params = SamplingParams(temperature, top_k=draw(st.sampled_from([0, 0, 1, 40, 1000])),
                            top_p=draw(st.sampled_from([1.0, 1.0, 0.95, 0.5, 0.1])),
                            min_p=draw(st.sampled_from([0.0, 0.0, 0.05, 0.2])))
    return row, params, rng.random(20), draw(st.sampled_from(HERE))


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(cases())
def test_the_fast_path_is_the_reference_on_any_row(case):
    row, params, uniforms, path = case
    with on_path(path):
        check(row, params, uniforms)
        greedy = laws.law(row, SamplingParams(0.0))
    assert greedy.token == int(np.argmax(row.astype(np.float64)))
