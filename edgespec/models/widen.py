"""A llama-architecture GGUF widened with zero weights: a larger model's cost, the source model's function.

Speculation pays most where the target fills the memory bus (a 3-14B read per token) and the draft is tiny. No
such weights can be downloaded here, and random weights have a big model's cost but no real text, so no real
acceptance. A widened copy of a real model has both: every matrix grows to a larger model's shape with zeros,
arranged so the function is the source's up to rounding.

- The hidden size grows with zero columns in the embeddings and in every input projection (q, k, v, gate, up)
  and zero rows in every output projection (attention output, down): the new dimensions stay 0 in the residual.
- RMSNorm over n_new dimensions of which n_old are non-zero: mean(x^2) shrinks by n_old / n_new, so the norm
  weights are scaled by sqrt(n_old / n_new) and epsilon by n_old / n_new; the normalised old dimensions are then
  exactly the source's.
- New attention heads have zero q, k, v rows and zero output columns (their output is 0). Head size is kept (the
  attention scale and rope are the source's); the old query heads are placed so each still reads its own
  key/value head under the wider grouping: llama.cpp gives query head h key/value head h // group.
- The feed-forward grows with zero gate/up rows and zero down columns (silu(0) * 0 = 0).

An EAGLE-3 head converted for the source (GGUF architecture `eagle3`) widens the same way to draft for the widened
target: its input projections read 2 (attention: [token embedding; g]) or 3 (fc: the target's three layers)
blocks of the new width, each with the source's columns at its start, and its target_hidden_size is the new
width. Widened to the target's shape, the head has a matching model's cost, and drafts the source head's laws.

It is an instrument for costs, not a model: its text is the source's, so a draft made from the source (its own
Q4_0, say) agrees with it as closely as with the source, more than a real 0.5B agrees with a real 7B of its family.
Report acceptance beside any speedup measured on it (docs/drafts.md, "Widened targets").

Weights are written tensor by tensor (the source dequantized to float32, then placed), f32, f16 or Q8_0; a Q8_0
tensor is quantized from the source's values only and its zero blocks written as zero bytes (a Q8_0 block of
zeros is 34 zero bytes): the 7B-class copy took 37 s on 2 CPU cores (docs/results/2026-11-28-big-pair.md).

usage: python -m edgespec.models.widen SRC.gguf DST.gguf --shape 2b|7b [--type f16|q8_0|f32]
       (SRC a llama model, or an EAGLE-3 head for one: widen both to the same shape)
       python -m edgespec.models.widen SRC.gguf DST.gguf --embd 1024 --heads 16 --kv-heads 4 --ff 4096
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.backends import gguf_file
from edgespec.errors import EdgespecError


@dataclass(frozen=True)
class Width:
    embd: int
    heads: int
    kv_heads: int
    ff: int


# a 2B-class body (2048 wide) and a 7B-class one (Mistral-7B's width and feed-forward) over the source's layers
SHAPES = {"2b": Width(2048, 32, 8, 8192), "7b": Width(4096, 64, 16, 14336)}
TYPES = ("f32", "f16", "q8_0")
FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0"}
# how many blocks of the hidden width an architecture's input projections read: eagle3's attention reads
# [norm(token embedding); norm(g)], its fc the target's three layers side by side
INPUT_BLOCKS = {"llama": {}, "eagle3": {"attn_q": 2, "attn_k": 2, "attn_v": 2, "fc": 3}}
SHAPE_KEYS = ("embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv")
EPS_KEY = "attention.layer_norm_rms_epsilon"


@dataclass(frozen=True)
class _Plan:
    """Where the source's rows and columns go: old index -> new index along each axis kind."""

    old: Width
    new: Width
    head_dim: int

    def embd(self) -> np.ndarray:  # [old embd] the hidden dimensions: the first ones
        return np.arange(self.old.embd)

    def blocks(self, n: int) -> np.ndarray:  # [n x old embd] n hidden-width blocks side by side, old ones first
        return (np.arange(n)[:, None] * self.new.embd + self.embd()).ravel()

    def ff(self) -> np.ndarray:  # [old ff]
        return np.arange(self.old.ff)

    def q(self) -> np.ndarray:  # [old heads * head_dim] query head h of group g -> the same place in new group g
        group_old, group_new = self.old.heads // self.old.kv_heads, self.new.heads // self.new.kv_heads
        h = np.arange(self.old.heads)
        return self._heads((h // group_old) * group_new + h % group_old)

    def kv(self) -> np.ndarray:  # [old kv_heads * head_dim] key/value head g stays g
        return self._heads(np.arange(self.old.kv_heads))

    def _heads(self, new_heads: np.ndarray) -> np.ndarray:
        return (new_heads[:, None] * self.head_dim + np.arange(self.head_dim)).ravel()


def widen_gguf(src: str | os.PathLike, dst: str | os.PathLike, width: Width, dtype: str = "f16",
               progress=None) -> Path:
    """Write at dst the llama GGUF src widened to `width` (its layers, vocabulary and tokenizer kept), weights of
    type dtype (f32, f16, q8_0; norms f32); returns dst. progress(done, total) is called after each tensor.
    Written beside dst under a temporary name and renamed, so a failure leaves nothing at dst."""
    if dtype not in TYPES:
        raise EdgespecError(f"unknown weight type '{dtype}' for a widened model: choose one of {', '.join(TYPES)}")
    reader = gguf_file.open_gguf(src)
    arch = gguf_file.architecture(reader)
    if arch not in INPUT_BLOCKS:
        raise EdgespecError(f"{src} is a '{arch}' model: widening knows llama models and their EAGLE-3 heads")
    plan = _plan(reader, arch, width, src)
    gguf = gguf_file.lib()
    qtype = gguf.GGMLQuantizationType[dtype.upper()]
    tensors = [(t, *_placement(t.name, int(t.shape[-1]), plan, src, INPUT_BLOCKS[arch])) for t in reader.tensors]

    writer = gguf_file.new_writer(None, arch)
    skip = ({f"{arch}.{k}" for k in (*SHAPE_KEYS, EPS_KEY, "target_hidden_size")}
            | {"general.file_type", "general.name"})
    gguf_file.copy_fields(writer, reader.fields.values(), lambda name: name in skip)
    name = reader.fields.get("general.name")
    writer.add_name(f"{name.contents() if name else Path(src).stem} widened to {width.embd}")
    writer.add_embedding_length(width.embd)
    writer.add_feed_forward_length(width.ff)
    writer.add_head_count(width.heads)
    writer.add_head_count_kv(width.kv_heads)
    writer.add_layer_norm_rms_eps(_scalar(reader, f"{arch}.{EPS_KEY}", src) * plan.old.embd / width.embd)
    if arch == "eagle3":  # the width of each target layer the head reads
        writer.add_uint32(f"{arch}.target_hidden_size", width.embd)
    writer.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[dtype]))
    for t, _, _, shape in tensors:
        if t.name == "d2t":  # eagle3's draft-to-target id map, kept as it is
            writer.add_tensor_info(t.name, shape, np.dtype(np.int64), 8 * int(np.prod(shape)))
        elif len(shape) == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor_info(t.name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor_info(t.name, shape, np.dtype(np.float16), 2 * int(np.prod(shape)))
        else:
            byte_shape = _byte_shape(shape, qtype)
            writer.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)

    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.partial")
    try:
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, (t, rows, cols, shape) in enumerate(tensors):
            writer.write_tensor_data(_widened(t, rows, cols, shape, plan, qtype))
            if progress is not None:
                progress(i + 1, len(tensors))
        writer.close()
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def _plan(reader, arch: str, new: Width, src) -> _Plan:
    """The source's width, checked against the new one: every old head and dimension must have a place."""
    embd, ff, heads, kv_heads = (int(_scalar(reader, f"{arch}.{k}", src)) for k in SHAPE_KEYS)
    old = Width(embd, heads, kv_heads, ff)
    head_dim = old.embd // old.heads
    if old.embd % old.heads or old.heads % old.kv_heads:
        raise EdgespecError(f"{src}: {old.heads} heads ({old.kv_heads} for keys and values) over {old.embd} "
                            "dimensions is not a shape widening understands")
    if new.heads % new.kv_heads:
        raise EdgespecError(f"{new.heads} heads do not share {new.kv_heads} key/value heads evenly")
    if new.heads * head_dim != new.embd:
        raise EdgespecError(f"a width of {new.embd} with {new.heads} heads changes the head size ({head_dim} in "
                            f"{src}): choose heads = width / {head_dim}")
    if (new.embd < old.embd or new.ff < old.ff or new.kv_heads < old.kv_heads
            or new.heads // new.kv_heads < old.heads // old.kv_heads):
        raise EdgespecError(f"{src} is {old.embd} wide (feed-forward {old.ff}, {old.heads} heads sharing "
                            f"{old.kv_heads} key/value heads): a wider copy needs at least that width, feed-forward, "
                            f"key/value heads and query heads per key/value head (got {new.embd}, {new.ff}, "
                            f"{new.heads}/{new.kv_heads})")
    return _Plan(old, new, head_dim)


def _scalar(reader, key: str, src) -> float:
    field = reader.fields.get(key)
    if field is None or len(field.data) != 1:
        raise EdgespecError(f"{src} has no single value for {key}: cannot widen it")
    return field.contents()


def _placement(name: str, n_rows: int, plan: _Plan, src, blocks: dict[str, int]) -> tuple[
        np.ndarray | None, np.ndarray | None, tuple[int, ...]]:
    """(old row -> new row or None where the rows stay (one per token), old column -> new column or None for a
    vector, the new shape in numpy's order) of a tensor by its name, n_rows its rows in the source; blocks: the
    tensors whose input is several hidden-width blocks (INPUT_BLOCKS). An error for a tensor widening does not know
    (its zeros could change the function)."""
    if name == "d2t":
        return None, None, (n_rows,)
    kind = name.split(".")[-2] if name.startswith("blk.") else name.rsplit(".", 1)[0]
    new, hd = plan.new, plan.head_dim
    embd = (plan.embd(), new.embd)

    def reads(kind: str):  # the columns of a projection from the hidden width, one block or several
        n = blocks.get(kind, 1)
        return embd if n == 1 else (plan.blocks(n), n * new.embd)

    axes = {"token_embd": (None, embd), "output": (None, embd), "output_norm": (embd, None),
            "attn_norm": (embd, None), "ffn_norm": (embd, None),
            "attn_q": ((plan.q(), new.heads * hd), reads("attn_q")),
            "attn_k": ((plan.kv(), new.kv_heads * hd), reads("attn_k")),
            "attn_v": ((plan.kv(), new.kv_heads * hd), reads("attn_v")),
            "attn_output": (embd, (plan.q(), new.heads * hd)),
            "ffn_gate": ((plan.ff(), new.ff), embd), "ffn_up": ((plan.ff(), new.ff), embd),
            "ffn_down": (embd, (plan.ff(), new.ff))}
    if "fc" in blocks:  # eagle3: its own norm of g, and the projection of the target's layers
        axes |= {"attn_norm_2": (embd, None), "fc": (embd, reads("fc"))}
    if kind not in axes or not name.endswith(".weight"):
        raise EdgespecError(f"{src}'s tensor {name} is not one widening knows how to place")
    rows, cols = axes[kind]
    if cols is None:  # a norm's vector
        return rows[0], None, (rows[1],)
    return (None if rows is None else rows[0]), cols[0], (n_rows if rows is None else rows[1], cols[1])


def _source(tensor) -> np.ndarray:
    """The tensor's values as float32, numpy's order ([rows, columns] for a matrix)."""
    gguf = gguf_file.lib()
    shape = tuple(int(d) for d in reversed(tensor.shape))
    if tensor.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return np.asarray(tensor.data, dtype=np.float32).reshape(shape)
    return gguf_file.dequantize(np.asarray(tensor.data), tensor.tensor_type.name).reshape(shape)


def _byte_shape(shape: tuple[int, int], qtype) -> tuple[int, int]:
    per_block, block_bytes = gguf_file.lib().GGML_QUANT_SIZES[qtype]
    if shape[1] % per_block:
        raise EdgespecError(f"rows of {shape[1]} weights are not whole blocks of {per_block}: choose f16")
    return shape[0], shape[1] // per_block * block_bytes


def _widened(tensor, rows, cols, shape, plan: _Plan, qtype) -> np.ndarray:
    """The widened tensor's data as written: a vector as float32; a matrix with the source's values at their
    places and zeros elsewhere, as float32, float16 or a quantized type's bytes [rows, row bytes]."""
    gguf = gguf_file.lib()
    if tensor.name == "d2t":
        return np.asarray(tensor.data, dtype=np.int64)
    a = _source(tensor)
    if cols is None:  # a norm: scaled so that the wider mean of squares gives the old normalisation
        out = np.zeros(shape, dtype=np.float32)
        out[rows] = a * np.float32(np.sqrt(plan.old.embd / plan.new.embd))
        return out
    if rows is None:  # the vocabulary's rows stay
        rows = np.arange(a.shape[0])
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        out = np.zeros(shape, dtype=np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.float16)
        out[np.ix_(rows, cols)] = a
        return out
    # quantized: blocks of the source's columns stay whole blocks, so quantize the source alone and place blocks
    from gguf.quants import quantize

    per_block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    starts = cols[::per_block]
    if len(cols) % per_block or np.any(starts % per_block) or np.any(cols != np.repeat(starts, per_block)
                                                                     + np.tile(np.arange(per_block), len(starts))):
        raise EdgespecError(f"{tensor.name}: the source's columns do not fall on whole blocks of {per_block}: "
                            "choose f16")
    out = np.zeros((shape[0], shape[1] // per_block, block_bytes), dtype=np.uint8)
    out[np.ix_(rows, starts // per_block)] = quantize(a, qtype).reshape(a.shape[0], -1, block_bytes)
    return out.reshape(shape[0], -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", help="a llama-architecture GGUF (any weight type)")
    ap.add_argument("dst", help="where to write the widened copy")
    ap.add_argument("--shape", choices=list(SHAPES), help="2b: 2048 wide, 32/8 heads, FFN 8192; "
                    "7b: 4096 wide, 64/16 heads, FFN 14336")
    ap.add_argument("--embd", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--ff", type=int)
    ap.add_argument("--type", choices=TYPES, default="f16")
    args = ap.parse_args()
    given = (args.embd, args.heads, args.kv_heads, args.ff)
    if not (args.shape and given.count(None) == 4 or not args.shape and None not in given):
        ap.error("give --shape, or all of --embd --heads --kv-heads --ff")
    width = SHAPES[args.shape] if args.shape else Width(*given)
    start = time.perf_counter()

    from edgespec.progress import Steps

    bar: list[Steps] = []  # made at the first tensor written, once widen_gguf knows how many there are

    def progress(done: int, total: int) -> None:
        if not bar:
            bar.append(Steps(total, f"widening {Path(args.src).name} to {width.embd}"))
        bar[0].step()

    try:
        path = widen_gguf(args.src, args.dst, width, args.type, progress=progress)
        if bar:
            bar[0].finish()
    except EdgespecError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"{path}: {gguf_file.n_params(path) / 1e9:.2f} B parameters, {path.stat().st_size / 2**30:.2f} GiB "
          f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
