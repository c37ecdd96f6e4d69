"""The draft-length controller on simulated devices (plan/sim.py): passes cost what a table says on a
virtual clock, so these speed comparisons are exact and the same on every machine, not wall-clock timings."""

import numpy as np
import pytest

from edgespec.decode.calibrate import measure_pass_costs, measure_read_cost
from edgespec.decode.cost import DraftController
from edgespec.decode.loop import Stats, speculate
from edgespec.decode.sampling import SamplingParams
from edgespec.decode.shape import RANK_SHARES, RankAcceptance
from edgespec.drafts.base import ModelDrafter, PromptLookupDrafter
from edgespec.plan.bound import tree_bound
from edgespec.plan.sim import (
    TARGET_TOP,
    Device,
    SimBackend,
    VirtualClock,
    copy_script,
    draft_picks,
    draft_ranks,
    pass_seconds,
    simulate,
)

# the H200 figures (3B f16 target; a 135M draft step 1.7 ms; a head step assumed at 0.35 ms) and its CPU
# whose 2-token pass costs twice a 1-token pass; benchmarks/controller_sim.py has these and more
H200 = Device("h200", {1: 3.29e-3, 2: 4.02e-3, 4: 4.30e-3, 5: 4.43e-3, 8: 4.92e-3}, draft_step=1.7e-3,
              draft_read=2e-5, head_token=0.35e-3)
CPU_2X = Device("cpu-2x", {1: 2e-3, 2: 4e-3}, draft_step=1e-3, draft_read=1e-3, head_token=0.2e-3)
# this CPU's f32 target and its Q4_0 draft (docs/results/2026-11-26-from-the-readme.md): reading a token the draft
# skipped costs a fifth of a target step
CPU_F32 = Device("cpu-f32", {1: 18.6e-3, 2: 25.9e-3, 4: 30.1e-3, 8: 42.7e-3}, draft_step=6.8e-3, draft_read=3.6e-3,
                 head_token=1.1e-3)


def test_a_pass_costs_what_the_table_says_interpolated_between_lengths_and_extrapolated_past_them():
    table = H200.target
    assert pass_seconds(table, 4) == table[4]
    assert pass_seconds(table, 3) == pytest.approx((table[2] + table[4]) / 2)
    assert pass_seconds(table, 10) == pytest.approx(table[8] + 2 * (table[8] - table[5]) / 3)
    assert pass_seconds(CPU_2X.target, 7) == pytest.approx(7 * CPU_2X.target[1])
    clock = VirtualClock()
    backend = SimBackend(np.arange(1, 100), 100, lambda n: pass_seconds(table, n), clock, top=TARGET_TOP, n_ctx=99)
    rows = backend.forward([1, 2, 3], 2)
    assert clock() == pytest.approx(pass_seconds(table, 3)) and rows.shape == (2, 100)
    assert list(rows.argmax(axis=1)) == [3, 4]  # the row at position i picks picks[i + 1]
    measured = measure_pass_costs(backend, 9, clock=clock)  # edgespec's own measurement reads the table back
    assert measured == pytest.approx({n: pass_seconds(table, n) for n in range(1, 10)})
    assert backend.tokens == []


def test_the_draft_model_reads_skipped_text_at_its_read_cost():
    clock = VirtualClock()
    draft = SimBackend(np.arange(1, 100), 100, lambda n: 1e-3 + (n - 1) * 2e-4, clock, top=0.5, n_ctx=99)
    assert measure_read_cost(draft, clock=clock) == pytest.approx(2e-4)


def judged_acceptance(draft: str, alpha: float, k: int) -> float:
    """Accepted over judged drafts with k drafts a round, over 2 answers of 512 tokens (greedy: the script)."""
    rng = np.random.default_rng(1)
    accepted = judged = 0
    for _ in range(2):
        script, n_prompt = copy_script(512, alpha, rng)
        n_vocab, clock = 2 * 512 + 3, VirtualClock()
        target = SimBackend(np.concatenate([script, np.ones(17, dtype=int)]), n_vocab, lambda n: 1e-3, clock,
                            top=TARGET_TOP, n_ctx=len(script) + 17)
        if draft == "lookup":
            drafter = PromptLookupDrafter(n_vocab)
        else:
            picks = draft_picks(script, n_prompt, alpha, n_vocab, rng)
            drafter = ModelDrafter(SimBackend(picks, n_vocab, lambda n: 1e-4, clock, top=0.5, n_ctx=len(picks)))
        stats = Stats()
        controller = DraftController({n: 1e-3 for n in range(1, 17)}, 1e-4, k_max=8)
        out = [e.token for e in speculate(target, drafter, controller, script[:n_prompt],
                                          SamplingParams(temperature=0), rng, max_tokens=512, draft_max=k,
                                          stats=stats, clock=clock)]
        assert out == script[n_prompt:]
        accepted, judged = accepted + stats.accepted, judged + stats.accepted + stats.rejected
    return accepted / judged


@pytest.mark.parametrize("draft", ["lookup", "model"])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.9])
def test_each_judged_draft_is_accepted_with_the_set_acceptance(draft, alpha):
    """Prompt lookup over copy_script and a draft model over draft_picks are right with probability alpha per
    judged token, at the first draft of a round and deeper in it alike (k = 4)."""
    assert judged_acceptance(draft, alpha, 4) == pytest.approx(alpha, abs=0.05)


@pytest.mark.parametrize("device", [H200, CPU_2X], ids=lambda d: d.name)
def test_prompt_lookup_left_to_the_controller_is_never_slower_where_it_is_never_right(device):
    """At acceptance 0 on the GPU's table (a 2-token pass 1.22x a 1-token pass) and the CPU's (2x), the controller
    keeps target-only speed within 3 %; virtual time, so this holds exactly, run after run."""
    target_only = simulate(device, "lookup", 0.0, draft_max=0, answers=2)
    controller = simulate(device, "lookup", 0.0, answers=2)
    assert controller.tokens_per_virtual_second >= 0.97 * target_only.tokens_per_virtual_second
    assert controller.drafting_rounds <= 0.02 * controller.rounds


@pytest.mark.parametrize("draft", ["model", "heads"])
@pytest.mark.parametrize("device", [H200, CPU_2X], ids=lambda d: d.name)
def test_a_draft_that_never_pays_costs_under_3_percent(device, draft):
    """A draft model or heads that are never right, or on a device where nothing pays (the 2x CPU), whatever the
    acceptance: within 3 % of target-only."""
    target_only = simulate(device, draft, 0.0, draft_max=0, answers=2)
    for alpha in (0.0, 0.9) if device is CPU_2X else (0.0,):
        drafting = simulate(device, draft, alpha, answers=2)
        assert drafting.tokens_per_virtual_second >= 0.97 * target_only.tokens_per_virtual_second


@pytest.mark.parametrize("draft", ["lookup", "model", "heads"])
def test_at_high_acceptance_the_controller_comes_within_10_percent_of_the_best_fixed_length(draft):
    target_only = simulate(H200, draft, 0.9, draft_max=0, answers=2).tokens_per_virtual_second
    best = max(simulate(H200, draft, 0.9, draft_max=k, answers=2).tokens_per_virtual_second for k in range(1, 9))
    controller = simulate(H200, draft, 0.9, answers=2).tokens_per_virtual_second
    assert best > 1.15 * target_only  # drafting pays here
    assert controller >= 0.9 * best


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_draft_model_that_must_read_what_it_skipped_is_not_probed_where_reading_costs_too_much(alpha):
    """On the CPU's f32 target a declined draft model that probed would first read every token it skipped (and the
    prompt), a fifth of a target step each: a fifth of the time it was declined. It is never probed there (it was,
    at 0.79x target-only), and a prompt is read at prefill only where drafting repays it."""
    target_only = simulate(CPU_F32, "model", alpha, draft_max=0, answers=2)
    controller = simulate(CPU_F32, "model", alpha, answers=2)
    assert controller.tokens_per_virtual_second >= 0.97 * target_only.tokens_per_virtual_second


def test_the_simulation_is_deterministic():
    assert simulate(H200, "model", 0.6, answers=1) == simulate(H200, "model", 0.6, answers=1)


def test_prompt_lookup_right_in_runs_drafts_inside_the_runs():
    """Where text repeats itself lookup is right in runs (copy_script's burst): at 0.3 acceptance overall on the
    GPU's table no fixed length beats target-only by much, but drafting after a kept guess and not after a rejected
    one does (virtual time: exact)."""
    target_only = simulate(H200, "lookup", 0.3, draft_max=0, answers=2, burst=0.85).tokens_per_virtual_second
    best = max(simulate(H200, "lookup", 0.3, draft_max=k, answers=2, burst=0.85).tokens_per_virtual_second
               for k in range(1, 9))
    controller = simulate(H200, "lookup", 0.3, answers=2, burst=0.85).tokens_per_virtual_second
    assert best < 1.05 * target_only and controller >= 1.1 * target_only


# an H200's measured passes of Qwen2.5-1.5B's widths at f16, 1 to 16 tokens (benchmarks/controller_sim.py,
# h200-1.5b-f16), a head step at 0.05 of a one-row pass
H200_15 = Device("h200-1.5b", {n: ms / 1e3 for n, ms in enumerate(
    (2.673, 3.261, 3.457, 3.455, 3.574, 3.622, 3.675, 3.722, 3.86, 3.879, 4.185, 4.201, 4.218, 4.284, 4.271, 4.333),
    start=1)}, draft_step=1.495e-3, draft_read=6.5e-5, head_token=0.134e-3)


def test_trees_on_flat_passes_beat_the_chain_and_reach_the_tree_bound():
    """Heads with three guesses a node on the H200's flat passes, acceptance 0.8: the planned trees beat the
    chain controller on the same texts (4 answers) by more than 2 %, and come within 3 % of the tree bound from
    the same table (virtual time: exact; 2.485x, the chain 2.379x, the bound 2.493x when written)."""
    target_only = simulate(H200_15, "heads", 0.8, draft_max=0).tokens_per_virtual_second
    chain = simulate(H200_15, "heads", 0.8).tokens_per_virtual_second
    trees = simulate(H200_15, "heads", 0.8, tree_width=3).tokens_per_virtual_second
    costs = {n: pass_seconds(H200_15.target, n) for n in range(1, 17)}
    bound = tree_bound(costs, 0.0, H200_15.head_token, RankAcceptance().kept(0.8), width=3, max_nodes=15,
                       max_depth=8)
    assert trees > 1.02 * chain  # virtual seconds from the device's table: the same on any machine, however busy
    assert trees / target_only >= 0.97 * bound.speedup


@pytest.mark.parametrize("alpha", [0.3, 0.9])
def test_trees_where_rows_are_dear_stay_as_fast_as_chains(alpha):
    """On the CPU whose 2-token pass costs two 1-token passes nothing pays (trees never lose to target-only);
    on the f32 CPU, where each row adds a third of a pass, the planned trees are no slower than chains."""
    target_only = simulate(CPU_2X, "heads", alpha, draft_max=0, answers=2).tokens_per_virtual_second
    assert simulate(CPU_2X, "heads", alpha, answers=2, tree_width=3).tokens_per_virtual_second >= 0.97 * target_only
    chain = simulate(CPU_F32, "heads", alpha, answers=2).tokens_per_virtual_second
    assert simulate(CPU_F32, "heads", alpha, answers=2, tree_width=3).tokens_per_virtual_second >= 0.97 * chain


def test_a_drafts_later_guesses_hold_what_the_first_missed_at_the_reference_shares():
    rng = np.random.default_rng(0)
    script = rng.integers(1, 500, 20000).tolist()
    ranks = draft_ranks(script, 10, 0.8, 501, np.random.default_rng(1), 3)
    assert np.array_equal(ranks[:, 0], draft_picks(script, 10, 0.8, 501, np.random.default_rng(1)))
    assert all(len(set(row)) == 3 and 0 not in row for row in ranks.tolist())  # distinct guesses, never EOS
    body, truth = ranks[10:len(script)], np.asarray(script[10:])
    missed = body[:, 0] != truth
    shares = [(body[missed, r] == truth[missed]).mean() for r in (1, 2)]
    assert shares == pytest.approx(list(RANK_SHARES[:2]), abs=0.02)
