"""Several generations at once on one llama.cpp target: the Python API's way to serve many clients.

`Parallel` opens the target (and a draft model, if one is asked for) once, with a sequence per stream
(backends/llama/streams.py), and answers a list of requests with up to `streams` of them decoding together: every
round, the streams' verify passes run as one llama_decode (a pass waits briefly for the others'), and a draft
model's steps join those of other streams already waiting (without waiting themselves). Each stream keeps its own
sampling parameters, generator, drafter and controller, so each answer is distributed as target-only decoding of
its request, exactly as one stream's is; greedy answers equal each request decoded alone up to llama.cpp's rounding
of rows computed beside others' (a near-tie may flip, as answer_many's do). ONNX targets run one stream at a time
(api.Engine).

    with Parallel("target.gguf", "ngram", streams=4) as p:
        results = p.generate(["Name three colors.", {"prompt": "Count to five.", "temperature": 0.7, "seed": 1}])
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Sequence
from pathlib import Path

from edgespec.api import K_MAX, Engine, Result
from edgespec.backends.llama.backend import LlamaBackend
from edgespec.backends.llama.streams import SharedContext
from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.decode.cost import DraftController, measure_pass_costs
from edgespec.drafts.base import MAX_DRAFT, PromptLookupDrafter
from edgespec.errors import EdgespecError
from edgespec.plan.placement import ALL_LAYERS, gpu_name


class Parallel:
    """Up to `streams` generations at once on one llama.cpp target (see the module docstring). draft: "none",
    "ngram" (prompt lookup per stream) or a draft model's GGUF (its steps joined across streams as the target's
    passes are). n_ctx: each stream's context. gpu_layers: target and draft layers on the GPU (default: all where
    this llama.cpp has a GPU)."""

    def __init__(self, target: str | os.PathLike, draft: str | os.PathLike = "ngram", *, streams: int = 4,
                 n_ctx: int = 2048, threads: int | None = None, gpu_layers: int | None = None, k_max: int = K_MAX):
        if Path(target).suffix.lower() != ".gguf":
            raise EdgespecError(f"{target}: several streams at once need a GGUF target (llama.cpp); an ONNX target "
                                "answers one request at a time")
        if not 1 <= streams <= MAX_OUTPUTS:
            raise EdgespecError(f"streams must be 1 to {MAX_OUTPUTS} (the sequences a context holds), got {streams}")
        layers = gpu_layers if gpu_layers is not None else (ALL_LAYERS if gpu_name() else 0)
        self.streams = streams

        def shared(path, ctx):
            return SharedContext(LlamaBackend(path, n_ctx=ctx * streams, n_threads=threads, n_gpu_layers=layers,
                                              sequences=streams, overlap=False, outputs=streams * MAX_OUTPUTS))

        self.target = shared(target, n_ctx)
        self.draft = None
        try:
            if self.target.stream(0).n_ctx < n_ctx:  # llama.cpp holds a model to the context it was trained for
                raise EdgespecError(f"{streams} streams of {n_ctx} tokens need {streams * n_ctx} cells, more than "
                                    f"{Path(target).name} was trained for ({self.target.backend.n_ctx}): ask for "
                                    "fewer streams or a shorter context")
            costs = measure_pass_costs(self.target.stream(0), k_max + 1)
            draft_cost = 0.0
            if os.fspath(draft) not in ("none", "ngram"):
                self.draft = shared(draft, min(n_ctx, 1024) + MAX_DRAFT)
                draft_cost = measure_pass_costs(self.draft.stream(0), 1)[1]
        except BaseException:
            self.close()
            raise
        self._engines = []
        for i in range(streams):
            if self.draft is not None:
                from edgespec.drafts.spec import model_drafter

                drafter = model_drafter(self.draft.stream(i), self.target.backend.vocab)
            else:
                drafter = PromptLookupDrafter(self.target.backend.vocab.n_vocab) if os.fspath(draft) == "ngram" \
                    else None
            controller = DraftController(dict(costs), draft_cost, k_max) if drafter is not None else None
            self._engines.append(Engine(self.target.stream(i), drafter, controller,
                                        self.draft.stream(i) if self.draft else None))

    def generate(self, requests: Sequence[str | dict], **common) -> list[Result]:
        """Answer each request (a prompt, or a dict of Engine.generate's arguments with "prompt"), `common`
        arguments applied to all; up to `streams` at once, the rest as streams come free. Results in request
        order; the first error a request raised is raised once all have ended."""
        todo: queue.Queue = queue.Queue()
        for i, request in enumerate(requests):
            todo.put((i, {"prompt": request} if isinstance(request, str) else dict(request)))
        results: list[Result | None] = [None] * len(requests)
        errors: list[BaseException] = []

        def serve(stream: int) -> None:
            engine = self._engines[stream]
            while True:
                try:
                    i, request = todo.get_nowait()
                except queue.Empty:
                    return
                self.target.begin(stream)  # a draft model's steps join whichever others are waiting, never wait
                try:
                    results[i] = engine.generate(request.pop("prompt"), **{**common, **request})
                except BaseException as error:  # noqa: BLE001 (handed to the caller below)
                    errors.append(error)
                finally:
                    self.target.end(stream)

        workers = [threading.Thread(target=serve, args=(s,), daemon=True)
                   for s in range(min(self.streams, len(requests)))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            raise errors[0]
        return results

    def close(self) -> None:
        for shared in (self.target, self.draft):
            if shared is not None:
                shared.close()

    def __enter__(self) -> Parallel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
