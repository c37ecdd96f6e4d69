"""advise's predicted acceptance against the loop's, many answers on a fake pair."""

import pytest
from fake import FakeBackend, controller
from test_advise import UNIT_COSTS, table

from edgespec.api import Engine
from edgespec.decode.sampling import SamplingParams
from edgespec.drafts.base import ModelDrafter
from edgespec.plan import advise


def test_predicted_acceptance_at_a_temperature_matches_the_loop():
    """At temperature 1 the walk accepts each depth with the probability the rule has there; its predicted
    acceptance is the loop's measured one (many answers on a fake pair), for each draft length."""
    target = FakeBackend(table(0, 1.0))
    engine = Engine(target, ModelDrafter(FakeBackend(table(0, 1.0) + table(1, 0.7)), target.vocab), controller())
    params = SamplingParams(temperature=1.0)
    prompts = [{"cat": "x", "prompt": "abcd"[i % 4]} for i in range(300)]
    answers = advise.calibrate(engine, {"d": engine.drafter}, prompts, params=params, k_max=3, max_tokens=20)["d"]
    for k in (1, 3):
        predicted = advise.predict(answers, UNIT_COSTS, k_max=3, max_tokens=20, greedy=False)["draft_lengths"][k]
        drafted = accepted = 0
        for i, row in enumerate(prompts):
            s = engine.generate(row["prompt"], max_tokens=20, draft_max=k, temperature=1.0, seed=10_000 + i).stats
            drafted, accepted = drafted + s.drafted, accepted + s.accepted
        assert predicted["acceptance"] == pytest.approx(accepted / drafted, abs=0.03), k
        assert 0.3 < predicted["acceptance"] < 0.9  # neither trivial nor hopeless: the test can tell
        assert predicted["acceptance_t0"] != predicted["acceptance"]
