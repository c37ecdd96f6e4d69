"""doctor's self-test passes the rule and fails a broken one."""

import numpy as np
import pytest
from stats_util import target_instead_of_residual

from edgespec import doctor
from edgespec.decode import rule
from edgespec.decode.sampling import SamplingParams


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_p=0.95)])
@pytest.mark.parametrize("broken", [False, True])
def test_self_test_passes_the_rule_and_fails_a_broken_one(monkeypatch, broken, params):
    """The self-test runs the loop's rule on float32 rows of a real vocabulary, as a target hands them over, and
    catches a rule that draws from the target's law instead of the residual."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 49152)).astype(np.float32)  # [3, V]: the draft's row, then the target's two
    logits[:, rng.choice(49152, 30, replace=False)] += rng.uniform(4, 9, size=(3, 30)).astype(np.float32)
    if broken:
        monkeypatch.setattr(rule, "residual", target_instead_of_residual)
    result = doctor.rule_selftest(logits[1:], logits[0], params, np.random.default_rng(1), 20000)
    assert result["ok"] != broken and (result["p_value"] < doctor.ALPHA) == broken, result
