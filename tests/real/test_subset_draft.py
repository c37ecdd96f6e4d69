"""A draft drafting from a subset of the vocabulary (backends/llama/subset.py), on the real SmolLM2 model: it
computes what the full draft computes on its tokens, nothing off them, and refuses bad input leaving no file."""

import json
import subprocess
import sys

import numpy as np
import pytest

import edgespec
from edgespec.backends.llama.backend import LlamaBackend
from edgespec.backends.llama.subset import SubsetDraft, read_subset, write_subset
from edgespec.backends.model_info import read_model_info
from edgespec.errors import EdgespecError

PROMPT = "<|im_start|>user\nWrite a Python function that reverses a list.<|im_end|>\n<|im_start|>assistant\n"


def test_a_subset_draft_computes_the_full_drafts_logits_on_its_tokens(q4_0_gguf, subset_gguf):
    full = LlamaBackend(q4_0_gguf, n_ctx=256, n_threads=2)
    draft = SubsetDraft(subset_gguf, n_ctx=256, n_threads=2)
    assert draft.vocab == full.vocab  # the loop's vocabulary check sees the draft's own tokenizer
    assert set(draft.vocab.eog_ids) <= set(draft.subset.tolist())  # it can always propose the end
    ids = full.tokenize(PROMPT, special=True)
    want, got = full.forward(ids, 4), draft.forward(ids, 4)  # [4, V]
    off = np.ones(full.vocab.n_vocab, bool)
    off[draft.subset] = False
    assert np.isneginf(got[:, off]).all()
    assert np.abs(got[:, ~off] - want[:, ~off]).max() < 1e-3
    assert (got.argmax(1) == np.where(off, -np.inf, want).argmax(1)).all()
    # its cache: rolled back two tokens and run again, the same rows; one token at a time as drafting does
    draft.rollback(len(ids) - 2)
    assert np.array_equal(draft.forward(ids[-2:], 2), got[-2:])
    token = int(got[-1].argmax())
    step = draft.forward([token], 1)[0]
    assert np.abs(step[~off] - full.forward([token], 1)[0][~off]).max() < 1e-3
    assert draft.tokens == full.tokens == [*ids, token]
    # what the planner reads from the file's header is what the loaded draft holds: the file's tensors and the
    # subset's output rows; a step reads the layers and those rows only
    info, full_info = read_model_info(subset_gguf), read_model_info(q4_0_gguf)
    assert info.draft_vocab == len(draft.subset) and full_info.draft_vocab == 0
    assert info.weight_bytes == draft.memory()["weights"] > full_info.weight_bytes
    assert info.bytes_read_per_token() < full_info.bytes_read_per_token()
    draft.close()
    full.close()


@pytest.mark.parametrize("padded", [False, True], ids=["exact", "padded"])
def test_the_loop_uses_a_subset_draft_and_keeps_the_targets_output(default_gguf, subset_gguf, tmp_path, padded):
    """Also with the subset draft's vocabulary padded by 128 ids (a padded pair: its rows cut to the target's)."""
    if padded:
        from edgespec.models.vocab_edit import pad_vocab

        subset_gguf = pad_vocab(subset_gguf, tmp_path / "subset-padded.gguf", 49152 + 128)
    engine = edgespec.load(default_gguf, subset_gguf, n_ctx=512)
    try:
        assert isinstance(engine.draft_backend, SubsetDraft)
        assert engine.placement()["draft"]["vocabulary"] == ("padded" if padded else "exact")
        base = engine.generate("Name three primary colors.", max_tokens=32, draft_max=0)
        spec = engine.generate("Name three primary colors.", max_tokens=32, draft_max=4)
        assert spec.tokens == base.tokens and spec.stats.drafted > 0 and spec.stats.accepted > 0
    finally:
        engine.close()


def test_bad_subsets_and_files_are_refused_leaving_nothing(tmp_path, q4_0_gguf, default_gguf):
    out = tmp_path / "draft.gguf"
    for ids in (np.array([5, 49152]), np.array([-1, 3]), np.array([], dtype=np.int64)):
        with pytest.raises(EdgespecError, match="token ids in 0..49151"):
            write_subset(q4_0_gguf, out, ids)
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model")
    with pytest.raises(EdgespecError, match="not a GGUF"):
        write_subset(not_gguf, out, np.arange(10))
    assert list(tmp_path.iterdir()) == [not_gguf]
    assert read_subset(default_gguf) is None
    with pytest.raises(EdgespecError, match="edgespec draft-vocab"):
        SubsetDraft(default_gguf, n_ctx=64)


def test_draft_vocab_command_keeps_the_answers_most_probable_tokens(tmp_path, q4_0_gguf, default_corpus):
    """CLI in a subprocess, as a user runs it; the tokens the target answered with are all kept."""
    from edgespec.train.corpus import read_corpus

    out = tmp_path / "draft-s.gguf"
    run = subprocess.run([sys.executable, "-m", "edgespec.cli", "draft-vocab", str(q4_0_gguf), "--corpus",
                          str(default_corpus), "--tokens", "256", "--out", str(out), "--json"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    subset = read_subset(out)
    assert summary["tokens"] == len(subset) and 256 <= len(subset) <= 256 + 8  # plus end-of-generation ids
    answers = np.concatenate([s.tokens[s.n_prompt:] for s in read_corpus(default_corpus)[1]])
    assert np.isin(answers, subset).all() and summary["answer_tokens_covered"] == 1.0
    bad = subprocess.run([sys.executable, "-m", "edgespec.cli", "draft-vocab", str(q4_0_gguf), "--corpus",
                          str(tmp_path), "--out", str(tmp_path / "x.gguf")], capture_output=True, text=True)
    assert bad.returncode != 0 and "not a corpus" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "x.gguf").exists()
