"""GGUF headers of real files read as gguf-py and llama.cpp read them."""

import tracemalloc

import pytest

from edgespec.backends.model_info import read_gguf_header, read_model_info
from edgespec.errors import EdgespecError

GGUF_FIXTURES = ["default_gguf", "q4_0_gguf"]


@pytest.fixture(scope="module", params=GGUF_FIXTURES)
def gguf_pair(request):
    """(path, gguf-py's GGUFReader of it): the reference for the streaming reader."""
    import gguf

    path = request.getfixturevalue(request.param)
    return path, gguf.GGUFReader(path)


def test_gguf_scalar_metadata_equals_gguf_py(gguf_pair):
    import gguf

    path, reader = gguf_pair
    meta, _ = read_gguf_header(path)
    scalars = {k: f.contents() for k, f in reader.fields.items()
               if len(f.types) == 1 and f.types[0] != gguf.GGUFValueType.ARRAY and not k.startswith("GGUF.")}
    assert scalars and meta == pytest.approx(scalars)
    assert "tokenizer.ggml.tokens" in reader.fields and "tokenizer.ggml.tokens" not in meta  # arrays are skipped

    info = read_model_info(path)
    keys = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "context_length")
    expected = tuple(reader.fields[f"llama.{k}"].contents() for k in keys)
    assert (info.n_layer, info.n_embd, info.n_ff, info.n_head, info.n_head_kv, info.n_ctx_train) == expected
    assert (info.n_layer, info.n_head, info.n_head_kv, info.head_dim, info.n_vocab) == (30, 9, 3, 64, 49152)
    assert info.format == "gguf" and info.tied_embeddings  # SmolLM2 has no output.weight


@pytest.mark.parametrize("fixture", GGUF_FIXTURES)
def test_gguf_weight_bytes_equal_llama_cpp_model_size(request, fixture):
    from edgespec.backends.llama.backend import LlamaBackend

    path = request.getfixturevalue(fixture)
    backend = LlamaBackend(path, n_ctx=256)
    try:
        assert read_model_info(path).weight_bytes == backend.memory()["weights"]
    finally:
        backend.close()


def test_gguf_tensor_table_equals_gguf_py(gguf_pair):
    path, reader = gguf_pair
    _, tensors = read_gguf_header(path)
    expected = [(t.name, t.tensor_type.name, int(t.n_elements), int(t.n_bytes)) for t in reader.tensors]
    assert [(t.name, t.type, t.n_elements, t.n_bytes) for t in tensors] == expected
    assert len(expected) == 272  # token_embd, output_norm and 30 blocks of 9: nothing dropped or doubled
    assert read_model_info(path).weight_bytes == sum(n for *_, n in expected)


def test_gguf_header_is_read_without_materialising_the_vocabulary(default_gguf):
    """The reason for the streaming reader: gguf-py holds ~150 MB of arrays for SmolLM2's 49k-token vocabulary."""
    tracemalloc.start()
    try:
        read_model_info(default_gguf)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20


@pytest.mark.parametrize("where", ["magic", "version", "counts", "metadata", "vocabulary", "tensor table"])
def test_truncated_gguf_header_is_a_clear_error(default_gguf, tmp_path, where):
    with open(default_gguf, "rb") as f:
        head = f.read(4_000_000)  # the header is 1.8 MB, the tensor table at its end
    last_tensor = head.rfind(b"blk.29.")
    assert 1_000_000 < last_tensor < len(head)
    n = {"magic": 2, "version": 6, "counts": 20, "metadata": 300, "vocabulary": 200_000,
         "tensor table": last_tensor + 5}[where]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(head[:n])
    message = "not a GGUF file" if where == "magic" else "corrupt or truncated GGUF header"
    with pytest.raises(EdgespecError, match=message) as e:
        read_model_info(cut)
    assert str(cut) in str(e.value)


def test_gguf_truncated_inside_the_tensor_data_is_a_clear_error(default_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(default_gguf, "rb") as f:
        cut.write_bytes(f.read(5_000_000))  # the whole header, a twentieth of the weights
    with pytest.raises(EdgespecError, match="truncated"):
        read_model_info(cut)


def test_pieces_read_from_the_metadata_are_what_llama_cpp_prints(default_gguf):
    """A GGUF's token texts decoded as its tokenizer kind writes them (byte-level BPE here) are the bytes llama.cpp
    prints for each token, but for control tokens, which keep their text: what `edgespec models` pairs a draft of
    another tokenizer by, without loading either."""
    from edgespec.backends.llama.backend import LlamaTokenizer
    from edgespec.backends.model_info import _pieces, read_gguf_vocab

    read, loaded = read_gguf_vocab(default_gguf), LlamaTokenizer(default_gguf).vocab
    differ = [i for i, (a, b) in enumerate(zip(read.pieces, loaded.pieces, strict=True)) if a != b]
    assert 0 < len(differ) < 20 and all(loaded.pieces[i] == b"" and read.pieces[i] == read.texts[i] for i in differ)
    assert _pieces("llama", (b"\xe2\x96\x81the", b"<0x0A>", b"<s>")) == (b" the", b"\n", b"<s>")  # SentencePiece
