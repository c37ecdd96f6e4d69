"""The draft-training corpus and distillation: what the target recorded, resuming, and a trained draft that
forms an exact pair with its target."""

import json

import numpy as np
import pytest
from conftest import CORPUS_PROMPTS, soft_llama

from edgespec.backends import gguf_file
from edgespec.backends.llama.backend import LlamaBackend
from edgespec.errors import EdgespecError
from edgespec.train import corpus as corpus_module
from edgespec.train.corpus import build_corpus, read_corpus, teacher_forced

PROMPTS = CORPUS_PROMPTS


@pytest.fixture(scope="module")
def corpus_dir(default_corpus, tmp_path_factory):
    """A copy of the session's small corpus: these tests delete and rebuild shards of it."""
    import shutil

    out = tmp_path_factory.mktemp("corpus") / "c"
    shutil.copytree(default_corpus, out)
    return out


def test_hidden_states_do_not_change_logits_and_survive_long_forwards(default_gguf):
    # with embeddings on, llama.cpp outputs every token of a batch: a 40-token forward asking 3 rows must
    # not hit its output cap (it aborts the process when it does)
    plain, hidden = LlamaBackend(default_gguf, n_ctx=256), LlamaBackend(default_gguf, n_ctx=256, hidden=True)
    tokens = plain.tokenize("The quick brown fox jumps over the lazy dog. " * 4, special=True)
    assert len(tokens) > 16
    np.testing.assert_array_equal(plain.forward(tokens, 3), hidden.forward(tokens, 3))
    assert hidden.last_hidden.shape == (3, 576) and plain.last_hidden is None
    hidden.forward([5], 0)
    assert hidden.last_hidden is None


def test_hidden_state_is_what_the_output_layer_reads(default_gguf):
    """The recorded state is the final normed one: the (tied) embedding matrix maps it to the logits."""
    from gguf.quants import dequantize

    tensor = next(t for t in gguf_file.open_gguf(default_gguf).tensors if t.name == "token_embd.weight")
    weights = dequantize(tensor.data, tensor.tensor_type).reshape(49152, 576)
    backend = LlamaBackend(default_gguf, n_ctx=256, hidden=True)
    logits = backend.forward(backend.tokenize("The capital of France is", special=True), 2)
    # llama.cpp's matmul quantizes activations to 8 bits: about 0.25 off on logits of magnitude ~25
    assert np.abs(backend.last_hidden @ weights.T - logits).max() < 0.6


def test_corpus_records_the_targets_greedy_answer_and_its_exact_top_k(corpus_dir, default_gguf):
    manifest, seqs = read_corpus(corpus_dir)
    assert manifest["complete"] and len(seqs) == 3 and [s.cat for s in seqs] == ["chat", "code", "math"]
    backend = LlamaBackend(default_gguf, n_ctx=512)
    for s in seqs:
        n_answer = len(s.tokens) - s.n_prompt
        assert s.topk_ids.shape == (n_answer, 32) and s.hidden.shape == (n_answer, 576)
        # greedy answers: the target's top-1 at each position is the token that follows it
        np.testing.assert_array_equal(s.topk_ids[:, 0], s.tokens[s.n_prompt:])
        probs = np.exp(s.topk_logits - s.lse[:, None])
        assert np.all(np.diff(s.topk_logits, axis=1) <= 0) and np.all(probs.sum(axis=1) <= 1 + 1e-5)
        # the log-sum-exp is the full row's: compare one position with a direct forward
        backend.rollback(0)
        row = backend.forward(list(s.tokens[:s.n_prompt]), 1)[0].astype(np.float64)
        assert abs(np.log(np.exp(row - row.max()).sum()) + row.max() - s.lse[0]) < 1e-3


def test_corpus_resumes_and_refuses_other_settings(corpus_dir, default_gguf, monkeypatch, tmp_path):
    before = (corpus_dir / "shard-00001.npz").read_bytes()
    (corpus_dir / "shard-00001.npz").unlink()  # as if interrupted before the last shard was renamed into place
    calls = []
    real = corpus_module._answer
    monkeypatch.setattr(corpus_module, "_answer", lambda *a, **k: calls.append(sorted(a[1])) or real(*a, **k))
    build_corpus(default_gguf, PROMPTS, corpus_dir, max_tokens=12, hidden=True, shard_size=2, progress=False)
    assert calls == [[2]]  # only the missing shard's prompt was answered again
    assert (corpus_dir / "shard-00001.npz").read_bytes() == before  # greedy: the same answer
    with pytest.raises(EdgespecError, match="other settings"):
        build_corpus(default_gguf, PROMPTS, corpus_dir, max_tokens=13, hidden=True, shard_size=2, progress=False)
    (tmp_path / "stuff.txt").write_text("x")
    with pytest.raises(EdgespecError, match="not a corpus"):
        build_corpus(default_gguf, PROMPTS, tmp_path, max_tokens=12, progress=False)
    with pytest.raises(EdgespecError, match="no corpus.json"):
        read_corpus(tmp_path)


def test_a_faster_model_answers_and_the_target_scores(default_gguf, q4_0_gguf, tmp_path):
    """--answers-from: the answer tokens are the answerer's greedy text, every record is the target's."""
    from edgespec.api import load

    out = tmp_path / "c"
    manifest = build_corpus(default_gguf, PROMPTS[:2], out, max_tokens=12, hidden=True, shard_size=2,
                            progress=False, answerer=q4_0_gguf)
    assert manifest["settings"]["answerer"] == str(q4_0_gguf)
    _, seqs = read_corpus(out)
    answerer = load(q4_0_gguf, "none")
    target = LlamaBackend(default_gguf, n_ctx=512, hidden=True)
    differ = 0
    for row, s in zip(PROMPTS[:2], seqs, strict=True):
        answer = answerer.generate(row["prompt"], max_tokens=12, temperature=0.0).tokens
        assert list(s.tokens[s.n_prompt:s.n_prompt + len(answer)]) == answer
        ids, logits, lse, hidden = teacher_forced(target, list(s.tokens), s.n_prompt, 32)
        np.testing.assert_array_equal(ids, s.topk_ids)
        np.testing.assert_allclose(logits, s.topk_logits, atol=1e-4)
        np.testing.assert_allclose(hidden.astype(np.float32), s.hidden.astype(np.float32), atol=1e-2)
        differ += int(np.abs(logits[:, 0] - _top1_logits(answerer.target, s)).max() > 1e-2)
    assert differ  # the records are not the answerer's own (the two quantizations disagree in the logits)
    answerer.close()
    # the same folder with the target answering is another corpus
    with pytest.raises(EdgespecError, match="other settings"):
        build_corpus(default_gguf, PROMPTS[:2], out, max_tokens=12, hidden=True, shard_size=2, progress=False)


def _top1_logits(backend, s):
    backend.rollback(0)
    rows = backend.forward(list(s.tokens[:-1]), len(s.tokens) - s.n_prompt)
    backend.rollback(0)
    return rows.max(axis=1)


def test_an_answerer_that_does_not_load_leaves_no_corpus_behind(default_gguf, tmp_path):
    with pytest.raises(EdgespecError, match="does not exist"):
        build_corpus(default_gguf, PROMPTS, tmp_path / "a", answerer=tmp_path / "missing.gguf", progress=False)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(EdgespecError):
        build_corpus(default_gguf, PROMPTS, tmp_path / "b", answerer=broken, progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_answer_draft_changes_how_fast_not_what_the_target_answers(default_corpus, default_gguf, q4_0_gguf,
                                                                       tmp_path):
    """The target answers one prompt at a time through speculative decoding with its Q4_0 quantization as
    draft: the same greedy answers and records as when it answers many at once (the default corpus); how the
    answers came is not a setting of the corpus (a build may resume otherwise); a draft that does not load
    leaves nothing behind."""
    manifest = build_corpus(default_gguf, PROMPTS, tmp_path / "d", max_tokens=12, hidden=True, shard_size=2,
                            progress=False, answer_draft=q4_0_gguf)
    assert manifest["settings"] == json.loads((default_corpus / "corpus.json").read_text())["settings"]
    (_, with_draft), (_, with_lookup) = read_corpus(tmp_path / "d"), read_corpus(default_corpus)
    for a, b in zip(with_draft, with_lookup, strict=True):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_array_equal(a.topk_ids, b.topk_ids)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(EdgespecError):
        build_corpus(default_gguf, PROMPTS, tmp_path / "e", answer_draft=broken, progress=False)
    assert not (tmp_path / "e").exists()


ANSWER_MANY = ["Write a Python add function.", "Say hello.", "Reply with one word: yes or no?",
               "Count from one to five.", "What is 2+2? Answer with a number only."]  # 40, 36, 2, 24, 7 tokens


def test_answering_many_at_once_gives_each_prompt_its_single_generation(default_gguf):
    """Three streams over five prompts (streams end at different times and take the next prompt): the greedy
    answers are the target-only engine's, token for token up to a flipped near-tie, and the cache is empty and
    sound afterwards."""
    from edgespec.api import load, prompt_tokens

    engine = load(default_gguf, "none")
    backend = LlamaBackend(default_gguf, n_ctx=3 * 80)
    prompts = [prompt_tokens(backend, text) for text in ANSWER_MANY]
    ended_order = []
    answers = backend.answer_many(prompts, 40, lambda i, logits: int(np.argmax(logits)), streams=3,
                                  on_answer=lambda i, answer, ended: ended_order.append(i))
    assert sorted(ended_order) == list(range(5)) and ended_order != list(range(5))  # streams really overlapped
    same = 0
    for prompt, text, (answer, ended) in zip(prompts, ANSWER_MANY, answers, strict=True):
        result = engine.generate(text, max_tokens=40, temperature=0.0)
        if answer == result.tokens:
            same += 1
            assert ended == (result.stats.finish_reason == "stop")
            continue
        # streams share the cache's cells, so attention sums in another order: a near-tie may flip, nothing more
        at = next((j for j, (a, b) in enumerate(zip(answer, result.tokens, strict=False)) if a != b),
                  min(len(answer), len(result.tokens)))  # one a prefix of the other: there one of them ended
        engine.target.rollback(0)
        row = engine.target.forward(prompt + answer[:at], 1)[0]
        picked = row[answer[at]] if at < len(answer) else max(row[t] for t in backend.vocab.eog_ids)
        assert ended or at < len(answer)
        assert row.max() - picked < 0.1, f"{text!r}: token {at} is not a near-tie"
    assert same >= 2  # measured here: 3 of 5 identical, two flip near-ties (gaps 0.02, 0.05)
    assert backend.tokens == []
    engine.target.rollback(0)
    np.testing.assert_array_equal(backend.forward(prompts[0], 1), engine.target.forward(prompts[0], 1))
    with pytest.raises(EdgespecError, match="more than the context of"):
        backend.answer_many(prompts, 230, lambda i, logits: 0, streams=3)
    assert backend.tokens == prompts[0]  # refused before touching the cache


def test_sampled_answers_from_many_streams_follow_the_targets_law(default_gguf):
    """A corpus at temperature 1 answering many prompts at once: each prompt's first token is drawn from the
    target's own distribution for that prompt (chi-square; two prompts in alternate streams, so logits
    handed to the wrong stream would fail)."""
    from stats_util import ALPHA, goodness_of_fit

    from edgespec.decode.sampling import SamplingParams, to_probs

    backend = LlamaBackend(default_gguf, n_ctx=16 * 16)
    texts = ["The capital of France is", "My favourite food is"]
    heads = [backend.tokenize(t, special=True) for t in texts]
    laws = []
    for head in heads:
        backend.rollback(0)
        laws.append(to_probs(backend.forward(head, 1)[0], SamplingParams(temperature=1.0)))
    backend.rollback(0)
    n = 600
    asked = {i: heads[i % 2] for i in range(n)}
    settings = corpus_module.CorpusSettings("t", 0, 1, 1.0, 32, False, 16, 7, "")
    drawn: dict[int, int] = {}
    corpus_module._answer(backend, asked, {}, settings, 16, lambda i, answer, ended: drawn.update({i: answer[0]}))
    for k, law in enumerate(laws):
        draws = [drawn[i] for i in range(k, n, 2)]
        expected = {t: float(p) for t, p in enumerate(law) if p > 0}
        assert goodness_of_fit(draws, expected) > ALPHA


def test_an_answerer_with_another_chat_template_is_refused_before_anything_is_written(default_gguf, tmp_path):
    """The same weights and vocabulary under another system prompt: its prompts would be other tokens."""
    data = default_gguf.read_bytes()
    at = data.index(b"tokenizer.chat_template")
    at = data.index(b"named SmolLM,", at)  # same length, so every offset in the file stays valid
    other = tmp_path / "other-template.gguf"
    other.write_bytes(data[:at] + b"named Robot1," + data[at + 13:])
    with pytest.raises(EdgespecError, match="another chat template"):
        build_corpus(default_gguf, PROMPTS, tmp_path / "c", answerer=other, progress=False)
    assert not (tmp_path / "c").exists()


def test_teacher_forced_positions_align_with_the_answer(default_gguf):
    backend = LlamaBackend(default_gguf, n_ctx=256)
    seq = backend.tokenize("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello there", special=True)
    ids, logits, lse, hidden = teacher_forced(backend, seq, 8, 4)
    assert ids.shape == (len(seq) - 8, 4) and hidden is None and backend.tokens == []
    # row 1 is the target's view at position 8, which predicts token 9
    row = backend.forward(seq[:9], 1)[0]
    np.testing.assert_allclose(np.sort(row)[-4:][::-1], logits[1], rtol=1e-5)
    assert ids[1, 0] == int(np.argmax(row))


@pytest.fixture(scope="module")
def soft_checkpoint(tmp_path_factory):
    return soft_llama(tmp_path_factory.mktemp("soft-llama"))


def test_distilled_draft_trains_exports_and_pairs_exactly_with_its_target(soft_checkpoint, tmp_path):
    from transformers import LlamaForCausalLM

    from edgespec.api import load
    from edgespec.backends.llama.subset import SubsetDraft, read_subset
    from edgespec.export import export
    from edgespec.train.distill import distill

    tiny_checkpoint = soft_checkpoint
    target = tmp_path / "target.gguf"
    export(str(tiny_checkpoint), "gguf", "f32", target, progress=False, parity=False)
    prompts = [{"cat": "chat", "prompt": f"Tell me something about the number {i}."} for i in range(16)]
    summary = distill(target, tmp_path / "draft.gguf", source=tiny_checkpoint, prompts=prompts, n_layers=1,
                      epochs=3, max_tokens=24, progress=False, lr=3e-3, holdout=0.25, train_output=True)
    training = summary["training"]
    assert training["subset"] == 8192 and training["own_output"]
    assert summary["answered_by"] == "target" and summary["corpus_positions"] > 0
    assert training["epochs"][-1]["held_out_loss"] < training["initial_loss"]  # it learned the target
    assert summary["export"]["parity"]["overall"]["top1_agreement"] > 0.95  # the GGUF is the trained model
    assert json.loads((tmp_path / "draft.gguf.distill.json").read_text())["draft"] == str(tmp_path / "draft.gguf")
    # the GGUF drafts from the answers' most probable tokens (8192 hold every token of these short answers)
    assert summary["draft_vocab"]["answer_tokens_covered"] == 1.0
    # its own output layer learned on the subset's rows only, and the subset draft reads those rows
    model = LlamaForCausalLM.from_pretrained(summary["checkpoint"])
    moved = (model.lm_head.weight - model.model.embed_tokens.weight).abs().amax(1).detach().numpy() > 0
    subset = read_subset(tmp_path / "draft.gguf")
    assert moved[subset].mean() > 0.9 and not np.delete(moved, subset).any()
    engine = load(target, tmp_path / "draft.gguf", n_ctx=256)
    assert isinstance(engine.draft_backend, SubsetDraft)
    full = LlamaBackend(tmp_path / "draft.gguf", n_ctx=256)
    ids = full.tokenize("Tell me something about the number 7.", special=False)
    want, got = full.forward(ids, 2), engine.draft_backend.forward(ids, 2)
    assert np.abs(got[:, subset] - want[:, subset]).max() < 1e-3
    engine.draft_backend.rollback(0)
    full.close()
    base = engine.generate("Tell me something about the number 99.", max_tokens=32, draft_max=0)
    spec = engine.generate("Tell me something about the number 99.", max_tokens=32, draft_max=3)
    assert spec.tokens == base.tokens and spec.stats.drafted > 0


def test_distill_trains_on_sampled_answers(soft_checkpoint, tmp_path):
    """distill --temperature/--seed: the corpus records both, its answers are not the greedy ones, and a draft
    trains on it."""
    from edgespec.export import export
    from edgespec.train.corpus import read_corpus
    from edgespec.train.distill import distill

    target = tmp_path / "target.gguf"
    export(str(soft_checkpoint), "gguf", "f32", target, progress=False, parity=False)
    prompts = [{"cat": "chat", "prompt": f"Tell me something about the number {i}."} for i in range(4)]
    common = {"source": soft_checkpoint, "prompts": prompts, "n_layers": 1, "epochs": 1, "max_tokens": 12,
              "progress": False, "holdout": 0.25}
    sampled = distill(target, tmp_path / "s.gguf", temperature=1.0, seed=3, **common)
    settings = json.loads((tmp_path / "s.corpus" / "corpus.json").read_text())["settings"]
    assert (settings["temperature"], settings["seed"]) == (1.0, 3)
    assert sampled["train_positions"] > 0 and (tmp_path / "s.gguf").is_file()
    greedy = distill(target, tmp_path / "g.gguf", **common)
    answers = [[s.tokens[s.n_prompt:].tolist() for s in read_corpus(tmp_path / f"{name}.corpus")[1]]
               for name in ("s", "g")]
    assert answers[0] != answers[1] and greedy["train_positions"] > 0


def test_distill_goes_on_training_a_draft_it_made_before(soft_checkpoint, tmp_path):
    """--init: the second run starts where the first ended (its held-out loss before training is the first's
    after), and a checkpoint that is not a draft of this target is refused before any corpus is written."""
    from edgespec.errors import EdgespecError
    from edgespec.export import export
    from edgespec.train.distill import distill

    target = tmp_path / "target.gguf"
    export(str(soft_checkpoint), "gguf", "f32", target, progress=False, parity=False)
    prompts = [{"cat": "chat", "prompt": f"Tell me something about the number {i}."} for i in range(8)]
    # the whole vocabulary: the tiny target's answers put little of their mass on any 8192 tokens, so a loss
    # over a subset would hardly move in one epoch
    common = {"source": soft_checkpoint, "prompts": prompts, "corpus": tmp_path / "c.corpus", "epochs": 1,
              "max_tokens": 16, "progress": False, "holdout": 0.25, "lr": 3e-3, "vocab_size": 0}
    first = distill(target, tmp_path / "a.gguf", n_layers=1, **common)["training"]
    second = distill(target, tmp_path / "b.gguf", init=tmp_path / "a.hf", **common)["training"]
    assert second["init"] == str(tmp_path / "a.hf") and second["layers_from_target"] is None
    assert second["initial_loss"] == pytest.approx(first["epochs"][-1]["held_out_loss"], abs=2e-3)
    assert second["initial_loss"] < first["initial_loss"]
    # deepened: the new layer starts as a no-op, so training starts where the first run ended
    deeper = distill(target, tmp_path / "e.gguf", init=tmp_path / "a.hf", n_layers=2, **common)["training"]
    assert deeper["grown"] == [0, "new"]
    last = deeper["epochs"][-1]  # one category: its agreement is the whole
    assert last["held_out_by_category"] == {"chat": last["held_out_agreement"]}
    assert deeper["initial_loss"] == pytest.approx(first["epochs"][-1]["held_out_loss"], abs=2e-3)
    # and through the CLI, which says where the draft stands per category
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    from click.testing import CliRunner

    from edgespec.cli import main

    result = CliRunner().invoke(main, [
        "distill", "--target", str(target), "--source", str(soft_checkpoint),
        "--out", str(tmp_path / "f.gguf"), "--prompts", str(prompts_file), "--only-prompts",
        "--corpus", str(tmp_path / "c.corpus"), "--init", str(tmp_path / "a.hf"), "--layers", "2",
        "--epochs", "1", "--max-tokens", "16", "--lr", "3e-3"])
    assert result.exit_code == 0, result.output
    assert "held-out agreement by category: chat " in result.output
    cli_run = json.loads((tmp_path / "f.gguf.distill.json").read_text())
    assert cli_run["training"]["grown"] == [0, "new"] and cli_run["export"]["quant"] == "q8_0"
    with pytest.raises(EdgespecError, match="3 layers, the target 3: not a draft"):
        distill(target, tmp_path / "d.gguf", init=soft_checkpoint, **{**common, "corpus": tmp_path / "d.corpus"})
    with pytest.raises(EdgespecError, match="--layers 3 with --init deepens the draft: give 1 .its own. to 2"):
        distill(target, tmp_path / "d.gguf", init=tmp_path / "a.hf", n_layers=3,
                **{**common, "corpus": tmp_path / "d.corpus"})
    assert not (tmp_path / "d.corpus").exists() and not (tmp_path / "d.gguf").exists()


def test_a_grown_draft_computes_what_it_computed_until_trained(soft_checkpoint):
    """New layers go between the old ones as copies with zeroed output projections: the same logits at once,
    and a training step moves them (their zeroed projections get gradients)."""
    import torch
    from transformers import LlamaForCausalLM

    from edgespec.train.draft_model import grow

    model = LlamaForCausalLM.from_pretrained(soft_checkpoint, dtype=torch.float32)
    grown, layout = grow(model, 7)
    assert layout == [0, "new", "new", 1, "new", "new", 2] and grown.config.num_hidden_layers == 7
    ids = torch.randint(0, 49152, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(grown(ids).logits, model(ids).logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(grown.model.layers[3].mlp.up_proj.weight, model.model.layers[1].mlp.up_proj.weight)
    grown(ids).logits.logsumexp(-1).sum().backward()
    assert grown.model.layers[1].mlp.down_proj.weight.grad.abs().sum() > 0


def test_a_refused_export_keeps_the_trained_draft_and_its_report(soft_checkpoint, tmp_path, monkeypatch):
    """Training done, export refused (a parity check, say): the checkpoint and its training report stay, the
    error says how to export it, and no draft GGUF is written."""
    from edgespec import export as export_module
    from edgespec.export import export
    from edgespec.train.distill import distill

    target = tmp_path / "target.gguf"
    export(str(soft_checkpoint), "gguf", "f32", target, progress=False, parity=False)

    def refuse(*args, **kwargs):
        raise EdgespecError("parity check failed for q8_0: top-1 agreement 0.9 < 0.95")

    monkeypatch.setattr(export_module, "export_source", refuse)
    prompts = [{"cat": "math", "prompt": f"What is {i} times 7?"} for i in range(4)]
    said = r"(?s)parity check failed.*kept: .*d\.hf.*edgespec export .*d\.hf --to gguf"
    with pytest.raises(EdgespecError, match=said):
        distill(target, tmp_path / "d.gguf", source=soft_checkpoint, prompts=prompts, n_layers=1, epochs=1,
                max_tokens=8, progress=False, holdout=0.25)
    report = json.loads((tmp_path / "d.hf" / "distill.json").read_text())
    assert report["export"] is None and report["training"]["epochs"][0]["held_out_by_category"].keys() == {"math"}
    assert not (tmp_path / "d.gguf").exists()


def test_a_subset_drafts_loss_is_its_cross_entropy_over_the_subset(soft_checkpoint):
    """With a subset, q is the draft's softmax over the subset's tokens only (what a subset draft drafts from),
    the target's probability on tokens outside it drops out, and a position whose target top-1 lies outside
    cannot agree; without one, q is over the whole vocabulary."""
    import torch
    from transformers import LlamaForCausalLM

    from edgespec.train.corpus import Sequence
    from edgespec.train.distill import _loss
    from edgespec.train.eagle import subset_positions

    model = LlamaForCausalLM.from_pretrained(soft_checkpoint, dtype=torch.float32)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 49152, 12)
    subset = np.sort(rng.choice(49152, 300, replace=False))
    n_prompt, k = 4, 5
    topk_ids = np.stack([rng.choice(subset, k, replace=False) for _ in range(len(tokens) - n_prompt)])
    topk_ids[2, 0] = next(t for t in range(49152) if t not in set(subset))  # a top-1 the subset draft cannot draft
    topk_ids[3, 1] = topk_ids[2, 0]
    topk_logits = np.sort(rng.normal(size=topk_ids.shape), axis=1)[:, ::-1].copy()
    with torch.no_grad():
        logits = model(torch.from_numpy(tokens[None].astype(np.int64))).logits[0, n_prompt - 1:-1].double()
    best = subset[int(logits[0, subset].argmax())]  # the first position agrees
    topk_ids[0] = [best, *[t for t in topk_ids[0] if t != best][:k - 1]]
    seq = Sequence(tokens, n_prompt, "chat", topk_ids, topk_logits, np.full(len(topk_ids), 1.5), None)
    with torch.no_grad():
        loss, agree = _loss(torch, model, [seq], "cpu", (torch.from_numpy(subset), subset_positions(subset, 49152)))
        full_loss, _ = _loss(torch, model, [seq], "cpu")
    p = np.exp(topk_logits - 1.5)
    logq = torch.log_softmax(logits[:, subset], dim=1).numpy()
    inside = np.isin(topk_ids, subset)
    where = np.searchsorted(subset, topk_ids)
    want = -np.mean([sum(p[i, j] * logq[i, where[i, j]] for j in range(k) if inside[i, j]) for i in range(len(p))])
    assert float(loss) == pytest.approx(want, rel=1e-4)
    logq_full = torch.log_softmax(logits, dim=1).numpy()
    assert float(full_loss) == pytest.approx(-np.mean((p * np.take_along_axis(logq_full, topk_ids, 1)).sum(1)),
                                             rel=1e-4)
    top = subset[logq.argmax(1)]
    assert agree.tolist() == [bool(top[i] == topk_ids[i, 0]) for i in range(len(p))]
    assert agree[0] and not agree[2]


def test_make_targets_select_the_training_prompts_they_say(tmp_path, capsys):
    """make qat-draft trains on every third prompt of each category (at most 100: 585 prompts), make qat-draft-all
    on the other 1210, in the file's order."""
    from edgespec.train.prompts import main, read_train_prompts

    main(["--every", "3", "--at-most", "100"])
    first = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (tmp_path / "first.jsonl").write_text("".join(json.dumps(x) + "\n" for x in first))
    main(["--except", str(tmp_path / "first.jsonl")])
    rest = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    everything = read_train_prompts()
    assert len(first) == 585 and len(rest) == len(everything) - 585 == 1210
    assert rest == [x for x in everything if x not in first]
    assert all(sum(x["cat"] == c for x in first) <= 100 for c in {x["cat"] for x in first})
