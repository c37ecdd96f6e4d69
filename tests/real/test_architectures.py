"""Export and load of the architectures the common families use (edgespec.models.tiny): Qwen2, Llama 3 with its
rope scaling, Phi3, Gemma2 and Mistral, as tiny random checkpoints exported to GGUF f32 and ONNX fp32 with the
parity check, loaded with edgespec.load, decoding greedy as transformers does from the checkpoint."""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from edgespec.api import load
from edgespec.backends.llama.backend import LlamaBackend
from edgespec.backends.onnx.backend import OnnxBackend
from edgespec.backends.onnx.weights import output_matrix
from edgespec.backends.protocol import check_compatible
from edgespec.errors import EdgespecError
from edgespec.export import export
from edgespec.export.gguf import sliding_window
from edgespec.export.hf import HFModel
from edgespec.export.parity import PARITY_PROMPTS
from edgespec.models.tiny import FAMILIES, write_tiny

VOCAB = {"qwen2": 151936}  # Qwen 2.5's embedding rows (its tokenizer names 151,665): one large vocabulary
# windows shorter than LONG_PROMPT and its answer, so decoding goes past them; Mistral's longer than the parity
# prompts, as the GGUF's context is capped to it (export/gguf.cap_context)
WINDOW = {"gemma2": 32, "mistral": 64}
LONG_PROMPT = "Alice sends Bob a message. Bob reads the message and sends Alice an answer. " * 3 + "Then Alice"
SHORT_PROMPT = "The capital of France is"
N_TOKENS = 24
# how far below transformers' best logit a greedy token of an export may score: float error can flip a near-tie
# (the Mistral ONNX export's 9th token here: 13.533185 against 13.533186); llama.cpp's f16 KV cache errs by up to
# 0.008 at these scales
TIE = {"gguf": 0.02, "onnx": 1e-4}


@dataclass(frozen=True)
class Exported:
    family: str
    checkpoint: Path
    source: HFModel  # transformers on the checkpoint
    gguf: dict  # export()'s summaries
    onnx: dict

    def path(self, fmt: str) -> str:
        return getattr(self, fmt)["path"]


@pytest.fixture(scope="module")
def default_tokenizer(tmp_path_factory):
    from edgespec.models.smollm2 import save_tokenizer

    return save_tokenizer(tmp_path_factory.mktemp("default-tokenizer"))


@pytest.fixture(scope="module", params=list(FAMILIES))
def exported(request, default_tokenizer, tmp_path_factory):
    """One family's checkpoint and its two exports (each export refuses to write on failed parity)."""
    family = request.param
    folder = tmp_path_factory.mktemp(family)
    window = {"sliding_window": WINDOW[family]} if family in WINDOW else {}
    checkpoint = write_tiny(family, folder / family, vocab_size=VOCAB.get(family), tokenizer=default_tokenizer,
                            **window)
    gguf = export(str(checkpoint), "gguf", "f32", folder / f"{family}.gguf", progress=False)
    onnx = export(str(checkpoint), "onnx", "fp32", folder / f"{family}-onnx", progress=False)
    return Exported(family, checkpoint, HFModel(checkpoint), gguf, onnx)


@pytest.mark.parametrize("fmt", ["gguf", "onnx"])
def test_float_exports_reproduce_the_checkpoint(exported, fmt):
    report = getattr(exported, fmt)["parity"]
    assert report["passed"], report["failures"]
    assert report["overall"]["greedy_equal"] == len(PARITY_PROMPTS)
    assert all(p["tokenizer_equal"] for p in report["prompts"])
    assert report["overall"]["kl"] < 1e-5


def test_gguf_context_is_capped_only_where_llama_cpp_drops_the_window(exported):
    """Gemma 2's GGUF keeps its window (llama.cpp attends within it); Mistral's becomes a Llama without one, so
    its context ends at the window, within which the two attend alike."""
    assert exported.gguf["context_capped_to"] == (WINDOW["mistral"] if exported.family == "mistral" else None)


@pytest.mark.parametrize("config, window", [
    ({"sliding_window": 4096, "max_position_embeddings": 32768}, 4096),  # Mistral 7B v0.1
    ({"sliding_window": None, "max_position_embeddings": 32768}, None),  # Mistral 7B v0.2
    ({"sliding_window": 131072, "use_sliding_window": False, "max_position_embeddings": 32768}, None),  # Qwen 2.5
    ({"sliding_window": 2047, "max_position_embeddings": 4096}, 2047),  # Phi-3 mini 4k
    ({"sliding_window": 262144, "max_position_embeddings": 131072}, None),  # Phi-3.5 mini
])
def test_sliding_window_is_read_from_the_config(config, window):
    assert sliding_window(config) == window


@pytest.mark.parametrize("fmt", ["gguf", "onnx"])
def test_loaded_exports_decode_greedy_as_transformers(exported, fmt):
    capped = exported.gguf["context_capped_to"] if fmt == "gguf" else None
    # llama.cpp runs Mistral with full attention: its GGUF's context ends where the window would begin to act
    prompt = SHORT_PROMPT if capped else LONG_PROMPT
    engine = load(exported.path(fmt), draft="ngram", n_ctx=256, threads=1)
    try:
        if capped:
            assert engine.target.n_ctx == capped == WINDOW[exported.family]
        ids = engine.prompt_tokens(prompt, chat=False)
        assert ids == exported.source.tokenize(prompt)
        tokens = engine.generate(prompt, chat=False, max_tokens=N_TOKENS).tokens
        expected = exported.source.greedy(ids, N_TOKENS)
        assert len(tokens) == len(expected)
        if tokens != expected:  # past a flipped near-tie the texts differ: each token must still be the argmax
            assert shortfall(exported.source, ids, tokens).max() < TIE[fmt], (tokens, expected)
        if exported.family in WINDOW and not capped:
            assert len(ids) + len(expected) > WINDOW[exported.family]  # decoding went past the window
    finally:
        engine.close()


def shortfall(source: HFModel, ids: list[int], tokens: list[int]) -> np.ndarray:
    """How far each token's logit falls below the best one in transformers' logits where it was chosen: [n]."""
    logits = source.logits(ids + tokens)[len(ids) - 1:-1]  # [n, V]: row i chose tokens[i]
    return logits.max(-1) - logits[np.arange(len(tokens)), tokens]


def test_gguf_and_onnx_exports_share_one_vocabulary(exported):
    """The two exports of a checkpoint can form a mixed target/draft pair: equal token texts, printed pieces,
    BOS, EOS and end-of-generation ids, the family's end-of-turn token among them."""
    gguf = LlamaBackend(exported.path("gguf"), n_ctx=64, n_threads=1)
    onnx = OnnxBackend(exported.path("onnx"), n_ctx=64, n_threads=1)
    check_compatible(gguf.vocab, onnx.vocab)
    assert gguf.vocab.pieces == onnx.vocab.pieces  # rows past the tokenizer's print nothing in both
    end_of_turn = FAMILIES[exported.family].end_of_turn
    assert gguf.vocab.texts[gguf.vocab.eos_id] == end_of_turn.encode()
    assert gguf.vocab.eos_id in gguf.vocab.eog_ids
    assert gguf.vocab.n_vocab == VOCAB.get(exported.family, len(exported.source.tokenizer))
    gguf.close()
    onnx.close()


def test_onnx_exports_return_the_hidden_state_their_output_layer_reads(exported):
    """Draft heads read the final hidden state and the output layer, found behind Gemma 2's soft-capping too."""
    backend = OnnxBackend(exported.path("onnx"), n_ctx=64, n_threads=1, hidden=True)
    logits = backend.forward([1, 2, 3, 4, 5], 3)  # [3, V]
    scores = backend.last_hidden @ output_matrix(exported.path("onnx")).T  # [3, V]
    cap = getattr(exported.source.model.config, "final_logit_softcapping", None)
    if cap:
        scores = np.tanh(scores / cap) * cap
    np.testing.assert_allclose(scores, logits, atol=1e-4 * np.abs(logits).max())
    backend.close()


def test_unknown_family_is_refused(tmp_path):
    with pytest.raises(EdgespecError, match="unknown model family 'gpt2': choose one of qwen2, llama3"):
        write_tiny("gpt2", tmp_path / "m")
    assert list(tmp_path.iterdir()) == []
