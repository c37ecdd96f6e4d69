"""Random-weight GGUF models of any shape and vocabulary, with the default model's tokenizer.

What a pass costs, and what the host does around it, depend on a model's shapes and vocabulary, not on its
weights' values. The models people run on devices (1-8B, vocabularies of 128k-152k tokens) cannot be
downloaded here, so benchmarks and tests write their shapes with random weights: the default model's
tokenizer (SmolLM2's BPE, chat template, special ids) padded to the vocabulary asked for with reserved
control tokens, as Llama 3 and Qwen 2.5 pad theirs. Weights are written tensor by tensor from a random block,
so a 3B f16 file (6 GB) is written at disk speed in bounded memory; q8_0 and q4_0 come from llama.cpp's
quantizer on the f16 file.

usage: python -m edgespec.models.random_gguf OUT.gguf [--shape 135m|1.5b|3b|8b|tiny] [--vocab 152064]
       [--type f16|f32|q8_0|q4_0] [--layers N] [--tokenizer FILE.gguf]
"""

from __future__ import annotations

import argparse
import functools
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgespec.backends import gguf_file
from edgespec.errors import EdgespecError


@dataclass(frozen=True)
class Shape:
    layers: int
    embd: int
    heads: int
    kv_heads: int
    ff: int


# SmolLM2-135M's body; Qwen2.5-1.5B's, Llama-3.2-3B's and Llama-3.1-8B's widths (llama architecture: no attention
# biases)
SHAPES = {"tiny": Shape(2, 64, 4, 2, 128), "135m": Shape(30, 576, 9, 3, 1536),
          "1.5b": Shape(28, 1536, 12, 2, 8960), "3b": Shape(28, 3072, 24, 8, 8192),
          "8b": Shape(32, 4096, 32, 8, 14336)}
TYPES = ("f32", "f16", "q8_0", "q4_0")
BLOCK = 1 << 20  # random values drawn once and tiled over every tensor
INIT_STD = 0.02  # what a fresh checkpoint's linear layers hold


def _tokenizer_fields(n_vocab: int, source: str | os.PathLike | None):
    """The tokenizer fields of a GGUF (default: the default model), its token list padded to n_vocab with
    reserved control tokens."""
    if source is None:
        from edgespec.models.default import default_target

        source = default_target()
    stat = os.stat(source)
    fields, tokens, types = _read_tokenizer(str(source), stat.st_size, stat.st_mtime_ns)
    if n_vocab < len(tokens):
        raise EdgespecError(f"a vocabulary of {n_vocab} tokens is smaller than the tokenizer's {len(tokens)}")
    pad = n_vocab - len(tokens)
    tokens = [*tokens, *(f"<|reserved_special_token_{i}|>".encode() for i in range(pad))]
    types = [*types, *[gguf_file.control_token_type()] * pad]
    return fields, tokens, types


@functools.lru_cache(maxsize=4)
def _read_tokenizer(path: str, size: int, mtime_ns: int) -> tuple[dict, tuple, tuple]:
    """A GGUF's tokenizer fields, tokens and token types, read once per file version (size and mtime in the key):
    gguf-py parses a 49k-token vocabulary in about 5 s, and a session writes several random GGUFs from one
    tokenizer."""
    reader = gguf_file.open_gguf(path)
    fields = {f.name: f for f in reader.fields.values() if f.name.startswith("tokenizer.")}
    tokens = tuple(bytes(t) if not isinstance(t, str) else t.encode()
                   for t in fields["tokenizer.ggml.tokens"].contents())
    return fields, tokens, tuple(fields["tokenizer.ggml.token_type"].contents())


def write_random_gguf(path: str | os.PathLike, *, shape: Shape | str = "135m", n_vocab: int = 152064,
                      dtype: str = "f16", seed: int = 0, n_ctx: int = 8192,
                      tokenizer: str | os.PathLike | None = None) -> Path:
    """Write a llama-architecture GGUF of `shape` with random weights and the tokenizer of the GGUF `tokenizer`
    (default: the default model's) padded to n_vocab; written beside path under a temporary name and renamed, so
    a failure leaves nothing at path."""

    shape = SHAPES[shape] if isinstance(shape, str) else shape
    if dtype not in TYPES:
        raise EdgespecError(f"unknown weight type '{dtype}': choose one of {', '.join(TYPES)}")
    if shape.embd % shape.heads or shape.heads % shape.kv_heads:
        raise EdgespecError(f"{shape.heads} heads ({shape.kv_heads} for keys and values) do not divide a width of "
                            f"{shape.embd}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields, tokens, types = _tokenizer_fields(n_vocab, tokenizer)
    float_type = "f32" if dtype == "f32" else "f16"
    tmp = path.with_name(f".{path.name}.{float_type}.partial")  # not quantize_gguf's own temporary name
    try:
        _write(tmp, shape, n_vocab, float_type, seed, n_ctx, fields, tokens, types)
        if dtype in ("q8_0", "q4_0"):
            from edgespec.backends.llama.lib import quantize_gguf

            quantize_gguf(tmp, path, dtype)
        else:
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _write(path, shape, n_vocab, float_type, seed, n_ctx, fields, tokens, types) -> None:
    head_dim = shape.embd // shape.heads
    writer = gguf_file.new_writer(path, "llama")
    writer.add_name(f"random {shape.layers}x{shape.embd} V{n_vocab}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(shape.embd)
    writer.add_feed_forward_length(shape.ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf_file.float_file_type(float_type))
    gguf_file.copy_fields(writer, fields.values(), lambda name: name in (
        "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)

    kv = shape.kv_heads * head_dim
    tensors = [("token_embd.weight", (n_vocab, shape.embd)), ("output_norm.weight", (shape.embd,))]
    for i in range(shape.layers):
        tensors += [(f"blk.{i}.attn_norm.weight", (shape.embd,)), (f"blk.{i}.ffn_norm.weight", (shape.embd,)),
                    (f"blk.{i}.attn_q.weight", (shape.embd, shape.embd)), (f"blk.{i}.attn_k.weight", (kv, shape.embd)),
                    (f"blk.{i}.attn_v.weight", (kv, shape.embd)),
                    (f"blk.{i}.attn_output.weight", (shape.embd, shape.embd)),
                    (f"blk.{i}.ffn_gate.weight", (shape.ff, shape.embd)),
                    (f"blk.{i}.ffn_up.weight", (shape.ff, shape.embd)),
                    (f"blk.{i}.ffn_down.weight", (shape.embd, shape.ff))]
    rng = np.random.default_rng(seed)
    block = (rng.standard_normal(BLOCK) * INIT_STD).astype(np.float32)

    def values(name, dims):
        """Norms are ones (as initialised); matrices a tiling of the random block at a random offset, float32
        norms and 1-D tensors whatever the type (llama.cpp reads them as f32)."""
        count = int(np.prod(dims))
        if len(dims) == 1:
            return np.ones(dims, dtype=np.float32)
        start = int(rng.integers(BLOCK))
        flat = np.resize(np.roll(block, -start), count).reshape(dims)
        return flat.astype(np.float16) if float_type == "f16" else flat

    for name, dims in tensors:  # shapes as numpy sees them: [rows, columns]
        dtype = np.float32 if len(dims) == 1 or float_type == "f32" else np.float16
        writer.add_tensor_info(name, dims, np.dtype(dtype), int(np.prod(dims)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, dims in tensors:
        writer.write_tensor_data(values(name, dims))
    writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=list(SHAPES), default="135m")
    ap.add_argument("--vocab", type=int, default=152064)
    ap.add_argument("--type", choices=TYPES, default="f16")
    ap.add_argument("--layers", type=int, help="override the shape's layer count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", help="a GGUF whose tokenizer to take (default: the default model's)")
    args = ap.parse_args()
    shape = SHAPES[args.shape] if args.layers is None else replace(SHAPES[args.shape], layers=args.layers)
    try:
        path = write_random_gguf(args.out, shape=shape, n_vocab=args.vocab, dtype=args.type, seed=args.seed,
                                 tokenizer=args.tokenizer)
    except EdgespecError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
