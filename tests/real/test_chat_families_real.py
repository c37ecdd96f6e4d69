"""Chat families on the real default model."""

import pytest
from test_chat_families import template


def test_the_smollm2_template_is_the_default_models(default_gguf):
    pytest.importorskip("llama_cpp")
    from edgespec.backends.llama.model import LlamaTokenizer

    model = LlamaTokenizer(default_gguf)
    try:
        assert model.chat_template() == template("smollm2")
    finally:
        model.close()
