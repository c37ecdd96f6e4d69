import itertools
import random

import pytest

from edgespec.decode.calibrate import measure_pass_costs
from edgespec.decode.cost import (
    BIN_DECAY,
    CONFIDENCE_BINS,
    EXPLORE_EVIDENCE,
    PROBE_EVERY,
    PROBE_MAX,
    PROBE_READ_MAX,
    REPAY_ROUNDS,
    DraftController,
    expected_tokens,
)


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def costs(per_extra_token):
    """A verify pass of n tokens costs 1 + per_extra_token * (n - 1) units."""
    return {n: 1.0 + per_extra_token * (n - 1) for n in range(1, 17)}


def controller_with(alpha, per_extra_token, draft_cost=0.0, rounds=200):
    c = DraftController(costs(per_extra_token), draft_cost, k_max=8)
    rng = random.Random(0)
    for _ in range(rounds):  # feed rounds of 4 drafts, each kept with probability alpha once those before it were
        n_acc = next((i for i in range(4) if rng.random() >= alpha), 4)
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


def probes(choices):
    """Rounds since the start (1-based) at which the controller chose a draft length of 1."""
    return [i + 1 for i, k in enumerate(choices) if k == 1]


def test_idle_controller_probes_acceptance_ever_more_rarely():
    """Probes that find nothing double the wait up to PROBE_MAX: a declined draft model reads the text it
    missed only when it probes."""
    c = controller_with(0.0, 0.6)
    assert not c.drafting()
    choices = [c.choose() for _ in range(1000)]
    gaps = [PROBE_EVERY, 2 * PROBE_EVERY, 4 * PROBE_EVERY, PROBE_MAX, PROBE_MAX, PROBE_MAX]  # 32, 64, ..., 256
    assert PROBE_MAX == 8 * PROBE_EVERY and probes(choices) == list(itertools.accumulate(gaps))
    assert set(choices) == {0, 1}


def test_a_probe_that_brings_drafting_back_resets_the_wait():
    c = controller_with(0.0, 0.6)
    first = probes([c.choose() for _ in range(PROBE_EVERY * 3)])  # probes after 32 and 64 more idle rounds
    assert first == [PROBE_EVERY, PROBE_EVERY * 3]
    for _ in range(60):  # the text turned easy: drafts are accepted
        c.observe(4, 4, 0.0, c.target_costs[5])
    assert c.drafting() and c.choose() > 1
    for _ in range(60):  # and hard again
        c.observe(4, 0, 0.0, c.target_costs[5])
    assert probes([c.choose() for _ in range(PROBE_EVERY)]) == [PROBE_EVERY]  # back to the first wait


def test_a_free_draft_scored_in_idle_rounds_is_never_probed():
    """Prompt lookup's guesses are scored against the target row every round it does not draft: that is the
    evidence a probe would bring, for nothing."""
    c = controller_with(0.0, 0.6)
    choices = []
    for _ in range(PROBE_EVERY * 4):
        choices.append(c.choose())
        c.observe_shadow(0.0)
    assert choices == [0] * (PROBE_EVERY * 4)


def test_no_probe_where_reading_the_skipped_text_costs_more_than_a_share_of_a_target_step():
    """A declined draft model reads every token it skipped before a probe: at a fifth of a target step a token
    (a draft model on a CPU), that alone costs a fifth of the time it was declined, however rare the probes."""
    cheap, dear = controller_with(0.0, 0.6), controller_with(0.0, 0.6)
    cheap.read_cost = 0.5 * PROBE_READ_MAX * cheap.target_costs[1]
    dear.read_cost = 2 * PROBE_READ_MAX * dear.target_costs[1]
    assert probes([cheap.choose() for _ in range(PROBE_EVERY)]) == [PROBE_EVERY]
    assert probes([dear.choose() for _ in range(PROBE_MAX * 4)]) == []


def test_drafting_resumes_after_idle_rounds_only_where_it_repays_reading_them():
    c = controller_with(0.0, 0.1, draft_cost=0.01)  # declined: nothing is accepted
    c.read_cost = 1.0  # a target step per token skipped
    for _ in range(1000):
        assert c.choose() == 0
    for _ in range(30):  # the text turns easy, as a free scorer might tell
        c.observe_shadow(1.0)
    k = c.best_k()
    assert k > 0 and c.read_cost * 1000 > REPAY_ROUNDS * c.saving(k)  # too many tokens skipped to repay soon
    assert c.choose() == 0
    c.read_cost = 0.0
    assert c.choose() == k


def test_a_draft_declined_on_one_hard_text_is_tried_again_on_the_next():
    """A draft model on a CPU is never probed once declined, so a hard first answer would otherwise bench it for
    good: each new text returns the estimate half way to the prior measured at load, where drafting pays."""
    c = DraftController(costs(0.1), 0.01, k_max=8, read_cost=0.05)  # reading a skipped token: 5 % of a step
    c.set_prior(0.8)
    assert c.begin(10) and c.best_k() > 0
    for _ in range(40):  # the first answer keeps nothing
        c.observe(2, 0, 0.02, c.target_costs[3])
    assert c.best_k() == 0 and [c.choose() for _ in range(2000)] == [0] * 2000
    before = (c.accepted, c.rejected)
    assert c.begin(10) and c.best_k() > 0 and c.choose() > 0  # the next answer drafts from the start
    # half of the earlier evidence kept: a draft that keeps failing is declined again within a few rounds
    assert (c.accepted, c.rejected) == pytest.approx(((before[0] + 6.4) / 2, (before[1] + 1.6) / 2))
    unprimed = controller_with(0.0, 0.1, draft_cost=0.01)  # no prior measured (prompt lookup): nothing to return to
    alpha = unprimed.alpha
    unprimed.begin(10)
    assert unprimed.alpha == alpha and unprimed.best_k() == 0


def test_a_draft_step_fitted_slow_on_one_text_is_timed_again_on_a_later_one():
    """The step cost is fitted only from rounds that draft: a few slow rounds (a process's first answer) that
    decline a draft model would fix its price for good. Each new text draws the fit part way back to the step
    timed at load, so a draft that pays drafts again within a few texts, and one that is slow is declined again
    within a few rounds of them. No clock here: the rounds' seconds are handed to the controller, in units of a
    one-token target pass (costs(...))."""
    load_step, slow_step = 0.1, 1.0  # a step as timed at load, and as the slow rounds took it
    c = DraftController(costs(0.02), load_step, k_max=8, read_cost=0.05)
    c.set_prior(0.8)
    assert c.begin(10) and c.choose() > 0

    def slow_round():
        c.observe(2, 2, 2 * slow_step, c.target_costs[3])

    for _ in range(3):
        slow_round()
    assert c.draft_cost > (load_step + slow_step) / 2  # fitted most of the way to the slow step
    assert c.best_k() == 0 and [c.choose() for _ in range(500)] == [0] * 500  # declined, and no probe comes
    texts = 0
    while not (c.begin(10) and c.choose() > 0):
        texts += 1
        assert texts < 6
    assert c.draft_cost < 0.7 * slow_step  # drawn back towards load_step
    declined_after = None
    for rounds in range(1, 20):  # the draft really is that slow now: the fit goes back up
        slow_round()
        if c.best_k() == 0:
            declined_after = rounds
            break
    assert declined_after is not None and declined_after <= 3


def test_a_gated_round_prices_a_draft_step_not_a_kept_token():
    """A gate that ends a chain has paid for the step whose token it did not keep, and prices that step itself
    (DraftGate.keep): the controller's draft cost stays a step's, or a hard text's short chains would read as a
    slower draft and count the unkept step twice."""
    per_step, per_token = DraftController(costs(0.1), 0.01, k_max=8), DraftController(costs(0.1), 0.01, k_max=8)
    for _ in range(60):  # each round: two steps of 0.01, one token kept
        per_step.observe(1, 1, 0.02, per_step.target_costs[2], draft_steps=2)
        per_token.observe(1, 1, 0.02, per_token.target_costs[2])
    assert per_step.draft_cost == pytest.approx(0.01) and per_step.draft_start == pytest.approx(0.0, abs=1e-9)
    assert per_token.drafting_cost(1) == pytest.approx(0.02, rel=0.05)  # one step a round, taking two steps' time
    gate = per_step.gate()
    judged = [gate.keep(0.95), gate.keep(0.05)]  # a sure token kept, an unsure one not
    assert judged == [True, False] and gate.steps == 2 and len(gate.confidences) == 1


def test_a_rounds_start_is_priced_apart_from_its_steps():
    """A draft's first step in a round costs more than the next (it reads what the last pass kept, its weights
    cold after the target's pass): fitted as a start and a step, the round costs what it took, and the
    controller drafts as far as that pays. Priced at the average step of the short chains it saw, every step
    would cost like a first one and the draft would stop at 2."""
    c = DraftController(costs(0.1), 0.1, k_max=8)
    rng = random.Random(0)
    for i in range(60):  # rounds of 1..3 steps: 0.3 to start, 0.1 a step
        k = 1 + i % 3
        n_acc = next((j for j in range(k) if rng.random() >= 0.75), k)
        c.observe(k, n_acc, 0.3 + 0.1 * k, c.target_costs[k + 1])
    for k in (1, 2, 3):
        assert c.drafting_cost(k) == pytest.approx(0.3 + 0.1 * k, rel=0.05)
    assert c.draft_start > 2 * c.draft_cost
    assert c.best_k() >= 3
    per_step = DraftController(costs(0.1), (0.4 + 0.5 + 0.6) / 6, k_max=8,  # the average step of those rounds
                               accepted=c.accepted, rejected=c.rejected, after_kept=c.after_kept,
                               after_rejected=c.after_rejected)
    assert per_step.best_k() <= 2


def test_a_prompt_is_read_at_prefill_only_where_drafting_would_repay_it():
    c = controller_with(0.75, 0.1, draft_cost=0.01)
    k = c.best_k()
    assert k > 0
    c.read_cost = 0.001
    assert c.begin(100) and c.choose() == k
    c.read_cost = 10 * REPAY_ROUNDS * c.saving(k) / 100
    assert not c.begin(100)  # the prompt stays unread, and the first rounds do not draft
    assert c.choose() == 0


def test_a_probe_keeps_its_first_draft_whatever_the_gate_calibration_says():
    """A gate whose calibration says no to every token would veto the probes that could change its mind: a probe's
    gate keeps its first token (the choice depends on no draw, so the output law is untouched)."""
    c = calibrated(0.0)  # no token pays
    c.accepted, c.rejected = 0.0, 50.0  # nor does drafting
    assert not c.gate().keep(0.95)
    choices = [c.choose() for _ in range(PROBE_EVERY)]
    assert choices[-1] == 1
    gate = c.gate()
    assert gate.keep(0.95) and not gate.go_on() and not gate.keep(0.95)
    assert c.choose() == 0 and not c.gate().keep(0.95)  # the next round is no probe


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


def calibrated(acceptance, per_extra_token=0.1, draft_cost=0.01):
    """A controller whose gate calibration says every confidence bin is accepted at `acceptance`."""
    c = DraftController(costs(per_extra_token), draft_cost, k_max=8)
    c.bin_accepted = [100 * acceptance] * CONFIDENCE_BINS
    c.bin_rejected = [100 * (1 - acceptance)] * CONFIDENCE_BINS
    return c


def test_the_gate_keeps_what_pays_and_ends_the_chain_where_it_stops_paying():
    # a row costs 0.1 of a pass: a token accepted 90 % of the time pays, one accepted 5 % does not
    gate = calibrated(0.9).gate()
    assert gate.keep(0.5) and gate.go_on() and gate.keep(0.5)
    assert gate.confidences == [0.5, 0.5] and gate.expected == pytest.approx(1 + 0.9 + 0.81)
    assert not calibrated(0.05).gate().keep(0.5)
    # deeper in the chain the chance that all before were accepted shrinks what a token adds: at 60 %
    # acceptance the gate keeps the first token and stops before the chain grows long
    gate = calibrated(0.6).gate()
    kept = 0
    while kept < 8 and gate.keep(0.5) and gate.go_on():
        kept += 1
    assert 1 <= kept < 8
    # where verify rows are dear (a row costs a whole pass), even a 90 % token does not pay for its row
    assert not calibrated(0.9, per_extra_token=1.0).gate().keep(0.9)


def test_the_gate_reads_acceptance_per_confidence_and_learns_it_from_verified_chains():
    c = DraftController(costs(0.1), 0.01, k_max=8)
    assert c.acceptance_at(0.95) > c.acceptance_at(0.55) > c.acceptance_at(0.05)  # prior: acceptance = confidence
    low, high = c.acceptance_at(0.05), c.acceptance_at(0.95)
    gate = c.gate()
    gate.confidences = [0.95, 0.95, 0.05, 0.05]  # four kept drafts
    for _ in range(20):  # the two sure ones accepted, the first unsure one rejected, the last never judged
        c.observe_gate(gate, n_drafted=4, n_accepted=2)
    assert c.acceptance_at(0.95) > high and c.acceptance_at(0.05) < low
    before = list(c.bin_accepted), list(c.bin_rejected)
    c.observe_gate(gate, n_drafted=1, n_accepted=1)  # a grammar cut the chain after its first draft
    assert c.bin_accepted[9] == pytest.approx(BIN_DECAY * before[0][9] + 1)
    assert c.bin_rejected[9] == pytest.approx(BIN_DECAY * before[1][9])
    assert (c.bin_accepted[0], c.bin_rejected[0]) == (before[0][0], before[1][0])  # nothing said of it


def test_with_no_runs_in_the_evidence_a_round_expects_eq_1():
    """Guesses kept and rejected independently leave the acceptance after a kept guess and after a rejected one at
    alpha: a round of k expects (1 - alpha^(k+1)) / (1 - alpha) tokens, as before runs were counted."""
    c = DraftController(costs(0.1), 0.0, k_max=8)
    assert [c.expected(k) for k in range(9)] == pytest.approx([expected_tokens(c.alpha, k) for k in range(9)])
    for kept in itertools.islice(itertools.cycle([1, 0, 1, 1, 0, 0]), 600):  # kept after kept as often as not
        c.observe_shadow(float(kept))
    assert c.expected(4) == pytest.approx(expected_tokens(c.alpha, 4), rel=0.05)


def test_guesses_right_in_runs_draft_after_a_kept_guess_and_stop_after_a_rejected_one():
    """Text that repeats itself makes prompt lookup right in runs (a shadow score of 1 after 1, 0 after 0) at one
    guess in five overall: independent acceptance of 0.2 would not pay for a round on this cost table, but the
    acceptance after a kept guess does, and the one after a rejected guess does not."""
    c = DraftController(costs(0.25), 0.0, k_max=8)
    for run in itertools.islice(itertools.cycle([[1.0] * 4, [0.0] * 16]), 40):
        for score in run:
            c.observe_shadow(score)
    assert c.alpha == pytest.approx(0.2, abs=0.05)
    assert all(expected_tokens(c.alpha, k) / c.verify_cost(k + 1) < 1 / c.verify_cost(1) for k in range(1, 9))
    c.observe_shadow(1.0)
    assert c.choose() >= 2  # inside a run: draft
    c.observe(c.choose(), 0, 0.0, c.verify_cost(2))  # the run ended at the first draft
    assert c.choose() == 0


def test_the_kept_survey_is_the_one_made_afresh_after_any_run_of_events():
    """The survey (and the costs part of it that shadow scores leave) is kept between the events that move what it
    read: after any sequence of rounds drafted and declined, shadow scores, new texts and priors, each choice
    equals a fresh controller's with the same state, which has kept nothing."""
    rng = random.Random(4)
    c = DraftController({n: 1.0 + 0.12 * (n - 1) for n in range(1, 17)}, draft_cost=0.05, k_max=8, read_cost=0.01)
    for _ in range(3000):
        event = rng.random()
        if event < 0.4:
            c.observe_shadow(rng.choice([0.0, 1.0, rng.random()]))
        elif event < 0.7:  # a declined round: the one-token cost moves
            c.observe(0, 0, 0.0, rng.uniform(0.8, 1.2))
        elif event < 0.95:
            k = rng.randint(1, 8)
            c.observe(k, rng.randint(0, k), rng.uniform(0.01, 0.5), rng.uniform(1.0, 3.0))
        elif event < 0.98:
            c.begin(rng.randint(1, 100))
        else:
            c.set_prior(rng.random())
        fresh = DraftController(dict(c.target_costs), c.draft_cost, c.k_max, read_cost=c.read_cost,
                                draft_start=c.draft_start, accepted=c.accepted, rejected=c.rejected,
                                after_kept=list(c.after_kept), after_rejected=list(c.after_rejected))
        fresh._last_kept, fresh._last_judged_now = c._last_kept, c._last_judged_now
        assert c._survey() == fresh._survey()
        n = rng.randint(0, 8)
        assert c.best_up_to(n) == fresh.best_up_to(n) and c.could_pay() == fresh.could_pay()


def test_a_rejection_followed_by_rounds_sat_out_does_not_decline_a_draft_model_for_the_rest_of_the_text():
    """The first guess after a rejection is priced as one (guesses come right in runs); once rounds were sat out
    with nothing judged, it is priced at the acceptance of any guess. An H200's 135M draft (a step 0.56 of a pass)
    at acceptance 0.9 pays after a kept guess and overall, not right after a rejection: priced so for good, it
    sat out 225 of 237 rounds of a text (benchmarks/controller_sim.py, h200-1.5b-f16)."""
    c = DraftController({n: 1.0 + 0.05 * (n - 1) for n in range(1, 10)}, draft_cost=0.56, k_max=8)
    c.set_prior(0.9)
    c.begin(0)
    c.after_kept, c.after_rejected = [19.0, 20.0], [3.0, 10.0]  # 0.95 after a kept guess, 0.3 after a rejected one
    assert c.choose() > 0
    c.observe(3, 0, 1.68, c.verify_cost(4))  # rejected at the first draft
    assert c.choose() == 0  # right after a rejection: the next guess is likely wrong too
    c.observe(0, 0, 0.0, c.verify_cost(1))  # a round sat out, nothing judged
    assert c.choose() > 0


def test_the_gate_looks_past_a_dear_first_row_to_the_chain_that_repays_it():
    """Where a pass of 2 rows costs almost what 9 do (a kernel for one row, another for several: 1.95x one row, then
    0.02 a row), one more token at acceptance 0.9 does not repay the second row (1.9 / 1.98 < 1 / 1.03), a chain
    of 8 does (6.1 tokens for 2.3 passes): the gate keeps going where the chain it leads to pays, not only the next
    token. A token at 0.4 repays no chain."""
    c = DraftController({1: 1.0, **{n: 1.95 + 0.02 * (n - 2) for n in range(2, 10)}}, 0.03, k_max=8)
    c.bin_accepted = [100 * 0.9] * CONFIDENCE_BINS
    c.bin_rejected = [100 * 0.1] * CONFIDENCE_BINS
    gate = c.gate()
    kept = 0
    while kept < 8 and gate.keep(0.95) and gate.go_on():
        kept += 1
    assert kept >= 6  # chains of 6-8 are the best for these costs (plan/bound.py)
    c.bin_accepted = [100 * 0.4] * CONFIDENCE_BINS
    c.bin_rejected = [100 * 0.6] * CONFIDENCE_BINS
    assert not c.gate().keep(0.95)


def test_the_gate_explores_a_confidence_it_has_never_seen_judged():
    """A calibration that says no to a confidence before any token of it was judged would never learn otherwise:
    the round's first token is kept while its bin has judged fewer than EXPLORE_EVIDENCE, and declined once the
    judged ones say it does not pay."""
    c = DraftController(costs(0.5), 0.01, k_max=8)  # a row costs half a pass: a token at the prior 0.55 does not pay
    assert c.unexplored(0.5) and c.gate().keep(0.5)
    gate = c.gate()
    gate.confidences = [0.5]
    for _ in range(int(EXPLORE_EVIDENCE) + 1):
        c.observe_gate(gate, n_drafted=1, n_accepted=0)
    assert not c.unexplored(0.5) and not c.gate().keep(0.5)


def test_pass_lengths_no_round_has_timed_move_with_the_ones_that_were():
    """Pass costs timed at load go stale as the host's load moves. Rounds of one length (2 tokens) that take twice
    their load time take every length no round has timed with them; a length timed since follows its own rounds,
    and one-token passes (every declined round) move nothing else."""
    c = DraftController(costs(0.2), 0.0, k_max=8)
    load = dict(c.target_costs)
    c.observe(3, 3, 0.0, load[4])  # a 4-token pass at its load price
    for _ in range(60):
        c.observe(1, 1, 0.0, 2 * load[2])
    assert c.verify_cost(2) == pytest.approx(2 * load[2], rel=1e-3)
    assert all(c.verify_cost(n) == pytest.approx(2 * load[n], rel=1e-3) for n in (3, 5, 9))
    assert c.verify_cost(4) == pytest.approx(load[4])  # timed: its own rounds decide
    for _ in range(60):
        c.observe(0, 0, 0.0, 3 * load[1])
    assert c.verify_cost(1) == pytest.approx(3 * load[1], rel=1e-3) and c.verify_cost(3) == pytest.approx(2 * load[3])
    c.set_pass_costs(load)  # priced from outside: every length untimed again
    c.observe(1, 1, 0.0, 1.2 * load[2])
    assert c.verify_cost(4) == pytest.approx(load[4] * c.verify_cost(2) / load[2])
