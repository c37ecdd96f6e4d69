"""`edgespec serve`: an OpenAI-compatible HTTP server over one loaded Engine (FastAPI on uvicorn).

Endpoints: POST /v1/chat/completions and /v1/completions (streamed as server-sent events with
"stream": true), GET /v1/models, GET /health. Every completion carries its generation's speculative
statistics (drafted, accepted, acceptance rate, ...) in an extra top-level `edgespec` field, which
OpenAI clients ignore; a stream sends them with its last chunk.

One generation at a time: the engine holds one KV cache per model, so requests queue on a lock (first
come, first served) and each generation runs on a worker thread, leaving the event loop free to accept
requests and to notice disconnects. A client that goes away stops its generation at the next token
(Stream.close), which releases the lock; the next generation re-syncs the caches from its own prompt, so
nothing of a cancelled one carries over.

Errors come back in OpenAI's shape, {"error": {"message", "type", "param", "code"}}: 400 for a request
edgespec cannot serve (validation, unsupported options, a prompt longer than the context), 401 for a
missing or wrong API key.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid
from typing import Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from edgespec.api import Engine
from edgespec.errors import EdgespecError

FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}  # ours -> OpenAI's


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class Sampling(BaseModel):
    """What both endpoints accept: OpenAI's sampling fields plus edgespec's top_k, min_p and draft_max."""

    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we need not read (user, ...)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(1, ge=1)
    draft_max: int | None = Field(None, ge=0, le=15)
    logprobs: bool | int | None = None
    tools: list | None = None
    response_format: dict | None = None

    def unsupported(self) -> str | None:
        if self.n != 1:
            return "n must be 1: edgespec generates one answer per request"
        if self.logprobs:
            return "logprobs are not supported"
        if self.tools:
            return "tools are not supported"
        kind = (self.response_format or {}).get("type", "text")
        if kind not in ("text", "json_object", "json_schema"):
            return f"response_format {kind!r} is not supported (text, json_object, json_schema)"
        if kind == "json_schema" and not isinstance((self.response_format.get("json_schema") or {}).get("schema"),
                                                     dict):
            return "response_format json_schema needs json_schema.schema, a JSON schema object"
        return None

    def schema(self) -> dict | None:
        """The JSON schema the answer is constrained to (json_object: any object), if any."""
        kind = (self.response_format or {}).get("type", "text")
        return ({"type": "object"} if kind == "json_object" else
                self.response_format["json_schema"]["schema"] if kind == "json_schema" else None)

    def engine_args(self, default_max_tokens: int) -> dict:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return {"max_tokens": self.max_completion_tokens or self.max_tokens or default_max_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "seed": self.seed, "stop": stop, "draft_max": self.draft_max, "json_schema": self.schema()}


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)


class CompletionRequest(Sampling):
    prompt: str = Field(min_length=1)


class KeyRefusedError(Exception):
    """A request without the server's API key."""


def error(status: int, message: str, *, param: str | None = None, code: str | None = None,
          kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


class Generation:
    """One request's generation on a worker thread; its events arrive on an asyncio queue as
    ("event", Event), then ("done", Stream) or ("error", exception). stop() ends it at the next token."""

    def __init__(self, engine: Engine, prompt, chat: bool, args: dict):
        self.queue: asyncio.Queue = asyncio.Queue()
        self._stop = threading.Event()
        self.finish_reason: str | None = None  # the loop's, once the thread has ended
        loop = asyncio.get_running_loop()
        put = lambda item: loop.call_soon_threadsafe(self.queue.put_nowait, item)  # noqa: E731

        def run():
            try:
                stream = engine.stream(prompt, chat=chat, **args)
                for event in stream:
                    if self._stop.is_set():
                        break
                    put(("event", event))
                stream.close()
                self.finish_reason = stream.stats.finish_reason
                put(("done", stream))
            except Exception as e:  # EdgespecError for the client; anything else is ours, reported as 500
                put(("error", e))

        self.done = loop.run_in_executor(None, run)

    def stop(self) -> None:
        self._stop.set()


def create_app(engine: Engine, *, api_key: str | None = None, model_id: str | None = None,
               default_max_tokens: int = 256) -> FastAPI:
    """The app serving `engine`. api_key: required as 'Authorization: Bearer KEY' when set (not on /health).
    model_id: the name /v1/models lists and responses report (default: the target's file name)."""
    served = model_id or engine.target.name
    lock = asyncio.Lock()
    last = {"finish_reason": None}  # of the last generation, for /health
    app = FastAPI(title="edgespec", description="OpenAI-compatible speculative decoding server")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            message = "the request body is not valid JSON"
        return error(400, f"{where}: {message}" if where else message, param=where or None)

    def authorize(request: Request):
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise KeyRefusedError

    @app.exception_handler(KeyRefusedError)
    async def refused(request: Request, exc: KeyRefusedError):
        return error(401, "missing or wrong API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": served, "draft": _draft_name(engine), "busy": lock.locked(),
                "last_finish_reason": last["finish_reason"]}

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models():
        return {"object": "list", "data": [{"id": served, "object": "model", "created": 0, "owned_by": "edgespec"}]}

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat(body: ChatRequest, request: Request):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        return await complete(request, body, messages, chat=True)

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest, request: Request):
        return await complete(request, body, body.prompt, chat=False)

    async def complete(request: Request, body: Sampling, prompt, chat: bool):
        problem = body.unsupported()
        if problem:
            return error(400, problem)
        ids = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
               "model": served}
        await lock.acquire()
        try:
            gen = Generation(engine, prompt, chat, body.engine_args(default_max_tokens))
        except BaseException:
            lock.release()
            raise
        # the lock is free again when the generation's thread has ended, however the request ends
        gen.done.add_done_callback(lambda _: (last.update(finish_reason=gen.finish_reason), lock.release()))
        watcher = asyncio.ensure_future(_stop_on_disconnect(request, gen))
        try:
            first = await gen.queue.get()
            if first[0] == "error":  # refused before any token (e.g. the prompt overflows the context)
                return _failure(first[1])
            if body.stream:
                return StreamingResponse(_sse(gen, first, ids, chat, watcher), media_type="text/event-stream")
            return await _whole(gen, first, ids, chat)
        finally:
            if not body.stream:
                gen.stop()
                watcher.cancel()

    return app


def _draft_name(engine: Engine) -> str:
    if engine.draft_backend is not None:
        return engine.draft_backend.name
    return engine.drafter.name if engine.drafter is not None else "none"


def _failure(exc: Exception) -> JSONResponse:
    if isinstance(exc, EdgespecError):
        return error(400, str(exc))
    return error(500, f"generation failed: {exc!r}", kind="server_error")


def _usage(stream) -> dict:
    s = stream.stats
    return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.generated,
            "total_tokens": s.prompt_tokens + s.generated}


async def _stop_on_disconnect(request: Request, gen: Generation) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.2)
    gen.stop()


async def _whole(gen: Generation, item, ids: dict, chat: bool):
    """Collect a whole answer."""
    pieces = []
    while item[0] == "event":
        pieces.append(item[1].text)
        item = await gen.queue.get()
    if item[0] == "error":
        return _failure(item[1])
    stream, text = item[1], "".join(pieces)
    finish = FINISH.get(stream.stats.finish_reason, "stop")
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish} if chat
              else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish})
    return {**ids, "object": "chat.completion" if chat else "text_completion", "choices": [choice],
            "usage": _usage(stream), "edgespec": stream.stats.to_dict()}


async def _sse(gen: Generation, item, ids: dict, chat: bool, watcher: asyncio.Future):
    """Server-sent events for a stream. A client that disconnects cancels the response: `finally` (or
    the watcher, if the response never started) stops the generation."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish: str | None = None, first: bool = False, **extra) -> str:
        if chat:
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return f"data: {json.dumps({**ids, 'object': kind, 'choices': [choice], **extra})}\n\n"

    try:
        if chat:
            yield chunk(None, first=True)
        while item[0] == "event":
            if item[1].text:
                yield chunk(item[1].text)
            item = await gen.queue.get()
        if item[0] == "error":
            failure = _failure(item[1])
            yield f"data: {failure.body.decode()}\n\n"
        else:
            stream = item[1]
            yield chunk(None, FINISH.get(stream.stats.finish_reason, "stop"), usage=_usage(stream),
                        edgespec=stream.stats.to_dict())
        yield "data: [DONE]\n\n"
    finally:
        gen.stop()
        watcher.cancel()


def serve(engine: Engine, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          default_max_tokens: int = 256) -> None:
    """Serve `engine` until interrupted."""
    import uvicorn

    app = create_app(engine, api_key=api_key, default_max_tokens=default_max_tokens)
    uvicorn.run(app, host=host, port=port, log_level="warning")
