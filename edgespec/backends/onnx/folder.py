"""An ONNX export folder: its files, onnxruntime's providers, and sessions on them.

The only module (with the others of this package) importing onnxruntime, onnx and tokenizers.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from edgespec.errors import EdgespecError

MODEL_FILE = "model.onnx"
HIDDEN_OUTPUT = "last_hidden_state"  # [batch, T, E]: added by edgespec's export (export/onnx.add_hidden_output)
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
             "tensorrt": "TensorrtExecutionProvider", "coreml": "CoreMLExecutionProvider"}
# best first; TensorRT builds its engines at load and per new shape range, so auto leaves it to those who ask.
# A GPU build of onnxruntime lists its providers whether or not the GPU libraries load: auto then runs on the CPU.
AUTO_ORDER = ("cuda", "coreml", "cpu")
DEVICE_MEMORY = {"CUDAExecutionProvider", "TensorrtExecutionProvider"}  # providers whose tensors live on a GPU


def require(module: str):
    """Import a runtime dependency of ONNX models, or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EdgespecError(f"ONNX models need {module}: pip install 'edgespec[onnx]'") from e


def check_onnx_folder(folder: str | os.PathLike) -> Path:
    """The export folder (a path to its model.onnx is accepted too), or a clear error."""
    folder = Path(folder)
    if folder.is_file() and folder.name == MODEL_FILE:
        folder = folder.parent
    if not folder.exists():
        raise EdgespecError(f"model folder not found: {folder}")
    if not folder.is_dir():
        raise EdgespecError(f"{folder} is not an ONNX model folder (export one with: edgespec export --to onnx)")
    if not (folder / MODEL_FILE).is_file():
        raise EdgespecError(f"{folder} has no {MODEL_FILE}: export one with: edgespec export --to onnx")
    return folder


def pick_provider(available: Sequence[str], provider: str) -> str:
    """The execution provider for `provider` (cpu, cuda, tensorrt, coreml or auto) among those available."""
    if provider == "auto":
        return next(PROVIDERS[d] for d in AUTO_ORDER if PROVIDERS[d] in available)
    if provider not in PROVIDERS:
        raise EdgespecError(f"unknown provider '{provider}': choose one of {', '.join([*PROVIDERS, 'auto'])}")
    if PROVIDERS[provider] not in available:
        hint = "install onnxruntime-gpu" if provider in ("cuda", "tensorrt") else "use --provider cpu"
        raise EdgespecError(f"provider '{provider}' needs onnxruntime's {PROVIDERS[provider]}, but this onnxruntime "
                            f"has only {', '.join(available)}: {hint}")
    return PROVIDERS[provider]


def available_providers() -> tuple[str, ...]:
    """Short names of the providers this onnxruntime offers (none without onnxruntime)."""
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        return ()
    names = {v: k for k, v in PROVIDERS.items()}
    return tuple(names[p] for p in ort.get_available_providers() if p in names)


def runtime_info() -> dict | None:
    """The installed onnxruntime's version and providers (None where it is not installed)."""
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        return None
    return {"version": ort.__version__, "providers": ort.get_available_providers()}


SPIN_WITHIN_RUNS = "runs"  # spin between the ops of a run, stop at its end (see open_session)
SPIN_SETTINGS = (False, SPIN_WITHIN_RUNS, True)


def open_session(ort, path: Path, provider: str, n_threads: int, *, strict: bool, spin: bool | str = False):
    """An InferenceSession on `provider` (CPU for the ops it lacks), quiet, its threads spinning as `spin` says.
    onnxruntime falls back to the CPU when the provider's libraries do not load: with `strict` that is an error.

    spin: False, the threads block as soon as they run out of work; SPIN_WITHIN_RUNS, they spin between the ops
    of a run and stop at its end (session.force_spinning_stop); True, they also spin on after a run. A spinning
    pool wakes faster between ops (the f32 SmolLM2 export decoded 12 % faster alone here), but one that spins on
    after a run takes the cores that a draft model, an EAGLE head's llama.cpp threads or the other model of a
    pair need before the next run (experiments/onnx_spinning.py)."""
    if spin not in SPIN_SETTINGS:
        raise EdgespecError(f"spin must be one of {', '.join(map(repr, SPIN_SETTINGS))}, got {spin!r}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = n_threads
    for pool in ("intra_op", "inter_op"):
        options.add_session_config_entry(f"session.{pool}.allow_spinning", "1" if spin else "0")
    if spin == SPIN_WITHIN_RUNS:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.log_severity_level = 2 if os.environ.get("EDGESPEC_ORT_LOG") else 3  # warnings, else errors only
    providers = [provider, "CPUExecutionProvider"] if provider != "CPUExecutionProvider" else [provider]
    if provider == "TensorrtExecutionProvider":
        providers.insert(1, "CUDAExecutionProvider")  # for the subgraphs TensorRT rejects
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
    except Exception as e:  # onnxruntime raises its own types (InvalidProtobuf, Fail, ...) for unreadable files
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EdgespecError(f"onnxruntime could not load {path}: {reason}") from None
    if strict and session.get_providers()[0] != provider:
        raise EdgespecError(f"onnxruntime could not start {provider} for {path}: its libraries did not load "
                            "(the reason is in onnxruntime's log above)")
    return session


def weight_files(folder: Path) -> list[Path]:
    """model.onnx and its external data: the files beside it named model.onnx* (the export's convention,
    e.g. model.onnx_data), found without parsing a graph that may be gigabytes."""
    return sorted(f for f in folder.iterdir() if f.is_file() and f.name.startswith(MODEL_FILE))


def read_json(path: Path) -> dict:
    """A JSON file of the folder, {} when absent, a clear error when unreadable."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EdgespecError(f"{path} is not valid JSON: {e}") from None
