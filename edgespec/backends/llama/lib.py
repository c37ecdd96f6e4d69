"""llama.cpp as a library (the only module that imports llama_cpp): loading it once, checking GGUF files, the
devices ggml sees, re-quantizing a GGUF, and the KV cache types a context takes. The models that run on it are in
llama_backend.py (tokens in) and llama_vectors.py (vectors in).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.machine import cores

GGUF_MAGIC = b"GGUF"

_llama = None  # the llama_cpp module, imported on first use


def lib():
    """The llama_cpp module, imported and initialised on first use."""
    global _llama
    if _llama is None:
        try:
            import llama_cpp
        except ImportError as e:
            raise EdgespecError(
                "GGUF models need llama-cpp-python: pip install 'edgespec[gguf]' (or run make install)"
            ) from e
        llama_cpp.llama_backend_init()
        # llama.cpp logs every load to stderr; keep a reference so the callback is not collected
        llama_cpp._edgespec_quiet_log = llama_cpp.llama_log_callback(lambda level, text, data: None)
        if not os.environ.get("EDGESPEC_LLAMA_LOG"):
            llama_cpp.llama_log_set(llama_cpp._edgespec_quiet_log, ctypes.c_void_p())
        _llama = llama_cpp
    return _llama


def logits_address() -> Callable[[int], int]:
    """llama_get_logits as a function that returns the buffer's address as an int: the binding's returns a
    ctypes pointer, which costs a cast per call, a measurable share of a token at 1-3 ms a pass."""
    cdll = getattr(getattr(lib(), "llama_cpp", None), "_lib", None)
    if cdll is None:  # a binding laid out otherwise: the cast
        return lambda ctx: ctypes.cast(lib().llama_get_logits(ctx), ctypes.c_void_p).value
    return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(("llama_get_logits", cdll))


def check_gguf_file(path: str | os.PathLike) -> Path:
    """Raise a clear error unless `path` is a readable file that starts like a GGUF."""
    path = Path(path)
    if not path.exists():
        raise EdgespecError(f"model file not found: {path}")
    if not path.is_file():
        raise EdgespecError(f"model path is not a file: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise EdgespecError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    return path


KV_TYPES = {"f16": "GGML_TYPE_F16", "q8_0": "GGML_TYPE_Q8_0", "q4_0": "GGML_TYPE_Q4_0"}  # best quality first
KV_BLOCKS = {"f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}  # (values per block, bytes per block), ggml's


DEVICE_PREFIXES = (("cuda", "cuda"), ("mtl", "metal"), ("metal", "metal"), ("vulkan", "vulkan"))  # CUDA0, MTL0, ...


def devices() -> list[dict]:
    """The devices llama.cpp's ggml sees: name, type (cpu, gpu, igpu, accel), backend, free and total bytes.

    llama-cpp-python does not bind ggml's device API, so it is called through ctypes on the ggml library
    llama_cpp loaded; an empty list where that library is not found.
    """
    llama = lib()
    folder = Path(llama.__file__).parent / "lib"
    found = sorted(folder.glob("libggml.*")) + sorted(folder.glob("ggml.dll"))
    if not found:
        return []
    ggml = ctypes.CDLL(str(found[0]))
    p, size_p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)
    for name, restype, argtypes in (("ggml_backend_dev_count", ctypes.c_size_t, []),
                                    ("ggml_backend_dev_get", p, [ctypes.c_size_t]),
                                    ("ggml_backend_dev_name", ctypes.c_char_p, [p]),
                                    ("ggml_backend_dev_description", ctypes.c_char_p, [p]),
                                    ("ggml_backend_dev_type", ctypes.c_int, [p]),
                                    ("ggml_backend_dev_memory", None, [p, size_p, size_p])):
        fn = getattr(ggml, name)
        fn.restype, fn.argtypes = restype, argtypes
    out = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        name = ggml.ggml_backend_dev_name(dev).decode()
        kind = ("cpu", "gpu", "igpu", "accel")[min(ggml.ggml_backend_dev_type(dev), 3)]
        backend = next((b for prefix, b in DEVICE_PREFIXES if name.lower().startswith(prefix)),
                       "cpu" if kind == "cpu" else name.lower())
        out.append({"name": name, "description": ggml.ggml_backend_dev_description(dev).decode(), "type": kind,
                    "backend": backend, "free": free.value, "total": total.value})
    return out


def build_info() -> dict | None:
    """The installed llama-cpp-python: version, llama.cpp's system info, GPU offload, the build and its devices
    (None where it is not installed)."""
    try:
        import llama_cpp
    except ImportError:
        return None
    info = llama_cpp.llama_print_system_info().decode()
    return {"version": llama_cpp.__version__, "system_info": info.strip(),
            "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
            "build": ("cuda" if "CUDA" in info else "metal" if "METAL" in info.upper() else "cpu")
            + (", native" if "NATIVE" in info.upper() else ""),
            "devices": devices()}


def gpu_name() -> str | None:
    """The first GPU (discrete or integrated) llama.cpp's build sees, e.g. CUDA0 or MTL0; None for a CPU build."""
    global _gpu
    if _gpu is None:
        _gpu = next((d["name"] for d in devices() if d["type"] in ("gpu", "igpu")), "")
    return _gpu or None


_gpu: str | None = None  # gpu_name's answer ("" for none), found once


QUANT_TYPES = {"f32": "LLAMA_FTYPE_ALL_F32", "f16": "LLAMA_FTYPE_MOSTLY_F16", "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
               "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
               "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
               "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}


def partial_path(dst: Path) -> Path:
    """Where quantize_gguf writes before renaming to dst."""
    return dst.with_name(f".{dst.name}.partial")


def quantize_gguf(src: str | os.PathLike, dst: str | os.PathLike, quant: str, *, threads: int | None = None) -> Path:
    """Re-quantize a GGUF with llama.cpp's quantizer (quantized inputs allowed).

    Writes to a temporary name beside dst and renames it, so a failure leaves nothing at dst.
    """
    src, dst = check_gguf_file(src), Path(dst)
    if quant not in QUANT_TYPES:
        raise EdgespecError(f"unknown quantization '{quant}': choose one of {', '.join(QUANT_TYPES)}")
    llama = lib()
    params = llama.llama_model_quantize_default_params()
    params.ftype = getattr(llama, QUANT_TYPES[quant])
    params.nthread = threads or cores()
    params.allow_requantize = True
    tmp = partial_path(dst)
    try:
        if llama.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
            raise EdgespecError(f"llama.cpp could not quantize {src} to {quant}")
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst
