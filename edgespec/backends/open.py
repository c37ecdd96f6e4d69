"""A backend for a model file by its format: a .gguf file (llama.cpp) or an ONNX export folder (onnxruntime)."""

from __future__ import annotations

import os
from pathlib import Path

from edgespec.backends.protocol import Backend
from edgespec.errors import EdgespecError


def is_onnx(path: str | os.PathLike) -> bool:
    """Whether a model path is an ONNX export (its folder, or its model.onnx) rather than a GGUF file."""
    path = Path(path)
    return path.is_dir() or path.suffix.lower() == ".onnx"


def open_model(path: str | os.PathLike, *, n_ctx: int, threads: int | None, provider: str = "cpu",
               kv_type: str = "f16", n_ubatch: int = 512, n_gpu_layers: int = 0, hidden: bool = False,
               spin: bool | str = False, load_mtp: bool = False, sequences: int | None = None) -> Backend:
    """A backend for a model by its format: a .gguf file (llama.cpp) or an ONNX export folder (onnxruntime).

    kv_type, n_ubatch and n_gpu_layers apply to llama.cpp; provider and spin (how threads spin between ops) to
    onnxruntime; hidden (return hidden states too, for draft heads) to both; load_mtp (the MTP layers a GGUF carries,
    for --draft mtp) and sequences (LlamaBackend's: MAX_OUTPUTS for draft trees' branches) to llama.cpp.
    """
    path = Path(path)
    if is_onnx(path):
        from edgespec.backends.onnx.backend import OnnxBackend

        return OnnxBackend(path if path.is_dir() else path.parent, n_ctx=n_ctx, n_threads=threads, provider=provider,
                           hidden=hidden, spin=spin)
    if path.suffix.lower() == ".gguf" or not path.suffix:
        from edgespec.backends.llama.backend import LlamaBackend

        return LlamaBackend(path, n_ctx=n_ctx, n_threads=threads, kv_type=kv_type, n_ubatch=n_ubatch,
                            n_gpu_layers=n_gpu_layers, hidden=hidden, load_mtp=load_mtp, sequences=sequences)
    raise EdgespecError(f"unsupported model format '{path.suffix}' for {path}: edgespec runs .gguf files and "
                        "ONNX export folders")
