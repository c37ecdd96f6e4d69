"""The drafting half that EAGLE-3 heads and MTP layers share: a one-layer decoder inside llama.cpp, beside the
target's context, fed the target's states.

Both read, for each committed position P, a row g[P] made from the target's pass over P (an EAGLE-3 head's
encoder output from three of its layers, drafts/eagle3.py; an MTP layer's, the target's last state, drafts/mtp.py)
and write a decoder entry (token P + 1, g[P]) at position P, whose logits are the law of token P + 2. Drafting goes
on from the decoder's own state: the next entry pairs the drafted token with the pre-norm output ("nextn" row) of
the entry before. This is what llama-server's `--spec-type draft-eagle3` and `draft-mtp` do
(common/speculative.cpp; docs/llama-drafts.md).

What differs from llama-server: the decoder's row is a law, not a top-1 guess, judged by edgespec's rejection rule
(a reduced vocabulary, an EAGLE-3 head's d2t map, is a draft with mass 0 outside its ids, `ids`): the output is the
target's law at every temperature. The controller chooses how far to draft and ends a chain where the head is
unsure (gated); with --tree-width W each drafted position also gets up to W - 1 siblings from the same law, leaves
verified in the same pass (llama-server verifies chains).

The decoder's cache holds entries for the committed text; a proposal's steps are removed after it. Where a
position's target rows were never computed here (a prompt restored from a saved state), its g row is zeros: drafts
there are worse, never wrong.

One stream: the target feeds one drafter (LlamaBackend.on_pass). Streams (parallel.Parallel: a SharedContext
target) share one decoder context with a sequence a stream, as llama-server's slots share one draft context
(`for_streams`): each stream's drafter writes its own sequence, g rows and entries; the shared context hands each
the rows of its stream from every joined pass (SharedContext.feed), and the drafters' calls into llama.cpp run on
the decode thread that runs the target's passes, one at a time (SharedContext.head_call). A stream's draft steps
are decodes of their own, not joined with the other streams' (llama-server drafts all slots in one decode).
"""

from __future__ import annotations

import copy

import numpy as np

from edgespec.backends.llama.ext import DECODE, ExtBatch, LayerInputs, ext, nextn_rows, target_layer_ids
from edgespec.backends.llama.lib import check_gguf_file
from edgespec.backends.llama.lib import lib as _lib
from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.drafts.base import Drafter, DraftTree, chain_with_siblings, grow_tree, head_round_costs
from edgespec.errors import EdgespecError

HEAD_BATCH = 64  # rows of a decoder's llama.cpp batch (decoder_params)


class LlamaHeadDrafter(Drafter):
    """Chains from a decoder context `_ctx` (memory `_mem`, extended batch `batch`) whose entries pair a token with a
    row of `g` [positions, width]; a subclass fills g from the target's passes (`_flush` before the rows are read)
    and sets ids (the target ids of the decoder's outputs, None: all)."""

    gated = True
    trees = True  # a chain and sibling leaves (propose_tree)
    ids: np.ndarray | None = None
    all_outputs = True  # every entry of a call an output (_entries); False: the last, states read unmasked
    seq = 0  # the decoder context's sequence this drafter writes (a stream's: for_streams)
    shared = None  # streams: the target's SharedContext, which feeds this drafter and runs its calls (head_call)
    siblings: tuple = ()  # streams: the other streams' drafters on this one's context, which it frees

    @staticmethod
    def check_target(target, what: str) -> None:
        """The errors for a target this decoder cannot read states from: not a GGUF one, or one that feeds
        another draft already (what: the draft in words, "an MTP layer")."""
        if not hasattr(target, "on_pass"):
            raise EdgespecError(f"{what} reads the target's states inside llama.cpp: {target.name} is not a GGUF "
                                "target")
        if target.on_pass is not None:
            raise EdgespecError(f"{target.name} already feeds another draft's states")

    @staticmethod
    def decoder_params(target, n_threads: int | None):
        """llama.cpp context parameters of a decoder beside `target` (a LlamaBackend): room for entries of the text
        and a proposal drafted past its end, a sequence for each of the target's streams (a pool of cells each), the
        target's context as its other (whose embeddings, output layer or memory the decoder's graph may take),
        batches of HEAD_BATCH rows.

        llama.cpp sizes a context's logits buffer for n_outputs_max rows of the whole vocabulary, and for a model
        with an encoder (EAGLE-3, DFlash) that is n_batch rows whatever is asked: at the target's 512 a 248k-token
        vocabulary would hold 0.5 GB for a head that outputs one row a step. A round writes a few entries; a
        prompt's, HEAD_BATCH at a time."""
        cparams = _lib().llama_context_default_params()
        streams = target.streams
        cparams.n_ctx = (target.n_ctx // streams + MAX_OUTPUTS) * streams
        cparams.n_batch = cparams.n_ubatch = min(HEAD_BATCH, cparams.n_ctx // streams)
        cparams.n_outputs_max = MAX_OUTPUTS
        cparams.n_seq_max = streams
        cparams.kv_unified = False
        cparams.n_threads = cparams.n_threads_batch = n_threads or target.n_threads
        cparams.no_perf = True
        cparams.ctx_other = target._ctx
        return cparams

    def attach(self, ctx, target, width: int) -> None:
        """Take the decoder context `ctx` (made with decoder_params), rows g of `width` and the target's passes."""
        self._ctx, self.target, self.width = ctx, target, width
        self.n_vocab = target.vocab.n_vocab
        self._mem = _lib().llama_get_memory(ctx)
        self.n_batch = _lib().llama_n_batch(ctx)
        # each entry's pre-norm state (and EAGLE-3's encoder rows): of the output rows, or of every row (_entries)
        ext("set_embeddings_nextn")(ctx, True, self.all_outputs)
        self.g = self._rows()
        self.batch = ExtBatch(ctx)
        target.on_pass = self._read_target
        self.reset()

    def _rows(self) -> np.ndarray:
        """Rows g[P] for the positions of one of the target's streams (pages as touched)."""
        return np.zeros((self.target.n_ctx // self.target.streams + MAX_OUTPUTS, self.width), dtype=np.float32)

    def for_streams(self, shared) -> list[LlamaHeadDrafter]:
        """A drafter for each stream of `shared` (the SharedContext of the target this one was made beside): this
        one for sequence 0, copies on the same decoder context for the others (their own sequence, g rows, batch
        and entries; _fresh for what a subclass keeps per stream). Each is fed its stream's rows by `shared`, not
        by the target's on_pass; this one frees the context, its copies' batches first."""
        self.target.on_pass = None
        drafters = [self]
        for seq in range(1, self.target.streams):
            other = copy.copy(self)
            other.seq, other.g, other.batch, other.siblings = seq, self._rows(), ExtBatch(self._ctx, seq), ()
            other._fresh()
            drafters.append(other)
        for drafter in drafters:
            drafter.shared = shared
            shared.feed[drafter.seq] = drafter._read_target
            drafter.reset()
        self.siblings = tuple(drafters[1:])
        return drafters

    def _feeding(self) -> bool:
        """Whether the target's passes still feed this drafter's context (a stream's drafters: that of stream 0
        answers for the context), so that closing it may turn off what the target keeps for it."""
        return self.target.on_pass == self._read_target or self.shared is not None and self.seq == 0

    def _fresh(self) -> None:
        """A copy for another stream (for_streams) drops what the subclass keeps of its original's stream."""

    def _call(self, fn, drafting: bool = False):
        """fn(), where a stream's drafter runs it: on the decode thread, marked drafting (its steps the others'
        verify waits for) where it drafts."""
        return fn() if self.shared is None else self.shared.head_call(self.seq, fn, drafting)

    def _read_target(self, positions: list[int], first: int = 0) -> None:
        """After each target pass (LlamaBackend.on_pass; a stream's, SharedContext.feed): its rows at `positions`,
        in batch order from batch index `first`."""
        raise NotImplementedError

    def _flush(self) -> None:
        """Rows of g the subclass still owes (EAGLE-3's encoder), written before an entry reads them."""

    def release(self) -> None:
        """Detach from the target and free the decoder's context and batch (a subclass frees what it loaded). A
        stream's copy (for_streams) frees its batch only: the drafter of stream 0 frees the rest."""
        if getattr(self, "target", None) is not None and self.target.on_pass == self._read_target:
            self.target.on_pass = None
        for drafter in (*self.siblings, self):
            if drafter.shared is not None:
                drafter.shared.feed.pop(drafter.seq, None)
            if getattr(drafter, "batch", None) is not None:
                drafter.batch.close()
                drafter.batch = None
        if self.seq == 0 and getattr(self, "_ctx", None):
            _lib().llama_free(self._ctx)
        self._ctx = None

    def reset(self) -> None:
        """Another text: the decoder's entries go; g rows stay, each rewritten when the target passes over it."""
        self._call(lambda: _lib().llama_memory_seq_rm(self._mem, self.seq, 0, -1))
        self.context: list[int] = []  # the committed tokens the decoder has entries for (all but the last)
        self.last: tuple[np.ndarray, np.ndarray] | None = None  # pre-norm state and logits of the newest entry

    def _entries(self, tokens: list[int], states: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
        """Decoder entries (tokens[i], states[i]) at positions first + i, in one call where a round's few fit; the
        last one's pre-norm state and logits (over the decoder's ids).

        Which rows are outputs: where the decoder's graph selects no output rows (EAGLE-3's), a batch with fewer
        outputs than rows returns its FIRST rows' logits, so the last MAX_OUTPUTS entries are all outputs (their
        logits are computed anyway) and the rows before them a call of their own; else the last alone, the
        pre-norm states read unmasked (every row's, by batch index: a masked context copies its first n_outputs
        rows of them, not its output rows). llama-server's batches are all outputs or none."""
        n = len(tokens)
        outputs = max(n - MAX_OUTPUTS, 0) if self.all_outputs else n - 1  # the first output row
        cuts = sorted({*range(0, n, self.n_batch), *([outputs] if self.all_outputs and outputs else []), n})
        for start, end in zip(cuts, cuts[1:], strict=False):
            for i in range(start, end):
                self.batch.add(tokens[i], states[i], first + i, i >= outputs)
            self.batch.process(DECODE)
        state = nextn_rows(self._ctx, 1, self.width, end - start - 1)[0]  # the last row's
        row = np.ctypeslib.as_array(_lib().llama_get_logits_ith(self._ctx, -1), shape=(self.n_vocab,))
        return state, (row[self.ids] if self.ids is not None else row.copy())

    def _commit(self, context: list[int]) -> None:
        """Entries for positions len(self.context) - 1 .. len(context) - 2: (token P + 1, g[P])."""
        done = len(self.context) - 1 if context[:len(self.context)] == self.context else 0
        if done < 0 or self.last is None:
            done = 0
        last = len(context) - 1
        if done < last:
            self._flush()
            _lib().llama_memory_seq_rm(self._mem, self.seq, done, -1)
            self.last = self._entries(context[done + 1:last + 1], self.g[done:last], done)
        self.context = list(context)

    def catch_up(self, context: list[int]) -> None:
        if len(context) > 2:
            self._call(lambda: self._commit(context[:-1]))

    def _stepping(self, context, draft):
        """draft(first, step) with the decoder caught up on `context`: first, its logits for the first draft;
        step(token, i), its logits for draft i + 1 once `token` is draft i (in order of i). The proposal's entries
        are removed after."""
        self._commit(context)
        state = {"h": self.last[0]}

        def step(token, i):  # entry at position len(context) - 1 + i: the i-th draft and the state before it
            state["h"], logits = self._entries([token], state["h"][None], len(context) - 1 + i)
            return logits

        try:
            return draft(self.last[1], step)
        finally:
            _lib().llama_memory_seq_rm(self._mem, self.seq, len(context) - 1, -1)

    def propose(self, context, k, params, rng, gate=None):
        """A chain of up to k tokens and their laws (drafts.chain_with_siblings one wide)."""
        if k == 0 or len(context) < 2:
            return [], np.zeros((0, self.n_vocab))
        tree = self._call(lambda: self._stepping(context, lambda first, step: chain_with_siblings(
            first, step, k, 1, params, rng, self.n_vocab, ids=self.ids, gate=gate)), drafting=True)
        return tree.tokens, tree.probs[:len(tree.tokens)]

    def propose_tree(self, context, shape, params, rng):
        """The tree `shape` plans (drafts.grow_tree): the decoder steps along its first guesses, once per depth as
        for a chain; the other guesses are leaves (branching False), so only the verify pass grows."""
        if shape.size == 0 or len(context) < 2:
            return DraftTree([], [], np.zeros((1, self.n_vocab)))
        return self._call(lambda: self._stepping(context, lambda first, step: grow_tree(
            shape, lambda path: step(path[-1], len(path) - 1) if path else first, params, rng, self.n_vocab,
            ids=self.ids)), drafting=True)

    start_cost = 0.0  # seconds a round spends besides its steps (measure_cost), the controller's draft_start prior

    def measure_cost(self, reps: int = 5, k: int = 4) -> float:
        """Seconds per draft step, beside start_cost per round (medians of reps), for the controller's prior."""
        self.start_cost, step = head_round_costs(self, list(range(1, 17)), reps, k)
        return step


class LayerReadingDrafter(LlamaHeadDrafter):
    """A decoder loaded from a file of its own that reads the inputs of chosen target layers (`layers`, llama.cpp's
    target_layer_ids; the id n_layer is the target's final pre-norm state): EAGLE-3 heads and DFlash drafts."""

    what = "a draft"  # in words, for errors

    def load(self, path, target) -> None:
        """Load the draft's model (`_model`) and its target layers, with the errors for a target it cannot read."""
        path = check_gguf_file(path)
        self.check_target(target, self.what)
        lib = _lib()
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = target.n_gpu_layers
        self._model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise EdgespecError(f"llama.cpp could not load {self.what} from {path}")
        self.layers = target_layer_ids(self._model)
        if any(layer > target.n_layer for layer in self.layers):
            self._free_model()
            raise EdgespecError(f"{path.name} reads target layers {self.layers}; {target.name} has {target.n_layer}")

    def read_layers(self, target) -> None:
        """Every later pass of the target keeps the inputs of the draft's layers (after attach)."""
        self.inputs = LayerInputs(target, [layer for layer in self.layers if layer < target.n_layer])
        if target.n_layer in self.layers:  # the id n_layer: the target's final pre-norm state
            ext("set_embeddings_nextn")(target._ctx, True, False)

    def features(self, n: int, first: int = 0) -> np.ndarray:
        """The target's features of n rows of its last pass from batch index `first` on: [n, len(layers) x E],
        layers in file order."""
        rows = self.inputs.read(n, first)  # [len(inputs), n, E]
        if len(self.inputs.layers) < len(self.layers):
            rows = np.concatenate([rows, nextn_rows(self.target._ctx, n, self.target.n_embd, first or None)[None]])
        return rows.transpose(1, 0, 2).reshape(n, -1)

    def close(self) -> None:
        if getattr(self, "inputs", None) is not None and self._feeding():
            self.inputs.close()
        self.release()
        if self.seq == 0:
            self._free_model()

    def _free_model(self) -> None:
        if getattr(self, "_model", None):
            _lib().llama_model_free(self._model)
            self._model = None

