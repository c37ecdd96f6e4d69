"""Where models run: `--gpu-layers N|all` read once, and whether a llama.cpp build has a GPU to put them on by
default (api.load then plans for this machine, as --device auto does)."""

from __future__ import annotations

from pathlib import Path

from edgespec.errors import EdgespecError

ALL_LAYERS = 10_000  # n_gpu_layers for "all": llama.cpp offloads min(this, layers + output)


def parse_gpu_layers(value: int | str | None) -> int | None:
    """--gpu-layers N|all as a layer count (None: not given, the default placement)."""
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        if value is not None and value < 0:
            raise EdgespecError(f"GPU layers must be 0 or more (or 'all'), got {value}")
        return value
    text = str(value).strip().lower()
    if text == "all":
        return ALL_LAYERS
    if not text.isdigit():
        raise EdgespecError(f"GPU layers must be a number or 'all', got {value!r}")
    return int(text)


def gpu_name() -> str | None:
    """The GPU llama.cpp's build sees (None: a CPU build, or no llama-cpp-python)."""
    try:
        from edgespec.backends.llama.lib import gpu_name as llama_gpu

        return llama_gpu()
    except EdgespecError:
        return None


def gpu_default(target) -> bool:
    """Whether a GGUF target loads on the GPU without being told: where llama.cpp's build has one."""
    return target is not None and Path(target).suffix.lower() == ".gguf" and gpu_name() is not None
