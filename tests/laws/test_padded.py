"""Padded pairs: a draft whose vocabulary is the target's with up to VOCAB_PADDING ids more or fewer (Qwen2.5 0.5B's
151,936 tokens for 7B-72B's 152,064), on table-driven fakes. The real model's padded copies: real/test_real_model.py."""

import numpy as np
import pytest
from fake import EOS, GREEDY, FakeBackend, make_vocab, random_table, run, tokens_of
from stats_util import check_target_law

from edgespec.backends.padded import PaddedDraft
from edgespec.backends.protocol import VOCAB_PADDING, Vocab, check_compatible
from edgespec.decode.sampling import SamplingParams
from edgespec.drafts.base import ModelDrafter
from edgespec.errors import EdgespecError

T = 7  # the target's ids; drafts of T - 1 (lacking the last) and T + 1 (one the target lacks)


def test_a_vocabulary_padded_either_way_pairs_and_one_further_apart_does_not():
    target = make_vocab(T)
    assert check_compatible(target, make_vocab(T)) == "exact"
    assert check_compatible(target, make_vocab(T - 1)) == "padded" == check_compatible(target, make_vocab(T + 1))
    assert check_compatible(make_vocab(1000), make_vocab(1000 + VOCAB_PADDING)) == "padded"
    with pytest.raises(EdgespecError, match=f"has {1001 + VOCAB_PADDING} tokens but the target's has 1000: more "
                                            f"than {VOCAB_PADDING} apart"):
        check_compatible(make_vocab(1000), make_vocab(1001 + VOCAB_PADDING))
    other = Vocab(texts=target.texts[:3] + (b"zz",) + target.texts[4:T - 1], pieces=target.pieces[:T - 1],
                  bos_id=EOS, eos_id=EOS, eog_ids=frozenset([EOS]))
    with pytest.raises(EdgespecError, match="draft token 3 is b'zz'"):  # the first difference on a shared id
        check_compatible(target, other)
    ends = Vocab(texts=target.texts, pieces=target.pieces, bos_id=EOS, eos_id=EOS, eog_ids=frozenset([EOS, 2]))
    with pytest.raises(EdgespecError, match="end-of-generation"):
        check_compatible(make_vocab(T + 1), ends)
    # an end-of-generation id only one side has is not a difference: the other never proposes or emits it
    padded_end = Vocab(texts=make_vocab(T + 1).texts, pieces=make_vocab(T + 1).pieces, bos_id=EOS, eos_id=EOS,
                       eog_ids=frozenset([EOS, T]))
    assert check_compatible(target, padded_end) == "padded"


@pytest.mark.parametrize("n_draft", [T - 1, T + 1])
def test_a_padded_draft_hands_over_rows_in_the_target_ids(n_draft):
    """Fewer ids: -inf on those it lacks, and a token it lacks read as its BOS; more: its extra ids cut off."""
    inner = FakeBackend(random_table(np.random.default_rng(0), n_draft))
    draft = PaddedDraft(inner, make_vocab(T))
    rows = draft.forward([1, 2, 3], 2, copy=False)
    assert rows.shape == (2, T) and draft.tokens == [1, 2, 3] == inner.tokens
    shared = min(n_draft, T)
    np.testing.assert_array_equal(rows[:, :shared], inner.table[[2, 3], :shared])
    assert np.all(rows[:, shared:] == -np.inf)
    copied = draft.forward([4], 1)  # copy=True: an array of the caller's, not the buffer
    draft.forward([5], 1, copy=False)
    np.testing.assert_array_equal(copied[0, :shared], inner.table[4, :shared])
    draft.rollback(2)
    assert draft.tokens == [1, 2] == inner.tokens
    if n_draft < T:
        draft.forward([T - 1], 1)  # the target's last id, which the draft lacks
        assert draft.tokens == [1, 2, T - 1] and inner.tokens == [1, 2, inner.vocab.bos_id]


@pytest.mark.parametrize("n_draft", [T - 1, T + 1])
@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=1.0, top_p=0.9)], ids=["greedy", "top-p"])
def test_a_padded_draft_model_keeps_the_target_output(n_draft, params):
    rng = np.random.default_rng(1)
    table = random_table(rng, T)
    draft = FakeBackend(random_table(rng, n_draft))
    drafter = ModelDrafter(draft, make_vocab(T))
    assert drafter.pairing == "padded"
    base, _ = run(FakeBackend(table), None, [1, 2], max_tokens=30, params=params, seed=4)
    spec, stats = run(FakeBackend(table), drafter, [1, 2], max_tokens=30, draft_max=3, params=params, seed=4)
    assert stats.drafted > 0 and max(stats.draft_lengths) == 3
    if params.greedy:
        assert tokens_of(spec) == tokens_of(base)


@pytest.mark.parametrize("n_draft, broken", [(T - 1, False), (T + 1, False), (T - 1, True)])
def test_padded_pairs_draw_the_target_law(monkeypatch, n_draft, broken):
    """The target gives real mass to its last id, which the smaller draft lacks (only the residual can emit it);
    the larger draft puts most of its mass on the id the target lacks (proposed, it would be an impossible
    token). Three tokens' joint law is the target chain's; a rule without the residual is caught."""
    rng = np.random.default_rng(2)
    table = random_table(rng, T, sharpness=1.0)
    table[:, EOS] = -np.inf  # no early end: markov_law's chains run the full length
    table[:, T - 1] = 1.5  # the id the smaller draft lacks: likely under the target
    draft_table = random_table(rng, n_draft, sharpness=1.0)
    if n_draft > T:
        draft_table[:, T] = 4.0  # the id the target lacks: what this draft would propose most
    drafted = check_target_law(monkeypatch, FakeBackend(table), ModelDrafter(FakeBackend(draft_table), make_vocab(T)),
                               table, SamplingParams(temperature=1.0), width=1, broken=broken, n_tokens=3, runs=4000)
    assert drafted > 1  # tokens drafted per answer
