"""Train an EAGLE-3 head for a GGUF target and write it as users get published ones: a SpecForge checkpoint
converted to GGUF by the pinned llama.cpp's converter (export/eagle3.py), which drafts/eagle3.py runs.

The head is llama.cpp's `eagle3` graph (src/models/eagle3.cpp): g[P] = fc(the inputs of three target layers at
position P, joined); at P the decoder layer reads [input_layernorm(embedding of token P + 1);
hidden_norm(g[P])] for its attention (twice the width) with g[P] as the residual, and its output through `norm`
and `lm_head` is the law of token P + 2; drafting further, the layer's pre-norm output stands in for g. Training
replays drafting (train/eagle.replay_chain, the "training-time test" of EAGLE-3): step s reads the pre-norm output
of step s - 1 one position back. The loss is the cross-entropy to the target's own distribution (the corpus's
top-K), over the head's vocabulary subset; EAGLE-3 has no feature regression.

Weights are kept in GGUF's layout here (q/k rows paired for ggml's RoPE, as train/eagle.py) and turned into Hugging
Face's for the checkpoint; the converter turns them back. The layer starts from the target's last layer (q/k/v
reading the average of the two normed inputs), fc from the last of the three layers, lm_head from the target's
output rows for the subset (kept frozen).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgespec.progress import say
from edgespec.train.corpus import Sequence
from edgespec.train.eagle import SUBSET_SIZE, answer_subset, layer_weights, replay_chain, torch_head_base, train_eagle

NAMES = {  # GGUF-layout name here -> the SpecForge checkpoint's
    "fc": "fc.weight", "attn_norm": "midlayer.input_layernorm.weight", "hidden_norm": "midlayer.hidden_norm.weight",
    "attn_q": "midlayer.self_attn.q_proj.weight", "attn_k": "midlayer.self_attn.k_proj.weight",
    "attn_v": "midlayer.self_attn.v_proj.weight", "attn_output": "midlayer.self_attn.o_proj.weight",
    "ffn_norm": "midlayer.post_attention_layernorm.weight", "ffn_gate": "midlayer.mlp.gate_proj.weight",
    "ffn_up": "midlayer.mlp.up_proj.weight", "ffn_down": "midlayer.mlp.down_proj.weight", "out_norm": "norm.weight"}


def default_layers(n_layer: int) -> list[int]:
    """The target layers an EAGLE-3 head reads where none are given: llama.cpp's converter's default."""
    return [2, n_layer // 2, n_layer - 3]


def layer_features(target: str | os.PathLike, seqs: list[Sequence], layers: list[int], *,
                   progress: bool = True) -> list[np.ndarray]:
    """Per sequence, the inputs of `layers` at each position but the last (the entries' features), joined in
    that order: float16 [len(tokens) - 1, len(layers) x E], from one teacher-forced pass of the target."""
    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.backends.llama.ext import LayerInputs

    longest = max(len(s.tokens) for s in seqs)
    backend = LlamaBackend(target, n_ctx=longest + 16, sequences=1)
    inputs = LayerInputs(backend, layers)
    current: dict[int, np.ndarray] = {}

    def keep(positions):
        rows = inputs.read(len(positions))  # [layers, n, E]
        for j, pos in enumerate(positions):
            current[pos] = rows[:, j].reshape(-1).astype(np.float16)

    backend.on_pass = keep
    out = []
    try:
        for i, s in enumerate(seqs):
            backend.rollback(0)
            current.clear()
            backend.forward([int(t) for t in s.tokens[:-1]], 0)
            out.append(np.stack([current[p] for p in range(len(s.tokens) - 1)]))
            if progress and i % 100 == 0:
                say(progress, f"  target layer inputs {i + 1}/{len(seqs)}")
    finally:
        inputs.close()
        backend.on_pass = None
        backend.close()
    return out


def initial_eagle3(target: str | os.PathLike, layer: int = -1) -> tuple[dict[str, np.ndarray], dict]:
    """Weights to start training from (module docstring) and the attention shape, from a GGUF target."""
    w, meta = layer_weights(target, layer)
    width = w["attn_norm"].shape[0]
    weights = {name: w[name] for name in ("attn_norm", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
                                          "out_norm")}
    weights["hidden_norm"] = w["attn_norm"].copy()
    for name in ("attn_q", "attn_k", "attn_v"):
        weights[name] = np.concatenate([w[name], w[name]], axis=1) * 0.5  # [out, 2E]: the inputs' average
    weights["fc"] = np.concatenate([np.zeros((width, 2 * width), np.float32), np.eye(width, dtype=np.float32)], 1)
    return weights, meta


def torch_head3(torch, weights: dict[str, np.ndarray], meta: dict, output):
    """The head as a torch module: forward(features [B, T, 3E], ...) -> pre-norm outputs per draft step (replay_chain),
    logits(pre-norm [N, E]) -> [N, S]; output [S, E]: lm_head, frozen."""

    F = torch.nn.functional

    class Head3(torch_head_base(torch, weights, meta)):
        def __init__(self):
            super().__init__()
            self.register_buffer("output", output)

        def entry(self, g, embeddings, pos):
            p, (b, t, _) = self.p, g.shape
            d = p["attn_q"].shape[0] // self.n_head
            x = torch.cat([self.norm(embeddings, p["attn_norm"]), self.norm(g, p["hidden_norm"])], dim=-1)
            q = self.rope((x @ p["attn_q"].T).view(b, t, self.n_head, d), pos)
            k = self.rope((x @ p["attn_k"].T).view(b, t, self.n_head_kv, d), pos)
            v = (x @ p["attn_v"].T).view(b, t, self.n_head_kv, d)
            group = self.n_head // self.n_head_kv
            return g, q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)

        def finish(self, g, attn):
            p = self.p
            x = g + attn.flatten(-2) @ p["attn_output"].T
            h = self.norm(x, p["ffn_norm"])
            return x + (F.silu(h @ p["ffn_gate"].T) * (h @ p["ffn_up"].T)) @ p["ffn_down"].T

        def logits(self, prenorm):
            return self.norm(prenorm, self.p["out_norm"]) @ self.output.T

        def forward(self, features, embeddings, real, valid, steps):
            return replay_chain(self, features @ self.p["fc"].T, embeddings, real, valid, steps)

    return Head3()


def eagle3_batch(torch, seqs: list[Sequence], embeddings: np.ndarray, features: list[np.ndarray]):
    """Padded tensors for a batch: features [B, T, 3E] and next-token embeddings [B, T, E] for the entries
    (T = the longest sequence's length - 1), real = valid [B, T] (every entry has its features), and per entry
    the corpus row of the target's law it must give (-1: none) [B, T]."""
    t = max(len(s.tokens) for s in seqs) - 1
    feats = np.zeros((len(seqs), t, features[0].shape[1]), np.float32)
    embs = np.zeros((len(seqs), t, embeddings.shape[1]), np.float32)
    valid = np.zeros((len(seqs), t), bool)
    rows = np.full((len(seqs), t), -1, np.int64)
    for b, (s, f) in enumerate(zip(seqs, features, strict=True)):
        n = len(s.tokens) - 1
        feats[b, :n] = f
        embs[b, :n] = embeddings[s.tokens[1:]]
        valid[b, :n] = True
        r = np.arange(n) + 2 - s.n_prompt  # entry P gives the law of token P + 2: corpus row P + 2 - n_prompt
        ok = (r >= 0) & (r < len(s.lse))
        rows[b, :n][ok] = r[ok]
    valid_t = torch.from_numpy(valid)
    return torch.from_numpy(feats), torch.from_numpy(embs), valid_t, valid_t, rows


def unrope_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """train/eagle.rope_rows undone: GGUF's q/k row order back to Hugging Face's."""
    return weight.reshape(n_head, weight.shape[0] // n_head // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def fit_eagle3(target: str | os.PathLike, hf_target: str | os.PathLike, seqs: list[Sequence],
               out: str | os.PathLike, *, layers: list[int] | None = None, subset_size: int | None = None,
               progress: bool = True, **train_kwargs) -> dict:
    """Features, start, train (train/eagle.train_eagle), then the SpecForge checkpoint (OUT.specforge/) and its
    GGUF (out) converted by llama.cpp's converter against the target's Hugging Face folder; the report."""
    from edgespec.drafts.heads import output_matrix
    from edgespec.export.eagle3 import convert_eagle3, save_specforge
    from edgespec.export.hf import read_config

    out = Path(out)
    config = read_config(Path(hf_target))
    config = {**config, **config.get("text_config", {})}
    layers = layers or default_layers(config["num_hidden_layers"])
    embeddings = output_matrix(target)
    subset = answer_subset(seqs, embeddings.shape[0], subset_size or SUBSET_SIZE)
    weights, meta = initial_eagle3(target)
    features = layer_features(target, seqs, layers, progress=progress)
    by_seq = {id(s): f for s, f in zip(seqs, features, strict=True)}
    trained, report = train_eagle(
        seqs, embeddings, weights, meta, subset=subset, kind="eagle3", feature_weight=0.0, progress=progress,
        make_head=lambda torch, output: torch_head3(torch, weights, meta, output),
        make_batch=lambda torch, group: eagle3_batch(torch, group, embeddings, [by_seq[id(s)] for s in group]),
        **train_kwargs)
    named = {NAMES[k]: v for k, v in trained.items()}
    for name, heads in (("attn_q", meta["n_head"]), ("attn_k", meta["n_head_kv"])):
        named[NAMES[name]] = unrope_rows(trained[name], heads)
    named["lm_head.weight"] = np.ascontiguousarray(embeddings[subset], dtype=np.float32)
    folder = save_specforge(out.with_name(out.name.removesuffix(".gguf") + ".specforge"), named,
                            target_config=config, layers=layers, draft_ids=subset)
    convert_eagle3(folder, hf_target, out)
    return {**report, "layers": layers, "checkpoint": str(folder)}
