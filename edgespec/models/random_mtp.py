"""Random-weight GGUFs of Qwen3.5 (llama.cpp architecture `qwen35`) carrying an MTP layer, for the MTP drafter's
loading and exactness tests: no Qwen3.5 weights can be downloaded here.

The file has what llama.cpp's converter writes for Qwen3.5 (convert_hf_to_gguf.py, conversion/qwen.py): a trunk
of gated-delta-net layers with a full-attention layer every `full_attention_interval`, and after it
`nextn_predict_layers` = 1 MTP block (`blk.N.nextn.eh_proj`, `enorm`, `hnorm` and a full-attention decoder layer)
sharing the trunk's embeddings and output layer. The tokenizer is the default model's (random_gguf.py).

The values are chosen so that a test has power, not so that the model writes text: token embeddings dominate the
residual stream (each trunk layer adds little), so the target's law of the next token is near a function of the
current token, peaked over a few tokens (`sharpness`: the spread of its logits); the MTP block's projection passes
the embedding of its token through with a perturbation (`mtp_noise`), so its law of the token after next is near
the target's and differs from it: a draft the rejection rule accepts often and must correct.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgespec.backends import gguf_file
from edgespec.models.random_gguf import INIT_STD, _tokenizer_fields


def write_random_qwen35_mtp(path: str | os.PathLike, *, layers: int = 4, embd: int = 64, heads: int = 4,
                            kv_heads: int = 2, head_dim: int = 16, ff: int = 128, n_vocab: int = 49152,
                            sharpness: float = 6.0, mtp_noise: float = 0.2, seed: int = 0, n_ctx: int = 4096,
                            tokenizer: str | os.PathLike | None = None) -> Path:
    """Write a qwen35 GGUF of `layers` trunk layers (every fourth full attention) and one MTP layer, float32,
    written under a temporary name and renamed."""
    rng = np.random.default_rng(seed)
    tensors = _tensors(rng, layers, embd, heads, kv_heads, head_dim, ff, n_vocab, sharpness, mtp_noise)
    arch = "qwen35"
    writer = float_writer(arch, f"random qwen35 {layers}x{embd} + MTP", _tokenizer_fields(n_vocab, tokenizer),
                          blocks=layers + 1, n_ctx=n_ctx, embd=embd, ff=ff, heads=heads, kv_heads=kv_heads,
                          head_dim=head_dim, rope_base=10_000_000.0)  # the MTP layer is the last block
    writer.add_uint32(f"{arch}.nextn_predict_layers", 1)
    writer.add_rope_dimension_count(head_dim)
    quarter = head_dim // 4  # interleaved multi-section RoPE over the rotated half: text uses the first three
    writer.add_array(f"{arch}.rope.dimension_sections", [quarter, quarter, head_dim // 2 - 2 * quarter, 0])
    writer.add_uint32(f"{arch}.full_attention_interval", 4)
    for key, value in SSM.items():
        writer.add_uint32(f"{arch}.ssm.{key}", value)
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    return gguf_file.write_new(writer, path)


def float_writer(arch: str, name: str, tokenizer: tuple, *, blocks: int, n_ctx: int, embd: int, ff: int, heads: int,
                 kv_heads: int, head_dim: int, rope_base: float, skip: tuple[str, ...] = ()):
    """A GGUFWriter of a float32 model of `arch` with the attention shapes given and a tokenizer
    (random_gguf._tokenizer_fields's fields, tokens and types; the fields named in skip left out)."""
    fields, tokens, types = tokenizer
    writer = gguf_file.new_writer(None, arch)
    writer.add_name(name)
    writer.add_block_count(blocks)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(embd)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf_file.float_file_type("f32"))
    gguf_file.copy_fields(writer, fields.values(), lambda field: field in (
        "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores", *skip))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    return writer


def initialisers(rng):
    """(normal(*shape, std=INIT_STD), ones(n)): float32 weights as a fresh checkpoint holds them."""

    def normal(*shape, std=INIT_STD):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ones(n):
        return np.ones(n, dtype=np.float32)

    return normal, ones


# the gated delta net's sizes: 2 key heads and 4 value heads of 16 (Qwen3.5's proportions, scaled down)
SSM = {"conv_kernel": 4, "state_size": 16, "group_count": 2, "time_step_rank": 4, "inner_size": 64}


def _tensors(rng, layers, embd, heads, kv_heads, head_dim, ff, n_vocab, sharpness, mtp_noise) -> dict:
    """name -> float32 array, numpy shapes [rows, columns] (ggml's dimensions reversed)."""
    normal, ones = initialisers(rng)

    def attention(i):
        return {f"blk.{i}.attn_q.weight": normal(2 * heads * head_dim, embd),  # queries and their gates
                f"blk.{i}.attn_k.weight": normal(kv_heads * head_dim, embd),
                f"blk.{i}.attn_v.weight": normal(kv_heads * head_dim, embd),
                f"blk.{i}.attn_output.weight": normal(embd, heads * head_dim),
                f"blk.{i}.attn_q_norm.weight": ones(head_dim), f"blk.{i}.attn_k_norm.weight": ones(head_dim)}

    def common(i):
        return {f"blk.{i}.attn_norm.weight": ones(embd), f"blk.{i}.post_attention_norm.weight": ones(embd),
                f"blk.{i}.ffn_gate.weight": normal(ff, embd), f"blk.{i}.ffn_up.weight": normal(ff, embd),
                f"blk.{i}.ffn_down.weight": normal(embd, ff)}

    state, k_heads, v_heads = SSM["state_size"], SSM["group_count"], SSM["time_step_rank"]
    key_dim, value_dim = state * k_heads, state * v_heads
    out = {"token_embd.weight": normal(n_vocab, embd, std=1.0), "output_norm.weight": ones(embd),
           "output.weight": normal(n_vocab, embd, std=sharpness / np.sqrt(embd))}
    for i in range(layers):
        out |= common(i)
        if (i + 1) % 4 == 0:
            out |= attention(i)
            continue
        out |= {f"blk.{i}.attn_qkv.weight": normal(2 * key_dim + value_dim, embd),
                f"blk.{i}.attn_gate.weight": normal(value_dim, embd),
                f"blk.{i}.ssm_conv1d.weight": normal(2 * key_dim + value_dim, SSM["conv_kernel"], std=0.5),
                f"blk.{i}.ssm_dt.bias": np.zeros(v_heads, dtype=np.float32),
                f"blk.{i}.ssm_a": -np.ones(v_heads, dtype=np.float32),
                f"blk.{i}.ssm_beta.weight": normal(v_heads, embd), f"blk.{i}.ssm_alpha.weight": normal(v_heads, embd),
                f"blk.{i}.ssm_norm.weight": ones(state), f"blk.{i}.ssm_out.weight": normal(embd, value_dim)}
    m = layers
    # concat(enorm(embedding), hnorm(h)) -> the block's input: the embedding through, perturbed by both halves
    eh = normal(embd, 2 * embd, std=mtp_noise / np.sqrt(2 * embd))
    eh[:, :embd] += np.eye(embd, dtype=np.float32)
    out |= common(m) | attention(m) | {f"blk.{m}.nextn.eh_proj.weight": eh, f"blk.{m}.nextn.enorm.weight": ones(embd),
                                       f"blk.{m}.nextn.hnorm.weight": ones(embd)}
    return out
