"""OpenAI tool calls: checking a request's `tools`, and reading the calls out of a model's answer (issue 46).

A chat template lists the tools for the model (decode/text.render_chat passes them as transformers does); each
family then answers a call in its own format, which `parse_calls` reads back into OpenAI's `tool_calls`:

- "hermes" (Qwen2.5/Qwen3, Hermes, SmolLM3 and most fine-tunes): `<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>`, one block per call, text around them kept as the message's content;
- "llama3" (Llama 3.1-3.3): the whole answer one JSON object `{"name": ..., "parameters": {...}}` (or
  "arguments"), after an optional `<|python_tag|>`; several separated by `;`;
- "mistral" (Mistral, Mistral-Nemo): `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}` objects, or
  (v11 templates) `[TOOL_CALLS]name[ARGS]{...}` per call;
- "json" (a template that says nothing of tools, as SmolLM2's): an answer that is one JSON object with "name"
  and "arguments" (or "parameters") naming a listed function.

`family_of(template)` tells the family from the chat template's text. Arguments are returned as JSON text, as
OpenAI sends them. Nothing here decodes: where a call is required, the server constrains the answer to the
family's call format with the function's parameters as the schema (the grammar path), so it always parses.
"""

from __future__ import annotations

import json
import re
import uuid

from edgespec.errors import EdgespecError

FAMILIES = ("hermes", "llama3", "mistral", "json")
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI accepts as a function name


def check_tools(tools: list) -> list[dict]:
    """The request's `tools` as function specs [{"name", "description", "parameters"}], or an EdgespecError
    naming the first entry that is not an OpenAI function tool (the server answers it with a 400)."""
    if not isinstance(tools, list) or not tools:
        raise EdgespecError("tools must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    specs, names = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise EdgespecError(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise EdgespecError(f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {name!r}")
        if name in names:
            raise EdgespecError(f"{where}.function.name '{name}' is listed twice")
        names.add(name)
        description = function.get("description", "")
        if not isinstance(description, str):
            raise EdgespecError(f"{where}.function.description must be a string")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise EdgespecError(f"{where}.function.parameters must be a JSON schema of an object")
        specs.append({"name": name, "description": description, "parameters": parameters})
    return specs


def family_of(template: str | None) -> str:
    """The tool-call format a chat template's model answers in (one of FAMILIES)."""
    text = template or ""
    if "<tool_call>" in text:
        return "hermes"
    if "[TOOL_CALLS]" in text:
        return "mistral"
    if "<|python_tag|>" in text or "ipython" in text:
        return "llama3"
    return "json"


def parse_calls(text: str, family: str, names: set[str] | None = None) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of an answer in `family`'s format: the calls in OpenAI's shape ({"id", "type":
    "function", "function": {"name", "arguments": JSON text}}) and the text outside them (None where nothing is
    left). names: the functions listed; a call of another name, or one that does not parse, stays text."""
    if family not in FAMILIES:
        raise ValueError(f"unknown tool-call family {family!r}: one of {', '.join(FAMILIES)}")
    found: list[tuple[str, object]] = []
    rest = text
    if family == "hermes":
        pieces = []
        for part in re.split(r"(<tool_call>.*?(?:</tool_call>|$))", text, flags=re.S):
            call = _call(_json(part[len("<tool_call>"):].removesuffix("</tool_call>")), names) \
                if part.startswith("<tool_call>") else None
            if call:
                found.append(call)
            else:
                pieces.append(part)
        rest = "".join(pieces)
    elif family == "mistral" and "[TOOL_CALLS]" in text:
        head, _, tail = text.partition("[TOOL_CALLS]")
        listed = _json(tail)
        calls = [_call(c, names) for c in listed] if isinstance(listed, list) else []
        if not calls:  # v11: name[ARGS]{...} per call
            calls = [_call({"name": m.group(1), "arguments": _json(m.group(2))}, names)
                     for m in re.finditer(r"([A-Za-z0-9_-]+)\[ARGS\](\{.*?\})\s*(?=\[TOOL_CALLS\]|$)", tail, re.S)]
        if calls and all(calls):
            found, rest = calls, head
    elif family in ("llama3", "json"):
        body = text.strip().removeprefix("<|python_tag|>").strip()
        parts = [p for p in body.split(";") if p.strip()] if family == "llama3" else [body]
        calls = [_call(_json(p), names) for p in parts]
        if calls and all(calls):
            found, rest = calls, ""
    tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                   "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
                  for name, arguments in found]
    rest = rest.strip()
    return (rest or None), tool_calls


def _json(text: str):
    try:
        return json.loads(text.strip())
    except ValueError:
        return None


def _call(value, names: set[str] | None) -> tuple[str, object] | None:
    """(name, arguments) of a parsed call object, or None where it is not one of a listed function."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        arguments = _json(arguments)
    if not isinstance(arguments, dict) or (names is not None and value["name"] not in names):
        return None
    return value["name"], arguments
