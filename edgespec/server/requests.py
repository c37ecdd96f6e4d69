"""What `edgespec serve` accepts: the request bodies of /v1/chat/completions and /v1/completions (pydantic).

OpenAI's fields, read strictly (a refused value is a 400 naming its field: server/errors.py), edgespec's own
(top_k, min_p, draft_max), and what a request asks that edgespec cannot serve (`Sampling.refusal`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edgespec.api import LONGEST_DRAFT
from edgespec.decode.sampling import MIN_TEMPERATURE
from edgespec.errors import EdgespecError
from edgespec.server.errors import check_unicode
from edgespec.tool_calls import check_choice, check_tools


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str | dict  # JSON text, as OpenAI sends it (an object is taken too)


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """A chat message: a system, user or assistant turn, an assistant's tool calls (content may then be null),
    or a tool's result (role "tool", with the id of the call it answers)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _complete(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content (only an assistant's tool calls may come "
                             "without)")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id: the id of the call it answers")
        return self

    def text(self) -> str | None:
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def to_dict(self) -> dict:
        """As chat templates take it (api.prompt_tokens rewrites tool calls for the template)."""
        extra = {"tool_calls": [c.model_dump() for c in self.tool_calls]} if self.tool_calls else {}
        extra |= {key: value for key in ("tool_call_id", "name") if (value := getattr(self, key))}
        return {"role": self.role, "content": self.text(), **extra}


class Sampling(BaseModel):
    """What both endpoints accept: OpenAI's sampling fields plus edgespec's top_k, min_p and draft_max.

    Numbers and flags are strict, as OpenAI's are: "0.7", true or 2.0 where a number, a flag or a whole number
    belongs is refused, not read as something else; NaN and Infinity (which Python's JSON parser reads) are refused
    too. Every refusal is a 400 naming the field (server/errors.py)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)  # OpenAI clients send fields we need not read

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data):
        """Refuse lone surrogates ("\\udcff" is valid JSON but no text): a tokenizer cannot encode them."""
        return check_unicode(data)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, strict=True)
    max_completion_tokens: int | None = Field(None, ge=1, strict=True)
    temperature: float = Field(1.0, ge=0.0, strict=True)
    top_p: float = Field(1.0, gt=0.0, le=1.0, strict=True)
    top_k: int = Field(0, ge=0, strict=True)
    min_p: float = Field(0.0, ge=0.0, lt=1.0, strict=True)
    seed: int | None = Field(None, ge=0, strict=True)  # numpy's generators take no negative seed
    stop: str | list[str] | None = None
    stream: bool = Field(False, strict=True)
    n: int = Field(1, ge=1, strict=True)
    draft_max: int | None = Field(None, ge=0, le=LONGEST_DRAFT, strict=True)
    logprobs: bool | int | None = None
    tools: list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = Field(True, strict=True)
    response_format: dict | None = None

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value):
        """SamplingParams' own floor, refused here so that a stream never starts on it."""
        if 0 < value < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value):
        """One message for both shapes stop may take (pydantic's would name the first it tried)."""
        if value is None or isinstance(value, str) or isinstance(value, list) and all(isinstance(s, str)
                                                                                      for s in value):
            return value
        raise ValueError("stop must be a string or a list of strings")

    def refusal(self) -> tuple[str, str] | None:
        """(the field, why) for a request edgespec cannot serve as asked; None if it can."""
        if self.n != 1:
            return "n", "n must be 1: edgespec generates one answer per request"
        if self.logprobs:
            return "logprobs", "logprobs are not supported"
        if self.tools is not None or self.tool_choice is not None:
            try:
                specs = check_tools(self.tools) if self.tools else []
            except EdgespecError as e:
                return "tools", str(e)
            try:
                forced = check_choice(self.tool_choice, {s["name"] for s in specs})
            except EdgespecError as e:
                return "tool_choice", str(e)
            if forced and self.schema() is not None:
                return "response_format", ("a required tool call decodes under its function's schema: send "
                                           "response_format or a tool_choice that forces a call, not both")
        if self.response_format is None:
            return None
        kind = self.response_format.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            return "response_format.type", (f"response_format type {kind!r} is not supported: give type text, "
                                            "json_object or json_schema")
        spec = self.response_format.get("json_schema")
        if kind == "json_schema" and not (isinstance(spec, dict) and isinstance(spec.get("schema"), dict)):
            return "response_format.json_schema", ("response_format json_schema needs json_schema.schema, a JSON "
                                                   "schema object")
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
                "seed": self.seed, "stop": stop, "draft_max": self.draft_max, "json_schema": self.schema(),
                **self.tool_args()}

    def tool_args(self) -> dict:
        """The tool fields as Engine.stream and Engine.prompt_tokens take them (none where none were sent)."""
        if self.tools is None:
            return {}
        return {"tools": self.tools, "tool_choice": self.tool_choice or "auto",
                "parallel_tool_calls": self.parallel_tool_calls}


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)


class CompletionRequest(Sampling):
    prompt: str = Field(min_length=1)

    def refusal(self) -> tuple[str, str] | None:
        if self.tools is not None or self.tool_choice is not None:
            return ("tools" if self.tools is not None else "tool_choice"), ("tools need /v1/chat/completions: a "
                                                                            "completion's prompt has no chat template")
        return super().refusal()
