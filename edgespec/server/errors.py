"""How `edgespec serve` tells a client no: every error in OpenAI's shape,
{"error": {"message", "type", "param", "code"}}, with a message that says what to do.

400 for a request edgespec cannot serve (invalid JSON or Unicode, validation, unsupported options, a prompt
longer than the context), 401 for a missing or wrong API key, 404/405 for an unknown endpoint, 429 when the
queue is full, 504 past the time limit, 500 for a failure of ours. Text holding a lone surrogate ("\\udcff" is
valid JSON but no Unicode) is refused while the body is validated, naming the field that holds it.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException

from edgespec.errors import EdgespecError


class ErrorDetail(BaseModel):
    message: str  # what went wrong and what to do
    type: str  # invalid_request_error, rate_limit_error, timeout_error, server_error
    param: str | None = None  # the field at fault, as a dotted path (messages.1.role)
    code: str | None = None  # invalid_api_key, queue_full, request_timeout, unknown_url


class ErrorBody(BaseModel):
    """Every refusal's body, in OpenAI's shape."""
    error: ErrorDetail


WHY = {400: "the request cannot be served: invalid JSON or Unicode, a value out of its range, an unsupported "
            "option, a prompt longer than the context",
       401: "a missing or wrong API key (when the server requires one)",
       429: "the request queue is full (Retry-After says when to retry)",
       500: "a failure of the server's",
       504: "the request took longer than the server's time limit, waiting included"}


def documented(*statuses: int) -> dict:
    """The OpenAPI `responses` of a route for these statuses: each in OpenAI's error shape, as sent here."""
    return {status: {"model": ErrorBody, "description": WHY[status]} for status in statuses}


def openapi_as_served(app: FastAPI) -> None:
    """The app's OpenAPI schema says what the server does: FastAPI documents a 422 for every route with a body,
    but a body that fails validation gets a 400 in OpenAI's shape (add_error_handlers); its 422 and the schemas
    only it uses are dropped."""
    generate = app.openapi

    def schema() -> dict:
        if app.openapi_schema is None:
            spec = generate()
            for operations in spec["paths"].values():
                for operation in operations.values():
                    operation["responses"].pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                spec.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = schema


class KeyRefusedError(Exception):
    """A request without the server's API key."""


class RequestTimeoutError(Exception):
    """A request that ran past the server's time limit."""


def error(status: int, message: str, *, param: str | None = None, code: str | None = None,
          kind: str = "invalid_request_error", headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status,
                        headers=headers)


def failure(exc: Exception) -> JSONResponse:
    """The answer to a generation that ended in `exc`: the user's error, the time limit, or ours."""
    if isinstance(exc, EdgespecError):
        return error(400, str(exc))
    if isinstance(exc, RequestTimeoutError):
        return error(504, f"the request took longer than the server's limit of {exc.args[0]:g} s "
                     "(--request-timeout), waiting included: ask for fewer tokens or retry later",
                     kind="timeout_error", code="request_timeout")
    return error(500, f"generation failed: {exc!r}", kind="server_error")


def queue_full(admitted: int, wait: int) -> JSONResponse:
    """The 429 for a request the queue has no room for; `wait`: seconds until it likely has."""
    return error(429, f"the server's queue is full ({admitted} requests, --max-queue): retry in about {wait} s",
                 kind="rate_limit_error", code="queue_full", headers={"Retry-After": str(wait)})


def check_unicode(data):
    """Refuse lone surrogates ("\\udcff" is valid JSON but no text): a tokenizer cannot encode them. For a
    request model's before-validator: returns `data` unchanged."""
    where = _lone_surrogate(data)
    if where is not None:
        raise PydanticCustomError("lone_surrogate", "text holds a lone surrogate (an unpaired \\ud800-\\udfff "
                                  "escape), which is not Unicode: send valid UTF-16 pairs or UTF-8",
                                  {"param": where})
    return data


def _lone_surrogate(value, where: str = "") -> str | None:
    """Where ("messages.0.content"; "" for the body itself) the first string in a parsed JSON value holding a
    lone surrogate is, keys included (a bad key names the object holding it); None if there is none."""
    if isinstance(value, str):
        return where if not _encodable(value) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and not _encodable(key):
            return where
        if (found := _lone_surrogate(item, f"{where}.{key}" if where else str(key))) is not None:
            return found
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")  # fails exactly on lone surrogates, as a tokenizer's would
    except UnicodeEncodeError:
        return False
    return True


def _param(problem: dict, body) -> str:
    """The field a validation error is about ("messages.0.content"; "" for the body itself): its location in the
    body, without the names of the union members pydantic tried, which follow it ("stop.str")."""
    loc = list(problem.get("loc", ()))
    path, value = [], body
    if loc[:1] == ["body"]:
        del loc[0]
    for part in loc:
        if isinstance(value, dict) and part in value or isinstance(value, list) and isinstance(part, int) \
                and 0 <= part < len(value):
            path.append(part)
            value = value[part]
        else:
            if problem.get("type") == "missing" and isinstance(value, dict):  # a field the body lacks: name it
                path.append(part)
            break
    return ".".join(str(p) for p in path)


def add_error_handlers(app: FastAPI) -> None:
    """Answer bad bodies, unknown endpoints and refused keys in OpenAI's shape instead of FastAPI's."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":  # its loc ends in a character offset, not a field
            return error(400, "the request body is not valid JSON")
        where = _param(first, exc.body)
        if first.get("type") == "lone_surrogate":
            where = first["ctx"]["param"]
        message = first.get("msg", "invalid request")
        return error(400, f"{where}: {message}" if where else message, param=where or None)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        # FastAPI's own: 400 for a body it cannot decode (not UTF-8), 404 and 405 for unknown endpoints
        message = ("the request body is not valid JSON: it must be UTF-8 text" if exc.status_code == 400 else
                   f"{exc.detail}: {request.method} {request.url.path}")
        return error(exc.status_code, message, code="unknown_url" if exc.status_code == 404 else None,
                     headers=exc.headers)

    @app.exception_handler(KeyRefusedError)
    async def refused(request: Request, exc: KeyRefusedError):
        return error(401, "missing or wrong API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")
