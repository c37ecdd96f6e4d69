"""The worker: owns the edgespec Engine and runs every model call on its own QThread.

The window never touches the engine. It calls `load_models`, `start_answer` and `stop` (safe from any
thread) and listens to the signals; the first two queue a request onto the worker's thread, so loading
and decoding never block the UI. `stop` only sets a flag, which the worker checks between events and
then closes the stream on its own thread: the engine is only ever used from that thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

import edgespec
from edgespec.errors import EdgespecError


@dataclass(frozen=True)
class Progress:
    """A snapshot of a generation's statistics, for the status line."""

    generated: int
    drafted: int
    accepted: int
    tokens_per_second: float
    finish_reason: str | None = None  # None while tokens are still coming

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


def describe(engine: edgespec.Engine) -> str:
    """Which models are loaded, e.g. 'SmolLM2-135M-Instruct.Q4_1.gguf + ngram (ctx 2048)'."""
    draft = engine.draft_backend.name if engine.draft_backend else (engine.drafter.name if engine.drafter else "none")
    return f"{engine.target.name} + {draft} (ctx {engine.target.n_ctx})"


class ChatWorker(QObject):
    """Loads a target/draft pair and streams answers; lives on a QThread (see ChatWindow)."""

    loaded = Signal(object, str, str)  # target path, draft, a description of the pair
    piece = Signal(str, bool, object)  # text, from_draft, Progress
    finished = Signal(str, object)  # the whole answer, final Progress
    failed = Signal(str)  # a message for the user; the previous engine (if any) is kept

    _load_requested = Signal(object, str)
    _answer_requested = Signal(object, int, float)

    def __init__(self, threads: int | None = None):
        """threads: CPU threads for the models (default: edgespec's, the cores it may run on, up to 8)."""
        super().__init__()
        self.threads = threads
        self.engine: edgespec.Engine | None = None
        self._stop = threading.Event()
        # emitted from the UI thread, received on the worker's thread: Qt queues the call
        self._load_requested.connect(self._load)
        self._answer_requested.connect(self._answer)

    # called from the UI thread

    def load_models(self, target: str | Path | None, draft: str | Path) -> None:
        """Load target (None: the default model) with draft (a file, "ngram" or "none"), replacing the pair."""
        self._load_requested.emit(target, str(draft))

    def start_answer(self, messages: list[dict], max_tokens: int, temperature: float) -> None:
        """Answer the chat `messages` (a copy is taken), emitting `piece` per event, then `finished`."""
        self._stop.clear()  # here, not on the worker's thread: a Stop clicked right after Send still counts
        self._answer_requested.emit([dict(m) for m in messages], max_tokens, temperature)

    def stop(self) -> None:
        """Ask the running answer to stop after its current event."""
        self._stop.set()

    def close_engine(self) -> None:
        """Free the models; call only once the worker's thread has finished."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    # run on the worker's thread

    @Slot(object, str)
    def _load(self, target, draft: str) -> None:
        try:
            if target is None:
                from edgespec.models.default import default_target

                target = default_target()
            engine = edgespec.load(target, draft, threads=self.threads)
        except EdgespecError as e:
            self.failed.emit(f"could not load the models: {e}")
            return
        except Exception as e:  # a library's own error on a strange file must not end the app
            self.failed.emit(f"could not load the models: {type(e).__name__}: {e}")
            return
        self.close_engine()  # only now: a failed load keeps the pair that was working
        self.engine = engine
        self.loaded.emit(Path(target), draft, describe(engine))

    @Slot(object, int, float)
    def _answer(self, messages: list[dict], max_tokens: int, temperature: float) -> None:
        if self.engine is None:
            self.failed.emit("no model is loaded: pick one in the Model menu")
            return
        try:
            stream = self.engine.stream(messages, max_tokens=max_tokens, temperature=temperature)
            started = time.perf_counter()
            for event in stream:
                self.piece.emit(event.text, event.from_draft, _progress(stream.stats, started))
                if self._stop.is_set():
                    stream.close()
                    break
        except EdgespecError as e:  # e.g. the conversation outgrew the context
            self.failed.emit(str(e))
            return
        except Exception as e:
            self.failed.emit(f"generation failed: {type(e).__name__}: {e}")
            return
        self.finished.emit(stream.text, _progress(stream.stats))


def _progress(stats: edgespec.Stats, started: float | None = None) -> Progress:
    """Progress from Stats; `started` (perf_counter at the first event requested) for a live rate."""
    rate = stats.tokens_per_second
    if started is not None:  # Stats.decode_s is only added up when the stream ends: measure it here
        decode_s = time.perf_counter() - started - stats.prefill_s
        rate = stats.generated / decode_s if decode_s > 0 else 0.0
    return Progress(stats.generated, stats.drafted, stats.accepted, rate,
                    stats.finish_reason if started is None else None)
