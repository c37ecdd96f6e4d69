"""The loop's output law is the target's: chains, trees, gates and lookup in front, each beside a broken rule."""

import numpy as np
import pytest
from fake import EOS, FakeBackend, Sources, random_table
from stats_util import check_target_law, law_runs, random_gates
from test_loop import MarkovTreeDrafter, V

from edgespec.decode.cost import CONFIDENCE_BINS, DraftController
from edgespec.decode.gate import DraftGate
from edgespec.decode.sampling import SamplingParams
from edgespec.drafts.base import ModelDrafter


@pytest.mark.parametrize("params, width, broken, gated", [(SamplingParams(temperature=1.0), 1, False, False),
                                                          (SamplingParams(temperature=0.7, top_k=4), 1, False, False),
                                                          (SamplingParams(temperature=1.0), 1, True, False),
                                                          (SamplingParams(temperature=1.0), 2, False, False),
                                                          (SamplingParams(temperature=0.7, top_k=4), 3, False, False),
                                                          (SamplingParams(temperature=1.0), 3, True, False),
                                                          (SamplingParams(temperature=1.0), 1, False, True),
                                                          (SamplingParams(temperature=0.7, top_k=4), 1, False, True),
                                                          (SamplingParams(temperature=1.0), 1, True, True)])
def test_speculative_sequences_follow_the_target_chain(monkeypatch, params, width, broken, gated):
    """Three tokens from the loop drafting from a different chain, as chains (a draft model, to a fixed length
    or as far as a gate lets it) or as trees 3 deep: their joint law is the target chain's; a wrong rule is
    caught."""
    rng = np.random.default_rng(5)
    t_table, d_table = random_table(rng, V, 1.5), random_table(rng, V, 1.5)
    t_table[:, EOS] = d_table[:, EOS] = -1e9
    target = FakeBackend(t_table)
    drafter = ModelDrafter(FakeBackend(d_table), target.vocab) if width == 1 else MarkovTreeDrafter(d_table)
    drafted = check_target_law(monkeypatch, target, drafter, t_table, params, width=width, broken=broken,
                               n_tokens=3, gate=random_gates() if gated else None)
    assert drafted > (2 * width if width > 1 else 1 / 2 if gated else 1)  # per answer (trees: tree nodes)


@pytest.mark.parametrize("params, broken", [(SamplingParams(temperature=1.0), False),
                                            (SamplingParams(temperature=0.7, top_k=4), False),
                                            (SamplingParams(temperature=1.0), True)])
def test_trees_in_the_planned_shapes_follow_the_target_chain(monkeypatch, params, broken):
    """Trees in the shapes the controller plans (decode/shape.py) from flat pass costs: up to 3 guesses a node, and
    later guesses with children of their own (the drafter branches). Three tokens' joint law is the target
    chain's; judging distinct candidates by the full draft law is caught."""
    rng = np.random.default_rng(5)
    t_table, d_table = random_table(rng, V, 1.5), random_table(rng, V, 1.5)
    t_table[:, EOS] = d_table[:, EOS] = -1e9
    shapes = []

    class Recorded(MarkovTreeDrafter):
        def propose_tree(self, context, shape, params, rng):
            shapes.append(shape)
            return super().propose_tree(context, shape, params, rng)

    drafted = check_target_law(monkeypatch, FakeBackend(t_table), Recorded(d_table), t_table, params, width=3,
                               broken=broken, n_tokens=3, draft_max=None)
    assert drafted > 6  # wide trees were drafted
    assert any(shape.parents[node] >= 0 and shape.ranks[shape.parents[node]] > 0
               for shape in shapes for node in range(shape.size))  # a later guess had children


@pytest.mark.parametrize("params, width, broken, draft_max", [(SamplingParams(temperature=1.0), 2, False, None),
                                                             (SamplingParams(temperature=0.7, top_k=4), 3, False, 3),
                                                             (SamplingParams(temperature=1.0), 3, True, None)])
def test_a_draft_models_trees_follow_the_target_chain(monkeypatch, params, width, broken, draft_max):
    """A draft model drafting trees (drafts/base.ModelDrafter.propose_tree: it steps along its first guesses, the
    later ones leaves), fixed or in the shapes planned from flat pass costs: three tokens' joint law is the target
    chain's; judging distinct candidates by the full draft law is caught."""
    rng = np.random.default_rng(5)
    t_table, d_table = random_table(rng, V, 1.5), random_table(rng, V, 1.5)
    t_table[:, EOS] = d_table[:, EOS] = -1e9
    target = FakeBackend(t_table)
    drafter = ModelDrafter(FakeBackend(d_table), target.vocab)
    drafted = check_target_law(monkeypatch, target, drafter, t_table, params, width=width, broken=broken,
                               n_tokens=3, draft_max=draft_max)
    assert drafted > 2 * width  # siblings were verified


def test_a_gate_that_judges_the_drawn_token_is_caught(monkeypatch):
    """The gate may end a chain on what the draft thought before drawing a token, never on the token drawn: a
    confidence that is the draft's probability of its own draw keeps likely draws more often than the draft
    law says, and the output law moves off the target's; the check above sees it."""
    from edgespec.drafts import base as drafts_module

    rng = np.random.default_rng(5)
    t_table, d_table = random_table(rng, V, 1.5), random_table(rng, V, 1.5)
    t_table[:, EOS] = d_table[:, EOS] = -1e9
    drawn = []

    def recorded(row_law, rng):
        drawn.append(row_law.sample(rng))
        return drawn[-1]

    def of_the_draw(logits):
        e = np.exp(logits - logits.max())
        return float(e[drawn[-1]] / e.sum())

    monkeypatch.setattr(drafts_module, "draw", recorded)
    monkeypatch.setattr(drafts_module, "confidence", of_the_draw)
    # costs and a calibration under which the real gate keeps drafts made at confidence 0.5 or more and only
    # those (a verify row costs a tenth of a pass; drafts below are accepted 5 % of the time, above 90 %)
    calibrated = DraftController({n: 1.0 + 0.1 * (n - 1) for n in range(1, 17)}, draft_cost=0.01, k_max=3)
    for b in range(CONFIDENCE_BINS):
        calibrated.bin_accepted[b], calibrated.bin_rejected[b] = (9.0, 1.0) if b >= CONFIDENCE_BINS // 2 else (0.5, 9.5)
    target = FakeBackend(t_table)
    check_target_law(monkeypatch, target, ModelDrafter(FakeBackend(d_table), target.vocab), t_table,
                     SamplingParams(temperature=1.0), width=1, broken=True, n_tokens=3,
                     gate=lambda _: DraftGate(calibrated))


@pytest.mark.parametrize("params, broken, gated", [(SamplingParams(temperature=1.0), False, False),
                                                   (SamplingParams(temperature=0.7, top_k=4), False, True),
                                                   (SamplingParams(temperature=1.0), True, False)])
def test_lookup_in_front_of_a_draft_model_keeps_the_target_chain(monkeypatch, params, broken, gated):
    """Four tokens from the loop drafting by prompt lookup where the text repeats and by a draft model elsewhere
    (ungated, and gated: lookup rounds ignore the gate): their joint law is the target chain's; a wrong rule
    is caught. Both sources drafted thousands of rounds."""
    rng = np.random.default_rng(5)
    t_table, d_table = random_table(rng, V, 1.5), random_table(rng, V, 1.5)
    t_table[:, EOS] = d_table[:, EOS] = -1e9
    target = FakeBackend(t_table)
    drafter = Sources(ModelDrafter(FakeBackend(d_table), target.vocab), V, min_ngram=1)
    check_target_law(monkeypatch, target, drafter, t_table, params, broken=broken, width=1, n_tokens=4,
                     gate=random_gates() if gated else None)
    assert min(drafter.rounds.values()) > law_runs(broken) / 3, drafter.rounds
