"""Medusa heads on the real default model: planned, loaded, trained."""

import numpy as np
from fake import random_table
from test_heads import HiddenFake, V, heads_file

from edgespec.backends import gguf_file
from edgespec.drafts.heads import save_heads


def test_trained_heads_on_the_real_model_learn_and_keep_greedy_output(default_gguf, default_corpus, tmp_path):
    from edgespec.api import load
    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.drafts.heads import output_matrix
    from edgespec.train.corpus import read_corpus
    from edgespec.train.eagle import answer_subset
    from edgespec.train.heads import train_medusa

    _, seqs = read_corpus(default_corpus)
    output = output_matrix(default_gguf)
    subset = answer_subset(seqs, output.shape[0])
    weight, bias, report = train_medusa(seqs, output, subset=subset, n_heads=2, epochs=3, lr=3e-3,
                                        holdout=0.34, progress=False)
    assert report["epochs"][-1]["loss"] < report["epochs"][0]["loss"] and report["subset"] == 8192
    backend = LlamaBackend(default_gguf, n_ctx=16)
    path = save_heads(tmp_path / "d.medusa.npz", weight, bias,
                      {"vocab_digest": backend.vocab.digest, "n_embd": backend.n_embd}, subset=subset)
    engine = load(default_gguf, path, n_ctx=512)
    assert engine.drafter.name == "medusa:d.medusa.npz" and engine.drafter.output.shape == (8192, 576)
    for prompt in ("Say hello.", "Name three colors."):
        base = engine.generate(prompt, max_tokens=24, draft_max=0)
        spec = engine.generate(prompt, max_tokens=24, draft_max=2)
        assert spec.tokens == base.tokens and spec.stats.drafted > 0
    trees = load(default_gguf, path, n_ctx=512, tree_width=2)
    for prompt in ("Say hello.", "Name three colors."):
        spec = trees.generate(prompt, max_tokens=24, draft_max=2)
        assert spec.tokens == engine.generate(prompt, max_tokens=24, draft_max=0).tokens
        assert spec.stats.tree_nodes > spec.stats.drafted > 0
    trees.close()  # heads on ONNX targets: tests/test_onnx_backend.py


def test_heads_are_planned_with_their_rows_of_the_output_layer(default_gguf, tmp_path):
    from edgespec.api import plan_for

    backend = HiddenFake(random_table(np.random.default_rng(0), V))
    heads = heads_file(tmp_path, backend)
    ngram = plan_for(default_gguf, "ngram", device="rpi5-8gb")
    planned = plan_for(default_gguf, heads, device="rpi5-8gb")
    weights = 4 * (3 * V * V + 3 * V)  # the heads' own float32 weights
    assert planned.drafter == "heads" and planned.runtime - ngram.runtime == 49152 * 576 * 4 + weights
    subset = plan_for(default_gguf, heads_file(tmp_path, backend, subset=np.arange(8192)), device="rpi5-8gb")
    assert subset.runtime - ngram.runtime == 8192 * 576 * 4 + weights  # only the subset's rows


def test_the_output_layer_is_read_from_the_header_in_blocks_or_as_a_view(default_gguf, tmp_path):
    """output_matrix finds the tensor from the streamed header: the default model's Q8_0 rows dequantize to
    what gguf's own reader gives (f16 on request, within its rounding), and F32 rows come back as a view of
    the file itself, not a copy."""
    import gguf
    from gguf.quants import dequantize

    from edgespec.drafts.heads import output_matrix

    tensor = next(t for t in gguf_file.open_gguf(default_gguf).tensors if t.name == "token_embd.weight")
    expected = dequantize(tensor.data, tensor.tensor_type).reshape(49152, 576)
    np.testing.assert_array_equal(output_matrix(default_gguf), expected)
    half = output_matrix(default_gguf, np.float16)
    assert half.dtype == np.float16 and np.abs(half - expected).max() <= 1e-3 * np.abs(expected).max()

    rows = np.arange(12 * 64, dtype=np.float32).reshape(12, 64)
    writer = gguf.GGUFWriter(str(tmp_path / "f32.gguf"), "llama")
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    writer.add_tensor("token_embd.weight", rows)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    view = output_matrix(tmp_path / "f32.gguf")
    np.testing.assert_array_equal(view, rows)
    assert isinstance(view.base, np.memmap) or isinstance(view, np.memmap)
