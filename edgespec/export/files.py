"""Facts about model files read without loading weights, and the disk check every export makes first."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models.source import Source

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def count_params(source: Source) -> int:
    """Parameter count: GGUF tensor shapes, safetensors headers, or (.bin checkpoints) file size / dtype."""
    if source.kind == "gguf":
        from edgespec.backends.gguf_file import n_params

        return n_params(source.path)
    total = 0
    for f in sorted(source.path.glob("*.safetensors")):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        for name, info in header.items():
            if name != "__metadata__":
                n = 1
                for d in info["shape"]:
                    n *= d
                total += n
    if not total:  # pickled weights: no header to read, so estimate from their size
        config = json.loads((source.path / "config.json").read_text())
        dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
        total = sum(f.stat().st_size for f in source.path.glob("*.bin")) // DTYPE_BYTES.get(dtype, 4)
    if not total:
        raise EdgespecError(f"{source.path} has no .safetensors or .bin weights to export")
    return total


def ensure_disk(folder: Path, need_bytes: float) -> None:
    """Refuse up front when `folder` has clearly too little room."""
    free = shutil.disk_usage(folder).free
    if free < need_bytes:
        raise EdgespecError(f"not enough disk: need about {need_bytes / 1e9:.2f} GB at {folder}, "
                            f"{free / 1e9:.2f} GB free")

