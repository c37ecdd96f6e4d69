"""Training on several corpora of one target: sampled answers beside greedy ones, a split by prompt that keeps
every answer to a held-out prompt out of training, and corpora that must not be mixed refused before work."""

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import CORPUS_PROMPTS

from edgespec.cli import main
from edgespec.errors import EdgespecError
from edgespec.train.corpus import Sequence, check_also, holdout_split, read_corpora, read_corpus


def seq(prompt: list[int], answer: list[int]) -> Sequence:
    n = len(answer)
    return Sequence(np.array(prompt + answer), len(prompt), "chat", np.zeros((n, 2), np.int32),
                    np.zeros((n, 2), np.float32), np.zeros(n, np.float32), None)


def test_the_split_keeps_every_answer_to_a_prompt_on_one_side():
    prompts = [[i, i + 1] for i in range(0, 40, 2)]
    greedy = [seq(p, [7, 8]) for p in prompts]
    sampled = [seq(p, [9]) for p in prompts]
    held, train = holdout_split(greedy + sampled, 0.25, np.random.default_rng(0))
    held_prompts = {tuple(s.tokens[:2]) for s in held}
    assert len(held_prompts) == 5 and len(held) == 10  # both answers to each of 5 of the 20 prompts
    assert held_prompts.isdisjoint(tuple(s.tokens[:2]) for s in train) and len(train) == 30
    # one corpus of distinct prompts: the permutation of its sequences it always was
    alone, _ = holdout_split(greedy, 0.25, np.random.default_rng(0))
    order = np.random.default_rng(0).permutation(20)
    assert [tuple(s.tokens) for s in alone] == [tuple(greedy[i].tokens) for i in order[:5]]
    # a second corpus does not move the first one's split
    assert {tuple(s.tokens[:2]) for s in alone} == held_prompts


def test_corpora_that_cannot_train_together_are_refused(default_corpus, tmp_path):
    with pytest.raises(EdgespecError, match="is the training corpus itself"):
        check_also(default_corpus, [default_corpus])
    (tmp_path / "empty").mkdir()
    with pytest.raises(EdgespecError, match="is not a corpus"):
        check_also(tmp_path / "new", [tmp_path / "empty"])
    for key, value, message in (("target_size", 1, "another target file scored it"),
                                ("top_k", 8, "it keeps another top-K"),
                                ("hidden", False, "it differs in keeping hidden states")):
        other = tmp_path / key
        shutil.copytree(default_corpus, other)
        manifest = json.loads((other / "corpus.json").read_text())
        manifest["settings"][key] = value
        (other / "corpus.json").write_text(json.dumps(manifest))
        check_also(default_corpus, [other])  # finished: only reading its records tells
        with pytest.raises(EdgespecError, match=message):
            read_corpora(default_corpus, [other])
    manifest["complete"] = False
    (other / "corpus.json").write_text(json.dumps(manifest))
    with pytest.raises(EdgespecError, match="is incomplete"):
        check_also(tmp_path / "new", [other])
    assert not (tmp_path / "new").exists()


def test_the_cli_refuses_a_corpus_beside_itself_before_any_work(default_corpus, tmp_path):
    result = CliRunner().invoke(main, ["train-heads", "--kind", "eagle", "--out", str(tmp_path / "h.eagle.npz"),
                                       "--corpus", str(default_corpus), "--also-corpus", str(default_corpus)])
    assert result.exit_code == 1 and "is the training corpus itself" in result.output
    result = CliRunner().invoke(main, ["train-heads", "--out", str(tmp_path / "h.medusa.npz"),
                                       "--also-corpus", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "does not exist" in result.output
    result = CliRunner().invoke(main, ["train-heads", "--out", str(tmp_path / "h.medusa.npz"), "--corpus-only",
                                       "--also-corpus", str(default_corpus)])
    assert result.exit_code == 1 and "--corpus-only trains nothing" in result.output
    assert not any(tmp_path.iterdir())


def test_heads_train_on_sampled_answers_beside_greedy_ones(default_gguf, tmp_path):
    from edgespec.train.heads import train_heads

    common = {"kind": "medusa", "prompts": CORPUS_PROMPTS, "max_tokens": 12, "progress": False}
    sampled = train_heads(default_gguf, tmp_path / "s.medusa.npz", corpus=tmp_path / "sampled", temperature=1.0,
                          seed=5, corpus_only=True, **common)
    assert "heads" not in sampled and not (tmp_path / "s.medusa.npz").exists()
    settings = json.loads((tmp_path / "sampled" / "corpus.json").read_text())["settings"]
    assert settings["temperature"] == 1.0 and settings["seed"] == 5 and settings["hidden"]
    summary = train_heads(default_gguf, tmp_path / "g.medusa.npz", corpus=tmp_path / "greedy",
                          also_corpora=[tmp_path / "sampled"], n_heads=1, epochs=1, holdout=0.34, **common)
    (_, greedy), (_, sampled_seqs) = read_corpus(tmp_path / "greedy"), read_corpus(tmp_path / "sampled")
    assert [s.tokens[s.n_prompt:].tolist() for s in greedy] != [s.tokens[s.n_prompt:].tolist() for s in sampled_seqs]
    assert summary["train_positions"] == sum(len(s.lse) for s in greedy + sampled_seqs)
    training = summary["training"]
    assert (training["held_out_sequences"], training["train_sequences"]) == (2, 4)  # one prompt, both answers
    assert summary["also_corpora"] == [str(tmp_path / "sampled")]
