"""DFlash block drafts in llama.cpp's own format (GGUF architecture `dflash`), drafting inside llama.cpp beside the
target's context, their laws under edgespec's rejection rule.

A DFlash draft (Chen et al. 2026, block diffusion) reads several of the target's layers like an EAGLE-3 head: after
every target pass the inputs of its `dflash.target_layers` for each row are joined, and for each committed position
the draft's encoder (`fc`) turns them into keys and values written into the draft's cache at that position (an
embedding-only decode, llama.cpp's "injection"). To draft, one decode of a block [last committed token, mask, ...,
mask] at the positions after the text, with non-causal attention inside the block, gives at block row i the law of
the token i places past the last: k laws from one call, however long the chain. The block's own entries are
removed after. This is what llama-server's `--spec-type draft-dflash` does (common/speculative.cpp).

The laws of a block are the draft's marginals: row i does not see the tokens drafted before it, so drawing each
drafted token from its row is a draft whose law at position i, given the drafted prefix, is that row, and the
rejection rule judges it like any other: the output is the target's law at every temperature (llama-server instead
keeps each row's top token and matches it). A reduced vocabulary (`d2t`) is a law with mass 0 outside its ids, as for
EAGLE-3. Chains of at most block_size - 1 tokens; DFlash2's selector and DSpark's Markov head are refused.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgespec.backends.llama.ext import DECODE
from edgespec.backends.llama.lib import check_gguf_file
from edgespec.backends.llama.lib import lib as _lib
from edgespec.backends.model_info import read_gguf_header
from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.drafts.base import DraftTree, chain_with_siblings, grow_tree
from edgespec.drafts.eagle3 import head_ids
from edgespec.drafts.llama_head import LayerReadingDrafter
from edgespec.errors import EdgespecError


class DFlashDrafter(LayerReadingDrafter):
    """Drafts chains from a DFlash GGUF against a LlamaBackend target (streams: for_streams)."""

    what = "a DFlash draft"

    def __init__(self, path: str | os.PathLike, target, *, n_threads: int | None = None):
        path = Path(path)
        meta, tensors = read_gguf_header(check_gguf_file(path))
        if meta.get("general.architecture") != "dflash" or meta.get("dflash.selector_top_k") \
                or any(t.name == "markov_w1.weight" for t in tensors):
            raise EdgespecError(f"{path.name}: edgespec drives DFlash block drafts, not DFlash2 selectors or DSpark "
                                "Markov heads (llama-server's --spec-type draft-dflash / draft-dspark run those)")
        self.load(path, target)
        if not self.layers:
            self._free_model()
            raise EdgespecError(f"{path.name} names no target layers to read (dflash.target_layers)")
        lib = _lib()
        self.block_size = int(meta.get("dflash.block_size") or 16)
        self.mask = lib.llama_vocab_mask(lib.llama_model_get_vocab(self._model))
        ctx = lib.llama_init_from_model(self._model, self.decoder_params(target, n_threads))
        if not ctx:
            self._free_model()
            raise EdgespecError(f"{path.name} is not a DFlash draft llama.cpp can run beside {target.name}")
        lib.llama_set_causal_attn(ctx, bool(meta.get("dflash.attention.causal", False)))
        self.ids = head_ids(path, target.vocab.n_vocab)
        self.name = f"dflash:{path.name}"
        self.attach(ctx, target, len(self.layers) * target.n_embd)  # g[P]: the target's features at P
        self.read_layers(target)

    def _read_target(self, positions: list[int], first: int = 0) -> None:
        """After a target pass: its rows' features, g[P] for each position."""
        self.g[positions] = self.features(len(positions), first)

    def _commit(self, context: list[int]) -> None:
        """The features of positions len(self.context) - 1 .. len(context) - 2 into the draft's cache."""
        done = len(self.context) - 1 if context[:len(self.context)] == self.context else 0
        done, last = max(done, 0), len(context) - 1
        if done < last:
            _lib().llama_memory_seq_rm(self._mem, self.seq, done, -1)
            for start in range(done, last, self.n_batch):
                for pos in range(start, min(start + self.n_batch, last)):
                    self.batch.add(None, self.g[pos], pos, False)
                self.batch.process(DECODE)
        self.context = list(context)

    def _stepping(self, context, draft, k: int = MAX_OUTPUTS):
        """draft(first, step) as LlamaHeadDrafter's, from one block decode of up to min(k, block_size - 1) laws
        (step returns None past them)."""
        k = min(k, self.block_size - 1, MAX_OUTPUTS - 1)  # the block's rows are all outputs
        self._commit(context)
        first = len(context) - 1
        for i in range(k + 1):  # every row an output: the graph selects none (see LlamaHeadDrafter._entries)
            self.batch.add(context[-1] if i == 0 else self.mask, None, first + i, True)
        try:
            self.batch.process(DECODE)
            rows = [np.ctypeslib.as_array(_lib().llama_get_logits_ith(self._ctx, i), shape=(self.n_vocab,))
                    for i in range(1, k + 1)]
            rows = [row[self.ids] if self.ids is not None else row.copy() for row in rows]
        finally:
            _lib().llama_memory_seq_rm(self._mem, self.seq, first, -1)
        return draft(rows[0], lambda token, i: rows[i + 1] if i + 1 < len(rows) else None)

    def propose(self, context, k, params, rng, gate=None):
        """A chain of up to min(k, block_size - 1) tokens and their laws, from one block decode."""
        k = min(k, self.block_size - 1, MAX_OUTPUTS - 1)
        if k <= 0 or len(context) < 2:
            return [], np.zeros((0, self.n_vocab))
        tree = self._call(lambda: self._stepping(context, lambda first, step: chain_with_siblings(
            first, step, k, 1, params, rng, self.n_vocab, ids=self.ids, gate=gate), k), drafting=True)
        return tree.tokens, tree.probs[:len(tree.tokens)]

    def propose_tree(self, context, shape, params, rng):
        """The tree `shape` plans, its laws from one block as deep as the shape (a block's rows are marginals, so
        a chain's siblings come from the same rows)."""
        from edgespec.decode.shape import tree_depth

        if shape.size == 0 or len(context) < 2:
            return DraftTree([], [], np.zeros((1, self.n_vocab)))
        return self._call(lambda: self._stepping(context, lambda first, step: grow_tree(
            shape, lambda path: step(path[-1], len(path) - 1) if path else first, params, rng, self.n_vocab,
            ids=self.ids), tree_depth(shape.parents)), drafting=True)

    def measure_cost(self, reps: int = 5, k: int = 4) -> float:
        """One block decode drafts the chain: its cost is nearly all the round's start (start_cost)."""
        return super().measure_cost(reps, max(min(k, self.block_size - 1), 2))
