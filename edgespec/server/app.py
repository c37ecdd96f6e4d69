"""`edgespec serve`: an OpenAI-compatible HTTP server over what `load` or `Parallel` loaded (FastAPI on uvicorn).

Endpoints: POST /v1/chat/completions (with OpenAI tools: edgespec/tool_calls.py) and /v1/completions (streamed
as server-sent events with "stream": true; bodies in edgespec/server/requests.py), GET /v1/models, GET /health,
GET /metrics (Prometheus text; no key needed, like /health), and the chat page at / (edgespec/web).
Every completion carries its generation's speculative statistics (drafted, accepted, acceptance rate, ...)
in an extra top-level `edgespec` field, which OpenAI clients ignore; a stream sends them with its last chunk.

One generation at a time on an Engine, which holds one KV cache per model; or one per stream of a Parallel
(`edgespec serve --parallel N`: a sequence of one llama.cpp context each, their passes joined into one decode a
round). Requests take the slots as they come free (first come, first served; edgespec/server/limits.py), the
slot whose cache holds the request's conversation so far where one does (its prefix is not read again), and
each generation runs on its slot's worker thread, leaving the event loop free to accept requests and to notice
disconnects. A client that goes away stops its generation at the next token (Stream.close), which frees its
slot; the next generation there re-syncs the caches from its own prompt, so nothing of a cancelled one carries
over. At most `max_queue` requests are admitted at once (those generating included); more are refused with a
429 and a Retry-After header. A request that runs past
`request_timeout` seconds from its arrival, waiting included, is stopped and answered with a 504 (a stream
that has started ends with an error event instead). Errors come back in OpenAI's shape
(edgespec/server/errors.py).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from fastapi import Depends, FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from edgespec.api import Engine
from edgespec.backends.llama.states import GAIN_TOKENS, PromptCache
from edgespec.backends.protocol import common_prefix
from edgespec.decode.loop import Stats
from edgespec.errors import EdgespecError
from edgespec.server.errors import (
    KeyRefusedError,
    RequestTimeoutError,
    add_error_handlers,
    documented,
    error,
    failure,
    openapi_as_served,
    queue_full,
)
from edgespec.server.limits import Admission, CountResponses, Metrics
from edgespec.server.requests import ChatRequest, CompletionRequest, Sampling
from edgespec.tool_calls import CallReader, ToolSet
from edgespec.web import add_page

FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}  # ours -> OpenAI's


class Generation:
    """One request's generation on a worker thread; its events arrive on an asyncio queue as
    ("event", Event), then ("done", Stream) or ("error", exception). stop() ends it at the next token.
    on_end(generation) runs on the event loop once its slot is free, before the last item arrives.
    whole: the events arrive together at the end (an answer sent whole needs no wake-up of the event loop per
    token: on two cores, work beside a pass slows the pass)."""

    def __init__(self, slots: Slots, slot: int, prompt, chat: bool, args: dict, on_end, whole: bool = False):
        self.slot = slot
        self.queue: asyncio.Queue = asyncio.Queue()
        self._stop = threading.Event()
        self.finish_reason: str | None = None  # the loop's, once the thread has ended
        self.stats: Stats | None = None  # the loop's, once it has started
        self.tools: ToolSet | None = None  # the request's tools as the stream reads its calls, once started
        self.started = time.perf_counter()
        loop = asyncio.get_running_loop()
        held = []  # events of a whole answer, put with the last item

        def put(*items):
            loop.call_soon_threadsafe(lambda: [self.queue.put_nowait(item) for item in items])

        def run():
            slots.begin(slot)
            try:
                stream = slots.engines[slot].stream(prompt, chat=chat, **args)
                self.stats, self.tools = stream.stats, stream.tools
                for event in stream:
                    if self._stop.is_set():
                        break
                    if whole:
                        held.append(("event", event))
                    else:
                        put(("event", event))
                stream.close()
                self.finish_reason = stream.stats.finish_reason
                last = ("done", stream)
            except Exception as e:  # EdgespecError for the client; anything else is ours, reported as 500
                last = ("error", e)
            finally:
                slots.end(slot)
            loop.call_soon_threadsafe(on_end, self)  # before the last item: counted by the time the client hears
            put(*held, last)

        loop.run_in_executor(slots.executor, run)

    def stop(self) -> None:
        self._stop.set()



class Served(Protocol):
    """What the server talks to, whatever the number of streams: an Engine (a stream of one) or a Parallel."""

    engines: Sequence[Engine]  # a stream each; a slot each
    name: str  # the target's
    draft_name: str

    def begin(self, stream: int) -> None: ...  # a stream starts a generation (the others' passes may wait for it)

    def end(self, stream: int) -> None: ...

    def cache_prompts(self, cache: PromptCache | None) -> bool: ...


class Slots:
    """What the app serves: its streams (Served.engines), a slot each (one generation at a time on an Engine,
    which holds one cache per model); a worker thread per slot (executor: the one an Engine was loaded on,
    `loading_thread`). begin/end bracket a slot's generation (a Parallel's streams wait briefly for each other's
    passes while they generate)."""

    def __init__(self, served: Served, executor: ThreadPoolExecutor | None = None):
        self.engines: Sequence[Engine] = served.engines
        self.name, self.draft = served.name, served.draft_name
        self.begin, self.end = served.begin, served.end
        self.executor = executor or ThreadPoolExecutor(len(self.engines), thread_name_prefix="edgespec-slot")
        self._used = [0] * len(self.engines)  # when each slot last took a request (a count)
        self.saving = False  # whether the slots save a conversation's state before another overwrites it

    def pick(self, prompt, chat: bool, **tools):
        """A function choosing a request's slot among the free ones: the one whose cache holds the prompt's
        conversation so far, where one does (at least half its cached tokens lead the prompt: its next turn),
        else the one used longest ago (the conversation least likely to come back). Where the slots save what they
        drop (`saving`: a prompt cache), the one whose cache holds most of the prompt also where that is a few
        tokens more than the other: its conversation's state is saved before the request overwrites it. tools:
        the request's, which the template lists before the conversation (Engine.prompt_tokens)."""
        tokens = self.engines[0].prompt_tokens(prompt, chat=chat, **tools) if len(self.engines) > 1 else []

        def choose(free: list[int]) -> int:
            held = {slot: common_prefix(self.engines[slot].target.tokens, tokens) for slot in free}
            best, oldest = max(free, key=held.__getitem__), min(free, key=self._used.__getitem__)
            cached = len(self.engines[best].target.tokens)
            nearer = self.saving and held[best] - held[oldest] >= GAIN_TOKENS
            slot = best if cached and (held[best] * 2 >= cached or nearer) else oldest
            self._used[slot] = max(self._used) + 1
            return slot

        return choose


def loading_thread() -> ThreadPoolExecutor:
    """A worker thread to load an Engine on and then to serve it from (create_app's executor): llama.cpp's CPU
    passes take 1.5x as long once a second thread has decoded (backends/llama/streams.py, _DecodeThread), and
    loading measures passes."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgespec-slot")


# what the generating routes answer: the completion as JSON, or with "stream": true its chunks as server-sent events
# (the schema an event's: its data a chunk as JSON, the last one [DONE]); the refusals, each in OpenAI's error shape
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string", "description": "a chunk as JSON, then [DONE]"},
                            "event": {"type": "string"}, "id": {"type": "string"}}}
GENERATING = {200: {"description": "the completion (JSON), or its chunks as server-sent events with \"stream\": true",
                    "content": {"text/event-stream": {"schema": SSE_EVENT}}},
              **documented(400, 401, 429, 500, 504)}


def create_app(engine: Served, *, api_key: str | None = None, model_id: str | None = None,
               default_max_tokens: int = 256, max_queue: int = 16, request_timeout: float | None = 600.0,
               executor: ThreadPoolExecutor | None = None, prompt_cache: PromptCache | None = None) -> FastAPI:
    """The app serving `engine`: an Engine (one generation at a time) or a Parallel (one a stream). api_key:
    required as 'Authorization: Bearer KEY' when set (not on /health or /metrics). model_id: the name /v1/models
    lists and responses report (default: the target's file name). max_queue: most requests admitted at once,
    those generating included; more get a 429. request_timeout: seconds a request may take from its arrival,
    waiting included (None: no limit). executor: where an Engine's generations run: the loading_thread() it was
    loaded on (default: a new thread; on the CPU its passes then take longer than on the loading thread).
    prompt_cache: where the models save the states of prompts they read (backends/llama/states.py; GGUF models), so a
    conversation's next turn starts from its state after other requests took its slot."""
    if max_queue < 1:
        raise EdgespecError(f"the queue must hold at least 1 request, got {max_queue}")
    if request_timeout is not None and request_timeout <= 0:
        raise EdgespecError(f"the request timeout must be positive, got {request_timeout}")
    slots = Slots(engine, executor)
    if prompt_cache is not None and not engine.cache_prompts(prompt_cache):
        prompt_cache = None  # an ONNX target's cache keeps no saved states
    slots.saving = prompt_cache is not None and prompt_cache.capacity > 0
    served = model_id or slots.name
    admission = Admission(max_queue, len(slots.engines))
    metrics = Metrics()
    last = {"finish_reason": None}  # of the last generation, for /health
    app = FastAPI(title="edgespec", description="OpenAI-compatible speculative decoding server")
    app.add_middleware(CountResponses, metrics=metrics)
    add_error_handlers(app)
    openapi_as_served(app)
    add_page(app, api_key_required=api_key is not None)

    def authorize(request: Request):
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise KeyRefusedError

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": served, "draft": slots.draft, "busy": admission.in_flight > 0,
                "slots": admission.slots, "slots_busy": admission.in_flight, "waiting": admission.waiting,
                "last_finish_reason": last["finish_reason"],
                "prompt_cache": prompt_cache.stats() if prompt_cache is not None else None}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus():
        return PlainTextResponse(metrics.text(admission.waiting, admission.in_flight, max_queue, admission.slots,
                                              prompt_cache.stats() if prompt_cache is not None else None),
                                 media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", dependencies=[Depends(authorize)], responses=documented(401))
    async def models():
        return {"object": "list", "data": [{"id": served, "object": "model", "created": 0, "owned_by": "edgespec"}]}

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)], responses=GENERATING)
    async def chat(body: ChatRequest, request: Request):
        messages = [m.to_dict() for m in body.messages]
        return await complete(request, body, messages, chat=True)

    @app.post("/v1/completions", dependencies=[Depends(authorize)], responses=GENERATING)
    async def completions(body: CompletionRequest, request: Request):
        return await complete(request, body, body.prompt, chat=False)

    def ended(gen: Generation) -> None:
        last.update(finish_reason=gen.finish_reason)
        metrics.add(gen.stats, time.perf_counter() - gen.started)
        admission.leave(gen.slot)

    async def complete(request: Request, body: Sampling, prompt, chat: bool):
        problem = body.refusal()
        if problem:
            return error(400, problem[1], param=problem[0])
        if not admission.admit():
            return queue_full(admission.admitted, metrics.retry_after(admission.slots))
        deadline = None if request_timeout is None else asyncio.get_running_loop().time() + request_timeout
        ids = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
               "model": served}
        try:
            pick = slots.pick(prompt, chat, **body.tool_args())
        except BaseException:
            admission.admitted -= 1
            raise
        try:
            slot = await admission.turn(deadline, pick)
        except TimeoutError:
            return failure(RequestTimeoutError(request_timeout))
        try:
            gen = Generation(slots, slot, prompt, chat, body.engine_args(default_max_tokens), ended,
                             whole=not body.stream)
        except BaseException:
            admission.leave(slot)
            raise
        watcher = asyncio.ensure_future(_stop_on_disconnect(request, gen))
        streaming = False  # once the response streams, _sse stops the generation
        try:
            first = await _next(gen, deadline, request_timeout)
            if first[0] == "error":  # refused before any token (e.g. the prompt overflows the context), or late
                return failure(first[1])
            if body.stream:
                streaming = True
                return StreamingResponse(_sse(gen, first, ids, chat, watcher, deadline, request_timeout),
                                         media_type="text/event-stream")
            return await _whole(gen, first, ids, chat, deadline, request_timeout)
        finally:
            if not streaming:
                gen.stop()
                watcher.cancel()

    return app


async def _next(gen: Generation, deadline: float | None, limit: float | None):
    """The generation's next item, or ("error", RequestTimeoutError) past the deadline, which stops it: the
    engine is free once its thread notices, at the next token."""
    try:
        async with asyncio.timeout_at(deadline):
            return await gen.queue.get()
    except TimeoutError:
        gen.stop()
        return "error", RequestTimeoutError(limit)


def _usage(stream) -> dict:
    s = stream.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated,
            "total_tokens": s.prompt_tokens + s.generated,
            "prompt_tokens_details": {"cached_tokens": s.cached_tokens}}


async def _stop_on_disconnect(request: Request, gen: Generation) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.2)
    gen.stop()


async def _whole(gen: Generation, item, ids: dict, chat: bool, deadline: float | None, limit: float | None):
    """Collect a whole answer."""
    pieces = []
    while item[0] == "event":
        pieces.append(item[1].text)
        item = await _next(gen, deadline, limit)
    if item[0] == "error":
        return failure(item[1])
    stream, text = item[1], "".join(pieces)
    finish = FINISH.get(stream.stats.finish_reason, "stop")
    message = {"role": "assistant", "content": text}
    if stream.tools is not None and stream.tool_calls:  # a call cut short (length) keeps that finish reason
        message = {**message, "content": stream.content, "tool_calls": stream.tool_calls}
        finish = "tool_calls" if finish == "stop" else finish
    choice = ({"index": 0, "message": message, "finish_reason": finish} if chat
              else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
    return {**ids, "object": "chat.completion" if chat else "text_completion", "choices": [choice],
            "usage": _usage(stream), "edgespec": stream.stats.to_dict()}


async def _sse(gen: Generation, item, ids: dict, chat: bool, watcher: asyncio.Future, deadline: float | None,
               limit: float | None):
    """Server-sent events for a stream; an error (a timeout included) is its last event before [DONE]. A client
    that disconnects cancels the response: `finally` (or the watcher, if the response never started) stops
    the generation. With tools, text that may be a call is held back and its calls sent at the end, a delta
    each; a forced call streams its name, then its arguments as they come (tool_calls.CallReader)."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None = None, first: bool = False, delta: dict | None = None,
              **extra) -> str:
        if chat:
            if delta is None:
                delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return f"data: {json.dumps({**ids, 'object': kind, 'choices': [choice], **extra})}\n\n"

    try:
        if chat:
            yield chunk(None, first=True)
        reader = CallReader(gen.tools) if gen.tools is not None else None
        while item[0] == "event":
            text, calls = reader.feed(item[1].text) if reader else (item[1].text, [])
            if text:  # from_draft: the page highlights the draft's accepted tokens
                yield chunk(text, edgespec={"from_draft": item[1].from_draft})
            for call in calls:  # a delta a chunk, as OpenAI sends them
                yield chunk(None, delta={"tool_calls": [call]})
            item = await _next(gen, deadline, limit)
        if item[0] == "error":
            refusal = failure(item[1])
            yield f"data: {refusal.body.decode()}\n\n"
        else:
            stream = item[1]
            finish = FINISH.get(stream.stats.finish_reason, "stop")
            if reader:
                rest, calls, called = reader.finish()
                if rest:
                    yield chunk(rest)
                for call in calls:
                    yield chunk(None, delta={"tool_calls": [call]})
                finish = "tool_calls" if called and finish == "stop" else finish
            yield chunk(None, finish, usage=_usage(stream), edgespec=stream.stats.to_dict())
        yield "data: [DONE]\n\n"
    finally:
        gen.stop()
        watcher.cancel()


def serve(engine: Served, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          default_max_tokens: int = 256, max_queue: int = 16, request_timeout: float | None = 600.0,
          executor: ThreadPoolExecutor | None = None, prompt_cache: PromptCache | None = None) -> None:
    """Serve `engine` until interrupted; the arguments after port are create_app's."""
    import uvicorn

    app = create_app(engine, api_key=api_key, default_max_tokens=default_max_tokens, max_queue=max_queue,
                     request_timeout=request_timeout, executor=executor, prompt_cache=prompt_cache)
    uvicorn.run(app, host=host, port=port, log_level="warning")
