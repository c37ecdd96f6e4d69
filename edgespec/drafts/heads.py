"""Medusa heads: drafts read off the target's own hidden state, no second model.

Head i (1-based) is a residual block over the target's final hidden state h at the position that
predicted the last committed token: h_i = h + SiLU(W_i h + b_i), and the target's output layer turns
h_i into a distribution over the token i places further on (Cai et al. 2024, Medusa-1). All heads run
at once from one state, so a draft of k tokens costs one [k, E] x [E, V] product, not k model steps.
The heads ignore each other's samples, which the rule allows: each drafted token comes with the
distribution it was drawn from, and verification stays exact.

The state comes from the loop: after each verify pass it hands the drafter the target's hidden row
that produced the committed token (`observe_target`). Before the first pass there is none, and the
first round drafts nothing. A heads file is .npz: weight [H, E, E], bias [H, E], a JSON `meta` with
the target's vocabulary digest and width, checked at load, and (files trained since) `subset`: the token
ids the heads draft from, as an EAGLE head's. The heads' laws then cover those rows of the output layer
only (8192 of SmolLM2's 49,152: a sixth of the product, which read the full layer at 0.6-0.9 of an f32
target step), and put no mass elsewhere; the rule stays exact for any draft law. Files without a subset
draft over the whole vocabulary.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from edgespec.drafts.base import Drafter
from edgespec.errors import EdgespecError

HEADS_SUFFIX = ".medusa.npz"


def output_matrix(gguf_path: str | os.PathLike, quantized_as: type = np.float32) -> np.ndarray:
    """The target's output layer [V, E] from its GGUF (tied embeddings: token_embd), or from an ONNX export folder
    (backends/onnx/weights.output_matrix). Rows the file stores as
    float32 or f16 come back as a view of the file (no copy); quantized rows are dequantized a block of rows
    at a time into a `quantized_as` array. The tensor is found from the streamed header: GGUFReader builds
    the whole vocabulary first, which here took the EAGLE drafter's load from a 76 MB to a 180 MB peak."""
    from edgespec.backends import gguf_file
    from edgespec.backends.model_info import read_gguf_header

    if Path(gguf_path).is_dir():
        from edgespec.backends.onnx.weights import output_matrix as onnx_output_matrix

        return onnx_output_matrix(Path(gguf_path))
    _, tensors = read_gguf_header(Path(gguf_path))
    tensors = {t.name: t for t in tensors if t.name in ("output.weight", "token_embd.weight")}
    tensor = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if tensor is None:
        raise EdgespecError(f"{gguf_path} has no output layer to share with draft heads")
    rows, n_embd = tensor.shape
    block, type_size = gguf_file.block_size(tensor.type)
    row_bytes = n_embd // block * type_size
    data = np.memmap(gguf_path, dtype=np.uint8, mode="r", offset=tensor.offset, shape=(rows, row_bytes))
    if gguf_file.is_float(tensor.type):
        return data.view(np.float32 if tensor.type.upper() == "F32" else np.float16)
    out = np.empty((rows, n_embd), dtype=quantized_as)
    for start in range(0, rows, 4096):
        out[start:start + 4096] = gguf_file.dequantize(data[start:start + 4096], tensor.type).reshape(-1, n_embd)
    return out


def check_heads_target(path, meta: dict, target, reader: str) -> None:
    """Heads read the target's hidden states and were trained for one vocabulary and width: refuse a target that
    returns no hidden states or is another model. reader: who reads them, for the message."""
    if not target.hidden:
        raise EdgespecError(f"{reader} the target's hidden states: open the target with hidden=True "
                            "(edgespec.load does this for a heads draft)")
    if meta.get("vocab_digest") != target.vocab.digest or meta.get("n_embd") != target.n_embd:
        raise EdgespecError(f"{path} was trained for another target (vocabulary {meta.get('vocab_digest')}, "
                            f"width {meta.get('n_embd')}); this one has {target.vocab.digest}, {target.n_embd}")


def one_blas_thread() -> None:
    """Limit numpy's BLAS to one thread for the rest of the process. Heads draft with small numpy products
    that gain nothing from threads, and OpenBLAS's idle threads spin on the cores that llama.cpp's threads
    need: measured here, a 2-token verify pass of the f32 target took 114 ms instead of 27 beside them."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def save_heads(path: str | os.PathLike, weight: np.ndarray, bias: np.ndarray, meta: dict,
               subset: np.ndarray | None = None) -> Path:
    """Write a heads file (f16 weights) through a temporary name; subset: the token ids the heads draft from."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.partial.npz")
    extra = {} if subset is None else {"subset": np.asarray(subset, dtype=np.int32)}
    np.savez(tmp, weight=weight.astype(np.float16), bias=bias.astype(np.float16),
             meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **extra)
    os.replace(tmp, path)
    return path


def load_heads(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray, dict, np.ndarray | None]:
    """weight [H, E, E], bias [H, E] (float32), meta, and the subset of token ids (None: the whole vocabulary)."""
    path = Path(path)
    if not path.is_file():
        raise EdgespecError(f"heads file not found: {path}")
    try:
        z = np.load(path)
        weight, bias = z["weight"].astype(np.float32), z["bias"].astype(np.float32)
        meta = json.loads(bytes(z["meta"]).decode())
        subset = z["subset"].astype(np.int64) if "subset" in z.files else None
    except (OSError, ValueError, KeyError) as e:
        raise EdgespecError(f"{path} is not a heads file written by edgespec train-heads ({e})") from None
    if weight.ndim != 3 or weight.shape[1:] != (weight.shape[1], weight.shape[1]) or bias.shape != weight.shape[:2]:
        raise EdgespecError(f"{path} has heads of inconsistent shapes {weight.shape} / {bias.shape}")
    if subset is not None and (subset.ndim != 1 or not len(subset) or subset.min() < 0
                               or np.any(np.diff(subset) <= 0)):
        raise EdgespecError(f"{path} has a malformed token subset (shape {subset.shape})")
    return weight, bias, meta, subset


def medusa_bytes(path: str | os.PathLike, n_vocab: int, n_embd: int) -> int:
    """What Medusa heads hold beside the target (memory planner): their float32 weights and a float32 copy
    of the output layer's rows they draft from (the subset's, or all n_vocab)."""
    weight, bias, _, subset = load_heads(path)
    rows = n_vocab if subset is None else len(subset)
    return 4 * (weight.size + bias.size + rows * n_embd)


def medusa_states(hidden: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The heads' states [H, E] from one target state [E]: h + SiLU(W_i h + b_i)."""
    pre = weight @ hidden + bias  # [H, E]
    return hidden + pre / (1.0 + np.exp(-pre))


class MedusaDrafter(Drafter):
    """Drafts up to n_heads tokens from the target's last hidden state; see the module docstring."""

    def __init__(self, path: str | os.PathLike, target, output: np.ndarray | None = None):
        """output: the target's output layer [V, E]; default: read from the target's GGUF or ONNX export."""
        self.weight, self.bias, self.meta, self.subset = load_heads(path)
        check_heads_target(path, self.meta, target, "Medusa heads read")
        output = output_matrix(target.path) if output is None else output  # [V, E]
        self.n_vocab = output.shape[0]
        if self.subset is not None and self.subset[-1] >= self.n_vocab:
            raise EdgespecError(f"{path} drafts token ids up to {self.subset[-1]}; the target has {self.n_vocab}")
        # [S, E] float32: the subset's rows gathered once (a view of an f32 file where there is no subset)
        self.output = np.ascontiguousarray(output if self.subset is None else output[self.subset], dtype=np.float32)
        one_blas_thread()
        self.n_heads = self.weight.shape[0]
        self.name = f"medusa:{Path(path).name}"
        self.feature: np.ndarray | None = None  # [E]: the target's state that produced the last token

    def observe_target(self, target, n_accepted: int, position: int) -> None:
        """After a verify pass (first row at `position`): keep the hidden row that sampled the committed token."""
        rows = target.last_hidden
        self.feature = None if rows is None else rows[n_accepted].astype(np.float32)

    def reset(self) -> None:
        self.feature = None

    def measure_cost(self, reps: int = 5) -> float:
        """Seconds per drafted token when all heads draft (the median of reps), for the controller's prior."""
        import time

        from edgespec.decode.sampling import SamplingParams

        saved, self.feature = self.feature, np.ones(self.weight.shape[1], dtype=np.float32)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            self.propose([], self.n_heads, SamplingParams(), np.random.default_rng(0))
            times.append(time.perf_counter() - t)
        self.feature = saved
        return sorted(times)[reps // 2] / self.n_heads

    def _logits(self, k: int) -> np.ndarray | None:
        """The first k heads' logits [k, S] from the target's last state (None: nothing to draft from)."""
        if k == 0 or self.feature is None:
            return None
        return medusa_states(self.feature, self.weight[:k], self.bias[:k]) @ self.output.T

    def propose_tree(self, context, shape, params, rng):
        """The tree `shape` plans (drafts.grow_tree), at most as deep as the heads. Head i reads only the target's
        state, so every node at depth i draws its children from the same law, and any node may have children."""
        from edgespec.drafts.base import DraftTree, grow_tree

        k = min(shape.depth, self.n_heads)
        logits = self._logits(k)
        if logits is None:
            return DraftTree([], [], np.zeros((1, self.n_vocab)))
        return grow_tree(shape, lambda path: logits[len(path)] if len(path) < k else None, params, rng,
                         self.n_vocab, ids=self.subset)

    gated = True  # knows how sure it is: the loop may end its chain by confidence (gate.DraftGate)
    trees = True  # proposes trees too (propose_tree)
    branching = True  # any node's children: a depth's law does not depend on the tokens above it

    def propose(self, context, k, params, rng, gate=None):
        """A chain of k tokens (drafts.chain_with_siblings one wide; row i of its laws is token i's)."""
        from edgespec.drafts.base import chain_with_siblings

        k = min(k, self.n_heads)
        logits = self._logits(k)
        if logits is None:
            return [], np.zeros((0, self.n_vocab))
        tree = chain_with_siblings(logits[0], lambda token, i: logits[i + 1], k, 1, params, rng, self.n_vocab,
                                   ids=self.subset, gate=gate)
        return tree.tokens, tree.probs[:len(tree.tokens)]
