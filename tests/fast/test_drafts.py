import numpy as np
import pytest
from fake import FakeBackend, make_vocab, random_table

from edgespec.backends.protocol import Vocab, check_compatible, common_prefix, sync
from edgespec.decode.cost import DraftController
from edgespec.decode.loop import draft_length
from edgespec.drafts.base import LookupFirstDrafter, ModelDrafter, PromptLookupDrafter
from edgespec.drafts.ngram import lookup
from edgespec.errors import EdgespecError


def test_lookup_prefers_the_longest_then_latest_match():
    ctx = np.array([1, 2, 3, 9, 9, 2, 3, 7, 5, 1, 2, 3])
    # suffix [1, 2, 3] occurs at 0 only -> continues with 9, 9
    assert lookup(ctx, 2, 3, 1) == [9, 9]
    ctx = np.array([4, 2, 3, 8, 6, 2, 3, 7, 6, 2, 3])
    # suffix trigram [6, 2, 3] latest earlier match at 4 -> 7, 6
    assert lookup(ctx, 2, 3, 1) == [7, 6]


def test_lookup_without_match_or_budget_proposes_nothing():
    assert lookup(np.array([1, 2, 3, 4]), 3, 3, 1) == []
    assert lookup(np.array([1, 2, 1, 2]), 0, 3, 1) == []
    assert lookup(np.array([5]), 3, 3, 1) == []


def test_lookup_repeats_a_period_that_reaches_the_end_of_the_context():
    """What followed a match that overlaps the suffix is the suffix's own continuation: the period repeats."""
    assert lookup(np.array([7, 8, 7]), 5, 3, 1) == [8, 7, 8, 7, 8]
    assert lookup(np.array([4, 5, 5, 5]), 6, 3, 1) == [5] * 6  # a model repeating one token
    assert lookup(np.array([1, 2, 3, 9, 1, 2, 3]), 6, 3, 1) == [9, 1, 2, 3, 9, 1]


def test_lookup_offers_what_it_found_and_nothing_where_that_does_not_pay():
    """The drafter offers the length of its match; the controller (draft_length, the one place a round's length is
    decided) prices the length it chooses up to that (k: a match always gives k, repeating its period), or none
    where no length is faster than the target alone; in front of a draft model, lookup's own controller
    (lookup_rounds) decides where lookup has a match, the draft model's where it has none."""
    costs = {1: 1.0, 2: 2.5, **{n: 2.5 + 0.1 * (n - 2) for n in range(3, 10)}}
    slow_costs = {n: 1.2 * n for n in range(1, 10)}  # a pass of n tokens costs 1.2 n: no length pays
    found, none = [3, 4, 5, 9, 3, 4, 5], [1, 2, 3]  # lookup finds [9, 3, 4, 5, 9, ...] and nothing
    first = LookupFirstDrafter(ModelDrafter(FakeBackend(random_table(np.random.default_rng(0), 16))), 16, min_ngram=1)
    lone = PromptLookupDrafter(16)
    assert (lone.offer(found, 5), lone.offer(none, 5), first.offer(found, 5), first.offer(none, 5)) == (5, 0, 5, None)
    for drafter in (lone, first):
        for pass_costs, k in ((costs, 8), (slow_costs, 0)):
            controller = DraftController(pass_costs, 0.0, k_max=8, accepted=100.0, rejected=0.01)  # all guesses kept
            lookup = controller.lookup_rounds()
            lookup.accepted, lookup.rejected = 100.0, 0.01
            assert draft_length(drafter, controller, found) == k
            assert draft_length(drafter, controller, found, draft_max=8) == 8  # a length the caller fixed
        sure = DraftController(costs, 0.0, k_max=8, accepted=100.0, rejected=0.01)
        assert draft_length(drafter, sure, none) == (0 if drafter.free else 8)  # the draft model's choice
        assert drafter.propose(found, 6, None, None)[0] == [9, 3, 4, 5, 9, 3]


def test_lookups_controller_shares_the_pass_costs_and_keeps_what_it_learnt_when_they_are_replaced():
    """A Parallel replaces a stream's pass costs whenever a stream begins or ends (set_pass_costs): lookup's
    controller prices by the new ones and keeps the acceptance it learnt."""
    controller = DraftController({n: 1.0 + 0.1 * n for n in range(1, 10)}, 0.0, k_max=8)
    lookup = controller.lookup_rounds()
    assert lookup.target_costs is controller.target_costs and lookup.draft_cost == 0.0
    lookup.observe(4, 4, 0.0, 1.4)
    accepted = lookup.accepted
    controller.set_pass_costs({n: 2.0 + 0.1 * n for n in range(1, 10)})
    assert controller.lookup_rounds() is lookup and lookup.target_costs is controller.target_costs
    assert lookup.accepted == accepted > 1.0


def test_common_prefix_and_sync_reuse_the_cache():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0
    backend = FakeBackend(random_table(np.random.default_rng(0), 8))
    sync(backend, [1, 2, 3, 4], 1)
    sync(backend, [1, 2, 3, 5, 6], 1)
    assert backend.tokens == [1, 2, 3, 5, 6] and backend.calls == [(4, 1), (2, 1)]
    sync(backend, [1, 2, 3, 5, 6], 1)  # all cached: the last token is re-run for its logits
    assert backend.calls[-1] == (1, 1)


def vocab_with(**changes):
    base = make_vocab(8)
    fields = dict(texts=base.texts, pieces=base.pieces, bos_id=base.bos_id, eos_id=base.eos_id, eog_ids=base.eog_ids)
    fields.update(changes)
    return Vocab(**fields)


@pytest.mark.parametrize("changes, message", [
    (dict(texts=make_vocab(8 + 129).texts, pieces=make_vocab(8 + 129).pieces), "137 tokens but the target's has 8"),
    (dict(bos_id=3), "bos_id is 3"),
    (dict(eos_id=3, eog_ids=frozenset([3])), "eos_id is 3"),
    (dict(eog_ids=frozenset([0, 5])), "end-of-generation"),
    (dict(texts=make_vocab(8).texts[:4] + (b"zz",) + make_vocab(8).texts[5:]), "draft token 4 is b'zz'"),
])
def test_mismatched_vocabularies_are_refused_naming_the_difference(changes, message):
    with pytest.raises(EdgespecError, match=message):
        check_compatible(make_vocab(8), vocab_with(**changes))
    draft = FakeBackend(random_table(np.random.default_rng(0), 8), vocab=vocab_with(**changes))
    with pytest.raises(EdgespecError):
        ModelDrafter(draft, make_vocab(8))
