"""The speculative loop on a table-driven fake backend: bookkeeping, stops, what it drafts (its output law:
laws/test_loop_laws.py)."""

import itertools

import numpy as np
import pytest
from fake import EOS, GREEDY, FakeBackend, Sources, controller, deterministic_table, random_table, run, tokens_of

from edgespec.decode.cost import DraftController
from edgespec.decode.loop import Stats, speculate
from edgespec.decode.sampling import SamplingParams
from edgespec.drafts.base import Drafter, ModelDrafter, PromptLookupDrafter
from edgespec.errors import EdgespecError

V = 6


CHAIN = {1: 2, 2: 3, 3: 4, 4: 5, 5: 1}  # 1 2 3 4 5 1 2 ... never EOS


def test_all_accepted_rounds_end_with_the_bonus_token():
    target = FakeBackend(deterministic_table(CHAIN, V))
    draft = FakeBackend(deterministic_table(CHAIN, V))
    events, stats = run(target, ModelDrafter(draft, target.vocab), [1], max_tokens=12, draft_max=3)
    assert tokens_of(events) == [2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    # every round: 3 drafts accepted + 1 bonus from the target
    assert stats.target_passes == 3 and stats.accept_counts == {3: 3} and stats.drafted == stats.accepted == 9
    assert [e.from_draft for e in events[:4]] == [True, True, True, False]
    assert target.calls[1:] == [(4, 4)] * 3  # verify passes of last token + 3 drafts, 4 logits rows


def test_rollback_keeps_target_cache_equal_to_committed_prefix():
    target = FakeBackend(deterministic_table(CHAIN, V))
    wrong = {**CHAIN, 3: 1}  # the draft goes wrong after token 3
    draft = FakeBackend(deterministic_table(wrong, V))
    prompt = [5, 1]
    stats = Stats()
    gen = speculate(target, ModelDrafter(draft, target.vocab), controller(), prompt, GREEDY,
                    np.random.default_rng(0), max_tokens=30, draft_max=4, stats=stats)
    committed = list(prompt)
    for event in gen:
        if event.token is None:
            continue
        committed.append(event.token)
        # the cache never holds a rejected token: it and the output agree on their common length
        n = min(len(target.tokens), len(committed))
        assert target.tokens[:n] == committed[:n]
    assert committed[2:] == list(itertools.islice(itertools.cycle([2, 3, 4, 5, 1]), 30))
    assert 0 < stats.acceptance_rate < 1
    assert target.tokens == committed[:-1]


def test_eos_inside_a_draft_ends_generation_without_emitting_it():
    chain = {1: 2, 2: 3, 3: EOS}
    target = FakeBackend(deterministic_table(chain, V))
    draft = FakeBackend(deterministic_table({**chain, EOS: 4}, V))
    events, stats = run(target, ModelDrafter(draft, target.vocab), [1], max_tokens=20, draft_max=5)
    assert tokens_of(events) == [2, 3]
    assert stats.finish_reason == "stop" and stats.generated == 2
    assert stats.end_token == EOS and stats.produced == 3  # the end token counted, as llama-server counts it
    assert stats.drafted == 3  # the draft stopped proposing at its own EOS


def test_max_tokens_caps_the_draft_of_the_last_round():
    target = FakeBackend(deterministic_table(CHAIN, V))
    draft = FakeBackend(deterministic_table(CHAIN, V))
    events, stats = run(target, ModelDrafter(draft, target.vocab), [1], max_tokens=6, draft_max=4)
    assert tokens_of(events) == [2, 3, 4, 5, 1, 2]
    assert stats.finish_reason == "length" and stats.produced == stats.generated == 6
    # round 1: 4 drafts + bonus = 5 tokens; round 2 has room for one token, so it drafts nothing
    assert target.calls[1:] == [(5, 5), (1, 1)]


def test_stop_string_inside_an_accepted_draft():
    target = FakeBackend(deterministic_table(CHAIN, V))
    draft = FakeBackend(deterministic_table(CHAIN, V))
    events, stats = run(target, ModelDrafter(draft, target.vocab), [1], max_tokens=20, draft_max=4, stop=["de"])
    assert "".join(e.text for e in events) == "c" and stats.finish_reason == "stop"
    assert stats.accepted == 4  # the round was accepted whole; the stop string cut it


def test_stop_string_ends_generation_and_is_not_printed():
    target = FakeBackend(deterministic_table(CHAIN, V))
    events, stats = run(target, None, [1], max_tokens=20, stop=["de"])  # tokens 2, 3, 4 print c, d, e
    assert "".join(e.text for e in events) == "c"
    assert stats.finish_reason == "stop"


def test_context_full_ends_with_a_stated_reason():
    target = FakeBackend(deterministic_table(CHAIN, V), n_ctx=10)
    draft = FakeBackend(deterministic_table(CHAIN, V), n_ctx=10)
    events, stats = run(target, ModelDrafter(draft, target.vocab), [1, 2, 3], max_tokens=50, draft_max=4)
    assert stats.finish_reason == "context" and len(tokens_of(events)) == 7


def test_prompt_longer_than_context_is_a_user_error():
    target = FakeBackend(deterministic_table(CHAIN, V), n_ctx=4)
    with pytest.raises(EdgespecError, match="context"):
        run(target, None, [1, 2, 3, 4, 5])


def test_prompt_lookup_proposes_the_continuation_of_the_last_ngram():
    target = FakeBackend(deterministic_table(CHAIN, V))
    events, stats = run(target, PromptLookupDrafter(V), [1, 2, 3, 4, 5, 1, 2], max_tokens=10, draft_max=4)
    assert tokens_of(events) == [3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    assert stats.acceptance_rate == 1.0


def test_seed_reproducibility():
    rng = np.random.default_rng(3)
    t_table, d_table = random_table(rng, V), random_table(rng, V)
    outs = []
    for _ in range(2):
        target, draft = FakeBackend(t_table), FakeBackend(d_table)
        events, _ = run(target, ModelDrafter(draft, target.vocab), [1], max_tokens=15, draft_max=3,
                        params=SamplingParams(temperature=1.0), seed=11)
        outs.append(tokens_of(events))
    assert outs[0] == outs[1]


def test_lookup_rounds_teach_the_controller_nothing_about_the_draft():
    """The draft model is wrong after token 3 and lookup is right: lookup rounds are free and always accepted,
    which must not make the draft model look cheap or good; its own rounds still count."""
    wrong = {**CHAIN, 3: 1}
    target = FakeBackend(deterministic_table(CHAIN, V))
    draft = FakeBackend(deterministic_table(wrong, V))
    drafter = Sources(ModelDrafter(draft, target.vocab), V, min_ngram=2)
    ctl = controller()
    fitted = []  # the drafting rounds ctl learnt from: (drafts, draft seconds, draft steps)
    observe = ctl.observe

    def spy(n_drafted, n_accepted, draft_s, target_s, **kwargs):
        if n_drafted:
            fitted.append((n_drafted, draft_s, kwargs.get("draft_steps")))
        observe(n_drafted, n_accepted, draft_s, target_s, **kwargs)

    ctl.observe = spy
    ticks = itertools.count()  # a clock that moves 1 ms a reading: every timing the loop takes is the same each run
    stats = Stats()
    events = list(speculate(target, drafter, ctl, [1, 2], GREEDY, np.random.default_rng(0), max_tokens=30,
                            draft_max=3, stats=stats, clock=lambda: next(ticks) * 1e-3))
    assert tokens_of(events) == list(itertools.islice(itertools.cycle([3, 4, 5, 1, 2]), 30))
    assert drafter.rounds["inner"] >= 1 and drafter.rounds["lookup"] >= 5  # the text repeats after 5 tokens
    assert stats.lookup_drafted == 3 * drafter.rounds["lookup"] == stats.lookup_accepted  # lookup is always right
    assert stats.drafted - stats.lookup_drafted == 3 * drafter.rounds["inner"]
    # the draft model's rounds alone: 3 drafts, 2 or fewer accepted (it breaks at 3); the prior is Beta(1, 1)
    inner_rounds = drafter.rounds["inner"]
    assert ctl.rejected > 1 and ctl.accepted < 1 + 3 * inner_rounds
    # the draft's cost was fitted to the draft model's rounds only: one fit each, 3 drafts each, and what it
    # ended at is what those rounds alone give
    assert len(fitted) == inner_rounds and all(n == 3 for n, _, _ in fitted)
    replay = controller()
    for n, draft_s, steps in fitted:
        replay.observe(n, 0, draft_s, 1.0, draft_steps=steps)
    assert (ctl.draft_start, ctl.draft_cost) == (replay.draft_start, replay.draft_cost)
    # the ticking clock's 1 ms readings pull the cost down from its 0.01 prior: no further than as many rounds
    # that took no time at all (every further one would pull it lower)
    instant = controller()
    for _ in range(inner_rounds):
        instant.observe(3, 2, 0.0, 1.0)
    assert ctl.draft_cost >= instant.draft_cost > 0
    # the draft model did not read every round: it caught up only for the rounds it drafted
    assert len([c for c in draft.calls if c[0] > 1]) <= inner_rounds + 1
    # lookup's rounds taught lookup's controller, which shares the target's pass costs
    lookup = ctl.lookup_rounds()
    assert lookup.target_costs is ctl.target_costs and lookup.alpha > 0.8 and lookup.draft_cost < 0.01


def test_lookup_drafts_where_the_draft_model_would_not_pay():
    """A draft model far slower than the target is never asked (its controller chooses k = 0), but where the text
    repeats, prompt lookup in front of it drafts by its own controller: free drafts, all accepted here."""
    target = FakeBackend(deterministic_table(CHAIN, V))
    draft = FakeBackend(deterministic_table(CHAIN, V))
    drafter = Sources(ModelDrafter(draft, target.vocab), V, min_ngram=2)
    slow = DraftController({n: 1.0 for n in range(1, 17)}, draft_cost=100.0, k_max=4)
    stats = Stats()
    events = list(speculate(target, drafter, slow, [1, 2, 3, 4, 5, 1, 2], GREEDY, np.random.default_rng(0),
                            max_tokens=40, stats=stats))
    assert tokens_of(events) == list(itertools.islice(itertools.cycle([3, 4, 5, 1, 2]), 40))
    assert drafter.rounds == {"lookup": drafter.rounds["lookup"]} and stats.lookup_drafted == stats.drafted > 20
    assert stats.accepted == stats.drafted and max(stats.draft_lengths) == 4  # lookup's controller went to k_max


def test_a_declined_draft_model_reads_the_text_only_when_it_probes():
    """Where the controller would not draft, the draft model skips the prompt at prefill and reads the text only
    for a probe round (then all it missed, at once); where it would draft, it reads the prompt at prefill."""
    target = FakeBackend(deterministic_table(CHAIN, V), n_ctx=1024)
    draft = FakeBackend(deterministic_table(CHAIN, V), n_ctx=1024)
    declining = DraftController({n: 1.0 + 0.6 * (n - 1) for n in range(1, 17)}, draft_cost=0.0, k_max=4,
                                accepted=0.0, rejected=50.0)
    declining.observe = lambda *args, **kwargs: None  # the fake's microsecond timings would rewrite the costs
    assert not declining.drafting() and declining.could_pay()
    prompt = [1, 2, 3]
    stats = Stats()
    events = list(speculate(target, ModelDrafter(draft, target.vocab), declining, prompt, GREEDY,
                            np.random.default_rng(0), max_tokens=20, stats=stats))
    assert draft.calls == [] and stats.drafted == 0 and len(events) == 20  # no probe within 20 rounds
    stats = Stats()
    list(speculate(target, ModelDrafter(draft, target.vocab), declining, prompt, GREEDY, np.random.default_rng(0),
                   max_tokens=200, stats=stats))
    # the probe comes at 32 idle rounds, this run's 12th: its draft reads all it missed, the prompt and 11
    # tokens but the last (which its proposal reads), in one pass
    assert draft.calls[0] == (len(prompt) + 11 - 1, 0) and stats.drafted > 0
    drafting = DraftController({n: 1.0 for n in range(1, 17)}, draft_cost=0.0, k_max=4)
    draft = FakeBackend(deterministic_table(CHAIN, V), n_ctx=1024)
    assert drafting.drafting()
    list(speculate(target, ModelDrafter(draft, target.vocab), drafting, prompt, GREEDY, np.random.default_rng(0),
                   max_tokens=4))
    assert draft.calls[0] == (len(prompt) - 1, 0)  # at prefill


class AheadBackend(FakeBackend):
    """A FakeBackend that can start a one-row pass before the caller needs it (llama.cpp on a GPU): its calls log
    such a pass as ("ahead", tokens, rows)."""

    def prefetch(self, tokens):
        self.ahead = self.forward(tokens, 1)
        self.calls[-1] = ("ahead", *self.calls[-1])
        return True

    def collect(self):
        return self.ahead


class AskedController(DraftController):
    """Counts the rounds it is asked to choose for; learns nothing from the fake's microsecond timings, which would
    rewrite its costs."""

    asked = 0

    def choose(self):
        self.asked += 1
        return super().choose()

    def observe(self, *args, **kwargs):
        pass


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=1.0)], ids=["greedy", "t=1"])
def test_a_declined_draft_leaves_the_target_as_target_only_decoding(params):
    """A draft the controller declines costs the target nothing: the same passes as target-only decoding, each but
    the first started before the token before it is handed out; a draft model gets no call (no keeping up with the
    text) and the controller chooses once a round for it; the output is the same."""
    costs = {1: 1.0, **{n: 1.05 * n for n in range(2, 17)}}  # a pass of n tokens dearer than n passes: nothing pays
    table = random_table(np.random.default_rng(3), V, sharpness=2.0)
    table[:, EOS] = -30.0  # no early end
    runs = {}
    for way in ("target-only", "model", "lookup"):
        target = AheadBackend(table, n_ctx=1024)
        draft = FakeBackend(table, n_ctx=1024)
        drafter = {"target-only": None, "model": ModelDrafter(draft, target.vocab), "lookup": PromptLookupDrafter(V)}
        declining = AskedController(dict(costs), draft_cost=0.0 if way == "lookup" else 0.1, k_max=4)
        stats = Stats()
        events = list(speculate(target, drafter[way], declining if drafter[way] else None, [1, 2, 3], params,
                                np.random.default_rng(0), max_tokens=60, stats=stats))
        runs[way] = (tokens_of(events), target.calls, draft.calls, declining.asked, stats)
    base_tokens, base_calls, _, _, base_stats = runs["target-only"]
    assert len(base_tokens) == 60 and sum(call[0] == "ahead" for call in base_calls) == base_stats.target_passes - 1
    for way in ("model", "lookup"):
        tokens, calls, draft_calls, asked, stats = runs[way]
        assert stats.drafted == 0 and tokens == base_tokens and calls == base_calls
        assert draft_calls == [] and asked == (stats.target_passes if way == "model" else 0)  # lookup: what it found


def test_draft_with_a_short_context_reads_a_window_and_changes_nothing_in_the_output():
    rng = np.random.default_rng(5)
    table = random_table(rng, V, sharpness=4.0)
    target_only, _ = run(FakeBackend(table, n_ctx=400), None, [1, 2, 3], max_tokens=300)
    # same chain as the target, but a 40-token context: it must slide its window over the text (the
    # fake asserts it never overflows) and, since the chain depends on the last token only, still agree
    events, _ = run(FakeBackend(table, n_ctx=400), ModelDrafter(FakeBackend(table, n_ctx=40)), [1, 2, 3],
                    max_tokens=300, draft_max=4)
    assert tokens_of(events) == tokens_of(target_only)
    # sampled text does not repeat, so each jump of the window re-reads it: (40 - 16) / 2 = 12 tokens,
    # about once per 12 generated
    table = random_table(rng, 64, sharpness=1.0)
    table[:, EOS] = -30.0  # no early end
    draft = FakeBackend(table, n_ctx=40)
    _, stats = run(FakeBackend(table, n_ctx=400), ModelDrafter(draft), [1, 2, 3], max_tokens=300, draft_max=4,
                   params=SamplingParams(temperature=1.0))
    assert stats.acceptance_rate == 1.0
    rebuilds = [n for n, _ in draft.calls if n > 4]
    assert 15 <= len(rebuilds) <= 30 and max(rebuilds) == 11


def test_decode_time_is_live_while_streaming():
    """Apps show tokens/s as tokens arrive: the stats' decode time grows with each event, not only at the end."""
    target = FakeBackend(deterministic_table(CHAIN, 6))
    stats = Stats()
    events = speculate(target, None, None, [1], GREEDY, np.random.default_rng(0), max_tokens=5, stats=stats)
    seen = []
    for _ in events:
        seen.append(stats.decode_s)
    assert all(t > 0 for t in seen) and seen == sorted(seen) and stats.decode_s >= seen[-1]


class MarkovTreeDrafter(Drafter):
    """Drafts trees from a Markov table (a head's stand-in): the candidates at a node come from the table's row
    for the node's token, drawn as sampling.candidates draws them."""

    name, trees, branching = "markov-tree", True, True  # a node's row depends on its own token alone

    def __init__(self, table):
        self.table = np.asarray(table, dtype=np.float64)

    def propose_tree(self, context, shape, params, rng):
        from edgespec.drafts.base import grow_tree

        return grow_tree(shape, lambda path: self.table[path[-1] if path else context[-1]], params, rng,
                         self.table.shape[0])

    def propose(self, context, k, params, rng):  # a chain: the tree one wide (row i: the law of token i)
        from edgespec.decode.shape import TreeShape

        tree = self.propose_tree(context, TreeShape.chain(k), params, rng)
        return tree.tokens, tree.probs[:k]


def run_tree(target, drafter, prompt, *, width, max_tokens=20, draft_max=3, params=GREEDY, seed=0):
    stats = Stats()
    events = list(speculate(target, drafter, controller(), prompt, params, np.random.default_rng(seed),
                            max_tokens=max_tokens, draft_max=draft_max, stats=stats, tree_width=width))
    return events, stats


def test_greedy_tree_accepts_the_target_choice_among_the_siblings():
    """The draft's first choice is always wrong and its second always right: a chain accepts nothing, a
    tree 2 wide accepts every depth through the siblings and the cache keeps the accepted branch."""
    t_table = deterministic_table(CHAIN, V)
    wrong = {a: (b % 5) + 1 for a, b in CHAIN.items()}  # the token after the right one
    d_table = np.full((V, V), -30.0)
    for a in range(V):
        d_table[a, wrong.get(a, 1)] = 30.0
        d_table[a, CHAIN.get(a, 1)] = 20.0
    chain_out, chain_stats = run_tree(FakeBackend(t_table), MarkovTreeDrafter(d_table), [1], width=1)
    target = FakeBackend(t_table)
    tree_out, tree_stats = run_tree(target, MarkovTreeDrafter(d_table), [1], width=2)
    expected = [CHAIN[1]]
    while len(expected) < 20:
        expected.append(CHAIN[expected[-1]])
    assert tokens_of(tree_out) == tokens_of(chain_out) == expected
    assert chain_stats.accepted == 0 and chain_stats.tree_nodes == 0
    # a sibling accepted at depth 1 is a leaf: the round ends there with the target's token after it
    assert tree_stats.accept_counts == {1: tree_stats.target_passes} and tree_stats.generated == 20
    assert tree_stats.tree_nodes == 2 * tree_stats.drafted
    assert target.tokens == [1, *expected][:len(target.tokens)]


def test_token_acceptance_counts_only_the_drafts_the_verifier_judged():
    """A draft wrong after every 3 (the cycle 1 2 3 4 5): each chain of 7 from 4 is judged up to its wrong fifth
    draft and the two after it are drafted but never judged; the last round, cut to the 2 drafts the length
    leaves, is all accepted. acceptance_rate counts the unjudged drafts, token_acceptance not."""
    target = FakeBackend(deterministic_table(CHAIN, V))
    draft = FakeBackend(deterministic_table({**CHAIN, 3: 1}, V))
    events, stats = run(target, ModelDrafter(draft, target.vocab), [4], max_tokens=18, draft_max=7)
    assert tokens_of(events) == list(itertools.islice(itertools.cycle([5, 1, 2, 3, 4]), 18))
    assert stats.draft_lengths == {7: 3, 2: 1} and stats.accept_counts == {4: 3, 2: 1} and stats.rejected == 3
    assert stats.acceptance_rate == pytest.approx(14 / 23) and stats.token_acceptance == pytest.approx(14 / 17)
    assert stats.to_dict()["token_acceptance"] == round(14 / 17, 4)


def test_a_declined_lookup_round_learns_its_shadow_score_while_the_next_pass_computes():
    """Prompt lookup's guess in a round it sat out is scored against the row in hand; the controller learns the
    pass's cost and the score, and lookup searches for the next round's guess, after the next round's pass has
    started (on a backend that starts passes ahead): the bookkeeping a declined draft brings runs while the device
    computes, as target-only decoding's text and consumer do."""
    order = []

    class Ahead(AheadBackend):
        def prefetch(self, tokens):
            order.append("pass started")
            return super().prefetch(tokens)

        def collect(self):
            order.append("row read")
            return super().collect()

    class Scored(DraftController):
        def observe(self, k, *args, **kwargs):
            order.append("cost learnt" if k == 0 else "drafted")
            super().observe(k, *args, **kwargs)

        def observe_shadow(self, p_accept):
            order.append("score learnt")
            super().observe_shadow(p_accept)

    table = np.full((V, V), -30.0)
    for a in range(V):
        table[a, (a + 1) % V] = 0.0  # a cycle over the vocabulary but EOS: lookup finds a guess once it repeats
    table[:, EOS] = -60.0
    declining = Scored({1: 1.0, **{n: 1.05 * n for n in range(2, 17)}}, draft_cost=0.0, k_max=4)
    lookup = PromptLookupDrafter(V)
    search = lookup._index._search
    lookup._index._search = lambda: order.append("searched") or search()
    stats = Stats()
    list(speculate(Ahead(table, n_ctx=1024), lookup, declining, [1, 2, 3], GREEDY, np.random.default_rng(0),
                   max_tokens=40, stats=stats))
    assert stats.drafted == 0 and order.count("score learnt") >= 20
    # each round reads its row, starts the next pass, then learns the pass's cost and the guess's score and searches
    # for the next round's guess (but the last, after which no pass comes)
    rounds = "/".join(order).split("row read/")[2:-1]
    assert len(rounds) >= 20 and set(rounds) <= {"pass started/cost learnt/score learnt/searched/",
                                                 "pass started/cost learnt/searched/"}


def test_a_draft_is_cut_after_its_end_of_generation_token():
    """Prompt lookup copies on past the end (the prompt holds 1 2 EOS 3 4) and the target agrees: the pass verifies
    the draft only up to the EOS, and the statistics count no token after the end as accepted."""
    chain = {1: 2, 2: EOS, EOS: 3, 3: 4}
    target = FakeBackend(deterministic_table(chain, V))
    events, stats = run(target, PromptLookupDrafter(V), [1, 2, EOS, 3, 4, 1], max_tokens=10, draft_max=4)
    assert tokens_of(events) == [2] and stats.finish_reason == "stop"
    assert stats.drafted == 2 and stats.accepted == 2  # 2 and EOS; not 3 and 4
    assert target.calls[-1] == (3, 3)  # the last token, 2 and EOS: three rows, not five
