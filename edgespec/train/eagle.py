"""Train an EAGLE head on a corpus of the target's answers with its hidden states (train.corpus).

The head (drafts/eagle.py) is trained the way it drafts. Step 1: every entry t reads the target's real
state h_t and token t+1, and g_t must give the target's distribution over token t+2 (cross-entropy to
the target's exact top-K probabilities, over the head's vocabulary subset) and approach h_{t+1}
(smooth L1). Step s > 1 replays drafting s tokens ahead at every position at once ("training-time
test"): the entry at t reads g from step s-1 at t-1 instead of h_t, and attends to the real entries
before t-s+2 plus the chain of guessed entries between, exactly what its KV cache holds at run time.
Without that, a head trained only on real states drifts after its first draft.

The layer starts from one of the target's own layers (its last by default), fc from [I, I] (the sum of
state and embedding), so training begins from a sensible transformer block rather than noise.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from edgespec.drafts.eagle import LAYER_WEIGHTS
from edgespec.errors import EdgespecError
from edgespec.progress import say
from edgespec.train.corpus import Sequence

SUBSET_SIZE = 8192  # output tokens: covers all but ~1 % of the target's probability mass on its own answers


def rope_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """A Hugging Face q or k projection [out, in] in GGUF's row order: llama.cpp's converter permutes each
    head's rows so that the two halves rotary embedding pairs up sit side by side (its normal RoPE)."""
    return weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def layer_weights(target: str | os.PathLike, layer: int = -1) -> tuple[dict[str, np.ndarray], dict]:
    """One decoder layer of a Llama target (float32, GGUF layout) and its attention shape: from a GGUF file,
    or from an ONNX export folder (its config and float initializers)."""
    if Path(target).is_dir():
        return _onnx_layer_weights(Path(target), layer)
    return _gguf_layer_weights(target, layer)


def _onnx_layer_weights(folder: Path, layer: int) -> tuple[dict[str, np.ndarray], dict]:
    from edgespec.backends.onnx.folder import read_json
    from edgespec.backends.onnx.weights import decoder_layer

    config = read_json(folder / "config.json")
    if config.get("model_type") != "llama" or "num_hidden_layers" not in config:
        raise EdgespecError(f"{folder}: an EAGLE head starts from a Llama-architecture layer; config.json says "
                            f"{config.get('model_type')!r}")
    layer = layer % config["num_hidden_layers"]
    n_head = config["num_attention_heads"]
    n_head_kv = config.get("num_key_value_heads") or n_head
    w = decoder_layer(folder, layer)
    weights = {"attn_norm": w["input_layernorm"], "attn_q": rope_rows(w["q_proj"], n_head),
               "attn_k": rope_rows(w["k_proj"], n_head_kv), "attn_v": w["v_proj"], "attn_output": w["o_proj"],
               "ffn_norm": w["post_attention_layernorm"], "ffn_gate": w["gate_proj"], "ffn_up": w["up_proj"],
               "ffn_down": w["down_proj"], "out_norm": w["norm"]}
    # as a GGUF stores them (float32), so a head's meta reads the same whichever file it started from
    meta = {"n_head": n_head, "n_head_kv": n_head_kv, "rope_base": float(np.float32(config.get("rope_theta", 1e4))),
            "eps": float(np.float32(config.get("rms_norm_eps", 1e-6))), "init_layer": layer}
    return weights, meta


def _gguf_layer_weights(gguf_path: str | os.PathLike, layer: int) -> tuple[dict[str, np.ndarray], dict]:
    from edgespec.backends import gguf_file

    reader = gguf_file.open_gguf(gguf_path)
    arch = gguf_file.architecture(reader)

    def field(name):
        f = reader.fields[f"{arch}.{name}"]
        return f.parts[f.data[0]][0].item()

    n_layers = field("block_count")
    layer = layer % n_layers
    weights = {}
    for t in reader.tensors:
        prefix, _, name = t.name.partition(".")[2].partition(".")
        if t.name.startswith(f"blk.{layer}.") and name.removesuffix(".weight") in LAYER_WEIGHTS:
            rows = gguf_file.dequantize(t.data, t.tensor_type.name)
            weights[name.removesuffix(".weight")] = np.asarray(rows, np.float32).reshape([int(d) for d in
                                                                                         reversed(t.shape)])
        if t.name == "output_norm.weight":
            weights["out_norm"] = np.asarray(gguf_file.dequantize(t.data, t.tensor_type.name), np.float32).reshape(-1)
    missing = {*LAYER_WEIGHTS, "out_norm"} - set(weights)
    if missing:
        raise EdgespecError(f"{gguf_path} layer {layer} lacks {sorted(missing)}: an EAGLE head starts from a "
                            "Llama-architecture layer")
    meta = {"n_head": field("attention.head_count"), "n_head_kv": field("attention.head_count_kv"),
            "rope_base": float(field("rope.freq_base")), "eps": float(field("attention.layer_norm_rms_epsilon")),
            "init_layer": layer}
    return weights, meta


def vocab_subset(seqs: list[Sequence], n_vocab: int, size: int, always: list[int]) -> np.ndarray:
    """The `size` tokens with the most target probability over the corpus's rows (plus `always`), sorted."""
    mass = np.zeros(n_vocab)
    for s in seqs:
        np.add.at(mass, s.topk_ids.ravel(), np.exp(s.topk_logits - s.lse[:, None]).ravel())
    mass[always] = np.inf
    return np.sort(np.argsort(-mass)[:size])


def answer_subset(seqs: list[Sequence], n_vocab: int, size: int = SUBSET_SIZE) -> np.ndarray:
    """The token ids heads draft from: the most probable on the corpus, the answers' last tokens (end of
    generation among them) always in."""
    always = sorted({int(s.tokens[-1]) for s in seqs})
    return vocab_subset(seqs, n_vocab, min(size, n_vocab), always)


def subset_positions(subset: np.ndarray, n_vocab: int) -> np.ndarray:
    """[V]: each token's index in the subset, -1 for tokens outside it."""
    index = np.full(n_vocab, -1, np.int64)
    index[subset] = np.arange(len(subset))
    return index


def torch_rms_norm(x, w, eps: float):
    """RMSNorm in torch, as llama.cpp's."""
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def torch_rope(x, pos, base: float):
    """Rotary embedding of x [B, T, H, D] at positions pos [T] (float64), adjacent pairs: ggml's mode for Llama on
    GGUF-ordered q/k rows, as drafts/eagle.rope."""
    import torch

    d = x.shape[-1]
    angles = pos[:, None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = torch.cos(angles).float()[None, :, None], torch.sin(angles).float()[None, :, None]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def replay_chain(head, features, embeddings, real, valid, steps):
    """Training-time test for a one-layer head with its own cache (EAGLE-1 and EAGLE-3): the head's output per
    draft step, each [B, T, E]. Step 1 reads `features` [B, T, E] at every entry; step s reads, where `real`
    [B, T], the output of step s-1 one position back, and its query attends to the real entries up to t-s+1 and
    to the guessed entries of steps 2..s, which sit at t-s+2 .. t: what the head's cache holds when it drafts s
    tokens ahead. head.entry(features, embeddings, pos) -> (z, q, k, v) for entries; head.finish(z, attn) -> the
    output that the next step reads. valid [B, T]: not padding."""
    import torch

    b, t, _ = features.shape
    pos = torch.arange(t, dtype=torch.float64)
    idx = torch.arange(t)
    z, q, k_real, v_real = head.entry(features, embeddings, pos)
    scale = q.shape[-1] ** -0.5

    def real_scores(q, upto):  # attention scores over real entries j <= t - upto: [B, H, T, T]
        keep = (idx[None, :] <= idx[:, None] - upto)[None, None] & valid[:, None, None, :]
        return (torch.einsum("bthd,bnhd->bhtn", q, k_real) * scale).masked_fill(~keep, float("-inf"))

    g = head.finish(z, torch.einsum("bhtn,bnhd->bthd", torch.softmax(real_scores(q, 0), -1), v_real))
    outs, chain = [g], []  # chain: (k, v) of earlier steps' guessed entries, each at its own position
    for s in range(2, steps + 1):
        guess = torch.cat([features[:, :1], g[:, :-1]], dim=1)  # g of step s-1, one position back
        z, q, k, v = head.entry(torch.where(real[..., None], guess, features), embeddings, pos)
        chain.append((k, v))
        # the query at t sees real entries up to t-s+1, then the guessed entries of steps 2..s, which
        # sit at t-s+2 .. t: step u's entry for this chain is u-s places back in its own tensor
        ks = [torch.roll(ku, s - u, dims=1) for u, (ku, _) in enumerate(chain, start=2)]
        vs = [torch.roll(vu, s - u, dims=1) for u, (_, vu) in enumerate(chain, start=2)]
        own = [torch.einsum("bthd,bthd->bht", q, ku)[..., None] * scale for ku in ks]
        attn = torch.softmax(torch.cat([real_scores(q, s - 1), *own], dim=-1), dim=-1)
        out = torch.einsum("bhtn,bnhd->bthd", attn[..., :t], v_real)
        for u, vu in enumerate(vs):
            out = out + attn[..., t + u].transpose(1, 2)[..., None] * vu
        g = head.finish(z, out)
        outs.append(g)
    return outs


def torch_head_base(torch, weights: dict[str, np.ndarray], meta: dict):
    """The base of the one-layer heads' torch modules: their weights as parameters (p, float32), the attention
    shape, and RMSNorm and RoPE as llama.cpp computes them."""
    nn = torch.nn

    class HeadBase(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.ParameterDict({k: nn.Parameter(torch.from_numpy(np.array(v, dtype=np.float32)))
                                       for k, v in weights.items()})
            self.n_head, self.n_head_kv = meta["n_head"], meta["n_head_kv"]
            self.eps, self.base = meta["eps"], meta["rope_base"]

        def norm(self, x, w):
            return torch_rms_norm(x, w, self.eps)

        def rope(self, x, pos):
            return torch_rope(x, pos, self.base)

    return HeadBase


def _torch_head(torch, weights: dict[str, np.ndarray], meta: dict):
    F = torch.nn.functional

    class Head(torch_head_base(torch, weights, meta)):
        def entry(self, features, embeddings, pos):
            """z, q, k, v for entries [B, T] at positions pos [T]."""
            p, (b, t, e) = self.p, features.shape
            d = e // self.n_head
            z = torch.cat([features, embeddings], dim=-1) @ p["fc_weight"].T + p["fc_bias"]
            h = self.norm(z, p["attn_norm"])
            q = self.rope((h @ p["attn_q"].T).view(b, t, self.n_head, d), pos)
            k = self.rope((h @ p["attn_k"].T).view(b, t, self.n_head_kv, d), pos)
            v = (h @ p["attn_v"].T).view(b, t, self.n_head_kv, d)
            return z, q, k.repeat_interleave(self.n_head // self.n_head_kv, 2), \
                v.repeat_interleave(self.n_head // self.n_head_kv, 2)

        def finish(self, z, attn):
            p = self.p
            x = z + attn.flatten(-2) @ p["attn_output"].T
            h = self.norm(x, p["ffn_norm"])
            return self.norm(x + (F.silu(h @ p["ffn_gate"].T) * (h @ p["ffn_up"].T)) @ p["ffn_down"].T, p["out_norm"])

        def forward(self, features, embeddings, real, valid, steps):
            """g per step, each [B, T, E]. Step 1 reads features [B, T, E]; step s reads, where `real` [B, T]
            (positions after the prompt), the g of step s-1 one position back. valid [B, T]: not padding."""
            return replay_chain(self, features, embeddings, real, valid, steps)

    return Head()


def _batch(torch, seqs: list[Sequence], embeddings: np.ndarray, no_feature):
    """Padded tensors for a batch of sequences: features/embeddings [B, T, E] (T = longest len - 1), the masks
    real/valid [B, T], and per entry the row of the target's distribution it must give (-1: none) [B, T]."""
    t = max(len(s.tokens) for s in seqs) - 1
    e = embeddings.shape[1]
    feats = np.zeros((len(seqs), t, e), np.float32)
    embs = np.zeros((len(seqs), t, e), np.float32)
    real = np.zeros((len(seqs), t), bool)
    valid = np.zeros((len(seqs), t), bool)
    rows = np.full((len(seqs), t), -1, np.int64)
    hidden = np.zeros((len(seqs), t, e), np.float32)  # h_{t+1}, what g_t approaches
    for b, s in enumerate(seqs):
        n, first = len(s.tokens) - 1, s.n_prompt - 1  # entries; the first with a real state
        feats[b, first:n] = s.hidden[:n - first]
        real[b, first:n] = True
        valid[b, :n] = True
        embs[b, :n] = embeddings[s.tokens[1:]]
        r = np.arange(n) + 2 - s.n_prompt  # entry t predicts corpus row t + 2 - n_prompt
        ok = (r >= 0) & (r < len(s.lse))
        rows[b, :n][ok] = r[ok]
        hidden[b, :n][ok] = s.hidden[r[ok]]
    feats_t = torch.from_numpy(feats)
    not_real = torch.from_numpy(~real)[..., None]
    feats_t = torch.where(not_real, no_feature.expand_as(feats_t), feats_t)
    return (feats_t, torch.from_numpy(embs), torch.from_numpy(real), torch.from_numpy(valid), rows,
            torch.from_numpy(hidden))


def _targets(torch, seqs: list[Sequence], rows: np.ndarray, subset_index: np.ndarray):
    """For entries with a row: subset ids [N, K] (-1 where the token is outside the subset), probabilities
    [N, K], and the target's top-1 as a subset id (-1 outside) [N]."""
    b_idx, t_idx = np.nonzero(rows >= 0)
    ids = np.stack([seqs[b].topk_ids[rows[b, t]] for b, t in zip(b_idx, t_idx, strict=True)])
    probs = np.stack([np.exp(seqs[b].topk_logits[rows[b, t]] - seqs[b].lse[rows[b, t]])
                      for b, t in zip(b_idx, t_idx, strict=True)])
    sub = subset_index[ids]
    return b_idx, t_idx, torch.from_numpy(sub), torch.from_numpy(probs.astype(np.float32)), sub[:, 0]


def train_eagle(seqs: list[Sequence], embeddings: np.ndarray, weights: dict[str, np.ndarray], meta: dict, *,
                subset: np.ndarray, steps: int = 3, epochs: int = 4, lr: float = 1e-3, batch: int = 2,
                feature_weight: float = 0.1, holdout: float = 0.1, seed: int = 0, progress: bool = True,
                kind: str = "eagle", make_head=None, make_batch=None):
    """Trained weights (float32) and a report with held-out top-1 agreement per draft step.

    EAGLE-1 (GGUF layout): weights are the starting layer (layer_weights) plus fc_weight/fc_bias/no_feature, the
    head reads the target's final states and approaches the next one (feature_weight). Another kind of head
    (train/eagle3.py) brings make_head(torch, output) -> a module with .p (its parameters), forward as replay_chain's
    and logits(outputs), and make_batch(torch, sequences) -> (features, embeddings, real, valid, rows); kind names
    it in the report. embeddings: the target's [V, E] (tied output layer), frozen; subset: the output token ids.
    """
    from edgespec.train.draft_model import start_head_training

    torch, rng, held, train_seqs = start_head_training(seqs, seed, holdout)
    subset_index = subset_positions(subset, embeddings.shape[0])
    output = torch.from_numpy(np.ascontiguousarray(embeddings[subset]))  # [S, E], frozen
    head = make_head(torch, output) if make_head else _torch_head(torch, weights, meta)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)

    def run(group):
        if make_batch:
            feats, embs, real, valid, rows = make_batch(torch, group)
            hidden = None
        else:
            feats, embs, real, valid, rows, hidden = _batch(torch, group, embeddings, head.p["no_feature"])
        outs = head(feats, embs, real, valid, steps)
        b_idx, t_idx, ids, probs, top1 = _targets(torch, group, rows, subset_index)
        n_prompt = np.array([s.n_prompt for s in group])[b_idx]
        losses, agree = [], []
        for s, g in enumerate(outs, start=1):
            ok = t_idx >= n_prompt - 3 + s  # the chain's last committed entry is at least the prompt's last
            gs = g[b_idx[ok], t_idx[ok]]  # [N, E]
            logq = torch.log_softmax(head.logits(gs) if make_head else gs @ output.T, dim=-1)  # [N, S]
            inside = ids[ok] >= 0
            ce = -(probs[ok] * torch.where(inside, logq.gather(1, ids[ok].clamp(min=0)), 0)).sum(1).mean()
            reg = 0 if hidden is None else torch.nn.functional.smooth_l1_loss(gs, hidden[b_idx[ok], t_idx[ok]])
            losses.append(ce + feature_weight * reg)
            agree.append((logq.argmax(1).numpy() == top1[ok]).astype(float))
        return sum(losses) / len(losses), agree

    def evaluate():
        hits = [[] for _ in range(steps)]
        with torch.no_grad():
            for start in range(0, len(held), batch):
                _, agree = run(held[start:start + batch])
                for s in range(steps):
                    hits[s].append(agree[s])
        return [round(float(np.concatenate(h).mean()), 4) for h in hits]

    report = {"kind": kind, "steps": steps, "subset": len(subset), "train_sequences": len(train_seqs),
              "held_out_sequences": len(held), "initial_agreement": evaluate(), "epochs": []}
    say(progress, f"{'EAGLE-3' if kind == 'eagle3' else 'EAGLE'} head; held-out top-1 agreement per draft step "
                   "before training: "
                   f"{report['initial_agreement']}")
    by_length = sorted(range(len(train_seqs)), key=lambda i: len(train_seqs[i].tokens))  # little padding
    batches = [by_length[i:i + batch] for i in range(0, len(by_length), batch)]
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(batches))
    for epoch in range(epochs):
        t0, losses = time.perf_counter(), []
        for n, b in enumerate(rng.permutation(len(batches))):
            loss, _ = run([train_seqs[i] for i in batches[b]])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            if progress and n % 20 == 0:
                say(progress, f"  epoch {epoch + 1} batch {n}/{len(batches)} loss {np.mean(losses[-20:]):.3f}")
        entry = {"epoch": epoch + 1, "loss": round(float(np.mean(losses)), 4), "held_out_agreement": evaluate(),
                 "seconds": round(time.perf_counter() - t0, 1)}
        report["epochs"].append(entry)
        say(progress, f"epoch {epoch + 1}/{epochs}: loss {entry['loss']:.3f}, held-out agreement per step "
                       f"{entry['held_out_agreement']} ({entry['seconds']:.0f} s)")
    trained = {k: v.detach().numpy().copy() for k, v in head.p.items()}
    return trained, report


def initial_weights(target: str | os.PathLike, layer: int = -1) -> tuple[dict[str, np.ndarray], dict]:
    """A head to start training from: the target's layer, fc = [I, I] (state + embedding), no_feature = 0."""
    weights, meta = layer_weights(target, layer)
    n_embd = weights["attn_norm"].shape[0]
    eye = np.eye(n_embd, dtype=np.float32)
    weights.update(fc_weight=np.concatenate([eye, eye], axis=1), fc_bias=np.zeros(n_embd, np.float32),
                   no_feature=np.zeros(n_embd, np.float32))
    return weights, meta


def fit_eagle(target: str | os.PathLike, seqs: list[Sequence], out: str | os.PathLike, meta: dict, *,
              subset_size: int = SUBSET_SIZE, layer: int = -1, **train_kwargs) -> dict:
    """Vocabulary subset, start from the target's layer, train, write the .eagle.npz; the training report.

    meta: what the file must record about the target (vocab_digest, n_embd); train_kwargs go to train_eagle.
    """
    from edgespec.drafts.eagle import save_eagle
    from edgespec.drafts.heads import output_matrix

    embeddings = output_matrix(target)
    weights, shape = initial_weights(target, layer)
    subset = answer_subset(seqs, embeddings.shape[0], subset_size)
    trained, report = train_eagle(seqs, embeddings, weights, shape, subset=subset, **train_kwargs)
    save_eagle(out, trained, subset, {**meta, **shape, "training": report})
    return report
