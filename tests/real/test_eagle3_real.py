"""EAGLE-3 heads in llama.cpp's format on the default model: a SpecForge checkpoint converted by the pinned
llama.cpp's own converter (as users convert published heads), drafting inside llama.cpp beside the target
(drafts/eagle3.py): greedy text equal to target-only, and at t = 1 the law of a drafted token equal to the target's,
a test that fails on a rule without the residual step.

The head has random weights: exactness holds for any head, and the test needs one whose law overlaps the
target's. Its d2t map keeps 12 ids, the target's most likely first tokens after the law test's prompt, so its
near-uniform law over them shares about a third of its mass with the target's there. The loop drafts the first
token after a prompt too (its prefill pass verifies it), so that token is the one drafted."""

import numpy as np
import pytest
from conftest import streams_draft_as_one
from stats_util import ALPHA, drafted_first_token_p, first_logits, goodness_of_fit, softmax, target_instead_of_residual

import edgespec
from edgespec.decode import rule as rule_module
from edgespec.drafts.eagle3 import head_ids
from edgespec.drafts.llama_kinds import describe, gguf_meta
from edgespec.export.eagle3 import convert_eagle3, random_eagle3
from edgespec.parallel import Parallel

LAW_PROMPT = "Once upon a time, in a small"  # the next token is " town" half the time
LAYERS = [2, 15, 27]


@pytest.fixture(scope="module")
def first_law(default_gguf):
    """The target's law of the first token after LAW_PROMPT (t = 1, no filters)."""
    return softmax(first_logits(default_gguf, LAW_PROMPT))


@pytest.fixture(scope="module")
def head(smollm2_checkpoint, first_law, tmp_path_factory):
    ids = np.argsort(first_law)[::-1][:12]
    folder = tmp_path_factory.mktemp("eagle3")
    random_eagle3(folder / "head", smollm2_checkpoint, layers=LAYERS, draft_ids=ids, seed=1, scale=0.02)
    return convert_eagle3(folder / "head", smollm2_checkpoint, folder / "head.gguf"), np.sort(ids)


def test_the_converted_head_is_an_eagle3_gguf_for_the_target(head):
    path, ids = head
    meta = gguf_meta(path)
    assert meta["general.architecture"] == "eagle3"
    assert meta["eagle3.target_layers"] == LAYERS and meta["eagle3.target_hidden_size"] == 576
    assert describe(meta).startswith("an EAGLE-3 head (GGUF architecture eagle3, for a target 576 wide")
    assert np.array_equal(head_ids(path, 49152), ids)  # d2t as absolute target ids


def test_greedy_text_is_target_only_text(default_gguf, head):
    spec = edgespec.load(default_gguf, str(head[0]), n_ctx=512)
    plain = edgespec.load(default_gguf, None, n_ctx=512)
    drafted = 0
    for prompt in ("Write a haiku about rain.", "List three prime numbers.", LAW_PROMPT):
        a = spec.generate(prompt, max_tokens=24, temperature=0, draft_max=3)
        b = plain.generate(prompt, max_tokens=24, temperature=0, draft_max=0)
        assert a.tokens == b.tokens
        drafted += a.stats.drafted
    assert drafted >= 3 * 20  # nearly every round drafted three tokens
    trees = edgespec.load(default_gguf, str(head[0]), n_ctx=512, tree_width=3)  # the chain, two siblings a depth
    for prompt in ("Write a haiku about rain.", LAW_PROMPT):
        a = trees.generate(prompt, max_tokens=24, temperature=0, draft_max=3)
        assert a.tokens == plain.generate(prompt, max_tokens=24, temperature=0, draft_max=0).tokens
        assert a.stats.tree_nodes > a.stats.drafted > 0


@pytest.mark.parametrize("broken", [False, True])
def test_a_drafted_token_follows_the_target_law_at_t1(default_gguf, head, first_law, monkeypatch, broken):
    """600 answers at t = 1 whose first token the head drafted: its law is the target's (cells for the tokens
    likely enough, and the rest). Without the residual step (resampling the target's law on a rejection) the test
    fails at the same alpha."""
    if broken:
        monkeypatch.setattr(rule_module, "residual", target_instead_of_residual)
    engine = edgespec.load(default_gguf, str(head[0]), n_ctx=256)
    p, accepted = drafted_first_token_p(engine, LAW_PROMPT, first_law, 600, 1.0, chat=False)
    assert 600 * 0.1 < accepted < 600 * 0.6  # kept and rejected drafts, both many times
    assert (p < ALPHA) == broken, p


def test_streams_draft_from_one_head_context_as_one_stream_does(reference_pair, head):
    """Two streams, the head's decoder a sequence each of one llama.cpp context, beside the f32 target: greedy
    answers, kept drafts and the head's last laws are one stream's (conftest.streams_draft_as_one)."""
    streams_draft_as_one(reference_pair[0], str(head[0]), ["Write a haiku about rain.", LAW_PROMPT])


def test_streams_draft_the_target_law_at_t1(default_gguf, head, first_law):
    """600 answers at t = 1 on two streams sharing the head's context, their first token drafted: its law is the
    target's. The same check as one stream's above, whose twin shows its power; without the residual step it failed
    here too (p about 5e-5; the streams' rule has its twin in test_streams)."""
    runs = 600
    with Parallel(default_gguf, str(head[0]), streams=2, n_ctx=256) as p:
        results = p.generate([{"prompt": LAW_PROMPT, "seed": seed} for seed in range(runs)], max_tokens=2,
                             temperature=1.0, chat=False, draft_max=1)
    assert all(r.stats.drafted >= 1 for r in results)
    accepted = sum(r.stats.accepted for r in results)
    assert runs * 0.1 < accepted < runs * 0.6
    p = goodness_of_fit([r.tokens[0] for r in results], {int(x): float(q) for x, q in enumerate(first_law)})
    assert p > ALPHA, p


def test_the_training_graph_drafts_as_llama_cpp_does(default_gguf, smollm2_checkpoint, tmp_path):
    """A head from train/eagle3 (the target's last layer, perturbed), converted by llama.cpp's converter and run
    by drafts/eagle3.py: its first draft step's logits and a second step's (fed the next real token) equal the
    training graph's at those entries, so what training optimises is what drafts."""
    import torch

    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.drafts.eagle3 import Eagle3Drafter
    from edgespec.drafts.heads import output_matrix
    from edgespec.export.eagle3 import save_specforge
    from edgespec.export.hf import read_config
    from edgespec.train.eagle3 import NAMES, initial_eagle3, layer_features, torch_head3, unrope_rows

    rng = np.random.default_rng(0)
    weights, meta = initial_eagle3(default_gguf)
    weights = {k: (v + rng.normal(0, 0.01, v.shape)).astype(np.float32) for k, v in weights.items()}
    embeddings = output_matrix(default_gguf)
    subset = np.sort(rng.choice(49152, 2048, replace=False))
    named = {NAMES[k]: v for k, v in weights.items()}
    named[NAMES["attn_q"]] = unrope_rows(weights["attn_q"], meta["n_head"])
    named[NAMES["attn_k"]] = unrope_rows(weights["attn_k"], meta["n_head_kv"])
    named["lm_head.weight"] = embeddings[subset]
    folder = save_specforge(tmp_path / "head", named, target_config=read_config(smollm2_checkpoint), layers=LAYERS,
                            draft_ids=subset)
    gguf = convert_eagle3(folder, smollm2_checkpoint, tmp_path / "head.gguf", outtype="f32")

    target = LlamaBackend(default_gguf, n_ctx=256, n_threads=2, sequences=1)
    tokens = target.tokenize("Speculative decoding drafts tokens cheaply and checks them at once.", special=False)
    target.close()
    n = len(tokens)

    class Seq:
        pass

    seq = Seq()
    seq.tokens = np.array(tokens)
    features = layer_features(default_gguf, [seq], LAYERS, progress=False)[0]  # [n - 1, 3E]
    head = torch_head3(torch, weights, meta, torch.from_numpy(np.ascontiguousarray(embeddings[subset])))
    valid = torch.ones(1, n - 1, dtype=torch.bool)
    with torch.no_grad():
        outs = head(torch.from_numpy(features.astype(np.float32))[None],
                    torch.from_numpy(np.ascontiguousarray(embeddings[tokens[1:]]))[None], valid, valid, 2)
        want = [head.logits(outs[0][0, n - 3]).numpy(), head.logits(outs[1][0, n - 2]).numpy()]

    target = LlamaBackend(default_gguf, n_ctx=256, n_threads=2, sequences=1)
    drafter = Eagle3Drafter(gguf, target)
    target.forward(tokens[:n - 1], 1)
    drafter._commit(tokens[:n - 1])
    first = drafter.last[1]
    second = drafter._entries([tokens[n - 1]], drafter.last[0][None], n - 2)[1]
    for got, ref in ((first, want[0]), (second, want[1])):
        assert np.abs(got - ref).max() < 2e-2 * max(1.0, np.abs(ref).max()), np.abs(got - ref).max()
        assert np.argsort(got)[-5:].tolist() == np.argsort(ref)[-5:].tolist()


def test_train_heads_writes_an_eagle3_gguf_that_drafts(default_gguf, smollm2_checkpoint, tmp_path):
    """train-heads --kind eagle3 end to end on four prompts: corpus, layer inputs, one epoch, the SpecForge
    checkpoint and its GGUF; the GGUF drafts for the target with greedy text equal to target-only."""
    from edgespec.train.heads import train_heads

    prompts = [{"cat": "chat", "prompt": p} for p in ("Name a colour.", "Say hello.", "Count to five.", "Why?")]
    out = tmp_path / "head.gguf"
    summary = train_heads(default_gguf, out, kind="eagle3", hf_target=smollm2_checkpoint, prompts=prompts,
                          epochs=1, max_tokens=16, progress=False, steps=2)
    assert summary["kind"] == "eagle3" and summary["training"]["kind"] == "eagle3"
    assert len(summary["training"]["epochs"][0]["held_out_agreement"]) == 2
    assert (tmp_path / "head.specforge" / "model.safetensors").is_file()
    assert gguf_meta(out)["eagle3.target_layers"] == [2, 15, 27]
    spec = edgespec.load(default_gguf, str(out), n_ctx=256)
    plain = edgespec.load(default_gguf, None, n_ctx=256)
    a = spec.generate("Name a colour.", max_tokens=16, temperature=0, draft_max=2)
    assert a.tokens == plain.generate("Name a colour.", max_tokens=16, temperature=0, draft_max=0).tokens
    assert a.stats.drafted > 0
