"""What a model file says about its memory, read from headers without loading any weights.

GGUF: the metadata and tensor table at the head of the file (names, ggml types, shapes). gguf-py's
GGUFReader would do, but it materialises every metadata array: for a 49k-token vocabulary that is
2 s and 150 MB of the very budget being planned, so the header is streamed here with gguf-py's
constants. ONNX: the initializers' shapes and element types, found by walking the protobuf and
skipping the tensor bytes, plus config.json for the attention geometry.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.backends.gguf_file import SUBSET_KEY
from edgespec.backends.open import is_onnx
from edgespec.backends.protocol import Vocab
from edgespec.errors import EdgespecError


@dataclass(frozen=True)
class Tensor:
    name: str
    type: str  # ggml type name (Q4_0, F32, ...) or ONNX element type (FLOAT, INT8, ...)
    n_elements: int
    n_bytes: int
    shape: tuple[int, ...] = ()  # GGUF: dimensions, outermost first (numpy's order)
    offset: int = 0  # GGUF: where the data starts in the file


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    format: str  # "gguf" | "onnx"
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    tensors: tuple[Tensor, ...] = field(repr=False)
    kv_dtype_bytes: float = 2.0  # ONNX: the past key/values' element size; GGUF: chosen at load (f16 default)
    draft_vocab: int = 0  # GGUF: the tokens a subset draft drafts from (backends/llama/subset.py); 0: all
    # GGUF models with recurrent layers (Mamba-style SSMs, Qwen3.5's gated delta nets): those layers keep a state
    # for each sequence instead of an attention cache (_recurrent_layers)
    recurrent_layers: int = 0
    state_floats: int = 0  # floats of one recurrent layer's state for a sequence (llama.cpp's n_embd_r + n_embd_s)
    attention_layers: int | None = None  # the layers with an attention cache (None: every one)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def weight_bytes(self) -> int:
        """Bytes held: the file's tensors, and a subset draft's output rows besides (backends/llama/subset.py: its
        input embeddings stay whole, its output layer is a copy of the subset's rows)."""
        return sum(t.n_bytes for t in self.tensors) + self._subset_rows_bytes()

    def _subset_rows_bytes(self) -> int:
        rows = next((t for t in self.tensors if t.name in ("output.weight", "token_embd.weight")), None)
        return rows.n_bytes * self.draft_vocab // max(self.n_vocab, 1) if self.draft_vocab and rows else 0

    @property
    def tied_embeddings(self) -> bool:
        """True when the output projection reuses the token embeddings (no separate output matrix)."""
        return not any(t.name in ("output.weight", "lm_head.weight") for t in self.tensors)

    def bytes_read_per_token(self) -> int:
        """Weight bytes one decode step reads: all, except an untied embedding table (one row is read); a subset
        draft reads its layers and the subset's output rows."""
        if self.draft_vocab:
            return sum(t.n_bytes for t in self.tensors if t.name not in ("output.weight", "token_embd.weight")) + (
                self._subset_rows_bytes())
        if self.tied_embeddings:
            return self.weight_bytes
        return sum(t.n_bytes for t in self.tensors if not _is_embedding(t.name))

    def layer_bytes(self) -> int:
        """Mean weight bytes of one transformer block (what offloading one layer to a GPU moves)."""
        blocks = sum(t.n_bytes for t in self.tensors if t.name.startswith(("blk.", "model.layers.", "/model/layers")))
        return blocks // max(self.n_layer, 1)


def _is_embedding(name: str) -> bool:
    return name in ("token_embd.weight", "model.embed_tokens.weight")


def read_model_info(path: str | os.PathLike) -> ModelInfo:
    """Facts of a .gguf file or an ONNX export folder (or its model.onnx)."""
    path = Path(path)
    if not path.exists():
        raise EdgespecError(f"model not found: {path}")
    if is_onnx(path):
        return read_onnx_info(path if path.is_dir() else path.parent)
    return read_gguf_info(path)


# --- GGUF ------------------------------------------------------------------------------------------

# the parts of a split model, as llama.cpp's gguf-split and gguf-py name them
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<parts>\d{5})\.gguf$", re.IGNORECASE)

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")  # a string's length


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str):
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> bytes:
        n = self.unpack("<Q")
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def value(self, vtype: int, keep: bool):
        """A metadata value; arrays are skipped (None) unless keep, since vocabularies are large."""
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, n = self.unpack("<I"), self.unpack("<Q")
            if item_type in _SCALARS and not keep:
                self.pos += n * struct.calcsize(_SCALARS[item_type])
                return None
            if item_type == _STRING and not keep:  # a vocabulary: walk the lengths, make no strings
                buf, pos, length = self.buf, self.pos, _U64.unpack_from
                for _ in range(n):
                    pos += 8 + length(buf, pos)[0]
                self.pos = pos
                return None
            items = [self.value(item_type, keep) for _ in range(n)]
            return items if keep else None
        if vtype not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.unpack(_SCALARS[vtype])


# the arrays kept in the metadata read_gguf_header gives: an EAGLE-3 head's target layers (a few ids)
KEPT_ARRAYS = (".target_layers",)


def read_gguf_header(path: Path) -> tuple[dict, list[Tensor]]:
    """Scalar metadata (arrays left out but KEPT_ARRAYS) and the tensor table of a GGUF file."""
    from edgespec.backends.gguf_file import ggml_type
    from edgespec.backends.llama.lib import check_gguf_file

    check_gguf_file(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        c = _Cursor(mm)
        try:
            c.pos = 4
            version, n_tensors, n_kv = c.unpack("<I"), c.unpack("<Q"), c.unpack("<Q")
            if version < 2:
                raise EdgespecError(f"{path} is GGUF version {version}; edgespec reads version 2 and later")
            meta = {}
            for _ in range(n_kv):
                key = c.string().decode("utf-8")
                vtype = c.unpack("<I")
                if key == SUBSET_KEY and vtype == _ARRAY:  # a subset draft: how many tokens, not which
                    meta[key] = struct.unpack_from("<Q", mm, c.pos + 4)[0]
                value = c.value(vtype, keep=key.endswith(KEPT_ARRAYS))
                if value is not None:
                    meta[key] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            table, data_end = [], 0
            for _ in range(n_tensors):
                name = c.string().decode("utf-8")
                dims = [c.unpack("<Q") for _ in range(c.unpack("<I"))]
                type_name, block, type_size = ggml_type(c.unpack("<I"))
                offset = c.unpack("<Q")  # from the start of the data section
                n = math.prod(dims)
                table.append((Tensor(name, type_name, n, n // block * type_size, tuple(reversed(dims))), offset))
                data_end = max(data_end, offset + table[-1][0].n_bytes)
            alignment = meta.get("general.alignment", 32)
            data_start = -(-c.pos // alignment) * alignment
            tensors = [dataclasses.replace(t, offset=data_start + offset) for t, offset in table]
        except (struct.error, ValueError, UnicodeDecodeError) as e:
            raise EdgespecError(f"{path} has a corrupt or truncated GGUF header ({e})") from None
        if data_start + data_end > len(mm):  # a cut download: the header is whole, the weights are not
            raise EdgespecError(f"{path} is truncated: its tensors need {data_start + data_end} bytes, the file has "
                                f"{len(mm)}")
    return meta, tensors


def read_gguf_info(path: Path) -> ModelInfo:
    meta, tensors = read_gguf_header(path)
    tensors += _other_parts_tensors(path, int(meta.get("split.count", 1) or 1))
    arch = meta.get("general.architecture", "llama")

    def get(key, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise EdgespecError(f"{path} has no {arch}.{key} in its metadata: cannot plan its memory")
        return value

    n_head = get("attention.head_count")
    n_embd = get("embedding_length")
    embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
    n_vocab = meta.get(f"{arch}.vocab_size") or (embd.n_elements // n_embd if embd else 0)
    return ModelInfo(path=path, format="gguf", n_layer=get("block_count"), n_embd=n_embd,
                     n_ff=get("feed_forward_length", 0), n_head=n_head,
                     n_head_kv=get("attention.head_count_kv", n_head),
                     head_dim=get("attention.key_length", n_embd // n_head), n_vocab=n_vocab,
                     n_ctx_train=get("context_length", 0), tensors=tuple(tensors), draft_vocab=meta.get(SUBSET_KEY, 0),
                     **_recurrent_layers(meta, arch))


def _recurrent_layers(meta: dict, arch: str) -> dict:
    """A GGUF's recurrent layers as llama.cpp reads them (src/models/qwen35.cpp and the Mamba-style others): where
    the header has an SSM inner size, each such layer's state is (conv_kernel - 1) x (inner + 2 x groups x state)
    floats of convolution and state x inner of SSM (llama_hparams::n_embd_r, n_embd_s); which layers are recurrent
    comes from `attention.recurrent_layers` or `full_attention_interval` (every interval-th trunk layer attends,
    the MTP layers are not counted), the others alone keeping an attention cache. Where neither says, every
    trunk layer is counted recurrent and every layer attending: more than llama.cpp holds, never less."""
    inner = meta.get(f"{arch}.ssm.inner_size")
    if not inner:
        return {}
    state, conv = meta.get(f"{arch}.ssm.state_size", 0), meta.get(f"{arch}.ssm.conv_kernel", 0)
    floats = max(conv - 1, 0) * (inner + 2 * meta.get(f"{arch}.ssm.group_count", 0) * state) + state * inner
    trunk = meta[f"{arch}.block_count"] - int(meta.get(f"{arch}.nextn_predict_layers", 0) or 0)
    flags, interval = meta.get(f"{arch}.attention.recurrent_layers"), meta.get(f"{arch}.full_attention_interval")
    if isinstance(flags, list):
        recurrent = sum(bool(f) for f in flags[:trunk])
    elif interval:
        recurrent = sum((i + 1) % interval != 0 for i in range(trunk))
    else:
        return {"recurrent_layers": trunk, "state_floats": floats}
    return {"recurrent_layers": recurrent, "state_floats": floats, "attention_layers": trunk - recurrent}


def _other_parts_tensors(path: Path, parts: int) -> list[Tensor]:
    """The tensors of a split model's other parts (name-00002-of-00003.gguf, ... beside its first part, named as
    llama.cpp's gguf-split and gguf-py name them): a plan counts the whole model's weights."""
    if parts <= 1:
        return []
    match = SPLIT_NAME.match(path.name)
    if match is None or int(match["part"]) != 1:
        raise EdgespecError(f"{path} is one part of a model split in {parts}: give its first part, "
                            "NAME-00001-of-0000N.gguf")
    tensors = []
    for part in range(2, parts + 1):
        sibling = path.with_name(f"{match['stem']}-{part:05d}-of-{match['parts']}.gguf")
        if not sibling.is_file():
            raise EdgespecError(f"{path} is part 1 of {parts}, and {sibling.name} is not beside it")
        tensors += read_gguf_header(sibling)[1]
    return tensors


# --- ONNX ------------------------------------------------------------------------------------------

# TensorProto.DataType -> bytes per element (onnx.proto); 4-bit types pack two per byte
_ONNX_TYPES = {1: ("FLOAT", 4), 2: ("UINT8", 1), 3: ("INT8", 1), 4: ("UINT16", 2), 5: ("INT16", 2),
               6: ("INT32", 4), 7: ("INT64", 8), 9: ("BOOL", 1), 10: ("FLOAT16", 2), 11: ("DOUBLE", 8),
               12: ("UINT32", 4), 13: ("UINT64", 8), 16: ("BFLOAT16", 2), 17: ("FLOAT8E4M3FN", 1),
               18: ("FLOAT8E4M3FNUZ", 1), 19: ("FLOAT8E5M2", 1), 20: ("FLOAT8E5M2FNUZ", 1),
               21: ("UINT4", 0.5), 22: ("INT4", 0.5)}
_MODEL_GRAPH, _GRAPH_INITIALIZER, _GRAPH_INPUT = 7, 5, 11  # field numbers in onnx.proto


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, wire type, value or (start, end) of a length-delimited payload) of one message."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = None, pos + 8
        elif wire == 5:
            value, pos = None, pos + 4
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = (pos, pos + n), pos + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _tensor(buf, start: int, end: int) -> Tensor:
    dims, dtype, name = [], 1, ""
    for number, wire, value in _fields(buf, start, end):
        if number == 1:  # dims: repeated int64, packed or not
            if wire == 2:
                pos = value[0]
                while pos < value[1]:
                    d, pos = _varint(buf, pos)
                    dims.append(d)
            else:
                dims.append(value)
        elif number == 2:
            dtype = value
        elif number == 8:
            name = bytes(buf[value[0]:value[1]]).decode("utf-8", "replace")
    type_name, size = _ONNX_TYPES.get(dtype, (f"TYPE{dtype}", 4))
    n = math.prod(dims)
    return Tensor(name, type_name, n, math.ceil(n * size))


def _input_elem_type(buf, start: int, end: int) -> tuple[str, int | None]:
    """(name, elem_type) of a ValueInfoProto: type.tensor_type.elem_type."""
    name, elem = "", None
    for number, _, value in _fields(buf, start, end):
        if number == 1:
            name = bytes(buf[value[0]:value[1]]).decode("utf-8", "replace")
        elif number == 2:  # TypeProto
            for n2, _, v2 in _fields(buf, *value):
                if n2 == 1:  # tensor_type
                    elem = next((v3 for n3, _, v3 in _fields(buf, *v2) if n3 == 1), None)
    return name, elem


def read_onnx_graph(path: Path) -> tuple[list[Tensor], dict[str, int]]:
    """Initializers of model.onnx (shapes and types; the bytes are skipped) and its inputs' element types."""
    tensors, inputs = [], {}
    if path.stat().st_size == 0:
        raise EdgespecError(f"{path} is empty: not an ONNX model")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        try:
            for number, _, value in _fields(mm, 0, len(mm)):
                if number != _MODEL_GRAPH:
                    continue
                for n2, _, v2 in _fields(mm, *value):
                    if n2 == _GRAPH_INITIALIZER:
                        tensors.append(_tensor(mm, *v2))
                    elif n2 == _GRAPH_INPUT:
                        name, elem = _input_elem_type(mm, *v2)
                        inputs[name] = elem
        except (IndexError, ValueError, TypeError) as e:
            raise EdgespecError(f"{path} is not a readable ONNX model ({e})") from None
    if not tensors:
        raise EdgespecError(f"{path} holds no initializers: not an ONNX model edgespec can plan")
    return tensors, inputs


def read_onnx_info(folder: Path) -> ModelInfo:
    from edgespec.backends.onnx.folder import MODEL_FILE, read_json

    model, config_file = folder / MODEL_FILE, folder / "config.json"
    if not model.is_file() or not config_file.is_file():
        raise EdgespecError(f"{folder} is not an ONNX export folder (it needs {MODEL_FILE} and config.json)")
    config = read_json(config_file)
    tensors, inputs = read_onnx_graph(model)
    past = next((elem for name, elem in inputs.items() if name.startswith("past_key_values.")), 1)
    n_head = config["num_attention_heads"]
    n_embd = config["hidden_size"]
    return ModelInfo(path=folder, format="onnx", n_layer=config["num_hidden_layers"], n_embd=n_embd,
                     n_ff=config.get("intermediate_size", 0), n_head=n_head,
                     n_head_kv=config.get("num_key_value_heads", n_head),
                     head_dim=config.get("head_dim") or n_embd // n_head, n_vocab=config["vocab_size"],
                     n_ctx_train=config.get("max_position_embeddings", 0), tensors=tuple(tensors),
                     kv_dtype_bytes=_ONNX_TYPES.get(past, ("", 4))[1])


def read_gguf_vocab(path: str | os.PathLike) -> Vocab:
    """The vocabulary facts check_compatible compares (token texts, BOS, EOS), streamed from a GGUF's metadata
    without gguf-py, whose reader takes seconds on a 150k-token vocabulary."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        c = _Cursor(mm)
        try:
            if mm[:4] != b"GGUF":
                raise ValueError("no GGUF magic")
            c.pos = 8
            _, n_kv = c.unpack("<Q"), c.unpack("<Q")
            meta = {}
            for _ in range(n_kv):
                key, vtype = c.string().decode("utf-8"), c.unpack("<I")
                if key == "tokenizer.ggml.tokens":
                    meta[key] = tuple(c.value(vtype, keep=True))
                elif key == "tokenizer.ggml.model" and vtype == _STRING:
                    meta[key] = c.value(vtype, keep=False).decode("utf-8", "replace")
                elif vtype in _SCALARS and key.startswith("tokenizer.ggml."):
                    meta[key] = c.value(vtype, keep=False)
                else:
                    c.value(vtype, keep=False)  # merges, scores and the like: skipped
        except (ValueError, UnicodeDecodeError, IndexError) as e:
            raise EdgespecError(f"{path}: cannot read its GGUF metadata ({e})") from None
    texts = meta.get("tokenizer.ggml.tokens")
    if not texts:
        raise EdgespecError(f"{path} has no tokenizer in its metadata")
    eos = meta.get("tokenizer.ggml.eos_token_id", -1)
    return Vocab(texts=texts, pieces=_pieces(meta.get("tokenizer.ggml.model"), texts),
                 bos_id=meta.get("tokenizer.ggml.bos_token_id", -1), eos_id=eos, eog_ids=frozenset([eos]))


def _pieces(model: str | None, texts: tuple[bytes, ...]) -> tuple[bytes, ...]:
    """The bytes each token stands for, decoded from its text as the tokenizer kind writes it: byte-level BPE
    ("gpt2": every byte a printable character, GPT-2's table) and SentencePiece ("llama": U+2581 for a space, <0xNN>
    for a byte); the texts themselves for another kind. Control tokens keep their text. What `edgespec models`
    matches a draft of another tokenizer by (drafts/cross.VocabMap), as llama.cpp's own pieces are at load."""
    if model == "gpt2":
        table = _byte_decoder()
        return tuple(bytes(table[ch] for ch in t.decode("utf-8", "replace")) if all(
            ch in table for ch in t.decode("utf-8", "replace")) else t for t in texts)
    if model == "llama":
        return tuple(bytes([int(t[3:5], 16)]) if len(t) == 6 and t.startswith(b"<0x") and t.endswith(b">")
                     else t.replace("\u2581".encode(), b" ") for t in texts)
    return texts


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE table, inverted: the printable character that stands for each byte -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}
