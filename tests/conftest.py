import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def default_gguf():
    from edgespec.models.default import default_target

    return default_target()


@pytest.fixture(scope="session")
def q4_0_gguf(default_gguf, tmp_path_factory):
    """A second GGUF of the default model (re-quantized to Q4_0): a real draft with the same vocabulary."""
    from edgespec.runtime.llama_backend import quantize_gguf

    return quantize_gguf(default_gguf, tmp_path_factory.mktemp("models") / "smollm2-q4_0.gguf", "q4_0")
