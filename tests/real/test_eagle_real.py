"""The EAGLE head on the real default model: planned, loaded and exact."""

import pytest

from edgespec.drafts.eagle import eagle_bytes
from edgespec.errors import EdgespecError

# the shipped head's acceptance on the default model at a fixed draft length of 3, on every third bench prompt: over
# 0.25 alone, 0.24 behind prompt lookup (which takes the easy repeats); an untrained head is accepted at about 0
HEAD_ACCEPTANCE_FLOOR = 0.2


def test_draft_trees_need_a_draft_model_or_heads(default_gguf):
    from edgespec.api import load

    with pytest.raises(EdgespecError, match="draft trees come from a draft model or heads"):
        load(default_gguf, "ngram", tree_width=2)
    with pytest.raises(EdgespecError, match="tree width must be between 1 and 4"):
        load(default_gguf, "ngram", tree_width=5)


def test_a_trained_eagle_head_on_the_real_model_learns_and_keeps_greedy_output(default_gguf, default_corpus,
                                                                               tmp_path):
    from edgespec.api import load, plan_for
    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.train.corpus import read_corpus
    from edgespec.train.eagle import fit_eagle

    _, seqs = read_corpus(default_corpus)
    backend = LlamaBackend(default_gguf, n_ctx=16)
    meta = {"vocab_digest": backend.vocab.digest, "n_embd": backend.n_embd}
    backend.close()
    path = tmp_path / "d.eagle.npz"
    report = fit_eagle(default_gguf, seqs, path, meta, subset_size=2048, epochs=3, steps=2, lr=1e-3, batch=1,
                       holdout=0.34, progress=False)
    assert report["epochs"][-1]["loss"] < report["epochs"][0]["loss"]
    engine = load(default_gguf, path, n_ctx=512)
    assert engine.drafter.name == "eagle:d.eagle.npz"
    for prompt in ("Say hello.", "Name three colors."):
        base = engine.generate(prompt, max_tokens=24, draft_max=0)
        spec = engine.generate(prompt, max_tokens=24, draft_max=3)
        assert spec.tokens == base.tokens and spec.stats.drafted > 0
        assert engine.generate(prompt, max_tokens=24).tokens == base.tokens  # chains as far as the gate lets them
    engine.close()
    trees = load(default_gguf, path, n_ctx=512, tree_width=3)  # the head's chain and two siblings per depth
    for prompt in ("Say hello.", "Name three colors."):
        spec = trees.generate(prompt, max_tokens=24, draft_max=3)
        assert spec.tokens == trees.generate(prompt, max_tokens=24, draft_max=0).tokens
        assert spec.stats.tree_nodes > spec.stats.drafted > 0
    trees.close()
    ngram = plan_for(default_gguf, "ngram", device="rpi5-8gb")
    planned = plan_for(default_gguf, path, device="rpi5-8gb")
    assert planned.drafter == "heads" and planned.runtime - ngram.runtime == eagle_bytes(path, 49152, 8192)
    assert eagle_bytes(path, 49152, 8192) > 49152 * 576 * 4 + 2048 * 576 * 2


def test_the_shipped_head_drafts_for_the_default_model_and_keeps_greedy_output(default_gguf):
    """The EAGLE head that ships ("eagle", trained on the default model's f32 export) loads for the default model,
    is accepted there well beyond chance, and, alone and behind prompt lookup, keeps greedy output."""
    from edgespec.api import load, plan_for
    from edgespec.bench import read_prompts

    prompts = [row["prompt"] for row in read_prompts(None)][::3]
    for draft in ("eagle", "ngram+eagle"):
        engine = load(default_gguf, draft, n_ctx=512)
        drafted = accepted = 0
        for prompt in prompts:
            base = engine.generate(prompt, max_tokens=32, draft_max=0)
            spec = engine.generate(prompt, max_tokens=32, draft_max=3)
            assert spec.tokens == base.tokens, (draft, prompt)
            drafted += spec.stats.drafted - spec.stats.lookup_drafted
            accepted += spec.stats.accepted - spec.stats.lookup_accepted
        engine.close()
        assert drafted > 50 and accepted / drafted > HEAD_ACCEPTANCE_FLOOR, (draft, accepted, drafted)
    assert plan_for(default_gguf, "eagle", device="rpi5-8gb").drafter == "heads"
