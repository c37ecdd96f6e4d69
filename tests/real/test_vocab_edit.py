"""Copies of the default model with another vocabulary (models/padded.py). Padded, as Qwen's larger models pad theirs:
llama.cpp reads the same tokenizer with 128 placeholder ids more, the same logits on the source's ids and exactly 0
on the new ones. Permuted, as another family numbers its tokens: the same tokens, logits and text under other ids,
and with tokens dropped a tokenizer of fewer merges whose every token is still one of the source's."""

import numpy as np
import pytest

from edgespec.backends import gguf_file
from edgespec.backends.protocol import check_compatible
from edgespec.errors import EdgespecError
from edgespec.models.vocab_edit import pad_vocab, permute_vocab

PAD = 128  # Qwen2.5 7B-72B's 152,064 ids against 0.5B-3B's 151,936
SEED, DROP = 7, 256
PROMPT = "<|im_start|>user\nWrite a Python function that reverses a list.<|im_end|>\n<|im_start|>assistant\n"


def load(path):
    """A model as the tests run it: one thread, so the original and a copy sum in the same order."""
    from edgespec.backends.llama.backend import LlamaBackend

    return LlamaBackend(path, n_ctx=64, n_threads=1)


@pytest.fixture(scope="module")
def original(default_gguf):
    backend = load(default_gguf)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def pair(original, default_gguf, tmp_path_factory):
    """(the default model, its copy padded by PAD ids)."""
    path = tmp_path_factory.mktemp("padded") / "smollm2-padded.gguf"
    copy = load(pad_vocab(default_gguf, path, original.vocab.n_vocab + PAD))
    yield original, copy
    copy.close()


@pytest.fixture(scope="module")
def permuted(original, default_gguf, tmp_path_factory):
    """(the default model, its copy with ids shuffled by SEED, perm: the original's id -> the copy's [V])."""
    path = tmp_path_factory.mktemp("permuted") / "smollm2-permuted.gguf"
    copy = load(permute_vocab(default_gguf, path, seed=SEED))
    yield original, copy, np.random.default_rng(SEED).permutation(original.vocab.n_vocab)  # the documented perm
    copy.close()


def greedy(backend, text: str, n: int) -> list[int]:
    """The first n ids greedy decoding picks after text (fewer where one ends generation)."""
    out, logits = [], backend.forward(backend.tokenize(text, special=True), 1)  # [1, V]
    while len(out) < n and (not out or out[-1] not in backend.vocab.eog_ids):
        out.append(int(np.argmax(logits[0])))
        logits = backend.forward(out[-1:], 1)
    backend.rollback(0)
    return out


def test_the_padded_vocabulary_is_the_original_and_placeholders(pair):
    original, padded = pair
    n = original.vocab.n_vocab
    assert padded.vocab.n_vocab == n + PAD
    assert padded.vocab.texts[:n] == original.vocab.texts
    assert padded.vocab.texts[n:] == tuple(f"[PAD{i}]".encode() for i in range(n, n + PAD))
    assert (padded.vocab.bos_id, padded.vocab.eos_id) == (original.vocab.bos_id, original.vocab.eos_id)
    assert padded.vocab.eog_ids == original.vocab.eog_ids
    assert check_compatible(original.vocab, padded.vocab) == check_compatible(padded.vocab, original.vocab) == "padded"


def test_the_padded_model_tokenizes_as_the_original(pair):
    original, padded = pair
    text = PROMPT + f"[PAD{original.vocab.n_vocab}]"  # a placeholder's name is text, never its id (unused, not control)
    for special in (True, False):
        assert padded.tokenize(text, special=special) == original.tokenize(text, special=special)
    assert padded.chat_template() == original.chat_template()


def test_the_padded_models_logits_are_the_originals_and_zero_on_the_padding(pair):
    original, padded = pair
    n = original.vocab.n_vocab
    ids = original.tokenize(PROMPT, special=True)
    want, got = original.forward(ids, 4), padded.forward(ids, 4)  # [4, V], [4, V + PAD]
    original.rollback(0)
    padded.rollback(0)
    assert got.shape == (4, n + PAD)
    np.testing.assert_allclose(got[:, :n], want, rtol=0, atol=1e-6)  # bit for bit here
    assert (got[:, n:] == 0.0).all()  # zero embedding rows, and the output is the embedding (tied)


def test_a_vocabulary_no_larger_than_the_sources_is_refused_and_writes_nothing(default_gguf, tmp_path):
    with pytest.raises(EdgespecError, match="has 49152 tokens: a padded vocabulary needs more, got 49152"):
        pad_vocab(default_gguf, tmp_path / "p.gguf", 49152)  # the boundary; fewer fails the same test
    assert list(tmp_path.iterdir()) == []


def test_a_source_that_is_no_gguf_is_refused(tmp_path):
    with pytest.raises(EdgespecError, match="model file not found"):
        pad_vocab(tmp_path / "missing.gguf", tmp_path / "p.gguf", 50000)
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(EdgespecError, match="is not a GGUF file"):
        pad_vocab(tmp_path / "text.gguf", tmp_path / "p.gguf", 50000)
    assert not (tmp_path / "p.gguf").exists()


def test_the_permuted_vocabulary_is_the_originals_shuffled(permuted):
    original, copy, perm = permuted
    n = original.vocab.n_vocab
    assert copy.vocab.n_vocab == n
    texts, pieces = np.empty(n, dtype=object), np.empty(n, dtype=object)
    texts[perm], pieces[perm] = original.vocab.texts, original.vocab.pieces  # the copy's id perm[i] is token i
    assert copy.vocab.texts == tuple(texts) and copy.vocab.pieces == tuple(pieces)
    assert (copy.vocab.bos_id, copy.vocab.eos_id) == (perm[original.vocab.bos_id], perm[original.vocab.eos_id])
    assert copy.vocab.eog_ids == {int(perm[i]) for i in original.vocab.eog_ids}  # the controls moved too
    assert (copy.vocab.bos_id, copy.vocab.eos_id) != (original.vocab.bos_id, original.vocab.eos_id)
    for target, draft in ((original, copy), (copy, original)):
        with pytest.raises(EdgespecError, match="must share the target's tokenizer"):
            check_compatible(target.vocab, draft.vocab)


def test_the_permuted_model_tokenizes_to_the_permuted_ids(permuted):
    original, copy, perm = permuted
    for special in (True, False):
        want = original.tokenize(PROMPT, special=special)
        assert copy.tokenize(PROMPT, special=special) == perm[want].tolist()
    assert copy.chat_template() == original.chat_template()


def test_the_permuted_models_logits_are_the_originals_permuted(permuted):
    original, copy, perm = permuted
    ids = original.tokenize(PROMPT, special=True)
    want, got = original.forward(ids, 4), copy.forward(perm[ids].tolist(), 4)  # [4, V] each
    original.rollback(0)
    copy.rollback(0)
    np.testing.assert_allclose(got[:, perm], want, rtol=0, atol=1e-6)  # the copy's row perm[i] is row i; bit for bit


def test_the_permuted_model_generates_the_originals_text(permuted):
    original, copy, perm = permuted
    want, got = greedy(original, PROMPT, 16), greedy(copy, PROMPT, 16)
    assert len(want) == 16 and got == perm[want].tolist()
    assert b"".join(copy.vocab.pieces[i] for i in got) == b"".join(original.vocab.pieces[i] for i in want)


def test_a_copy_with_tokens_dropped_tokenizes_into_the_tokens_it_kept(original, default_gguf, tmp_path):
    copy = load(permute_vocab(default_gguf, tmp_path / "dropped.gguf", seed=SEED, drop=DROP))
    try:
        n = original.vocab.n_vocab
        assert copy.vocab.n_vocab == n - DROP and set(copy.vocab.texts) < set(original.vocab.texts)
        id_of = {t: i for i, t in enumerate(original.vocab.texts)}
        to_original = np.array([id_of[t] for t in copy.vocab.texts])  # [n - DROP] the copy's id -> the original's
        assert to_original[[copy.vocab.bos_id, copy.vocab.eos_id]].tolist() == [original.vocab.bos_id,
                                                                                original.vocab.eos_id]
        assert set(to_original[list(copy.vocab.eog_ids)].tolist()) == original.vocab.eog_ids
        dropped = sorted(set(range(n)) - set(to_original.tolist()))
        for i in dropped[:32]:  # a dropped token's text becomes two or more kept tokens, the same bytes
            text = original.vocab.pieces[i].decode("utf-8", errors="ignore")
            ids = copy.tokenize(text, special=False)
            assert len(ids) >= 2 and b"".join(copy.vocab.pieces[j] for j in ids) == text.encode()
        ids = copy.tokenize(PROMPT, special=True)  # none of PROMPT's tokens is dropped: the same tokens
        assert to_original[ids].tolist() == original.tokenize(PROMPT, special=True)
        want, got = original.forward(to_original[ids].tolist(), 4), copy.forward(ids, 4)  # [4, V], [4, V - DROP]
        original.rollback(0)
        np.testing.assert_allclose(got, want[:, to_original], rtol=0, atol=1e-6)  # the kept rows, moved whole
    finally:
        copy.close()


def test_drop_removes_only_tokens_no_merge_builds_on_with_their_merges(tmp_path):
    """On a tokenizer small enough to see: "abc" and "bc" are the tokens no merge builds on, "bc" is the padding
    token, so only "abc" may go, with "ab c"; the documented permutation then numbers the six left."""
    src = tiny_bpe_gguf(tmp_path / "tiny.gguf")
    dst = permute_vocab(src, tmp_path / "dropped.gguf", seed=SEED, drop=1)
    reader = gguf_file.open_gguf(dst)
    kept = [0, 1, 2, 3, 4, 6]
    rng = np.random.default_rng(SEED)
    rng.choice([5], 1)
    perm = rng.permutation(len(kept))
    texts = reader.fields["tokenizer.ggml.tokens"].contents()
    assert [texts[perm[j]] for j in range(len(kept))] == [TINY[i] for i in kept]
    rows = np.asarray(reader.tensors[0].data)  # [6, 4] row i filled with the source's id of token i
    assert [rows[perm[j], 0] for j in range(len(kept))] == kept and (rows == rows[:, :1]).all()
    assert reader.fields["tokenizer.ggml.merges"].contents() == ["a b", "b c"]
    assert reader.fields["tokenizer.ggml.padding_token_id"].contents() == perm[5]  # "bc", the sixth kept
    assert reader.fields["llama.vocab_size"].contents() == 6
    with pytest.raises(EdgespecError, match="has 1 tokens that no merge builds on: drop must be 1..1, got 2"):
        permute_vocab(src, tmp_path / "no.gguf", drop=2)
    with pytest.raises(EdgespecError, match="has no BPE merges: drop removes tokens only from a BPE vocabulary"):
        permute_vocab(tiny_bpe_gguf(tmp_path / "spm.gguf", merges=False), tmp_path / "no.gguf", drop=1)
    assert not (tmp_path / "no.gguf").exists()


TINY = ["<s>", "a", "b", "c", "ab", "abc", "bc"]


def tiny_bpe_gguf(path, *, merges: bool = True):
    """A GGUF of TINY's tokens (merges "a b", "ab c", "b c"; "<s>" a control token, BOS and EOS, "bc" the padding
    token) and a token_embd.weight whose row i is i: what permute_vocab reads, no model llama.cpp would run."""
    gguf = gguf_file.lib()
    writer = gguf_file.new_writer(None, "llama")
    writer.add_vocab_size(len(TINY))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(TINY)
    writer.add_token_types([gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (len(TINY) - 1))
    if merges:
        writer.add_token_merges(["a b", "ab c", "b c"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_pad_token_id(6)
    writer.add_tensor("token_embd.weight", np.repeat(np.arange(len(TINY), dtype=np.float32)[:, None], 4, axis=1))
    gguf_file.write(writer, path)
    return path
