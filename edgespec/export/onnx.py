"""ONNX export of a Hugging Face checkpoint: optimum's exporter, onnxruntime's quantizers, a parity check.

The contract: `export_onnx` writes a folder holding `model.onnx` (a decoder with past key/values, its
external data file if it has one), the tokenizer files and generation_config.json, or writes nothing.
The work happens in a hidden temporary folder beside `out`, renamed to `out` only after the parity check
passed; on any failure, Ctrl-C included, the temporary folder is removed (the parity report stays).

This is the only module importing optimum and onnx's tools (and onnxruntime's quantizers), lazily, so
`import edgespec` works without them; exports are run for the parity check by the runtime's own
OnnxBackend, the backend that serves them later. Nothing here writes to stdout: the CLI's --json mode
owns it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import shutil
import sys
import tempfile
from pathlib import Path

from edgespec.backends.onnx.backend import HIDDEN_OUTPUT, OnnxBackend
from edgespec.backends.onnx.weights import logits_matmul
from edgespec.errors import EdgespecError
from edgespec.export.files import count_params, ensure_disk
from edgespec.export.hf import HFModel, read_config
from edgespec.export.parity import BackendModel, check, run_parity, write_report
from edgespec.models.source import Source
from edgespec.progress import say as say_if

ONNX_QUANTS = ("fp32", "fp16", "int8", "int4")
MODEL_FILE = "model.onnx"
# besides the model: what a runtime needs to tokenize and to stop, checked after the export
REQUIRED_FILES = ("tokenizer.json", "generation_config.json")
# copied from the source when the exporter did not write them
SIDE_FILES = REQUIRED_FILES + ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
BLOCK_SIZE = 32  # weights per scale in MatMulNBits blocks; 128 costs SmolLM2-135M int4 KL 0.52 against 0.34
# The MLP output projections: their inputs carry the activation outliers of SiLU(gate) * up, so quantizing
# them costs the most, whether the error is in their int4 weights or in their per-tensor int8 inputs.
# Measured on SmolLM2-135M (mean KL, top-1 agreement): int8 per channel, all MatMuls 0.42, 0.71; all but
# these 0.075, 0.87; int4 all 0.34, 0.76; these in 8 bits 0.15, 0.87 (llama.cpp's Q4_K_M too gives ffn_down
# more bits).
SENSITIVE_MATMULS = "/mlp/down_proj/"
PARITY_CTX = 512  # the parity prompts and their greedy continuations fit easily
DISK_FACTOR = 2.5  # the float32 export, a quantized copy, and room for the quantizers' scratch files


def _require(module: str):
    """Import an export dependency, or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EdgespecError(f"ONNX export needs the export extra ({e.name} is missing): "
                            "pip install 'edgespec[export]'") from e


def export_onnx(src: Path, out: Path, quant: str, *, progress: bool = True, parity: bool = True) -> dict:
    """Export checkpoint folder `src` to an ONNX folder `out`, quantized to `quant` (one of ONNX_QUANTS).

    With `parity`, the export is compared with the source (report at `<out>.parity.json`, pass or fail)
    and is not written if the check fails. `progress` prints phase lines to stderr. Returns what was
    written: format, quant, path, model_file, weight_bytes, parity (the report) and parity_report.
    """
    if quant not in ONNX_QUANTS:
        raise EdgespecError(f"unknown ONNX quantization {quant!r}: choose one of {', '.join(ONNX_QUANTS)}")
    src, out = Path(src), Path(out)
    read_config(src)  # a clear error for a folder that is no checkpoint, before anything else
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise EdgespecError(f"{out} already exists and is not an empty folder: remove it or choose another output")
    out.parent.mkdir(parents=True, exist_ok=True)
    ensure_disk(out.parent, count_params(Source("hf", src, str(src))) * 4 * DISK_FACTOR)
    report_path = Path(str(out) + ".parity.json")
    report_path.unlink(missing_ok=True)  # a report left by an earlier failed export would describe another model

    say = functools.partial(say_if, progress)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    report = None
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the libraries' prints must not reach our stdout
            folder = build(src, tmp, quant, say)
            exported = BackendModel(OnnxBackend(folder, n_ctx=PARITY_CTX))
            exported.logits([0, 1])  # loads and runs on the CPU, even when no parity check follows
            if parity:
                say("checking parity ...")
                report = run_parity(quant, HFModel(src), exported)
                write_report(report, report_path)
                check(report, report_path)
            exported.backend.close()  # closes the session before its files move
        folder.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"wrote {out}")
    return {"format": "onnx", "quant": quant, "path": str(out), "model_file": MODEL_FILE,
            "weight_bytes": sum(f.stat().st_size for f in weight_files(out / MODEL_FILE)),
            "parity": report, "parity_report": str(report_path) if parity else None}


def build(src: Path, tmp: Path, quant: str, say) -> Path:
    """Export `src` in float32 under `tmp`, quantize it into its own folder there; return that folder."""
    raw = tmp / "fp32"
    say("exporting to ONNX ...")
    export_fp32(src, raw)
    add_hidden_output(raw / MODEL_FILE, read_config(src)["hidden_size"])
    complete_side_files(src, raw)
    if quant == "fp32":
        folder = raw
    else:
        # a fresh folder, so no float32 external data file can stay beside the quantized model
        folder = tmp / quant
        folder.mkdir()
        for f in raw.iterdir():
            if f.is_file() and not f.name.startswith(MODEL_FILE):
                shutil.copy2(f, folder)
        say(f"quantizing to {quant} ...")
        external = len(weight_files(raw / MODEL_FILE)) > 1
        QUANTIZERS[quant](raw / MODEL_FILE, folder / MODEL_FILE, external)
        shutil.rmtree(raw)
    return folder


def export_fp32(src: Path, folder: Path) -> None:
    """optimum's decoder-with-past export of `src` on the CPU in float32 into `folder`."""
    exporters = _require("optimum.exporters.onnx")
    try:
        exporters.main_export(str(src), folder, task="text-generation-with-past", device="cpu", dtype="fp32",
                              local_files_only=True, do_validation=False)  # our parity check is the validation
    except (ValueError, KeyError) as e:  # how optimum says the architecture or task is not supported
        raise EdgespecError(f"optimum cannot export {src} to ONNX: {e}") from e


def add_hidden_output(model: Path, n_embd: int) -> None:
    """Make the graph also return the final normed hidden state, what its output layer reads and draft heads
    (Medusa, EAGLE) read too: an Identity of the output MatMul's input, as output HIDDEN_OUTPUT [batch, T, E].
    Added before quantization, which keeps graph outputs (fp16 keeps their float32 type); a graph that has it
    already is left as it is."""
    onnx = _require("onnx")
    proto = onnx.load(str(model), load_external_data=False)  # external weights stay where they are
    graph = proto.graph
    if any(o.name == HIDDEN_OUTPUT for o in graph.output):
        return
    head = logits_matmul(graph)
    if head is None:
        raise EdgespecError(f"{model}: the logits do not come from the output layer's MatMul: edgespec cannot find "
                            "the hidden state draft heads read")
    logits = next(o for o in graph.output if o.name == "logits")
    batch, length = (d.dim_param or d.dim_value for d in logits.type.tensor_type.shape.dim[:2])
    graph.node.append(onnx.helper.make_node("Identity", [head.input[0]], [HIDDEN_OUTPUT], name="/edgespec/hidden"))
    graph.output.append(onnx.helper.make_tensor_value_info(HIDDEN_OUTPUT, logits.type.tensor_type.elem_type,
                                                           [batch, length, n_embd]))
    onnx.save_model(proto, str(model))


def complete_side_files(src: Path, folder: Path) -> None:
    """Copy tokenizer and generation files the exporter did not write; refuse if required ones are missing."""
    for name in SIDE_FILES:
        if not (folder / name).exists() and (src / name).is_file():
            shutil.copy2(src / name, folder / name)
    missing = [name for name in REQUIRED_FILES if not (folder / name).exists()]
    if missing:
        raise EdgespecError(f"{src} has no {', '.join(missing)}: the export needs them beside the model")


def weight_files(model: Path) -> list[Path]:
    """The .onnx file and the external data files it refers to."""
    onnx = _require("onnx")
    proto = onnx.load(str(model), load_external_data=False)
    tensors = [*proto.graph.initializer, *(a.t for node in proto.graph.node for a in node.attribute if a.HasField("t"))]
    locations = {entry.value for t in tensors if onnx.external_data_helper.uses_external_data(t)
                 for entry in t.external_data if entry.key == "location"}
    return [model] + [model.parent / name for name in sorted(locations)]


def save(proto, path: Path, external: bool) -> None:
    """Write a model, its weights in `<name>_data` beside it when the source used external data."""
    onnx = _require("onnx")
    onnx.save_model(proto, str(path), save_as_external_data=external, all_tensors_to_one_file=True,
                    location=path.name + "_data")


def to_fp16(src: Path, dst: Path, external: bool) -> None:
    """float16 weights and compute; float32 inputs and outputs, so callers feed the same arrays."""
    float16 = _require("onnxruntime.transformers.float16")
    # a path rather than a proto: shape inference then works on files over protobuf's 2 GB limit
    save(float16.convert_float_to_float16(str(src), keep_io_types=True), dst, external)


def to_int8(src: Path, dst: Path, external: bool) -> None:
    """Dynamic quantization: per-channel int8 weights, activations quantized on the fly; the sensitive
    MatMuls stay float32. Weights use 7 of their 8 bits (reduce_range): on x86 CPUs without VNNI, onnxruntime
    multiplies uint8 activations by int8 weights with VPMADDUBSW, whose 16-bit pair sums saturate on full-range
    weights (SmolLM2-135M on an AVX2-only EPYC: mean KL 3.35, top-1 0.30), and an export must be right on
    every CPU it is copied to, not only on the one that made it (7 bits: KL 0.084, top-1 0.84)."""
    quantization = _require("onnxruntime.quantization")
    quantization.quantize_dynamic(src, dst, weight_type=quantization.QuantType.QInt8, per_channel=True,
                                  reduce_range=True, nodes_to_exclude=sensitive_matmuls(src),
                                  use_external_data_format=external)


def to_int4(src: Path, dst: Path, external: bool) -> None:
    """Weight-only symmetric block quantization (MatMulNBits): 4-bit MatMul weights, 8-bit for the sensitive
    ones; embeddings and activations stay float32."""
    onnx = _require("onnx")
    nbits = _require("onnxruntime.quantization.matmul_nbits_quantizer")
    sensitive = sensitive_matmuls(src)
    quantizer = nbits.MatMulNBitsQuantizer(onnx.load(str(src)), bits=4, block_size=BLOCK_SIZE, is_symmetric=True,
                                           nodes_to_exclude=sensitive)
    quantizer.process()
    if sensitive:  # an empty include list would mean every MatMul
        quantizer = nbits.MatMulNBitsQuantizer(quantizer.model.model, bits=8, block_size=BLOCK_SIZE,
                                               is_symmetric=True, nodes_to_include=sensitive)
        quantizer.process()
    save(quantizer.model.model, dst, external)


def sensitive_matmuls(model: Path) -> list[str]:
    """Names of the MatMul nodes that quantization hurts most (see SENSITIVE_MATMULS)."""
    graph = _require("onnx").load(str(model), load_external_data=False).graph
    return [node.name for node in graph.node if node.op_type == "MatMul" and SENSITIVE_MATMULS in node.name]


QUANTIZERS = {"fp16": to_fp16, "int8": to_int8, "int4": to_int4}
