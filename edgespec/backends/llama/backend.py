"""GGUF models through llama-cpp-python's low-level API (backends/llama/lib.py loads the library).

One model, one context, one sequence. `forward` builds a llama_batch that asks for logits only at
the positions the caller needs, and the context's output buffer is capped at MAX_OUTPUTS rows, so
neither llama.cpp nor we hold n_ctx x n_vocab floats. Rollback is `llama_memory_seq_rm`.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from edgespec.backends.llama.lib import KV_TYPES, check_gguf_file, logits_address
from edgespec.backends.llama.lib import lib as _lib
from edgespec.backends.llama.model import LlamaHandles, LlamaTokenizer, chat_template_of, read_vocab, tokenize_text
from edgespec.backends.llama.trees import TreePasses
from edgespec.backends.protocol import MAX_OUTPUTS, Backend, check_forward, common_prefix
from edgespec.errors import EdgespecError
from edgespec.machine import cores

if TYPE_CHECKING:
    from edgespec.backends.llama.states import PromptCache

__all__ = ["LlamaBackend", "LlamaTokenizer"]  # the tokenizer alone, importable from here as before


class LlamaBackend(TreePasses, LlamaHandles, Backend):
    """A GGUF model and its KV cache. See edgespec.backends.protocol.Backend for the contract."""

    trees = True  # forward_tree, keep_branch

    def __init__(self, path: str | os.PathLike, *, n_ctx: int = 2048, n_threads: int | None = None,
                 n_gpu_layers: int = 0, kv_type: str = "f16", n_ubatch: int = 512, hidden: bool = False,
                 sequences: int | None = None, overlap: bool | None = None, outputs: int = MAX_OUTPUTS,
                 unified: bool | None = None, load_mtp: bool = False):
        """sequences: how many sequences the cache holds (draft trees need a branch each, answer_many a stream
        each); 1 makes the context llama-bench's and llama-server's for one conversation. Default: MAX_OUTPUTS
        (trees' branches cost an attention cache nothing, its cells shared), but 1 for a model with recurrent
        layers, which keep a state and its snapshots per sequence (below): MAX_OUTPUTS sequences would hold 16x
        the states a chain needs (1 + n_rs_seq rows a sequence of each recurrent layer's state: plan/planner.py,
        state_bytes, checked against llama.cpp's log). overlap: whether
        prefetch starts passes (default: where layers run on a GPU, whose llama_decode returns once the work is
        queued; on the CPU it returns when the pass is done, so starting it early gains nothing). outputs: the most
        rows of logits one decode returns (backends/llama/streams.py joins a pass per stream). unified: whether the
        sequences share one pool of cells (default: where there are several), which draft trees need (a branch
        shares the cells of the nodes above it); with a pool each (n_ctx / sequences cells, llama-server's slots'
        layout) a row's attention reads its own sequence's cells only, not every sequence's, but llama.cpp splits
        a decode into one pass per run of consecutive sequences with as many tokens each (streams.py orders a
        joined decode by sequence and fills the idle sequences between). load_mtp: load the MTP ("nextn") layers
        the GGUF carries (llama.cpp skips them otherwise), for --draft mtp (drafts/mtp.py).

        A model with recurrent layers (Qwen3.5's gated delta nets) keeps MAX_OUTPUTS snapshots of their state per
        sequence (llama.cpp's n_rs_seq), so that a verify pass can be rolled back as an attention cache is."""
        path = check_gguf_file(path)
        if sequences is not None and not 1 <= sequences <= MAX_OUTPUTS:
            raise ValueError(f"sequences must be in 1..{MAX_OUTPUTS}, got {sequences}")
        if kv_type not in KV_TYPES:
            raise EdgespecError(f"unknown KV cache type '{kv_type}': choose one of {', '.join(KV_TYPES)}")
        lib = _lib()
        self.name = path.name
        self.path = path
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        mparams.load_mtp = self.load_mtp = load_mtp
        self._model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise EdgespecError(f"llama.cpp could not load {path}: the GGUF is corrupt, truncated or "
                                "of an architecture this llama.cpp build does not know")
        self.recurrent = bool(lib.llama_model_is_recurrent(self._model) or lib.llama_model_is_hybrid(self._model))
        if sequences is None:
            sequences = 1 if self.recurrent else MAX_OUTPUTS
        n_threads = n_threads or min(cores(), 8)
        cparams = lib.llama_context_default_params()
        n_ctx_train = lib.llama_model_n_ctx_train(self._model)
        cparams.n_ctx = n_ctx = min(n_ctx, n_ctx_train) if n_ctx_train > 0 else n_ctx
        cparams.n_batch = cparams.n_ubatch = min(n_ubatch, n_ctx)
        # a quantized V cache needs flash attention; llama.cpp's "auto" turns it on where the device has it
        cparams.type_k = cparams.type_v = getattr(lib, KV_TYPES[kv_type])
        # draft trees: each root-to-leaf branch of a tree is a sequence of its own, and the text and the nodes
        # branches share are cells of several sequences in one unified cache (forward_tree)
        cparams.n_seq_max = sequences
        self.unified = cparams.kv_unified = sequences > 1 if unified is None else unified
        cparams.n_outputs_max = outputs  # rows of logits a decode may return (streams.py joins several passes)
        cparams.n_rs_seq = MAX_OUTPUTS if self.recurrent else 0  # a verify pass's rows, each one a snapshot
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.no_perf = True
        # hidden: llama.cpp also returns the final (normed) hidden state of every row with logits,
        # what draft heads read; without pooling it costs one extra [n_outputs, n_embd] buffer
        cparams.embeddings = hidden
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise EdgespecError(f"llama.cpp could not create a context of {n_ctx} tokens for {path}")
        self._mem = lib.llama_get_memory(self._ctx)
        self._vocab_p = lib.llama_model_get_vocab(self._model)
        # llama.cpp pads the context to a multiple of 256, past a shorter training context too; the model holds no
        # more than that (export/gguf.cap_context lowers it where llama.cpp ignores a sliding window)
        padded = lib.llama_n_ctx(self._ctx)
        self.n_ctx = min(padded, n_ctx_train) if n_ctx_train > 0 else padded
        self.n_batch = lib.llama_n_batch(self._ctx)
        self.n_threads = n_threads
        self.kv_type, self.n_gpu_layers = kv_type, n_gpu_layers
        self.vocab = read_vocab(self._vocab_p)
        self.tokens: list[int] = []
        self.hidden = hidden
        self.n_embd = lib.llama_model_n_embd(self._model)
        self.n_layer = lib.llama_model_n_layer(self._model)
        self.last_hidden: np.ndarray | None = None  # [n_logits, n_embd] of the last forward, if hidden
        self._batch = lib.llama_batch_init(self.n_batch, 0, MAX_OUTPUTS)
        self._tree: tuple | None = None  # a tree forward_tree left for keep_branch: (tokens, sequences, hidden)
        self._pending: list[int] = []  # the tail of self.tokens not in the KV cache yet (keep_branch)
        self._logits_address = logits_address()
        self._logits: tuple[int, np.ndarray] | None = None  # llama.cpp's output buffer: (address, a view of it)
        self.sequences, self.outputs = sequences, outputs
        self.streams = 1  # generations sharing this context, a sequence each (a SharedContext's: its streams)
        if overlap is None:
            from edgespec.backends.llama.lib import gpu_name

            overlap = n_gpu_layers > 0 and gpu_name() is not None
        self.overlap = overlap
        self._ahead = False  # a pass prefetch started, whose rows collect has not read
        self.states: PromptCache | None = None  # saved sequence states a prompt may start from (recall)
        # called after every llama_decode with the positions of its rows, in batch order: a draft that reads the
        # target's states of each pass (an EAGLE-3 head's layer inputs) takes them here, before the next decode
        self.on_pass: Callable[[list[int]], None] | None = None

    def forward(self, tokens: Sequence[int], n_logits: int, *, copy: bool = True) -> np.ndarray:
        """See Backend.forward. copy=False: where the pass fits one batch, the rows are a read-only view of
        llama.cpp's output buffer, valid until this backend's next forward (a 600 KB copy saved per token at a
        152k vocabulary)."""
        lib = _lib()
        self._settle()
        if self._pending:  # tokens a kept tree branch still owes the cache go first, in the same pass
            tokens = [*self._pending, *tokens]
            del self.tokens[len(self.tokens) - len(self._pending):]
            self._pending = []
        n = len(tokens)
        check_forward(self, n, n_logits, MAX_OUTPUTS)
        if self.hidden and 0 < n_logits < n and n > MAX_OUTPUTS:
            # with embeddings on, llama.cpp outputs every token of a batch (an assert aborts past
            # n_outputs_max): run the rows without logits with them off, then the rest with them on. Up to
            # MAX_OUTPUTS rows (a verify pass after a kept tree branch) share one pass, all rows out.
            self.forward(tokens[:n - n_logits], 0)
            return self.forward(tokens[n - n_logits:], n_logits, copy=copy)
        with_hidden = self.hidden and n_logits > 0
        if self.hidden:
            lib.llama_set_embeddings(self._ctx, with_hidden)
        view = not copy and n <= self.n_batch
        out = None if view else np.empty((n_logits, self.vocab.n_vocab), dtype=np.float32)  # [n_logits, V]
        hidden = np.empty((n_logits, self.n_embd), dtype=np.float32) if with_hidden else None  # [n_logits, E]
        for start in range(0, n, self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            first_out = n - n_logits - start  # index in this chunk of the first position with logits
            try:
                if first_out == len(chunk) - 1 and not with_hidden:  # the last row alone: a decoding step
                    self._decode_step(chunk)
                else:
                    self._decode([(tok, len(self.tokens) + j, 0, j >= first_out or with_hidden)
                                  for j, tok in enumerate(chunk)])
            except EdgespecError:
                self.rollback(len(self.tokens))  # drop whatever part of the chunk got in
                raise
            self.tokens.extend(chunk)
            tail = len(chunk) - max(first_out, 0)  # the chunk's last rows, the ones asked for
            if tail > 0:
                # llama.cpp's output buffer holds the rows in batch order; with hidden states on, every row of
                # the chunk has an output and the ones asked for are its last
                n_out = len(chunk) if with_hidden else tail
                rows = self._output_rows(n_out)[n_out - tail:]
                if view:
                    out = rows
                else:
                    at = start + max(first_out, 0) - (n - n_logits)
                    out[at:at + tail] = rows
            for j in range(max(first_out, 0), len(chunk)) if hidden is not None else ():
                row = lib.llama_get_embeddings_ith(self._ctx, j)
                hidden[start + j - (n - n_logits)] = np.ctypeslib.as_array(row, shape=(self.n_embd,))
        self.last_hidden = hidden
        return out if out is not None else np.empty((0, self.vocab.n_vocab), dtype=np.float32)

    def placement(self) -> dict:
        """Where the model runs: llama.cpp's GPU device (None: the CPU) and the layers on it, out of the
        repeating layers plus the output layer (the planner's count)."""
        from edgespec.backends.llama.lib import gpu_name

        gpu = gpu_name()
        on_gpu = min(self.n_gpu_layers, self.n_layer + 1) if gpu and self.n_gpu_layers > 0 else 0
        return {"runtime": "llama.cpp", "device": gpu if on_gpu else "cpu", "gpu_layers": on_gpu,
                "layers": self.n_layer + 1}

    def prefetch(self, tokens: Sequence[int]) -> bool:
        """Start a forward of tokens (one row of logits, the last token's) without waiting for it, where
        `overlap`: the caller's own work on the token before (text, stats, its consumer) then runs while the
        device computes, and collect returns the rows. The tokens are in `tokens` from here on, as after a
        forward; any other call discards the rows. Returns whether a pass was started."""
        self._settle()
        if not self.overlap or self.hidden or self.on_pass or self._pending or self._tree is not None or not tokens \
                or len(tokens) > self.n_batch or len(self.tokens) + len(tokens) > self.n_ctx:
            return False
        try:
            self._decode_step(tokens)
        except EdgespecError:
            self.rollback(len(self.tokens))
            raise
        self.tokens.extend(tokens)
        self._ahead = True
        return True

    def collect(self) -> np.ndarray:
        """The rows [1, V] of the pass prefetch started (waiting for it): a read-only view of llama.cpp's
        output buffer, valid until this backend's next pass."""
        if not self._ahead:
            raise RuntimeError("collect without a pass that prefetch started")
        self._ahead = False
        return self._output_rows(1)  # llama_get_logits waits for the pass

    def _settle(self) -> None:
        """Wait for a pass prefetch started whose rows nobody will read: its tokens stay in the cache."""
        if self._ahead:
            self._ahead = False
            _lib().llama_synchronize(self._ctx)

    def _output_rows(self, n_out: int) -> np.ndarray:
        """The last decode's logits rows [n_out, V], a read-only view of llama.cpp's output buffer (valid until
        the next decode), made again only when llama.cpp moves the buffer."""
        address = self._logits_address(self._ctx)
        if self._logits is None or self._logits[0] != address:
            n_vocab = self.vocab.n_vocab
            buffer = (ctypes.c_float * (MAX_OUTPUTS * n_vocab)).from_address(address)
            rows = np.frombuffer(buffer, dtype=np.float32).reshape(MAX_OUTPUTS, n_vocab)
            rows.flags.writeable = False
            self._logits = (address, rows)
        return self._logits[1][:n_out]

    def answer_many(self, prompts: Sequence[Sequence[int]], max_tokens: int,
                    pick: Callable[[int, np.ndarray], int], *, streams: int = MAX_OUTPUTS,
                    on_answer: Callable[[int, list[int], bool], None] | None = None) -> list[tuple[list[int], bool]]:
        """Plain decoding of many prompts at once, for corpora: up to `streams` of them share every decoding pass
        (a pass reads the weights once however many rows it has, so on a bandwidth-bound device N rows cost far
        less than N passes), and a prompt that ends makes room for the next. pick(i, logits [V]) chooses prompt
        i's next token. Returns, per prompt, its answer and whether it ended on an end-of-generation token (which
        the answer leaves out); on_answer(i, answer, ended_on_eog) is called as each prompt ends.

        The passes are shaped like a single generation's, so llama.cpp runs the same kernels: a prompt but its last
        token is prefilled in a pass of its own, then every pass has one row per stream. (It computes passes of 64
        rows or more with other kernels: mixing prefills into decoding passes moved a quantized model's logits by
        up to 0.75 and flipped greedy answers.) What remains is rounding: streams share the cache's cells, so
        attention sums in another order, and a near-tie may flip (tests/real/test_distill.py measures it).

        Each stream is a sequence of its own in the unified cache, sharing its n_ctx cells: fewer streams run
        where `streams` of the longest prompt with max_tokens would not fit. The cache is empty before and after."""
        need = max((len(p) + max_tokens for p in prompts), default=0)
        if not all(prompts) or need > self.n_ctx:
            raise EdgespecError(f"a prompt with {max_tokens} tokens to answer needs {need} cells, more than the "
                                f"context of {self.n_ctx} (or a prompt is empty)")
        streams = max(1, min(streams, self.sequences, len(prompts), self.n_ctx // need))  # as many as fit
        self.rollback(0)  # also waits for a prefetched pass
        if self.hidden:
            _lib().llama_set_embeddings(self._ctx, False)
        answers: list[tuple[list[int], bool] | None] = [None] * len(prompts)
        waiting = iter(range(len(prompts)))
        live: dict[int, list] = {}  # stream (its sequence id) -> [prompt index, answer so far]
        try:
            while True:
                for s in range(streams):  # idle streams take the next prompts and prefill them
                    if s not in live and (i := next(waiting, None)) is not None:
                        live[s] = [i, []]
                        prompt = prompts[i]
                        for start in range(0, len(prompt) - 1, self.n_batch):
                            chunk = prompt[start:min(start + self.n_batch, len(prompt) - 1)]
                            self._decode([(tok, start + j, s, False) for j, tok in enumerate(chunk)])
                if not live:
                    return answers
                order = sorted(live)
                rows = []
                for s in order:  # each stream's newest token (a fresh prompt's last one) asks for the next
                    i, answer = live[s]
                    rows.append((answer[-1] if answer else prompts[i][-1], len(prompts[i]) + len(answer) - 1, s, True))
                self._decode(rows)
                for row, s in enumerate(order):
                    i, answer = live[s]
                    logits = np.ctypeslib.as_array(_lib().llama_get_logits_ith(self._ctx, row),
                                                   shape=(self.vocab.n_vocab,))
                    tok = pick(i, logits)
                    ended = tok in self.vocab.eog_ids
                    if not ended:
                        answer.append(tok)
                    if ended or len(answer) >= max_tokens:
                        answers[i] = (answer, ended)
                        del live[s]
                        _lib().llama_memory_seq_rm(self._mem, s, -1, -1)
                        if on_answer:
                            on_answer(i, answer, ended)
        finally:
            for s in range(streams):
                _lib().llama_memory_seq_rm(self._mem, s, -1, -1)

    def _decode(self, rows: Sequence[tuple[int, int, Sequence[int] | int, bool]]) -> None:
        """One llama_decode of rows (token, position, sequence id(s), whether it returns logits)."""
        b = self._batch
        for j, (tok, pos, seqs, out) in enumerate(rows):
            seqs = (seqs,) if isinstance(seqs, int) else seqs
            b.token[j], b.pos[j], b.logits[j], b.n_seq_id[j] = tok, pos, int(out), len(seqs)
            for m, seq in enumerate(seqs):
                b.seq_id[j][m] = seq
        b.n_tokens = len(rows)
        rc = _lib().llama_decode(self._ctx, b)
        if rc != 0:
            raise EdgespecError(f"llama_decode failed with code {rc} on {self.name} ({len(rows)} rows)")
        if self.on_pass is not None:
            self.on_pass([pos for _, pos, _, _ in rows])

    def _decode_step(self, tokens: Sequence[int]) -> None:
        """One llama_decode of tokens after the cache on sequence 0, the last one's logits out: llama.cpp's own
        batch of one sequence (positions from the cache), what llama-bench and llama-server decode with."""
        lib = _lib()
        ids = (ctypes.c_int32 * len(tokens))(*tokens)
        rc = lib.llama_decode(self._ctx, lib.llama_batch_get_one(ids, len(tokens)))
        if rc != 0:
            raise EdgespecError(f"llama_decode failed with code {rc} on {self.name} ({len(tokens)} rows)")
        if self.on_pass is not None:
            self.on_pass(list(range(len(self.tokens), len(self.tokens) + len(tokens))))

    def keep_states(self, cache: PromptCache | None) -> bool:
        self.states = cache
        return True

    def recall(self, tokens: Sequence[int], common: int) -> int:
        """See Backend.recall: with `states`, sequence 0's long parts are saved before they are dropped, and a
        prompt starts from the saved state that holds most of it (backends/llama/states.py)."""
        if self.states is None or not self.states.worth(len(self.tokens), len(tokens), common):
            return common
        self._settle()
        self._drop_branches()
        cached = self.tokens[:len(self.tokens) - len(self._pending)]  # what the cells hold
        held = self.states.recall(self, self._ctx, self._mem, 0, cached, tokens, min(common, len(cached)))
        if held is None:
            return common
        self.tokens, self._pending = held, []
        return common_prefix(held, tokens)

    def rollback(self, n_past: int) -> None:
        if n_past < 0 or n_past > len(self.tokens):
            raise ValueError(f"cannot roll back to {n_past} with {len(self.tokens)} tokens cached")
        self._settle()
        self._drop_branches()  # a tree no branch was kept from
        del self._pending[max(n_past - (len(self.tokens) - len(self._pending)), 0):]
        if not _lib().llama_memory_seq_rm(self._mem, 0, n_past, -1):
            if not self.recurrent:
                raise RuntimeError(f"llama_memory_seq_rm refused to truncate {self.name} to {n_past}")
            # further back than the recurrent layers' snapshots reach (a new prompt sharing a prefix): the prefix
            # is computed again
            keep = self.tokens[:n_past]
            _lib().llama_memory_seq_rm(self._mem, 0, -1, -1)
            self.tokens, self._pending = [], []
            if keep:
                self.forward(keep, 0)
            return
        del self.tokens[n_past:]

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        return tokenize_text(self._vocab_p, text, special)

    def chat_template(self) -> str | None:
        return chat_template_of(self._model)

    def memory(self) -> dict[str, int]:
        return {**self._held(), "logits": MAX_OUTPUTS * self.vocab.n_vocab * 4}
