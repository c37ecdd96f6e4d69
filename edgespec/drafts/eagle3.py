"""EAGLE-3 heads in llama.cpp's own format (GGUF architecture `eagle3`), drafting inside llama.cpp beside the
target's context, their whole distributions under edgespec's rejection rule.

An EAGLE-3 head (Li et al. 2025) reads three of the target's layers. After every target pass the inputs of those
layers for each row (llama-ext's layer-input extraction, backends/llama/ext.py) are joined, 3 x the target's width,
and the head's encoder (`fc`) turns each into one row g[P]. Its decoder, one Llama layer, takes at position P the
pair (token P + 1, g[P]) and its logits there are the law of token P + 2. Drafting goes on from its own state: the
next entry pairs the drafted token with the pre-norm output of the entry before. This is what llama-server's
`--spec-type draft-eagle3` does (common/speculative.cpp); docs/llama-drafts.md says it step by step.

What differs from llama-server: the head's row is a law, not a top-1 guess. With a `d2t` map the head speaks a
subset of the target's ids and llama.cpp scatters its logits into the target's vocabulary with -inf elsewhere; the
drafter keeps the subset's logits (`ids`), a draft with mass 0 outside them, which the rejection rule judges like
any other draft: the output is the target's law at every temperature. The controller chooses how far to draft and
ends a chain where the head is unsure (gated).

The head's cache holds entries for the committed text; a proposal's steps are removed after it. Where a position's
target rows were never computed here (a prompt restored from a saved state), its g row is zeros: drafts there are
worse, never wrong. One stream: the target feeds one drafter (LlamaBackend.on_pass).

What a drafting round costs besides its steps, and the controller does not price yet: an encoder call over the
target's rows since the last round, and two decoder calls for the entries committed since (the last alone, see
_entries).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgespec.backends.llama.ext import DECODE, ENCODE, ExtBatch, LayerInputs, ext, nextn_rows, target_layer_ids
from edgespec.backends.llama.lib import check_gguf_file
from edgespec.backends.llama.lib import lib as _lib
from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.drafts.base import Drafter, chain_with_siblings, head_chain_cost
from edgespec.errors import EdgespecError

PENDING = 64  # target rows kept for the encoder before it runs without a draft asking


def head_ids(path: str | os.PathLike, n_vocab: int) -> np.ndarray | None:
    """The target ids an EAGLE-3 GGUF drafts (its d2t map, converted to absolute ids), None where it drafts the
    whole vocabulary."""
    from gguf import GGUFReader

    tensor = next((t for t in GGUFReader(str(path)).tensors if t.name == "d2t"), None)
    if tensor is None:
        return None
    ids = np.asarray(tensor.data, dtype=np.int64).reshape(-1)
    if ids.size == 0 or ids.min() < 0 or ids.max() >= n_vocab or np.unique(ids).size != ids.size:
        raise EdgespecError(f"{Path(path).name}: its d2t map is not a set of distinct ids under {n_vocab}")
    return ids


class Eagle3Drafter(Drafter):
    """Drafts chains from an EAGLE-3 GGUF against a LlamaBackend target (one stream)."""

    gated = True

    def __init__(self, path: str | os.PathLike, target, *, n_threads: int | None = None):
        path = check_gguf_file(path)
        if not hasattr(target, "on_pass"):
            raise EdgespecError(f"an EAGLE-3 head reads the target's layers inside llama.cpp: {target.name} is not "
                                "a GGUF target")
        if target.on_pass is not None:
            raise EdgespecError(f"{target.name} already feeds another draft's states")
        lib = _lib()
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = target.n_gpu_layers
        self._model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise EdgespecError(f"llama.cpp could not load the EAGLE-3 head {path}")
        self.layers = target_layer_ids(self._model)
        self.width = lib.llama_model_n_embd(self._model)
        self.n_vocab = target.vocab.n_vocab
        cparams = lib.llama_context_default_params()
        # entries for the text and for a proposal drafted past its end
        cparams.n_ctx = target.n_ctx + MAX_OUTPUTS
        cparams.n_batch = cparams.n_ubatch = min(target.n_batch, cparams.n_ctx)
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = n_threads or target.n_threads
        cparams.no_perf = True
        cparams.ctx_other = target._ctx  # the head's graph takes the target's token embeddings (and output layer)
        self._ctx = lib.llama_init_from_model(self._model, cparams) if len(self.layers) == 3 else None
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise EdgespecError(f"{path.name} is not an EAGLE-3 head llama.cpp can run beside {target.name} "
                                f"(it reads target layers {self.layers}; an EAGLE-3 head reads three)")
        self._mem = lib.llama_get_memory(self._ctx)
        self.n_batch = lib.llama_n_batch(self._ctx)
        ext("set_embeddings_nextn")(self._ctx, True, True)  # the encoder's rows and each step's pre-norm state
        self.target = target
        last = [layer for layer in self.layers if layer >= target.n_layer]
        if any(layer > target.n_layer for layer in last):
            self.close()
            raise EdgespecError(f"{path.name} reads target layers {self.layers}; {target.name} has {target.n_layer}")
        self.inputs = LayerInputs(target, [layer for layer in self.layers if layer < target.n_layer])
        if last:  # the id n_layer: the target's final pre-norm state
            ext("set_embeddings_nextn")(target._ctx, True, False)
        self.ids = head_ids(path, self.n_vocab)
        self.g = np.zeros((target.n_ctx + MAX_OUTPUTS, self.width), dtype=np.float32)  # g[P], pages as touched
        self.pending: dict[int, np.ndarray] = {}  # position -> the target's features there, not encoded yet
        self.batch = ExtBatch(self._ctx)
        target.on_pass = self._read_target
        self.name = f"eagle3:{path.name}"
        self.reset()

    def close(self) -> None:
        lib = _lib()
        if getattr(self, "target", None) is not None and self.target.on_pass == self._read_target:
            self.target.on_pass = None
            self.inputs.close()
        if getattr(self, "batch", None) is not None:
            self.batch.close()
        if self._ctx:
            lib.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            lib.llama_model_free(self._model)
            self._model = None

    def reset(self) -> None:
        """Another text: the head's entries go; g rows stay, each rewritten when the target passes over it."""
        _lib().llama_memory_seq_rm(self._mem, 0, 0, -1)
        self.context: list[int] = []  # the committed tokens the head has entries for (all but the last)
        self.last: tuple[np.ndarray, np.ndarray] | None = None  # pre-norm state and logits of the newest entry

    def _read_target(self, positions: list[int]) -> None:
        """After a target pass: its rows' features, kept by position until the head's encoder reads them (in
        _encode, when the head drafts, or once PENDING have gathered): a pass the head drafts nothing after costs
        a copy of its rows, not an encoder call."""
        n = len(positions)
        rows = self.inputs.read(n)  # [len(inputs), n, E]
        if len(self.inputs.layers) < 3:
            rows = np.concatenate([rows, nextn_rows(self.target._ctx, n, self.target.n_embd)[None]])
        features = rows.transpose(1, 0, 2).reshape(n, -1)  # [n, 3E], layers in file order
        self.pending.update(zip(positions, features, strict=True))
        if len(self.pending) >= PENDING:
            self._encode()

    def _encode(self) -> None:
        """The pending features through the head's encoder, into g at their positions."""
        if not self.pending:
            return
        positions = sorted(self.pending)
        features = np.stack([self.pending.pop(pos) for pos in positions]).astype(np.float32)  # [n, 3E]
        lib = _lib()
        for start in range(0, len(positions), self.n_batch):
            chunk = features[start:start + self.n_batch]
            after = lib.llama_memory_seq_pos_max(self._mem, 0) + 1  # the encoder reads no position; llama.cpp
            for j, row in enumerate(chunk):  # checks them against the head's cache all the same
                self.batch.add(None, row, after + j, True)
            self.batch.process(ENCODE)
            self.g[positions[start:start + len(chunk)]] = nextn_rows(self._ctx, len(chunk), self.width)

    def _entries(self, tokens: list[int], states: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
        """Decoder entries (tokens[i], states[i]) at positions first + i; the last one's pre-norm state and logits
        (over the head's ids).

        The last entry goes alone: llama.cpp's eagle3 decoder graph keeps every row to its end (it selects no
        output rows), and a batch with fewer outputs than rows returns its first rows' (llama-server's batches
        are all outputs or none)."""
        last = len(tokens) - 1
        for start in range(0, last, self.n_batch):
            for i in range(start, min(start + self.n_batch, last)):
                self.batch.add(tokens[i], states[i], first + i, False)
            self.batch.process(DECODE)
        self.batch.add(tokens[last], states[last], first + last, True)
        self.batch.process(DECODE)
        state = nextn_rows(self._ctx, 1, self.width, -1)[0]  # the last row, the one output
        row = np.ctypeslib.as_array(_lib().llama_get_logits_ith(self._ctx, -1), shape=(self.n_vocab,))
        return state, (row[self.ids] if self.ids is not None else row.copy())

    def _commit(self, context: list[int]) -> None:
        """Entries for positions len(self.context) - 1 .. len(context) - 2: (token P + 1, g[P])."""
        done = len(self.context) - 1 if context[:len(self.context)] == self.context else 0
        if done < 0 or self.last is None:
            done = 0
        last = len(context) - 1
        if done < last:
            self._encode()
            _lib().llama_memory_seq_rm(self._mem, 0, done, -1)
            self.last = self._entries(context[done + 1:last + 1], self.g[done:last], done)
        self.context = list(context)

    def catch_up(self, context: list[int]) -> None:
        if len(context) > 2:
            self._commit(context[:-1])

    def propose(self, context, k, params, rng, gate=None):
        """A chain of up to k tokens and their laws (drafts.chain_with_siblings one wide)."""
        if k == 0 or len(context) < 2:
            return [], np.zeros((0, self.n_vocab))
        self._commit(context)
        state = {"h": self.last[0]}

        def step(token, i):  # entry at position len(context) - 1 + i: the i-th draft and the state before it
            state["h"], logits = self._entries([token], state["h"][None], len(context) - 1 + i)
            return logits

        try:
            tree = chain_with_siblings(self.last[1], step, k, 1, params, rng, self.n_vocab, ids=self.ids, gate=gate)
        finally:
            _lib().llama_memory_seq_rm(self._mem, 0, len(context) - 1, -1)
        return tree.tokens, tree.probs[:len(tree.tokens)]

    def measure_cost(self, reps: int = 5, k: int = 4) -> float:
        """Seconds per drafted token in a k-token chain (the median of reps), for the controller's prior."""
        return head_chain_cost(self, list(range(1, 17)), reps, k)

