"""The target's layer inputs through llama.cpp's staging functions (backends/llama/ext.py), on the default model:
the features an EAGLE-3 head reads. Layer 0's input is each token's embedding row as gguf-py reads it from the file;
the rows of a prompt fed in two passes equal those of one pass (each row is its own token's, in order, with the
cache behind it)."""

import numpy as np
import pytest

from edgespec.backends import gguf_file
from edgespec.backends.llama.backend import LlamaBackend
from edgespec.backends.llama.ext import LayerInputs, target_layer_ids
from edgespec.errors import EdgespecError

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def target(default_gguf):
    backend = LlamaBackend(default_gguf, n_ctx=256, n_threads=2)
    yield backend
    backend.close()


def embedding_rows(path, ids):
    reader = gguf_file.open_gguf(path)
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    table = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return table.reshape(-1, table.shape[-1])[ids]


def test_layer_inputs_are_each_tokens_own_rows(target, default_gguf):
    ids = target.tokenize("The lighthouse keeper climbed the stairs at dusk.", special=False)
    layers = (0, 4, target.n_layer - 1)
    tap = LayerInputs(target, layers)
    try:
        target.rollback(0)
        target.forward(ids, 1)
        whole = tap.read(len(ids))
        assert whole.shape == (3, len(ids), target.n_embd)
        np.testing.assert_allclose(whole[0], embedding_rows(default_gguf, ids), rtol=0, atol=1e-6)
        assert not np.allclose(whole[1], whole[0]) and not np.allclose(whole[2], whole[1])

        target.rollback(0)
        half = len(ids) // 2
        target.forward(ids[:half], 1)
        first = tap.read(half)
        target.forward(ids[half:], 1)
        second = tap.read(len(ids) - half)
        np.testing.assert_allclose(np.concatenate([first, second], axis=1), whole, rtol=1e-4, atol=1e-4)
        # a twin that pairs the rows with the wrong tokens (one place off) is told apart
        assert not np.allclose(whole[2][1:], np.concatenate([first, second], axis=1)[2][:-1], atol=1e-2)
    finally:
        tap.close()
        target.rollback(0)


def test_bad_layers_are_refused_before_llama_cpp_sees_them(target):
    with pytest.raises(EdgespecError, match=f"layer {target.n_layer}: the model has layers 0 to"):
        LayerInputs(target, [target.n_layer])
    with pytest.raises(EdgespecError, match="layer -1"):
        LayerInputs(target, [-1])


def test_a_plain_model_reads_no_target_layers(target):
    assert target_layer_ids(target._model) == []
