"""Widened copies of a llama GGUF (models/widen.py): a larger model's shapes and cost, the source's function. The
logits of every position and the greedy text of a real model must be the source's, up to float rounding; a width
that cannot hold the source is refused before anything is written."""

import numpy as np
import pytest
from stats_util import first_logits, softmax

import edgespec
from edgespec.backends import gguf_file
from edgespec.backends.protocol import forward_rows
from edgespec.errors import EdgespecError
from edgespec.export.eagle3 import convert_eagle3, random_eagle3
from edgespec.models.random_gguf import write_random_gguf
from edgespec.models.widen import SHAPES, Width, widen_gguf

PROMPT = "<|im_start|>user\nWrite a Python function that reverses a list.<|im_end|>\n<|im_start|>assistant\n"
TINY_WIDER = Width(128, 8, 2, 320)  # tiny is 64 wide, 4 heads of 16 sharing 2, feed-forward 128


def load(path):
    """One thread, so the source and its copy sum in the same order as far as the shapes allow."""
    from edgespec.backends.llama.backend import LlamaBackend

    return LlamaBackend(path, n_ctx=128, n_threads=1)


def logits_of(path, text=PROMPT) -> np.ndarray:
    """[n, V] the logits of every position of text."""
    backend = load(path)
    try:
        return np.concatenate([rows.copy() for rows in forward_rows(backend, backend.tokenize(text, special=True))])
    finally:
        backend.close()


def greedy(path, n: int, text=PROMPT) -> list[int]:
    backend = load(path)
    try:
        out, logits = [], backend.forward(backend.tokenize(text, special=True), 1)
        while len(out) < n and (not out or out[-1] not in backend.vocab.eog_ids):
            out.append(int(np.argmax(logits[0])))
            logits = backend.forward(out[-1:], 1)
        return out
    finally:
        backend.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer random model at f32: normalised activations against 0.02-std embeddings give logits of std ~0.16."""
    folder = tmp_path_factory.mktemp("widen")
    return write_random_gguf(folder / "tiny.gguf", shape="tiny", n_vocab=49152, dtype="f32", seed=3)


def test_the_widened_shapes_are_a_larger_models(tiny, tmp_path):
    wide = widen_gguf(tiny, tmp_path / "wide.gguf", TINY_WIDER, "f32")
    shapes = {t.name: [int(d) for d in t.shape] for t in gguf_file.open_gguf(wide).tensors}  # ggml's order
    assert shapes["token_embd.weight"] == [128, 49152]
    assert shapes["blk.0.attn_q.weight"] == [128, 128] and shapes["blk.0.attn_k.weight"] == [128, 32]
    assert shapes["blk.1.ffn_down.weight"] == [320, 128] and shapes["output_norm.weight"] == [128]
    # 2B-class from SmolLM2-135M's 30 layers: the parameters the measurements were made with
    layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048
    assert 30 * layer + 49152 * 2048 + 2048 == pytest.approx(1.93e9, rel=0.01) and SHAPES["2b"].embd == 2048


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_a_widened_copy_computes_the_sources_logits(tiny, tmp_path, dtype):
    """f32: the source's logits at every position to float32 rounding (sums of more terms, the new ones zero).
    q8_0: a widened Q8_0 holds the blocks llama.cpp's quantizer makes of the source, and zero blocks add exactly
    nothing to ggml's block dot products: its logits are the source's Q8_0's, bit for bit."""
    if dtype == "q8_0":
        from edgespec.backends.llama.lib import quantize_gguf

        source = quantize_gguf(tiny, tmp_path / "tiny-q8_0.gguf", "q8_0")
    else:
        source = tiny
    want = logits_of(source)
    got = logits_of(widen_gguf(tiny, tmp_path / "wide.gguf", TINY_WIDER, dtype))
    assert got.shape == want.shape and want.std() > 1e-3
    if dtype == "q8_0":
        assert np.array_equal(got, want)
    else:
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))


def test_the_default_model_widened_writes_its_own_text(default_gguf, tmp_path):
    """The real model (dequantized from its Q4_1 to f32, the reference) and a copy 1024 wide with 16 heads over 4
    key/value heads (SmolLM2's 9 over 3, placed 3 per group of 4) and 2.7x its feed-forward, at f16: the same
    greedy answer, logits within f16's rounding of the activations."""
    reference = widen_gguf(default_gguf, tmp_path / "same.gguf", Width(576, 9, 3, 1536), "f32")
    wide = widen_gguf(default_gguf, tmp_path / "wide.gguf", Width(1024, 16, 4, 4096), "f16")
    assert greedy(wide, 40) == greedy(reference, 40)
    want, got = logits_of(reference), logits_of(wide)
    assert np.abs(got - want).max() < 0.1 and (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.95


@pytest.mark.parametrize("width, message", [
    (Width(512, 8, 2, 1536), "at least that width"),          # narrower than 576
    (Width(1024, 16, 2, 4096), "at least that width"),        # fewer key/value heads than the source's 3
    (Width(1024, 8, 4, 4096), "changes the head size"),       # 128-wide heads
    (Width(1024, 16, 5, 4096), "evenly"),
])
def test_a_width_that_cannot_hold_the_source_is_refused_and_writes_nothing(default_gguf, tmp_path, width, message):
    with pytest.raises(EdgespecError, match=message):
        widen_gguf(default_gguf, tmp_path / "wide.gguf", width, "f16")
    assert list(tmp_path.iterdir()) == []


def test_another_architecture_is_refused(tmp_path):
    writer = gguf_file.new_writer(None, "gpt2")
    writer.add_block_count(1)
    gguf_file.write(writer, tmp_path / "gpt2.gguf")
    with pytest.raises(EdgespecError, match="'gpt2' model: widening knows llama models and their EAGLE-3 heads"):
        widen_gguf(tmp_path / "gpt2.gguf", tmp_path / "wide.gguf", SHAPES["2b"])
    assert not (tmp_path / "wide.gguf").exists()


LAW_PROMPT = "Once upon a time, in a small"


@pytest.fixture(scope="module")
def eagle3_pairs(default_gguf, smollm2_checkpoint, tmp_path_factory):
    """The default model and an EAGLE-3 head for it (random weights over the target's 12 likeliest first tokens,
    converted by llama.cpp's converter), both at their own width and both widened to 768, at f32: the copies'
    logits are their sources' to float32 rounding (a Q8_0 copy is not, at a width ratio of 4/3: the activations'
    own Q8 blocks round differently)."""
    folder = tmp_path_factory.mktemp("widen-eagle3")
    ids = np.argsort(softmax(first_logits(default_gguf, LAW_PROMPT)))[::-1][:12]
    random_eagle3(folder / "head", smollm2_checkpoint, layers=[2, 15, 27], draft_ids=ids, seed=1)
    head = convert_eagle3(folder / "head", smollm2_checkpoint, folder / "head.gguf")
    widths = {"same": Width(576, 9, 3, 1536), "wide": Width(768, 12, 4, 2048)}
    return {name: (widen_gguf(default_gguf, folder / f"{name}.gguf", w, "f32"),
                   widen_gguf(head, folder / f"{name}-head.gguf", w, "f32")) for name, w in widths.items()}


def test_an_eagle3_head_widened_with_its_target_drafts_its_laws(eagle3_pairs, monkeypatch):
    """The widened head reads the widened target's layers (3 x 768 into fc, [embedding; g] of 2 x 768 into the
    attention) and computes the source head's logits: over the same greedy answers (the targets agree), every
    decoder call's logits, committed entries and draft steps alike, are the source pair's up to the rounding the
    widened target's 30 layers add (its own logits move by 3e-4 of their range)."""
    head = gguf_file.open_gguf(eagle3_pairs["wide"][1])
    shapes = {t.name: [int(d) for d in t.shape] for t in head.tensors}
    assert shapes["fc.weight"] == [3 * 768, 768] and shapes["blk.0.attn_q.weight"] == [2 * 768, 768]
    assert head.fields["eagle3.target_hidden_size"].contents() == 768
    from edgespec.drafts.llama_head import LlamaHeadDrafter

    entries = LlamaHeadDrafter._entries
    seen: list[np.ndarray] = []

    def recorded(self, tokens, states, first):
        state, logits = entries(self, tokens, states, first)
        seen.append(logits.copy())
        return state, logits

    monkeypatch.setattr(LlamaHeadDrafter, "_entries", recorded)
    runs = {}
    for name, (target, head) in eagle3_pairs.items():
        engine = edgespec.load(str(target), str(head), n_ctx=256)
        seen.clear()
        answers = [engine.generate(prompt, chat=False, max_tokens=16, temperature=0, draft_max=3)
                   for prompt in (LAW_PROMPT, "The three primary colours are")]
        runs[name] = [a.tokens for a in answers], list(seen), sum(a.stats.drafted for a in answers)
    (same_text, same_logits, drafted), (wide_text, wide_logits, _) = runs["same"], runs["wide"]
    assert wide_text == same_text and drafted >= 2 * 12
    assert len(wide_logits) == len(same_logits) > drafted  # the draft steps and the rounds' committed entries
    for want, got in zip(same_logits, wide_logits, strict=True):
        assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max() and got.argmax() == want.argmax()
