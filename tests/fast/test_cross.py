"""Drafts with another tokenizer (token-level intersection, drafts/cross.py) on table-driven fakes: the target and
the draft spell text with different tokens at different ids. Their law: laws/test_cross_laws.py; the real
model's: real/test_real_model.py."""

import numpy as np
import pytest
from fake import EOS, GREEDY, FakeBackend, random_table, run, tokens_of

from edgespec.backends.protocol import Vocab
from edgespec.decode.sampling import SamplingParams
from edgespec.drafts.cross import CrossDrafter, VocabMap
from edgespec.drafts.spec import model_drafter
from edgespec.errors import EdgespecError

# the target's tokens and the draft's: one-letter tokens at other ids, and words only one side has
TARGET = [b"", b"a", b"b", b"c", b"ab", b"ba", b"abc"]
DRAFT = [b"", b"c", b"b", b"a", b"ca", b"bb"]


def vocab(pieces: list[bytes]) -> Vocab:
    texts = tuple(b"<eos>" if i == EOS else p for i, p in enumerate(pieces))
    return Vocab(texts=texts, pieces=tuple(pieces), bos_id=EOS, eos_id=EOS, eog_ids=frozenset([EOS]))


class Spelling(FakeBackend):
    """A FakeBackend whose tokenizer spells text by longest match over its own pieces."""

    def tokenize(self, text, *, special):
        data, out = text.encode(), []
        pieces = sorted(((p, i) for i, p in enumerate(self.vocab.pieces) if p), key=lambda x: -len(x[0]))
        while data:
            piece, i = next((p, i) for p, i in pieces if data.startswith(p))
            out.append(i)
            data = data[len(piece):]
        return out


def test_the_intersection_pairs_ids_that_spell_the_same_bytes():
    m = VocabMap(vocab(TARGET), vocab(DRAFT))
    assert m.draft_to_target.tolist() == [0, 3, 2, 1, -1, -1]  # <eos> by its text, letters by their bytes
    assert m.target_ids.tolist() == [0, 1, 2, 3] and m.draft_ids.tolist() == [0, 3, 2, 1]
    assert m.target_to_draft.tolist() == [0, 3, 2, 1, -1, -1, -1]
    row = m.to_target(np.array([0.0, 1.0, 2.0, 3.0, 9.0, 9.0]), np.full(len(TARGET), -np.inf))
    assert row.tolist() == [0.0, 3.0, 2.0, 1.0, -np.inf, -np.inf, -np.inf]  # the words only the draft has: gone


def test_a_draft_that_shares_too_few_tokens_is_refused_naming_both_reasons():
    few = [b"", b"x", b"y", b"z", b"a"]
    with pytest.raises(EdgespecError, match=r"draft token 1 is b'x'.*another tokenizer.* 2 of its 5 tokens \(40%\)"):
        model_drafter(Spelling(random_table(np.random.default_rng(0), len(few)), vocab=vocab(few)), vocab(TARGET))


def cross_pair(seed, sharpness=1.0):
    rng = np.random.default_rng(seed)
    table = random_table(rng, len(TARGET), sharpness)
    table[:, EOS] = -np.inf  # no early end: markov_law's chains run the full length
    draft = Spelling(random_table(rng, len(DRAFT), sharpness), vocab=vocab(DRAFT), n_ctx=1024)
    return table, draft


def test_the_draft_reads_the_committed_text_in_its_own_tokens():
    _, draft = cross_pair(0)
    drafter = model_drafter(draft, vocab(TARGET))
    assert isinstance(drafter, CrossDrafter) and drafter.pairing == "cross-tokenizer"
    context = [6, 5]  # "abc" + "ba"
    assert drafter.draft_tokens(context) == [3, 2, 1, 2, 3] == draft.tokenize("abcba", special=True)
    context.append(4)  # the loop's list grows: read on from where it was
    assert drafter.draft_tokens(context) == draft.tokenize("abcbaab", special=True)
    assert bytes(drafter._text) == b"abcbaab"
    assert drafter.draft_tokens([2, 2]) == [5]  # another text: read from its start ("bb", a word of the draft's)


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=1.0, top_k=3)], ids=["greedy", "top-k"])
def test_a_cross_tokenizer_draft_keeps_the_target_output(params):
    table, draft = cross_pair(1, sharpness=3.0)
    drafter = CrossDrafter(draft, vocab(TARGET))
    base, _ = run(FakeBackend(table, vocab=vocab(TARGET)), None, [1, 2], max_tokens=30, params=params, seed=4)
    spec, stats = run(FakeBackend(table, vocab=vocab(TARGET)), drafter, [1, 2], max_tokens=30, draft_max=3,
                      params=params, seed=4)
    assert stats.drafted > 0 and set(draft.tokens) <= set(range(len(DRAFT)))
    if params.greedy:
        assert tokens_of(spec) == tokens_of(base)


def test_string_level_drafting_proposes_the_drafts_text_in_the_targets_tokens():
    """At t = 0 a string-level draft writes its own greedy tokens, words the target lacks included, and proposes
    the target's spelling of that text (with probability 1 each): the target's greedy output all the same."""
    table, draft = cross_pair(1, sharpness=3.0)
    target = Spelling(table, vocab=vocab(TARGET))
    drafter = CrossDrafter(draft, vocab(TARGET), text_mode=lambda text: target.tokenize(text, special=False))
    own = [int(np.argmax(draft.table[3]))]  # the draft's greedy token after "a" (its id 3)
    for _ in range(2):
        own.append(int(np.argmax(draft.table[own[-1]])))
    written = b"".join(DRAFT[t] for t in own)
    tokens, laws = drafter.propose_text([1], 3)  # the target's "a"
    assert laws is None and tokens == target.tokenize(written.decode(), special=False)[:3]
    base, _ = run(Spelling(table, vocab=vocab(TARGET)), None, [1, 2], max_tokens=30, seed=4)
    spec, stats = run(target, drafter, [1, 2], max_tokens=30, draft_max=3, seed=4)
    assert tokens_of(spec) == tokens_of(base) and stats.drafted > 0 and not drafter.gated
