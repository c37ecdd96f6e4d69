"""Several generations at once on one llama.cpp target: the Python API's way to serve many clients.

`Parallel` opens the target (and a draft model, if one is asked for) once, with a sequence per stream
(backends/llama/streams.py), and answers a list of requests with up to `streams` of them decoding together: every
round, the streams' verify passes run as one llama_decode (a pass waits briefly for the others'), and the steps of
the streams drafting with a draft model run as one decode of the draft. Each stream keeps its own
sampling parameters, generator, drafter and controller, so each answer is distributed as target-only decoding of
its request, exactly as one stream's is; greedy answers equal each request decoded alone up to llama.cpp's rounding
of rows computed beside others' (a near-tie may flip, as answer_many's do). ONNX targets run one stream at a time
(api.Engine).

    with Parallel("target.gguf", "ngram", streams=4) as p:
        results = p.generate(["Name three colors.", {"prompt": "Count to five.", "temperature": 0.7, "seed": 1}])
"""

from __future__ import annotations

import copy
import os
import queue
import threading
from collections.abc import Sequence

from edgespec.api import Engine, Result, open_engine
from edgespec.backends.llama.backend import LlamaBackend
from edgespec.backends.llama.streams import SharedContext
from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.decode.calibrate import controller_for, measure_pass_costs
from edgespec.drafts.base import MAX_DRAFT, PromptLookupDrafter
from edgespec.drafts.spec import llama_head, model_drafter
from edgespec.pair import Pair
from edgespec.run import K_MAX, Run, resolve_run


def open_run(run: Run) -> Engine | Parallel:
    """A Run opened: an Engine for one stream, a Parallel (an Engine a stream) for several. Both are what the server
    serves (server.Served)."""
    return open_engine(run) if run.streams == 1 else Parallel(run)


def _rows_costs(measured: dict[int, float], rows: int) -> dict[int, float]:
    """Pass costs for 1..rows rows from those measured (1..n), never less for more rows (timings are noisy);
    beyond n, on the line through the last two (a pass of more rows than one stream sends)."""
    n, costs, most = max(measured), {}, 0.0
    step = max(measured[n] - measured[n - 1], 0.0) if n > 1 else measured[n]
    for r in range(1, rows + 1):
        most = max(most, measured[r] if r <= n else measured[n] + step * (r - n))
        costs[r] = most
    return costs


class Parallel:
    """Up to `streams` generations at once on one llama.cpp target (see the module docstring).

    target: a GGUF file or hub name (None: the default model). draft: "auto" (api.load's choice: prompt lookup, or
    a catalogued draft model for a hub target), "none", "ngram" (prompt lookup per stream) or a draft model (GGUF
    file or hub name, the target's vocabulary, padded, or another tokenizer; its steps joined across streams as
    the target's passes are), "mtp", or an EAGLE-3 or DFlash GGUF (one decoder context beside the target, a
    sequence a stream: drafts/llama_head.for_streams); EAGLE-1 and Medusa heads and prompt lookup in front of a
    draft run one stream at a time (run.one_stream_reason). n_ctx: each stream's context. gpu_layers: target
    and draft layers on the GPU (default: where this llama.cpp has a GPU, what the plan for this machine puts
    there). device, budget, kv_type, profiles: plan the memory of `streams` contexts (run.plan_for) and refuse
    what cannot fit before any weights load. target: also a Run (run.resolve_run), every other argument then
    unread."""

    def __init__(self, target: str | os.PathLike | Pair | Run | None = None, draft: str | os.PathLike | None = "ngram",
                 *, streams: int = 4, n_ctx: int = 2048, threads: int | None = None,
                 gpu_layers: int | str | None = None, k_max: int = K_MAX, device: str | None = None,
                 budget: str | int | None = None, kv_type: str | None = None,
                 profiles: str | os.PathLike | None = None):
        run = resolve_run(target, draft, streams=streams, n_ctx=n_ctx, threads=threads, gpu_layers=gpu_layers,
                          k_max=k_max, device=device, budget=budget, kv_type=kv_type, profiles=profiles)
        self.run = run
        spec, streams, n_ctx, k_max = run.pair.draft, run.streams, run.n_ctx, run.k_max
        heads = spec.family == "heads"  # an EAGLE-3 head, DFlash or MTP layer (run.one_stream_reason: no others)
        self._own_pass = (spec.kind == "lookup" or heads) and not run.one_pool  # a draft's rows: a pass of their own
        self.streams = streams
        self._lock = threading.Lock()

        def shared(path, ctx, settings, drafts_for=None, **more):
            return SharedContext(LlamaBackend(path, n_ctx=ctx * streams, n_threads=run.threads, sequences=streams,
                                              overlap=False, outputs=streams * MAX_OUTPUTS, unified=run.one_pool,
                                              **settings.as_kwargs(), **more), drafts_for=drafts_for)

        self.target = shared(run.pair.target, n_ctx, run.target_settings, load_mtp=spec.kind == "mtp")
        self.draft = self.heads = None
        try:
            # passes of up to streams + k_max rows: a stream drafting k beside others that send a token each
            self._rows_cost = _rows_costs(measure_pass_costs(self.target.stream(0), min(streams + k_max, MAX_OUTPUTS)),
                                          streams + k_max)
            self._k_max, self._active = k_max, set()
            costs = self._batch_costs(1)
            draft_cost = 0.0
            if heads:  # one decoder context, a sequence a stream (drafts/llama_head.for_streams)
                self.heads = llama_head(spec, self.target.backend, threads=run.threads)
                drafters = self.heads.for_streams(self.target)
                draft_cost = self.heads.measure_cost()
            elif spec.kind == "model":
                # its steps join those of the other streams drafting (backends/llama/streams.py), but a step is
                # priced whole, as if the others did not draft: what it adds to the round where it drafts alone
                # (the others' verify waits for it). Priced as a share of a step of every generating stream, a
                # stream whose text drafted well drafted alone at a fraction of its cost: at 2 streams 93 tok/s
                # against 97 target-only, the draft model declined (docs/results/2026-11-27-streams-draft.md)
                self.draft = shared(spec.source, min(n_ctx, 1024) + MAX_DRAFT, run.draft_settings, self.target)
                draft_cost = measure_pass_costs(self.draft.stream(0), 1)[1]
            draft_streams = [self.draft.stream(i) if self.draft else None for i in range(streams)]
            if not heads:
                drafters = [model_drafter(backend, self.target.backend.vocab, quiet=i > 0) if backend is not None
                            else PromptLookupDrafter(self.target.backend.vocab.n_vocab) if spec.kind == "lookup"
                            else None for i, backend in enumerate(draft_streams)]
            # one controller built for the pair (its prior and reading cost measured once), a copy a stream
            first = controller_for(self.target.stream(0), drafters[0], draft_streams[0], costs, draft_cost, k_max,
                                   learn_costs=False)
            self.engines: list[Engine] = [
                Engine(self.target.stream(i), drafter, copy.deepcopy(first), draft_streams[i], run.plan,
                       draft_choice=dict(run.pair.choice)) for i, drafter in enumerate(drafters)]
        except BaseException:
            self.close()
            raise

    @property
    def name(self) -> str:
        """The target's name (its file's)."""
        return self.target.backend.name

    @property
    def plan(self):
        """The memory plan the streams were loaded with (None where no device or budget asked): the Run's."""
        return self.run.plan

    @property
    def draft_choice(self) -> dict:
        """What "auto" chose and why, or the draft asked for: the Run's."""
        return dict(self.run.pair.choice)

    @property
    def draft_name(self) -> str:
        return self.engines[0].draft_name

    def placement(self) -> dict:
        """Where the models run (Engine.placement), with the number of streams."""
        return {**self.engines[0].placement(), "streams": self.streams}

    def begin(self, stream: int) -> None:
        """Stream `stream` starts a generation: the others' passes wait briefly for its (SharedContext.begin), and
        every stream's controller prices its passes among one more."""
        self.target.begin(stream)  # the draft model's context is scheduled with the target's: one begin for both
        self._reprice(stream, True)

    def end(self, stream: int) -> None:
        self.target.end(stream)
        self._reprice(stream, False)

    def _reprice(self, stream: int, generating: bool) -> None:
        """Price every stream's passes among the streams generating now. A stream that generates alone learns its
        passes' costs as one Engine does (its loop's timings, the host's work of a round included, which passes
        timed at load leave out: on the reference pair's server 11-13 ms a one-token round against 10 ms timed,
        enough to decline a draft model one Engine drafts with: docs/results/2026-11-27-parallel-auto.md); once
        another stream begins or it ends, what it learnt becomes the passes of that many rows in every stream's
        prices, and its fit of the draft model's step (if it drafts with one) every stream's: without it a client
        whose requests take each stream in turn (no prompt cache) would leave each controller a quarter of the
        rounds to fit from."""
        with self._lock:
            if len(self._active) == 1:
                alone = self.engines[next(iter(self._active))].controller
                if alone is not None and alone.learn_costs:
                    learnt = {**self._rows_cost, **{n: alone.target_costs[n] for n in range(1, self._k_max + 2)}}
                    self._rows_cost = _rows_costs(learnt, len(learnt))
                    for engine in self.engines:
                        if engine.controller is not alone:
                            engine.controller.take_draft_costs(alone)
            (self._active.add if generating else self._active.discard)(stream)
            costs = self._batch_costs(max(len(self._active), 1))
            for i, engine in enumerate(self.engines):
                if engine.controller is not None:
                    engine.controller.set_pass_costs(costs)
                    engine.controller.learn_costs = self._active == {i}

    def _batch_costs(self, active: int) -> dict[int, float]:
        """What a verify of n tokens costs a stream among `active` generating streams that send a token each: its
        share of the joined pass of `active` rows, and the rows its drafts add to it. With C(r) a pass of r rows,
        c(n) = C(active) / active + C(active - 1 + n) - C(active). Choosing by these, a stream drafts exactly
        where its expected extra tokens beat the batch's tokens per second for the time its rows add (a verify
        of 4 streams x 5 tokens is not 4 verifies of 5); alone (active 1) they are the measured costs. Where each
        stream has a pool of cells and others generate, llama.cpp computes the rows a draft adds as a pass of its
        own (passes of several drafting streams join only where their sequences are consecutive): c(n) =
        C(active) / active + C(n - 1), so a stream drafts where its draft pays even alone."""
        c = self._rows_cost
        if self._own_pass and active > 1:
            return {n: c[active] / active + (c[n - 1] if n > 1 else 0.0) for n in range(1, self._k_max + 2)}
        return {n: c[active] / active + c[active - 1 + n] - c[active] for n in range(1, self._k_max + 2)}

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
            engine = self.engines[stream]
            while True:
                try:
                    i, request = todo.get_nowait()
                except queue.Empty:
                    return
                self.begin(stream)
                try:
                    results[i] = engine.generate(request.pop("prompt"), **{**common, **request})
                except BaseException as error:  # noqa: BLE001 (handed to the caller below)
                    errors.append(error)
                finally:
                    self.end(stream)

        workers = [threading.Thread(target=serve, args=(s,), daemon=True)
                   for s in range(min(self.streams, len(requests)))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            raise errors[0]
        return results

    def cache_prompts(self, cache) -> bool:
        """Engine.cache_prompts for every stream: states saved from one stream are restored into any other."""
        return all([engine.cache_prompts(cache) for engine in self.engines])

    def close(self) -> None:
        if self.heads is not None:  # its context reads the target's: it goes first
            self.heads.close()
            self.heads = None
        for shared in (self.target, self.draft):
            if shared is not None:
                shared.close()

    def __enter__(self) -> Parallel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
