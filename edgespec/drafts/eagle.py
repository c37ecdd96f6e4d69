"""EAGLE head: a one-layer draft that reads the target's hidden states (Li et al. 2024, EAGLE-1).

The head keeps a sequence of its own, one entry per position t of the text: entry t joins the
target's final hidden state h_t (the state that produced token t+1) with the embedding of token t+1,
z_t = fc([h_t; e(x_{t+1})]), and one Llama decoder layer (causal attention over earlier entries, with
its own KV cache) and the target's final norm turn it into g_t, a guess at h_{t+1}. The target's
output layer reads g_t as a distribution over token t+2. Drafting goes on from its own guesses:
entry t+1 is (g_t, the drafted token), and so on; the guesses are dropped when the target has spoken.

Positions where the target's state is unknown (the prompt, except its last token: a prefill returns no
hidden rows) use a learned `no_feature` vector, at training and at run time alike, so the head still
reads the prompt's tokens. The head's output covers a subset of the vocabulary (the tokens the target
actually emits, from the training corpus): every other token gets draft probability 0, which the
rejection rule handles like any other draft distribution, so verification stays exact; it makes a draft
step cost ~1/6 of a full-vocabulary one.

A heads file is .eagle.npz: the layer's weights (f16), `subset` (token ids), and a JSON `meta` with the
target's vocabulary digest, width and attention shape. Layer weights follow GGUF's layout, and RoPE
rotates adjacent pairs as ggml does for Llama, so the head can start from one of the target's layers.

Two runners compute the same head: NumpyHead (float32, the reference the training graph is tested against)
and GgmlHead, which drafts: at load the layer, final norm and output rows become a one-layer Llama GGUF
(f16 weights by default) that llama.cpp runs with vectors as input, and only fc stays in numpy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.drafts.base import Drafter
from edgespec.errors import EdgespecError

EAGLE_SUFFIX = ".eagle.npz"
LAYER_WEIGHTS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down")  # GGUF names of one Llama block's tensors; out_norm is the target's output_norm
WEIGHTS = ("fc_weight", "fc_bias", "no_feature", *LAYER_WEIGHTS, "out_norm")
MAX_ENTRIES = 4096  # the head's cache; a longer text keeps its most recent entries


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Rotary embedding of x [T, H, D] at positions [T], adjacent pairs (ggml's mode for Llama)."""
    d = x.shape[-1]
    angles = positions[:, None] * base ** (-np.arange(0, d, 2) / d)  # [T, D/2]
    cos, sin = np.cos(angles)[:, None, :].astype(x.dtype), np.sin(angles)[:, None, :].astype(x.dtype)  # float32
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


class EagleHead:
    """The head's weights and its KV cache; `step` appends entries and returns their outputs g."""

    def __init__(self, weights: dict[str, np.ndarray], meta: dict):
        self.w = weights
        self.n_head, self.n_head_kv = meta["n_head"], meta["n_head_kv"]
        self.rope_base, self.eps = meta["rope_base"], meta["eps"]
        n_embd = weights["attn_norm"].shape[0]
        self.head_dim = n_embd // self.n_head
        shape = (MAX_ENTRIES, self.n_head_kv, self.head_dim)
        self.keys, self.values = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        self.n = 0  # entries in the cache
        self.positions = np.zeros(MAX_ENTRIES, np.int64)

    def truncate(self, n: int) -> None:
        self.n = min(self.n, n)

    def step(self, features: np.ndarray, embeddings: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Append entries for features [T, E] + next-token embeddings [T, E] at positions [T]; g [T, E]."""
        w, t = self.w, len(features)
        if self.n + t > MAX_ENTRIES:  # keep the most recent half: older text matters least to a draft
            keep = MAX_ENTRIES // 2
            for a in (self.keys, self.values, self.positions):
                a[:keep] = a[self.n - keep:self.n]
            self.n = keep
        x = np.concatenate([features, embeddings], axis=1) @ w["fc_weight"].T + w["fc_bias"]  # [T, E]
        h = rms_norm(x, w["attn_norm"], self.eps)
        q = rope((h @ w["attn_q"].T).reshape(t, self.n_head, self.head_dim), positions, self.rope_base)
        k = rope((h @ w["attn_k"].T).reshape(t, self.n_head_kv, self.head_dim), positions, self.rope_base)
        self.keys[self.n:self.n + t] = k
        self.values[self.n:self.n + t] = (h @ w["attn_v"].T).reshape(t, self.n_head_kv, self.head_dim)
        self.positions[self.n:self.n + t] = positions
        self.n += t
        keys, values = self.keys[:self.n], self.values[:self.n]  # [N, Hkv, D]
        group = self.n_head // self.n_head_kv
        q = q.reshape(t, self.n_head_kv, group, self.head_dim)
        scores = np.einsum("tkgd,nkd->kgtn", q, keys) * self.head_dim ** -0.5  # [Hkv, G, T, N], float32
        causal = np.arange(self.n)[None, :] > (self.n - t + np.arange(t))[:, None]  # [T, N]: later entries
        scores[..., causal] = -np.inf
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("kgtn,nkd->tkgd", scores, values).reshape(t, -1)  # [T, E]
        x = x + attn @ w["attn_output"].T
        h = rms_norm(x, w["ffn_norm"], self.eps)
        gate = h @ w["ffn_gate"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * (h @ w["ffn_up"].T)) @ w["ffn_down"].T
        return rms_norm(x, w["out_norm"], self.eps)  # normed like the target's states, which g stands in for


class NumpyHead:
    """EagleHead with the output layer: the reference runner (float32 numpy), also what the tests compare to."""

    def __init__(self, weights: dict[str, np.ndarray], meta: dict, output: np.ndarray):
        self.w, self.layer, self.output = weights, EagleHead(weights, meta), output  # output: [S, E]

    @property
    def n(self) -> int:
        return self.layer.n

    def truncate(self, n: int) -> None:
        self.layer.truncate(n)

    def append(self, features: np.ndarray, embeddings: np.ndarray, positions: np.ndarray):
        """Entries for features/embeddings [T, E] at positions [T]: the last one's g [E] and logits [S]."""
        g = self.layer.step(features, embeddings, positions)[-1]
        return g, self.output @ g


class GgmlHead:
    """The same head in llama.cpp: fc runs in numpy, the decoder layer, final norm and output rows run as a
    one-layer Llama fed vectors (LlamaVectorModel), with weights in `weight_type`. In the loop this is what
    keeps a draft step cheap: numpy reads the head's 36 MB of float32 weights and output rows every step (the
    target's pass has evicted them from the caches), llama.cpp reads 17 MB in f16 (9 MB in q8_0) with the
    target's threads. The rows sit at positions 0, 1, ... (entry t at position t), as the drafter appends them."""

    def __init__(self, weights: dict[str, np.ndarray], meta: dict, output: np.ndarray, *, n_ctx: int,
                 n_threads: int | None, weight_type: str):
        import tempfile

        from edgespec.backends.llama.vectors import LlamaVectorModel

        self.fc_weight, self.fc_bias = weights["fc_weight"], weights["fc_bias"]
        with tempfile.TemporaryDirectory(prefix="edgespec-eagle-") as tmp:
            path = write_head_gguf(Path(tmp) / "head.gguf", weights, meta, output, weight_type=weight_type,
                                   n_ctx=n_ctx)
            self.model = LlamaVectorModel(path, n_ctx=n_ctx, n_threads=n_threads, n_ubatch=HEAD_UBATCH)  # read in

    @property
    def n(self) -> int:
        return self.model.n

    def truncate(self, n: int) -> None:
        self.model.truncate(n)

    def append(self, features: np.ndarray, embeddings: np.ndarray, positions: np.ndarray):
        if positions[0] != self.model.n:
            raise EdgespecError(f"head entries must follow each other: got position {positions[0]} after "
                                f"{self.model.n} entries")
        z = np.concatenate([features, embeddings], axis=1) @ self.fc_weight.T + self.fc_bias
        logits, hidden = self.model.forward(z, 1)
        return hidden[0], logits[0]


WEIGHT_TYPES = ("f16", "q8_0", "f32")  # the head's matrices in llama.cpp; norms stay float32


def write_head_gguf(path: Path, weights: dict[str, np.ndarray], meta: dict, output: np.ndarray, *,
                    weight_type: str, n_ctx: int) -> Path:
    """The head's decoder layer, final norm and output rows [S, E] as a one-layer Llama GGUF (the output
    tied to token_embd, which the head never reads: its inputs are vectors). Its vocabulary is S
    placeholder tokens, one per output row."""
    from edgespec.backends import gguf_file

    if weight_type not in WEIGHT_TYPES:
        raise EdgespecError(f"unknown head weight type {weight_type!r}: choose one of {', '.join(WEIGHT_TYPES)}")
    n_embd, n_rows = weights["attn_norm"].shape[0], len(output)
    writer = gguf_file.new_writer(path, "llama")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(1)
    writer.add_feed_forward_length(weights["ffn_gate"].shape[0])
    writer.add_head_count(meta["n_head"])
    writer.add_head_count_kv(meta["n_head_kv"])
    writer.add_rope_freq_base(meta["rope_base"])
    writer.add_rope_dimension_count(n_embd // meta["n_head"])
    writer.add_layer_norm_rms_eps(meta["eps"])
    gguf_file.add_placeholder_vocab(writer, n_rows)
    gguf_file.add_weights(writer, "token_embd.weight", output, weight_type)
    gguf_file.add_weights(writer, "output_norm.weight", weights["out_norm"], weight_type)
    for name in LAYER_WEIGHTS:
        gguf_file.add_weights(writer, f"blk.0.{name}.weight", weights[name], weight_type)
    gguf_file.write(writer)
    return path


def save_eagle(path: str | os.PathLike, weights: dict[str, np.ndarray], subset: np.ndarray, meta: dict) -> Path:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial.npz")
    np.savez(tmp, subset=subset.astype(np.int32), meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
             **{name: weights[name].astype(np.float16) for name in WEIGHTS})
    os.replace(tmp, path)
    return path


def load_eagle(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], np.ndarray, dict]:
    path = Path(path)
    if not path.is_file():
        raise EdgespecError(f"EAGLE head file not found: {path}")
    try:
        z = np.load(path)
        weights = {name: z[name].astype(np.float32) for name in WEIGHTS}
        subset, meta = z["subset"].astype(np.int64), json.loads(bytes(z["meta"]).decode())
        n_embd = weights["attn_norm"].shape[0]
        if weights["fc_weight"].shape != (n_embd, 2 * n_embd) or n_embd % meta["n_head"] or subset.ndim != 1:
            raise ValueError(f"fc weight {weights['fc_weight'].shape} for width {n_embd}, {meta['n_head']} heads")
    except (OSError, ValueError, KeyError) as e:
        raise EdgespecError(f"{path} is not an EAGLE head written by edgespec train-heads ({e})") from None
    return weights, subset, meta


HEAD_UBATCH = 32  # rows per llama.cpp pass of the head (LlamaVectorModel's default)


def eagle_bytes(path: str | os.PathLike, n_vocab: int, n_ctx: int, *, rows_quantized: bool = True,
                weight_type: str = "f16") -> int:
    """What an EAGLE drafter (the ggml runner) adds to a process at its peak, for a target context of n_ctx, read
    from the file's headers (the memory planner's figure). Held: the target's embeddings [V, E] in f16 when
    its rows are quantized (rows_quantized; else a view of the target's file, of which the subset's rows are
    read), fc in float32, and in llama.cpp the layer and output rows in weight_type, a float32 KV cache and
    attention scores [n_ctx, HEAD_UBATCH, n_head]. At load, for a moment: the head's weights and output rows
    in float32 and the GGUF written from them."""
    from edgespec.backends import gguf_file

    with np.load(path) as z:
        shapes = {name: z[name].shape for name in ("subset", "meta", *WEIGHTS)}  # npz members load one at a time
        meta = json.loads(bytes(z["meta"]).decode())
    n_embd, n_subset, n_rows = shapes["attn_norm"][0], shapes["subset"][0], n_ctx + MAX_OUTPUTS
    block, size = gguf_file.block_size(weight_type)
    matrices = sum(int(np.prod(shapes[name])) for name in LAYER_WEIGHTS if len(shapes[name]) == 2)
    matrices += n_subset * n_embd
    every_weight = sum(int(np.prod(shapes[name])) for name in WEIGHTS)
    embeddings = 2 * n_vocab * n_embd if rows_quantized else 4 * n_subset * n_embd
    numpy_side = sum(int(np.prod(shapes[name])) for name in ("fc_weight", "fc_bias", "no_feature"))
    held = embeddings + 4 * numpy_side + matrices * size // block + 4 * n_rows * (
        2 * shapes["attn_k"][0] + HEAD_UBATCH * meta["n_head"])
    loading = 4 * (every_weight + n_subset * n_embd) + 2 * matrices
    return held + loading


class EagleDrafter(Drafter):
    """Drafts a chain from the EAGLE head; see the module docstring.

    runner: "ggml" (llama.cpp, weights in `weight_type`: the fast one) or "numpy" (float32, the reference)."""

    def __init__(self, path: str | os.PathLike, target, embeddings: np.ndarray | None = None, *,
                 runner: str = "ggml", weight_type: str = "f16", n_threads: int | None = None):
        """embeddings: the target's token embeddings [V, E] (tied to its output layer); default: from its GGUF."""
        from edgespec.drafts.heads import check_heads_target, one_blas_thread, output_matrix

        if runner not in ("ggml", "numpy"):
            raise EdgespecError(f"unknown EAGLE runner {runner!r}: choose ggml or numpy")
        weights, self.subset, self.meta = load_eagle(path)
        check_heads_target(path, self.meta, target, "an EAGLE head reads")
        # [V, E]: f16 where the target's rows are quantized (half the memory; rows are read one at a time)
        self.embeddings = output_matrix(target.path, np.float16) if embeddings is None else embeddings
        output = np.ascontiguousarray(self.embeddings[self.subset], dtype=np.float32)  # [S, E]
        self.n_vocab = self.embeddings.shape[0]
        if runner == "ggml":  # entries at positions 0 .. n_ctx-1, and a chain drafted past the last
            self.head = GgmlHead(weights, self.meta, output, n_ctx=target.n_ctx + MAX_OUTPUTS,
                                 n_threads=n_threads or target.n_threads, weight_type=weight_type)
        else:
            self.head = NumpyHead(weights, self.meta, output)
        one_blas_thread()
        self.no_feature = weights["no_feature"]
        self.name = f"eagle:{Path(path).name}"
        self.reset()

    def reset(self) -> None:
        self.head.truncate(0)
        self.context: list[int] = []  # the committed tokens the head's cache has entries for (all but the last)
        self.features: dict[int, np.ndarray] = {}  # position -> the target's hidden state there, not yet read
        self.last: tuple[np.ndarray, np.ndarray] | None = None  # g [E] and logits [S] of the newest committed entry

    def observe_target(self, target, n_accepted: int, position: int) -> None:
        """After a verify pass whose first row sat at `position`: keep the rows for the committed tokens."""
        rows = target.last_hidden
        if rows is not None:
            for i in range(n_accepted + 1):
                self.features[position + i] = rows[i]

    def _commit(self, context: list[int]) -> None:
        """Entries for positions len(self.context)-1 .. len(context)-2 (each pairs a state with the next token)."""
        if context[:len(self.context)] != self.context:  # another text: start over
            self.head.truncate(0)
            self.context, self.last = [], None
        first, last = max(len(self.context) - 1, 0), len(context) - 1  # the new entries' positions, last exclusive
        if first < last:
            positions = np.arange(first, last)
            features = np.stack([self.features.pop(int(p), self.no_feature) for p in positions]).astype(np.float32)
            self.last = self.head.append(features, self._embed(context[first + 1:last + 1]), positions)
        self.context = list(context)
        self.features = {p: f for p, f in self.features.items() if p >= last}

    def _embed(self, tokens) -> np.ndarray:
        return self.embeddings[tokens].astype(np.float32)  # [T, E]

    def catch_up(self, context: list[int]) -> None:
        """Entries for all of `context` but its last token (the loop's catch_up, untimed for the controller):
        proposing then costs one entry plus k steps, however long the loop went without drafting."""
        if len(context) > 2:
            self._commit(context[:-1])

    gated = True  # knows how sure it is: the loop may end its chain by confidence (gate.DraftGate)
    trees = True  # proposes trees too (propose_tree), whose guesses past the first at a node are leaves

    def propose(self, context, k, params, rng, gate=None):
        """A chain of k tokens (drafts.chain_with_siblings one wide; row i of its laws is token i's)."""
        from edgespec.drafts.base import chain_with_siblings

        if k == 0 or len(context) < 2:
            return [], np.zeros((0, self.n_vocab))
        tree = self._stepping(context, lambda step: chain_with_siblings(
            self.last[1], lambda token, i: step(token, i + 1), k, 1, params, rng, self.n_vocab, ids=self.subset,
            gate=gate))
        return tree.tokens, tree.probs[:len(tree.tokens)]

    def propose_tree(self, context, shape, params, rng):
        """The tree `shape` plans (drafts.grow_tree): the head steps along its first guesses, once per depth as for
        a chain; the other guesses are leaves (branching False), so only the verify pass grows."""
        from edgespec.drafts.base import DraftTree, grow_tree

        if shape.size == 0 or len(context) < 2:
            return DraftTree([], [], np.zeros((1, self.n_vocab)))
        return self._stepping(context, lambda step: grow_tree(
            shape, lambda path: step(path[-1], len(path)) if path else self.last[1], params, rng, self.n_vocab,
            ids=self.subset))

    def _stepping(self, context, draft):
        """draft(step) with the head caught up on `context`; step(token, depth): the head's logits at that depth
        once `token` is the draft at the depth before it, read in order of depth. The head's cache is left as the
        context left it."""
        self._commit(context)
        n_committed = self.head.n
        state = {"g": self.last[0]}

        def step(token, depth):
            state["g"], logits = self.head.append(state["g"][None, :], self._embed([token]),
                                                  np.array([len(context) - 2 + depth]))
            return logits

        try:
            return draft(step)
        finally:
            self.head.truncate(n_committed)

    def measure_cost(self, reps: int = 5, k: int = 4) -> float:
        """Seconds per drafted token in a k-token chain (the median of reps), for the controller's prior."""
        from edgespec.drafts.base import head_chain_cost

        return head_chain_cost(self, [int(t) for t in self.subset[:16]], reps, k)
