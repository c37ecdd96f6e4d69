"""Random-weight GGUFs with the default model's tokenizer: the shapes benchmarks need, loadable by llama.cpp."""

import numpy as np
import pytest

from edgespec.errors import EdgespecError
from edgespec.models.random_gguf import write_random_gguf


def test_a_padded_vocabulary_keeps_the_default_tokenizer(tmp_path):
    from edgespec.backends.llama.backend import LlamaBackend, LlamaTokenizer
    from edgespec.models.default import default_target

    path = write_random_gguf(tmp_path / "r.gguf", shape="tiny", n_vocab=152064, dtype="q8_0")
    model, reference = LlamaBackend(path, n_ctx=64, n_threads=1), LlamaTokenizer(default_target())
    try:
        assert model.vocab.n_vocab == 152064
        text = "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"
        assert model.tokenize(text, special=True) == reference.tokenize(text, special=True)
        assert model.vocab.eog_ids == reference.vocab.eog_ids and model.chat_template() == reference.chat_template()
        assert model.vocab.texts[:49152] == reference.vocab.texts
        assert model.vocab.pieces[152063] == b""  # a reserved control token prints nothing
        logits = model.forward(model.tokenize(text, special=True), 2)
        assert logits.shape == (2, 152064) and np.isfinite(logits).all() and logits.std() > 0
    finally:
        model.close()
        reference.close()
    assert [p.name for p in tmp_path.iterdir()] == ["r.gguf"]  # the f16 file it was quantized from is gone


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused_and_writes_nothing(tmp_path):
    with pytest.raises(EdgespecError, match="smaller than the tokenizer"):
        write_random_gguf(tmp_path / "r.gguf", shape="tiny", n_vocab=1000)
    assert list(tmp_path.iterdir()) == []
