"""Model facts from headers (backends.model_info) against the reference readers: onnx here, gguf-py and llama.cpp on
real GGUF files in real/test_model_info_real.py."""

import json
import math

import numpy as np
import pytest

from edgespec.backends.model_info import read_model_info, read_onnx_graph
from edgespec.errors import EdgespecError

# --- GGUF ------------------------------------------------------------------------------------------


def test_non_gguf_and_missing_files_are_clear_errors(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("hello, not a model")
    with pytest.raises(EdgespecError, match="not a GGUF file"):
        read_model_info(text)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(EdgespecError, match="not a GGUF file"):
        read_model_info(empty)
    with pytest.raises(EdgespecError, match="not found"):
        read_model_info(tmp_path / "absent.gguf")
    bad_type = tmp_path / "bad-type.gguf"  # a valid start, then metadata of value type 99
    bad_type.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
                         + (3).to_bytes(8, "little") + b"key" + (99).to_bytes(4, "little"))
    with pytest.raises(EdgespecError, match="corrupt or truncated.*unknown GGUF value type 99"):
        read_model_info(bad_type)


# --- ONNX ------------------------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def packed_dims_tensor(name: str, dims: list[int], data_type: int, raw: bytes) -> bytes:
    """A TensorProto with its dims packed (onnx's own writer emits them one key per dim)."""
    return (_field(1, b"".join(_varint(d) for d in dims)) + _varint(2 << 3) + _varint(data_type)
            + _field(8, name.encode()) + _field(9, raw))


@pytest.fixture
def onnx_export(tmp_path):
    """An ONNX export folder whose model.onnx has initializers of several types, one as external data, one with
    packed dims; and config.json. Returns (folder, the name of the external data file)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((64, 40)).astype(np.float32), "big_f32"),  # 10 KiB: external
        numpy_helper.from_array(rng.standard_normal((3, 7)).astype(np.float16), "w_f16"),
        numpy_helper.from_array(rng.integers(-128, 127, (5, 300)).astype(np.int8), "w_i8"),  # 300: a 2-byte varint
        numpy_helper.from_array(rng.integers(0, 255, (2, 2, 3)).astype(np.uint8), "w_u8"),
        numpy_helper.from_array(np.array(1.5, dtype=np.float32), "scalar"),  # no dims: one element
        helper.make_tensor("w_i4", TensorProto.INT4, [3, 5], rng.integers(-8, 7, 15).tolist()),  # 8 bytes packed
        helper.make_tensor("w_u4", TensorProto.UINT4, [4, 4], rng.integers(0, 15, 16).tolist()),
    ]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"]),
              helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT16, [1, 2, "past", 8]),
              helper.make_tensor_value_info("past_key_values.0.value", TensorProto.FLOAT16, [1, 2, "past", 8])]
    graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["logits"])], "g", inputs,
                              [helper.make_tensor_value_info("logits", TensorProto.INT64, [1, "seq"])], inits)
    folder = tmp_path / "export"
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph), path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=1024)
    # a second graph field merges into the first (protobuf semantics): one more initializer, dims packed
    packed = packed_dims_tensor("w_packed", [300, 2], TensorProto.FLOAT16, np.zeros(600, np.float16).tobytes())
    path.write_bytes(path.read_bytes() + _field(7, _field(5, packed)))
    (folder / "config.json").write_text(json.dumps({
        "num_hidden_layers": 1, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2,
        "intermediate_size": 32, "vocab_size": 100, "max_position_embeddings": 512}))
    return folder, "model.onnx.data"


def onnx_reference(path):
    """(name, type, elements, bytes) per initializer, as onnx itself reads them (external data loaded)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    out = []
    for init in onnx.load(path).graph.initializer:
        array = numpy_helper.to_array(init)
        four_bit = init.data_type in (TensorProto.INT4, TensorProto.UINT4)
        out.append((init.name, TensorProto.DataType.Name(init.data_type), int(array.size),
                    math.ceil(array.size / 2) if four_bit else int(array.nbytes)))
    return out


def test_onnx_initializers_equal_onnx_numpy_helper(onnx_export):
    from onnx import TensorProto

    folder, data_file = onnx_export
    expected = onnx_reference(folder / "model.onnx")
    assert {name for name, *_ in expected} >= {"big_f32", "w_i4", "w_u4", "w_packed", "scalar"}
    assert any(i.data_location == TensorProto.EXTERNAL for i in _load_without_data(folder / "model.onnx"))
    tensors, inputs = read_onnx_graph(folder / "model.onnx")
    assert [(t.name, t.type, t.n_elements, t.n_bytes) for t in tensors] == expected
    assert inputs == {"input_ids": TensorProto.INT64, "past_key_values.0.key": TensorProto.FLOAT16,
                      "past_key_values.0.value": TensorProto.FLOAT16}

    (folder / data_file).unlink()  # the tensors' bytes are never read: the external file is not needed
    assert read_onnx_graph(folder / "model.onnx")[0] == tensors


def _load_without_data(path):
    import onnx

    return onnx.load(path, load_external_data=False).graph.initializer


def test_onnx_export_folder_info(onnx_export):
    from edgespec.plan.planner import kv_bytes

    folder, _ = onnx_export
    info = read_model_info(folder)
    assert read_model_info(folder / "model.onnx") == info  # the file names its folder
    assert (info.format, info.n_layer, info.n_embd, info.n_head, info.n_head_kv, info.head_dim, info.n_vocab,
            info.n_ctx_train) == ("onnx", 1, 16, 2, 2, 8, 100, 512)
    assert info.kv_dtype_bytes == 2  # the past is FLOAT16
    assert info.weight_bytes == sum(n for *_, n in onnx_reference(folder / "model.onnx"))
    assert kv_bytes(info, 100, "q4_0", "onnxruntime") == 1 * 2 * 2 * 8 * 100 * 2  # the export's dtype, not q4_0


@pytest.mark.parametrize("seed", range(6))
def test_corrupt_onnx_is_a_clear_error(onnx_export, seed):
    folder, _ = onnx_export
    (folder / "model.onnx").write_bytes(np.random.default_rng(seed).bytes(20_000))
    with pytest.raises(EdgespecError, match="model.onnx"):
        read_model_info(folder)


def test_onnx_without_initializers_or_config_is_a_clear_error(onnx_export):
    import onnx
    from onnx import TensorProto, helper

    folder, _ = onnx_export
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph), folder / "model.onnx")
    with pytest.raises(EdgespecError, match="holds no initializers"):
        read_model_info(folder)
    (folder / "config.json").unlink()
    with pytest.raises(EdgespecError, match="not an ONNX export folder"):
        read_model_info(folder)


def test_empty_onnx_is_a_clear_error(onnx_export):
    folder, _ = onnx_export
    (folder / "model.onnx").write_bytes(b"")
    with pytest.raises(EdgespecError):
        read_model_info(folder)
