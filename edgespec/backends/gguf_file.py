"""GGUF files through gguf-py: opening one, reading its tokenizer, parameter count and rows, ggml block sizes, and
writing files field by field. The one module importing gguf-py, besides the exporter (export/gguf.py), which
drives llama.cpp's converter. Headers alone are read without it (backends/model_info.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError

SUBSET_KEY = "edgespec.draft.subset"  # int32 array: the token ids a subset draft's output layer keeps, ascending


def lib():
    """gguf-py, or a clear error saying how to install it."""
    try:
        import gguf
    except ImportError as e:
        raise EdgespecError("GGUF files need gguf-py: pip install 'edgespec[gguf]'") from e
    return gguf


def open_gguf(path: str | os.PathLike, mode: str = "r"):
    """A GGUFReader of the file (mode "r+" edits values in place, which `mapped.flush()` writes), or one clear error
    for a file that is none."""
    from edgespec.backends.llama.lib import check_gguf_file

    path = check_gguf_file(path)
    try:
        return _reader()(path, mode)
    except (ValueError, OSError, IndexError) as e:
        raise EdgespecError(f"{path} is not a readable GGUF ({e})") from None


@cache
def _reader() -> type:
    """gguf-py's GGUFReader over a plain array view of its memory map (`data`; the map itself is `mapped`). The
    reader slices the map once or twice for every value, 250k slices for a 49k-token vocabulary, and a slice of a
    np.memmap runs the subclass's finalizer, which took about half of the default model's read (measured:
    docs/results/2026-11-29-header-reads.md, benchmarks/load_reads.py). The fields and tensors are the same views
    of the same file."""

    class Reader(lib().GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._view

        @data.setter
        def data(self, mapped: np.memmap) -> None:
            self.mapped, self._view = mapped, mapped.view(np.ndarray)

    return Reader


def block_size(type_name: str) -> tuple[int, int]:
    """(weights per block, bytes per block) of a ggml type by name, e.g. "Q4_0" -> (32, 18)."""
    gguf = lib()
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name.upper()]]


def ggml_type(code: int) -> tuple[str, int, int]:
    """(name, weights per block, bytes per block) of the ggml type a GGUF header numbers `code`; ValueError for a
    number gguf-py does not know."""
    gguf = lib()
    gtype = gguf.GGMLQuantizationType(code)
    return (gtype.name, *gguf.GGML_QUANT_SIZES[gtype])


def is_float(type_name: str) -> bool:
    return type_name.upper() in ("F32", "F16")


def dequantize(data: np.ndarray, type_name: str) -> np.ndarray:
    """Rows of raw blocks [n, row bytes] as float32 [n, weights]."""
    gguf = lib()
    from gguf.quants import dequantize as dequantize_rows

    return dequantize_rows(data, gguf.GGMLQuantizationType[type_name.upper()])


def n_params(path: str | os.PathLike) -> int:
    """The number of weights in a GGUF file's tensors."""
    return int(sum(int(t.n_elements) for t in open_gguf(path).tensors))


def architecture(reader) -> str:
    return reader.fields[lib().Keys.General.ARCHITECTURE].contents()


def new_writer(path: str | os.PathLike | None, arch: str):
    """A GGUFWriter for a model of architecture `arch` (path None: given when written, see write)."""
    return lib().GGUFWriter(None if path is None else str(path), arch)


def copy_fields(writer, fields: Iterable, skip: Callable[[str], bool] = lambda name: False) -> None:
    """Copy metadata fields of a reader (its fields.values(), or some of them) to a writer; the reader's own
    GGUF.* entries and the architecture, which the writer has, are left out, as are those `skip` names."""
    gguf = lib()
    for field in fields:
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE or skip(field.name):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)


def add_placeholder_vocab(writer, n: int) -> None:
    """A vocabulary of n placeholder tokens, one per output row, for a model fed vectors (heads, subset drafts)."""
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"<row {i}>".encode() for i in range(n)])
    writer.add_token_scores([0.0] * n)
    writer.add_token_types([lib().TokenType.NORMAL] * n)


def control_token_type() -> int:
    return int(lib().TokenType.CONTROL)


def float_file_type(float_type: str):
    """The general.file_type of a file whose weights are all f32 or mostly f16."""
    gguf = lib()
    return gguf.LlamaFileType.ALL_F32 if float_type == "f32" else gguf.LlamaFileType.MOSTLY_F16


def add_weights(writer, name: str, a: np.ndarray, type_name: str) -> None:
    """A float array as a tensor of ggml type `type_name`: quantized where its rows are whole blocks, f16 where
    a quantized type's blocks do not fit the rows, float32 for vectors and F32."""
    gguf = lib()
    from gguf.quants import quantize

    qtype = gguf.GGMLQuantizationType[type_name.upper()]
    a = np.ascontiguousarray(a, dtype=np.float32)
    if a.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32 and a.shape[1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0:
        writer.add_tensor(name, quantize(a, qtype), raw_dtype=qtype)
    elif a.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, a.astype(np.float16))
    else:
        writer.add_tensor(name, a)


def write(writer, path: str | os.PathLike | None = None) -> None:
    """Write the writer's header, metadata and tensors (to `path` where the writer was made without one)."""
    writer.write_header_to_file(None if path is None else Path(path))
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_new(writer, path: str | os.PathLike) -> Path:
    """Write the writer's file to `path` under a temporary name beside it, renamed when whole: a failure leaves
    nothing at path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        write(writer, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
