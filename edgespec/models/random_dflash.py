"""Random-weight DFlash block drafts (llama.cpp architecture `dflash`) for a GGUF target, for the DFlash drafter's
loading and exactness tests: no DFlash draft can be downloaded here.

The file has what llama.cpp's converter writes for a DFlash checkpoint (conversion/qwen.py, DFlashModel): the
target's tokenizer with a mask token (`tokenizer.ggml.mask_token_id`), `dflash.target_layers` (the target layers
whose inputs it reads), `dflash.block_size`, an encoder `fc` (len(target_layers) x the target's width -> its
width) and its norm `enc.output_norm`, Qwen3 decoder layers (query and key norms) and `output_norm`; the token
embeddings are the target's (ctx_other). With `draft_ids` it drafts a reduced vocabulary: its own output layer over
those ids and `d2t`, the target id of each row, as published DFlash drafts for large vocabularies do.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgespec.backends import gguf_file
from edgespec.models.random_gguf import _tokenizer_fields
from edgespec.models.random_mtp import float_writer, initialisers


def write_random_dflash(path: str | os.PathLike, target: str | os.PathLike, *, layers: list[int],
                        block_size: int = 8, n_layer: int = 1, heads: int = 4, kv_heads: int = 2, head_dim: int = 64,
                        ff: int = 512, mask_token: int | None = None, draft_ids: np.ndarray | None = None,
                        seed: int = 0) -> Path:
    """Write a DFlash GGUF drafting for the GGUF `target` (its width, tokenizer), reading the inputs of its `layers`,
    float32, under a temporary name and renamed."""
    from edgespec.backends.model_info import read_model_info

    info = read_model_info(target)
    embd, n_vocab = info.n_embd, info.n_vocab
    mask_token = n_vocab - 1 if mask_token is None else mask_token
    normal, ones = initialisers(np.random.default_rng(seed))
    arch = "dflash"
    writer = float_writer(arch, f"random dflash {n_layer}x{embd} for {Path(target).name}",
                          _tokenizer_fields(n_vocab, target), blocks=n_layer, n_ctx=info.n_ctx_train or 8192,
                          embd=embd, ff=ff, heads=heads, kv_heads=kv_heads, head_dim=head_dim, rope_base=100000.0,
                          skip=("tokenizer.ggml.mask_token_id",))
    writer.add_array(f"{arch}.target_layers", [int(i) for i in layers])
    writer.add_uint32(f"{arch}.block_size", block_size)
    writer.add_bool(f"{arch}.attention.causal", False)
    writer.add_mask_token_id(mask_token)

    tensors = {"fc.weight": normal(embd, len(layers) * embd), "enc.output_norm.weight": ones(embd),
               "output_norm.weight": ones(embd)}
    for i in range(n_layer):
        tensors |= {f"blk.{i}.attn_norm.weight": ones(embd), f"blk.{i}.ffn_norm.weight": ones(embd),
                    f"blk.{i}.attn_q.weight": normal(heads * head_dim, embd),
                    f"blk.{i}.attn_k.weight": normal(kv_heads * head_dim, embd),
                    f"blk.{i}.attn_v.weight": normal(kv_heads * head_dim, embd),
                    f"blk.{i}.attn_output.weight": normal(embd, heads * head_dim),
                    f"blk.{i}.attn_q_norm.weight": ones(head_dim), f"blk.{i}.attn_k_norm.weight": ones(head_dim),
                    f"blk.{i}.ffn_gate.weight": normal(ff, embd), f"blk.{i}.ffn_up.weight": normal(ff, embd),
                    f"blk.{i}.ffn_down.weight": normal(embd, ff)}
    if draft_ids is not None:
        tensors["output.weight"] = normal(len(draft_ids), embd)
        tensors["d2t"] = np.asarray(draft_ids, dtype=np.int64)
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    return gguf_file.write_new(writer, path)
