"""ONNX export: optimum's exporter, onnxruntime's quantizers, a parity check, and nothing at `out` unless it passed."""

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from edgespec.backends.onnx.backend import OnnxBackend
from edgespec.errors import EdgespecError
from edgespec.export import onnx as onnx_export
from edgespec.export import parity
from edgespec.export.hf import HFModel
from edgespec.export.onnx import ONNX_QUANTS, export_onnx
from edgespec.export.parity import BackendModel


def leftovers(parent: Path) -> list[str]:
    """Hidden temporary folders an export left behind in `parent`."""
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


@pytest.fixture(scope="module")
def tiny_exports(tiny_checkpoint, tmp_path_factory):
    """Every quantization of the tiny checkpoint, exported with parity: {quant: export_onnx's result}."""
    parent = tmp_path_factory.mktemp("tiny-onnx")
    return {quant: export_onnx(tiny_checkpoint, parent / quant, quant, progress=False) for quant in ONNX_QUANTS}


@pytest.fixture
def external_data(monkeypatch):
    """Make the float32 export keep its weights in model.onnx_data, as optimum does past protobuf's 2 GB."""
    import onnx

    export_fp32 = onnx_export.export_fp32

    def export_external(src, folder):
        export_fp32(src, folder)
        model = onnx.load(str(folder / "model.onnx"))
        onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx_data", size_threshold=100)

    monkeypatch.setattr(onnx_export, "export_fp32", export_external)


@pytest.mark.parametrize("quant", ONNX_QUANTS)
def test_export_passes_parity_and_holds_what_a_runtime_needs(tiny_exports, quant):
    result = tiny_exports[quant]
    out = Path(result["path"])
    assert (result["format"], result["quant"], result["model_file"]) == ("onnx", quant, "model.onnx")
    assert result["parity"]["passed"], result["parity"]["failures"]
    assert result["parity_report"] == str(out) + ".parity.json"
    assert json.loads(Path(result["parity_report"]).read_text()) == result["parity"]
    for name in ("model.onnx", "tokenizer.json", "generation_config.json"):
        assert (out / name).is_file(), name
    assert result["weight_bytes"] == (out / "model.onnx").stat().st_size  # small enough for one file
    assert leftovers(out.parent) == []


def test_quantized_exports_are_smaller(tiny_exports):
    size = {quant: result["weight_bytes"] for quant, result in tiny_exports.items()}
    assert size["fp16"] < 0.6 * size["fp32"]
    assert size["int8"] < 0.5 * size["fp32"]
    assert size["int4"] < size["fp32"]  # only the MatMuls: the tiny model's float32 embedding dominates


def test_fp32_export_decodes_like_transformers(tiny_checkpoint, tiny_exports):
    source = HFModel(tiny_checkpoint)
    exported = BackendModel(OnnxBackend(tiny_exports["fp32"]["path"], n_ctx=256))
    for prompt in ["Once upon a time", "1, 2, 3,"]:
        ids = source.tokenize(prompt)
        assert exported.tokenize(prompt) == ids
        np.testing.assert_allclose(exported.logits(ids), source.logits(ids), atol=1e-4)
        greedy = exported.greedy(ids, 8)  # one cached step per token
        assert len(greedy) == 8
        assert greedy == source.greedy(ids, 8)


def test_the_source_answers_once_for_each_export_of_a_checkpoint(tiny_checkpoint, tmp_path):
    """A second look at the same checkpoint (the next export's parity) answers from what the first computed,
    without loading the model; a checkpoint whose files changed is run again."""
    ids = HFModel(tiny_checkpoint).tokenize("Once upon a time")
    first = HFModel(tiny_checkpoint)
    logits, greedy = first.logits(ids), first.greedy(ids, 6)
    logits[:] = 0  # the caller's copy
    again = HFModel(tiny_checkpoint)
    np.testing.assert_array_equal(again.logits(ids), first._logits(ids))
    assert again.greedy(ids, 6) == greedy and again._model is None
    changed = shutil.copytree(tiny_checkpoint, tmp_path / "changed")
    assert HFModel(changed).greedy(ids, 6) == greedy
    weights = next(changed.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    other = HFModel(changed)
    assert other.greedy(ids, 6) == greedy and other._model is not None


@pytest.mark.parametrize("quant", ONNX_QUANTS)
def test_external_data_goes_with_the_model_and_no_stale_file_stays(tiny_checkpoint, tiny_exports, external_data,
                                                                    tmp_path, quant):
    result = export_onnx(tiny_checkpoint, tmp_path / quant, quant, progress=False)
    out = Path(result["path"])
    weights = onnx_export.weight_files(out / "model.onnx")
    assert len(weights) == 2  # the graph and one data file
    assert sorted(f.name for f in out.iterdir() if "onnx" in f.name) == sorted(f.name for f in weights)
    assert result["parity"]["passed"], result["parity"]["failures"]
    assert result["weight_bytes"] == pytest.approx(tiny_exports[quant]["weight_bytes"], rel=0.05)


def test_int8_weights_keep_to_7_bits(tiny_exports):
    """Full-range int8 weights saturate onnxruntime's u8s8 kernel on x86 CPUs without VNNI (two products of
    255 * 127 overflow its 16-bit sums; 255 * 64 do not): the export must use 7 bits whichever CPU made it."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(Path(tiny_exports["int8"]["path"]) / onnx_export.MODEL_FILE))
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert weights and sum(w.size for w in weights) > 10_000
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) == 64


def test_quiet_export_writes_nothing_to_stdout(tiny_checkpoint, tmp_path, capfd):
    result = export_onnx(tiny_checkpoint, tmp_path / "m", "int8", progress=False, parity=False)
    out, err = capfd.readouterr()
    assert out == ""
    assert "quantizing" not in err
    assert (result["parity"], result["parity_report"]) == (None, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_export_libraries_are_imported_only_when_used():
    code = ("import sys, edgespec.export.onnx; "
            "print(sorted({'onnx', 'onnxruntime', 'optimum', 'torch', 'transformers'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_a_missing_library_says_how_to_install_it():
    with pytest.raises(EdgespecError, match=r"no_such_module is missing\): pip install 'edgespec\[export\]'"):
        onnx_export._require("no_such_module")


def test_missing_source_folder_is_an_error(tmp_path):
    with pytest.raises(EdgespecError, match="no config.json"):
        export_onnx(tmp_path / "absent", tmp_path / "out", "fp32")
    assert list(tmp_path.iterdir()) == []


def test_unknown_quant_is_refused_before_any_work(tmp_path):
    with pytest.raises(EdgespecError, match="fp32, fp16, int8, int4"):
        export_onnx(tmp_path / "absent", tmp_path / "out", "q3")  # not even the source is looked at
    assert list(tmp_path.iterdir()) == []


def test_non_empty_output_folder_is_refused(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(EdgespecError, match="not an empty folder"):
        export_onnx(tiny_checkpoint, out, "fp32")
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert leftovers(tmp_path) == []


def test_too_little_disk_is_refused_up_front(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_export.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=10**6))
    with pytest.raises(EdgespecError, match=r"not enough disk: need about 0\.03 GB at .*, 0\.00 GB free"):
        export_onnx(tiny_checkpoint, tmp_path / "out", "fp32")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error", [RuntimeError("quantizer crashed"), KeyboardInterrupt()])
def test_failure_while_quantizing_leaves_nothing(tiny_checkpoint, tmp_path, monkeypatch, capfd, error):
    def crash(*args, **kwargs):
        raise error

    monkeypatch.setattr("onnxruntime.quantization.quantize_dynamic", crash)
    with pytest.raises(type(error)):
        export_onnx(tiny_checkpoint, tmp_path / "out", "int8", progress=True)
    assert list(tmp_path.iterdir()) == []
    out, err = capfd.readouterr()
    assert out == ""  # progress lines go to stderr, the libraries' prints too
    assert "exporting to ONNX ...\n" in err and "quantizing to int8 ...\n" in err


def test_parity_failure_leaves_only_the_report(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setitem(parity.THRESHOLDS, "fp32", parity.Threshold(max_kl=-1.0, min_top1=1.0, greedy_equal=True))
    with pytest.raises(EdgespecError, match="parity check failed for fp32: mean KL .* > -1.0"):
        export_onnx(tiny_checkpoint, tmp_path / "out", "fp32", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["out.parity.json"]
    report = json.loads((tmp_path / "out.parity.json").read_text())
    assert not report["passed"] and report["overall"]["top1_agreement"] == 1.0


def test_smollm2_fp32_export_reproduces_the_checkpoint(smollm2_onnx_fp32):
    report = smollm2_onnx_fp32["parity"]
    assert report["passed"], report["failures"]
    assert report["overall"]["greedy_equal"] == len(parity.PARITY_PROMPTS)


@pytest.mark.parametrize("quant, max_size", [("int8", 0.5), ("int4", 0.4)])
def test_smollm2_quantized_export_passes_parity(smollm2_checkpoint, smollm2_onnx_fp32, tmp_path, monkeypatch,
                                                quant, max_size):
    # the exporter's output is the float32 export (conftest): reuse it rather than spend another 20 s exporting
    fp32 = smollm2_onnx_fp32["path"]
    monkeypatch.setattr(onnx_export, "export_fp32", lambda src, folder: shutil.copytree(fp32, folder))
    result = export_onnx(smollm2_checkpoint, tmp_path / quant, quant, progress=False)
    assert result["parity"]["passed"], result["parity"]["failures"]
    assert result["weight_bytes"] < max_size * smollm2_onnx_fp32["weight_bytes"]


@pytest.mark.parametrize("quant", ONNX_QUANTS)
def test_every_quantization_returns_hidden_states_and_heads_read_its_output_layer(tiny_exports, quant):
    """The hidden-state output survives each quantizer. Heads read the output layer from float weights: fp32 and
    fp16 keep them, int4 keeps the tied embedding table float (the tiny model ties them), int8 quantizes both
    and is refused for heads with a clear error."""
    from edgespec.backends.onnx.weights import output_matrix

    folder = tiny_exports[quant]["path"]
    backend = OnnxBackend(folder, n_ctx=64, hidden=True)
    logits = backend.forward([1, 2, 3, 4, 5], 3)
    assert backend.last_hidden.shape == (3, 64)
    if quant == "int8":
        with pytest.raises(EdgespecError, match="keeps quantized; use an fp32 or fp16 export"):
            output_matrix(folder)
    else:
        output = output_matrix(folder).astype(np.float32)  # [V, E]
        np.testing.assert_allclose(backend.last_hidden @ output.T, logits, atol=1e-3 * np.abs(logits).max())
    backend.close()
