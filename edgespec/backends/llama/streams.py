"""Several generations on one llama.cpp context: each a sequence of its cache, their passes joined into one decode.

A pass reads the weights once however many rows it carries, so on a bandwidth-bound device the passes of several
streams cost little more together than one of them alone; this is where batching and speculative decoding compound
(issue 45). `SharedContext` owns a LlamaBackend opened with one sequence per stream; `stream(i)` is a Backend for
sequence i, which the speculative loop drives as it drives any target, from a thread of its own. A stream's forward
waits until every stream inside a generation (`begin` .. `end`) has asked for its pass, or `wait_s` has passed since
it asked (a stream busy with its text must not stall the others), and then one llama_decode carries every waiting
pass's rows, each stream's tokens on its own sequence at its own positions; each gets its rows back, copied (the
output buffer serves the next pass). A pass of more than MAX_OUTPUTS tokens (a prompt's prefill) runs on its own,
in batches of n_batch tokens with the others' joined passes between them (a request joins between rounds and a
long prompt holds the decoding streams up by one batch at a time), as answer_many's prefills do: llama.cpp
computes passes of 64 rows or more with other kernels, which would move the decoding streams' logits.

A draft model's context joins its target's (`SharedContext(draft, drafts_for=target)`): one lock, the target's
streams' generations. A round then runs as one pass per draft step and one verify: the streams that draft ask for
their draft steps, the others for their verify; once every generating stream has asked for a pass of either
model, the draft steps run as one decode of the draft, the drafting streams' next steps after it, and the verify
waits for a drafting stream's rows (it comes back within a step) where it would not wait for a stream busy with
its text.

Each stream's loop keeps its own sampling parameters, generator, drafter and controller: the output of each is
distributed as target-only decoding of its request, as one stream's is. Every call into llama.cpp holds one lock.
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edgespec.backends.llama.backend import LlamaBackend
from edgespec.backends.llama.lib import lib as _lib
from edgespec.backends.protocol import MAX_OUTPUTS, Backend, check_forward, common_prefix
from edgespec.errors import EdgespecError

if TYPE_CHECKING:
    from edgespec.backends.llama.states import PromptCache

WAIT_S = 0.002  # how long a pass waits for the other generating streams' before it runs without them
POLL_S = 0.001  # past WAIT_S, how often a pass looks whether the decode thread is free
DRAFTING_WAIT_S = 0.05  # the longest a verify waits for a drafting stream's rows (its steps, sampled on the host)


class _DecodeThread:
    """The one thread that runs every decode of the process's shared contexts, whichever stream asks.

    llama.cpp's CPU backend runs a pass on an OpenMP team of the calling thread: once a second thread has decoded,
    passes take 1.5x as long on two cores, also back on the first (15 -> 22 ms a pass of the reference target;
    decoding from one thread only, it need not be the main one, keeps 15: docs/results/2026-11-27-serve-load.md).
    A stream's thread hands its decode here and waits for it (one hand-over a decode, whatever streams it carries).
    The hand-over is a queue and a lock per call, not an executor's future: 74-75 us a pass of the reference target
    against 121-124 with a future (there 11 against 24-26 us, back 63-64 against 97-98 with the cores busy after
    the pass), what a lone stream pays over one Engine besides its Python (experiments/lone_stream.py,
    docs/results/2026-11-27-one-client-streams.md)."""

    def __init__(self):
        self._fresh()
        os.register_at_fork(after_in_child=self._fresh)  # a forked child has no decode thread: it starts its own

    def _fresh(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self._count = threading.Lock()
        self.pending = 0  # decodes handed over and not done: while there are, a pass waiting for others loses nothing

    def call(self, fn):
        if threading.current_thread() is self._thread:
            return fn()
        if self._thread is None:  # the first call starts the thread (the lock: one, whichever threads call)
            with self._start:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._serve, name="edgespec-decode", daemon=True)
                    self._thread.start()
        done, box = threading.Lock(), []
        done.acquire()
        with self._count:
            self.pending += 1
        try:
            self._jobs.put((fn, box, done))
            done.acquire()  # released once fn has returned or raised
        finally:
            with self._count:
                self.pending -= 1
        result, error = box
        if error is not None:
            raise error
        return result

    def _serve(self):
        while True:
            fn, box, done = self._jobs.get()
            try:
                box.extend((fn(), None))
            except BaseException as error:  # noqa: BLE001 (raised in the caller's thread)
                box.extend((None, error))
            finally:
                done.release()


DECODER = _DecodeThread()


@dataclass
class _Pass:
    seq: int
    tokens: list[int]
    n_logits: int
    rows: np.ndarray | None = None
    error: BaseException | None = None


class SharedContext:
    """One llama.cpp context serving `backend.sequences` streams (see the module docstring)."""

    def __init__(self, backend: LlamaBackend, *, wait_s: float = WAIT_S, drafts_for: SharedContext | None = None):
        """backend: opened with a sequence per stream, no passes started ahead, and outputs for every stream's
        pass at once (sequences * MAX_OUTPUTS). drafts_for: the target's context, where this is its draft model's
        (stream i drafts for the target's stream i; the module docstring says how their passes are scheduled)."""
        if backend.hidden or backend.overlap:
            raise EdgespecError("streams share a context without hidden states or passes started ahead")
        self.backend, self.wait_s = backend, wait_s
        self._asked: dict[int, _Pass] = {}  # sequence -> the pass its stream waits for
        self.target, self.draft = drafts_for, None
        if drafts_for is None:
            self._cond = threading.Condition()
            self._active: set[int] = set()  # sequences inside a generation
            self._prefilling: set[int] = set()  # sequences reading a prompt: the others' passes do not wait for them
            self._drafting: set[int] = set()  # sequences that asked for a draft step since their last verify
        else:
            if drafts_for.draft is not None or drafts_for.target is not None:
                raise EdgespecError("a target's context takes one draft model's context")
            drafts_for.draft = self
            self._cond, self._active = drafts_for._cond, drafts_for._active
            self._prefilling, self._drafting = drafts_for._prefilling, drafts_for._drafting
        self._streams = [StreamBackend(self, i) for i in range(backend.sequences)]
        backend.streams = backend.sequences
        # sequence -> what reads that stream's rows of each pass (a head's drafter: drafts/llama_head.for_streams):
        # called on the decode thread right after the decode, with the rows' positions and first batch index
        self.feed: dict[int, Callable[[list[int], int], None]] = {}
        self.states: PromptCache | None = None  # saved sequence states a stream's prompt may start from
        self.decodes = 0  # joined passes run (for stats and tests)
        self.rows_decoded = 0

    def stream(self, i: int) -> StreamBackend:
        return self._streams[i]

    def begin(self, i: int) -> None:
        """Stream i starts a generation: passes wait for its until it ends."""
        with self._cond:
            self._active.add(i)

    def end(self, i: int) -> None:
        with self._cond:
            self._active.discard(i)
            self._drafting.discard(i)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:  # not under a decode of a stream still running (every decode holds the lock)
            self.backend.close()

    def _forward(self, stream: StreamBackend, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        if not tokens:
            return np.empty((0, self.backend.vocab.n_vocab), dtype=np.float32)
        if len(tokens) > MAX_OUTPUTS:
            return self._prefill(stream, list(tokens), n_logits)
        p = _Pass(stream.seq, list(tokens), n_logits)
        head = self.target or self
        with self._cond:
            self._asked[p.seq] = p
            (self._drafting.add if self.target else self._drafting.discard)(p.seq)
            start = time.monotonic()
            while p.rows is None and p.error is None:
                waited = time.monotonic() - start
                ready = head._ready(waited)
                if ready is not None:  # whichever stream's thread sees a pass ready runs it
                    ready._run_asked()
                    continue
                self._cond.wait(timeout=self.wait_s - waited if waited < self.wait_s else POLL_S)
        if p.error is not None:
            raise p.error
        return p.rows

    def _ready(self, waited: float) -> SharedContext | None:
        """The context (this target's or its draft model's) whose asked passes run now, the longest wait among
        them `waited` seconds; None: wait. Called on the target's, holding the lock.

        Draft steps first: once every generating stream has asked for a pass of either model (the drafting streams
        step together; their verify rows then join the others'), or past wait_s (a stream busy with its text
        holds no one up for longer). The verify once every generating stream has asked for one; past wait_s also
        without the streams busy with their text, not without a drafting one (between two steps, back within
        one), unless it takes DRAFTING_WAIT_S; and past wait_s only while the decode thread has nothing else to
        do (another context's pass, which a stream that has not asked may be waiting for)."""
        draft = self.draft
        drafts = set(draft._asked) if draft is not None else set()
        missing = self._active - self._prefilling - set(self._asked) - drafts
        if drafts and (not missing or waited >= self.wait_s):
            return draft
        if not self._asked or drafts:
            return None
        if not missing:
            return self
        late = waited >= self.wait_s and not DECODER.pending
        if late and (not missing & self._drafting or waited >= DRAFTING_WAIT_S):
            return self
        return None

    def _run_asked(self) -> None:
        """The passes the streams are waiting for, joined; their streams woken. Called holding the lock."""
        if self._asked:
            self._run_joined(list(self._asked.values()))
            self._asked.clear()
            self._cond.notify_all()

    def _prefill(self, stream: StreamBackend, tokens: list[int], n_logits: int) -> np.ndarray:
        """A long pass (a prompt): in batches of n_batch tokens, as LlamaBackend.forward makes them (the same
        kernels, so the same cache), each a decode of its own. Between batches the decoding streams' joined pass
        runs, so a long prompt holds them up by one batch at a time; and they do not wait for this stream's."""
        rows, first_out = [], len(tokens) - n_logits
        head = self.target or self
        with self._cond:
            self._prefilling.add(stream.seq)
            self._cond.notify_all()  # passes waiting for this stream's need not
        try:
            for at in range(0, len(tokens), self.backend.n_batch):
                chunk = tokens[at:at + self.backend.n_batch]
                p = _Pass(stream.seq, chunk, max(0, at + len(chunk) - max(first_out, at)))
                with self._cond:  # the decoding streams' next pass first (waited for up to wait_s)
                    start, decodes = time.monotonic(), head._group_decodes()
                    while head._group_decodes() == decodes:
                        waited = time.monotonic() - start
                        ready = head._ready(waited)
                        if ready is not None:
                            ready._run_asked()
                        elif waited < self.wait_s:
                            self._cond.wait(timeout=self.wait_s - waited)
                            continue
                        break
                    self._run([p])
                    self._cond.notify_all()
                if p.error is not None:
                    raise p.error
                rows.append(p.rows)
        finally:
            with self._cond:
                self._prefilling.discard(stream.seq)
                self._cond.notify_all()
        return np.concatenate(rows)

    def _group_decodes(self) -> int:
        return self.decodes + (self.draft.decodes if self.draft is not None else 0)

    def _run_joined(self, passes: list[_Pass]) -> None:
        """The passes in as few decodes as the context's outputs allow (backend.outputs rows each)."""
        group, rows = [], 0
        for p in passes:
            if group and rows + p.n_logits > self.backend.outputs:
                self._run(group)
                group, rows = [], 0
            group.append(p)
            rows += p.n_logits
        self._run(group)

    def _run(self, passes: list[_Pass]) -> None:
        """One llama_decode of the passes' rows, each stream's on its sequence after its cached tokens; rows, or
        the error, handed to each pass, and the streams' tokens extended."""
        backend = self.backend
        passes = sorted(passes, key=lambda p: p.seq)  # llama.cpp's order where each sequence has a pool of cells
        gaps, filler = ([], 0) if backend.unified else self._gaps(passes)
        items, outputs = [], []  # outputs: per pass, its first output's index among the batch's outputs
        fed = []  # (what reads a pass's rows, their positions, the first's batch index)
        n_out = 0
        for seq, p in sorted([(p.seq, p) for p in passes] + [(seq, None) for seq in gaps], key=lambda e: e[0]):
            start = len(self._streams[seq].tokens)
            if p is None:  # a filler after the idle stream's cached tokens, its cells taken out after the decode
                items.extend((passes[0].tokens[0], start + j, seq, False) for j in range(filler))
                continue
            first_out = len(p.tokens) - p.n_logits
            if seq in self.feed:
                fed.append((self.feed[seq], list(range(start, start + len(p.tokens))), len(items)))
            items.extend((tok, start + j, seq, j >= first_out) for j, tok in enumerate(p.tokens))
            outputs.append(n_out)
            n_out += p.n_logits
        try:
            def decode():
                backend._decode(items)
                for read, positions, first in fed:
                    read(positions, first)
                return _rows(backend, n_out).copy() if n_out else None  # a prompt's batch before its last has none

            rows = DECODER.call(decode)
        except EdgespecError as error:
            for seq in [p.seq for p in passes] + gaps:
                stream = self._streams[seq]
                _lib().llama_memory_seq_rm(backend._mem, seq, len(stream.tokens), -1)  # whatever got in
            for p in passes:
                p.error = error
            return
        for seq in gaps:  # the fillers' cells, out again
            _lib().llama_memory_seq_rm(backend._mem, seq, len(self._streams[seq].tokens), -1)
        self.decodes += 1
        self.rows_decoded += len(items)
        for p, first in zip(passes, outputs, strict=True):
            p.rows = rows[first:first + p.n_logits] if n_out else np.empty((0, backend.vocab.n_vocab), dtype=np.float32)
            self._streams[p.seq].tokens.extend(p.tokens)

    def _gaps(self, passes: list[_Pass]) -> tuple[list[int], int]:
        """The idle sequences a decode of `passes` (in sequence order) fills, and the filler tokens each gets.
        Where each sequence has a pool of cells, llama.cpp computes a decode in passes (llama_batch_allocr::
        split_equal): the first takes as many tokens from each of a run of consecutive sequences as the one with
        fewest brings, the next the same of what is left, and so on; each pass reads the weights again. So each
        gap between the streams gets as many filler tokens after its cached ones (no logits) as the shortest pass
        brings (a token, where streams decode a token each or a draft is verified beside them): a row each where a
        split would cost a pass. A gap without room in its cells is left to llama.cpp's split."""
        length = min(len(p.tokens) for p in passes)
        asked = {p.seq for p in passes}
        gaps = [seq for seq in range(passes[0].seq + 1, passes[-1].seq) if seq not in asked]
        if any(len(self._streams[seq].tokens) + length > self._streams[seq].n_ctx for seq in gaps):
            return [], 0
        return gaps, length

    def head_call(self, seq: int, fn, drafting: bool):
        """fn() on the decode thread, for stream `seq`'s head drafter (drafts/llama_head.LlamaHeadDrafter._call):
        one call at a time into a decoder context the streams share, on the thread whose OpenMP team runs the
        target's passes. drafting: the call drafts, so the others' verify waits for this stream's (up to
        DRAFTING_WAIT_S) as it waits for a draft model's steps."""
        if drafting:
            with self._cond:
                if seq in self._active:  # not a measurement before any generation
                    self._drafting.add(seq)
        return DECODER.call(fn)

    def _rollback(self, stream: StreamBackend, n_past: int) -> None:
        with self._cond:
            if not _lib().llama_memory_seq_rm(self.backend._mem, stream.seq, n_past, -1):
                raise RuntimeError(f"llama_memory_seq_rm refused to truncate stream {stream.seq} to {n_past}")
            del stream.tokens[n_past:]


class StreamBackend(Backend):
    """Sequence `seq` of a SharedContext as a Backend: its own tokens, its passes joined with the other streams'.
    Its context is its share of the cache's cells."""

    def __init__(self, shared: SharedContext, seq: int):
        backend = shared.backend
        self.shared, self.seq = shared, seq
        self.name, self.vocab = backend.name, backend.vocab
        self.n_ctx = backend.n_ctx // backend.sequences
        self.n_threads = backend.n_threads
        self.tokens: list[int] = []

    def forward(self, tokens: Sequence[int], n_logits: int, *, copy: bool = True) -> np.ndarray:
        check_forward(self, len(tokens), n_logits, MAX_OUTPUTS)
        return self.shared._forward(self, tokens, n_logits)

    def rollback(self, n_past: int) -> None:
        if n_past < 0 or n_past > len(self.tokens):
            raise ValueError(f"cannot roll back to {n_past} with {len(self.tokens)} tokens cached")
        self.shared._rollback(self, n_past)

    def keep_states(self, cache: PromptCache | None) -> bool:
        """The context's: every stream of it (and of the draft model's context, its own) saves into `cache`."""
        self.shared.states = cache
        return True

    def recall(self, tokens: Sequence[int], common: int) -> int:
        """See Backend.recall: with the context's `states`, a state saved from any of its streams may be copied in
        (backends/llama/states.py), holding the lock that every decode of the context holds."""
        shared = self.shared
        if shared.states is None or not shared.states.worth(len(self.tokens), len(tokens), common):
            return common
        with shared._cond:  # the tokens change with the cells: the others' decodes fill gaps after them
            held = shared.states.recall(shared, shared.backend._ctx, shared.backend._mem, self.seq, self.tokens,
                                        tokens, common)
            if held is None:
                return common
            self.tokens[:] = held
        return common_prefix(held, tokens)

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        return self.shared.backend.tokenize(text, special=special)

    def chat_template(self) -> str | None:
        return self.shared.backend.chat_template()

    def memory(self) -> dict[str, int]:
        return self.shared.backend.memory()

    def placement(self) -> dict:
        return self.shared.backend.placement()


def _rows(backend: LlamaBackend, n_out: int) -> np.ndarray:
    """The last decode's n_out logits rows [n_out, V], a view of llama.cpp's output buffer (valid until the next
    decode); more than the MAX_OUTPUTS rows LlamaBackend reads where several streams' passes shared the decode."""
    if n_out <= MAX_OUTPUTS:
        return backend._output_rows(n_out)
    n_vocab = backend.vocab.n_vocab
    buffer = (ctypes.c_float * (n_out * n_vocab)).from_address(backend._logits_address(backend._ctx))
    return np.frombuffer(buffer, dtype=np.float32).reshape(n_out, n_vocab)
