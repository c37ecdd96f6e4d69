import pytest

from edgespec.runtime.cost import PROBE_EVERY, DraftController, expected_tokens, measure_pass_costs


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def costs(per_extra_token):
    """A verify pass of n tokens costs 1 + per_extra_token * (n - 1) units."""
    return {n: 1.0 + per_extra_token * (n - 1) for n in range(1, 17)}


def controller_with(alpha, per_extra_token, draft_cost=0.0, rounds=200):
    c = DraftController(costs(per_extra_token), draft_cost, k_max=8)
    for _ in range(rounds):  # feed rounds of 4 drafts with the given acceptance pattern
        n_acc = 4 if alpha == 1 else round(alpha * 4)
        c.observe(4, n_acc, 4 * draft_cost, c.target_costs[5])
    return c


def test_cheap_verify_and_high_acceptance_drafts_long():
    assert controller_with(1.0, 0.05).choose() == 8


def test_expensive_verify_and_low_acceptance_does_not_draft():
    assert controller_with(0.25, 0.6).choose() == 0


def test_costly_draft_model_shortens_the_draft():
    cheap = controller_with(0.75, 0.1, draft_cost=0.01).choose()
    costly = controller_with(0.75, 0.1, draft_cost=0.5).choose()
    assert cheap > costly >= 0


def test_idle_controller_probes_acceptance_now_and_then():
    c = controller_with(0.0, 0.6)
    choices = [c.choose() for _ in range(PROBE_EVERY * 3)]
    assert choices.count(1) == 3 and choices.count(0) == PROBE_EVERY * 3 - 3


def test_acceptance_estimate_is_accepted_over_accepted_plus_rejections():
    c = DraftController(costs(0.1), 0.0, k_max=4, accepted=0.0, rejected=0.0)
    c.observe(4, 2, 0.0, 1.0)  # two accepted, then one rejection
    c.observe(4, 4, 0.0, 1.0)  # four accepted, no rejection
    assert c.alpha == pytest.approx((0.97 * 2 + 4) / (0.97 * 2 + 4 + 0.97))


def test_measure_pass_costs_times_each_length_and_empties_the_cache():
    import numpy as np
    from fake import FakeBackend, random_table

    backend = FakeBackend(random_table(np.random.default_rng(0), 8))
    measured = measure_pass_costs(backend, 5, reps=2)
    assert sorted(measured) == [1, 2, 3, 4, 5] and all(t >= 0 for t in measured.values())
    assert backend.tokens == []
    assert (5, 5) in backend.calls


def test_a_draft_too_slow_to_ever_pay_is_not_probed():
    c = controller_with(0.9, 0.6, draft_cost=2.0)  # a draft step costs twice a target step
    assert not c.could_pay()
    assert [c.choose() for _ in range(PROBE_EVERY * 3)] == [0] * (PROBE_EVERY * 3)
