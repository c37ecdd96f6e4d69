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
OpenAI sends them.

Nothing here decodes. `ToolSet` is what a generation needs to know of a request's tools: the tools the template
lists (a template that lists none, as SmolLM2's, gets the "json" format explained in a system message), the
history rewritten for the template (`chat_history`), and where a call is required or a function named
(`tool_choice`), the text the answer begins with (the family's call opener, put at the end of the prompt) and the
JSON schema of the rest (the call with the function's parameters): the engine decodes under it on the grammar
path, so a forced call always parses and its arguments validate. `CallReader` splits a streamed answer into the
content to send at once and the text held back while it may still be a call.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

from edgespec.errors import EdgespecError

FAMILIES = ("hermes", "llama3", "mistral", "json")
MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3": "<|python_tag|>"}  # what opens a call
ARGUMENTS = {"llama3": "parameters"}  # the key of a call's arguments, where not "arguments"
_NAME = r"[A-Za-z0-9_-]{1,64}"  # what OpenAI accepts as a function name
NAME = re.compile(f"^{_NAME}$")
# a forced call's text as its schema and COMPACT fix it: this head, the arguments, then the family's closing
_FORCED_HEAD = re.compile(rf'\[?\{{"name": "({_NAME})", "(?:arguments|parameters)": ')
_CLOSERS = {"mistral": "}]"}  # others: "}"
COMPACT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}  # JSON as OpenAI writes it
INSTRUCTIONS = ("You can call these tools; each one's arguments follow its JSON schema:\n{tools}\n\n"
                'To call a tool, answer with only a JSON object {{"name": "<the tool\'s name>", "arguments": '
                "{{<its arguments>}}}}. Otherwise answer in text.")


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


def lists_tools(template: str | None) -> bool:
    """Whether a chat template lists the tools itself (it reads the `tools` variable)."""
    return "tools" in (template or "")


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
    tool_calls = [{"id": call_id(family), "type": "function",
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


def call_id(family: str) -> str:
    """A new call id: Mistral's templates accept only 9 letters and digits, OpenAI's look like call_<24>."""
    if family == "mistral":
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    return f"call_{secrets.token_hex(12)}"


def check_choice(tool_choice, names: set[str]) -> tuple[str, ...] | None:
    """The functions one of which the answer must call, from OpenAI's tool_choice ("auto", "required", "none",
    {"type": "function", "function": {"name": ...}}, or a bare name) among the tools' names: () for auto, None
    for none."""
    if tool_choice in (None, "auto"):
        return ()
    if tool_choice == "none":
        return None
    if not names:
        raise EdgespecError("tool_choice needs tools: send the functions the model may call")
    if tool_choice == "required":
        return tuple(sorted(names))
    name = tool_choice
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        name = function.get("name") if tool_choice.get("type") == "function" and isinstance(function, dict) else None
    if not isinstance(name, str):
        raise EdgespecError('tool_choice must be "auto", "none", "required" or {"type": "function", "function": '
                            '{"name": ...}}')
    if name not in names:
        raise EdgespecError(f"tool_choice names '{name}', which is not among the tools: {', '.join(sorted(names))}")
    return (name,)


@dataclass(frozen=True)
class ToolSet:
    """A request's tools as one generation uses them (see the module docstring)."""

    tools: tuple[dict, ...]  # the OpenAI tool entries, as the template receives them
    family: str
    listed: bool  # the template lists tools itself; else INSTRUCTIONS in a system message
    forced: tuple[str, ...]  # the functions one of which must be called; () where the model chooses
    parallel: bool  # more than one call in an answer (OpenAI's parallel_tool_calls)
    calling: bool = True  # False for tool_choice "none": the model sees the tools, its answer is text

    @classmethod
    def of(cls, tools: list, tool_choice, parallel: bool, template: str | None) -> ToolSet | None:
        """The request's tools for a chat template; None where there are none (some clients send [] for none)."""
        specs = check_tools(tools) if tools else []
        forced = check_choice(tool_choice, {s["name"] for s in specs})
        if not specs:
            return None
        entries = tuple({"type": "function", "function": spec} for spec in specs)
        return cls(entries, family_of(template), lists_tools(template), forced or (), parallel,
                   calling=forced is not None)

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    def rendered(self) -> list[dict] | None:
        """The tools the chat template lists (None: it lists none, the system message explains them)."""
        return list(self.tools) if self.listed else None

    def instructions(self) -> str | None:
        return None if self.listed else INSTRUCTIONS.format(tools="\n".join(json.dumps(t["function"])
                                                                            for t in self.tools))

    def opener(self) -> str:
        """What a forced answer begins with, written after the prompt (the model continues from it)."""
        if not self.forced or self.family not in ("hermes", "mistral"):
            return ""
        return MARKERS[self.family] + ("\n" if self.family == "hermes" else "")

    def schema(self) -> dict | None:
        """The JSON schema a forced answer's text after the opener is decoded under (None: not forced): one call
        of a forced function, its objects closed, written compactly."""
        if not self.forced:
            return None
        key = ARGUMENTS.get(self.family, "arguments")
        parameters = {t["function"]["name"]: _closed(t["function"]["parameters"]) for t in self.tools}
        calls = [{"type": "object", "properties": {"name": {"const": name}, key: parameters[name]},
                  "required": ["name", key], "additionalProperties": False} for name in self.forced]
        call = calls[0] if len(calls) == 1 else {"anyOf": calls}
        if self.family == "mistral":  # one call, as the other families' forced answers: a list could run on
            call = {"type": "array", "items": call, "minItems": 1, "maxItems": 1}
        return {**call, "x-guidance": COMPACT}

    def read(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, tool_calls) of an answer's text (after the opener). A forced call's arguments are the text
        the model wrote (valid under the schema, so they parse), as a stream sends them."""
        if not self.calling:
            return text, []
        content, calls = parse_calls(self.opener() + text, self.family, self.names)
        head = _FORCED_HEAD.match(text) if self.forced else None
        if head is not None and head.group(1) in self.names:
            # the schema fixes the call's text: its head, the arguments, its closing characters; a call cut short
            # (max_tokens) keeps the arguments written so far, as OpenAI's does
            arguments = text[head.end():len(text) - len(_CLOSERS.get(self.family, "}"))] if calls else \
                text[head.end():]
            call = calls[0] if calls else {"id": call_id(self.family), "type": "function"}
            content, calls = None, [{**call, "function": {"name": head.group(1), "arguments": arguments}}]
        return content, calls if self.parallel else calls[:1]


def chat_history(messages: list[dict], template: str | None, tools: ToolSet | None = None) -> list[dict]:
    """Chat messages as the template takes them: OpenAI's assistant `tool_calls` (arguments as JSON text) with
    their arguments as objects, as transformers passes them; for a template that lists no tools, a call written
    as the JSON the model is told to answer with (and a `tool` result as a user turn naming its function where
    the template takes only user and assistant turns); and the tools' instructions where the template needs
    them (a system message, or the first user turn for a template without a system role)."""
    listed = lists_tools(template)
    alternating = not listed and "alternate" in (template or "")  # Gemma's: only user and assistant turns
    named: dict[str, str] = {}  # call id -> function name, for the results of a template without tools
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None) or []
        if calls:
            calls = [{"id": c.get("id"), "type": "function",
                      "function": {"name": c["function"]["name"], "arguments": _arguments(c["function"])}}
                     for c in calls]
            named.update((c["id"], c["function"]["name"]) for c in calls)
            if listed:
                m["tool_calls"] = calls
            else:
                written = "\n".join(json.dumps({"name": c["function"]["name"],
                                                "arguments": c["function"]["arguments"]}) for c in calls)
                m["content"] = "\n".join(t for t in (m.get("content"), written) if t)
        if m["role"] == "tool" and alternating:
            name = m.get("name") or named.get(m.get("tool_call_id"), "the tool")
            m = {"role": "user", "content": f"Result of {name}: {m.get('content') or ''}"}
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    extra = tools.instructions() if tools is not None else None
    if extra:
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{extra}"}
        elif "System role not supported" in (template or "") and out:  # Gemma 2: the first user turn carries it
            first = next((i for i, m in enumerate(out) if m["role"] == "user"), 0)
            out[first] = {**out[first], "content": f"{extra}\n\n{out[first]['content']}"}
        else:
            out.insert(0, {"role": "system", "content": extra})
    return out


def _closed(schema):
    """A JSON schema whose objects take no properties they do not list, unless they say otherwise (as llama.cpp's
    grammars and OpenAI's strict mode read them): an open object lets a forced call run on to max_tokens."""
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: (_closed(value) if key not in ("const", "enum", "default", "examples") else value)
              for key, value in schema.items()}
    if (schema.get("type") == "object" or "properties" in schema) and "additionalProperties" not in schema:
        closed["additionalProperties"] = False
    return closed


def _arguments(function: dict):
    """A call's arguments as an object where they are JSON text of one (as OpenAI sends them back)."""
    arguments = function.get("arguments", {})
    parsed = _json(arguments) if isinstance(arguments, str) else arguments
    return parsed if isinstance(parsed, dict) else arguments


class CallReader:
    """A streamed answer as OpenAI streams it: content to send now, and tool-call deltas.

    Text that may be a call is held back: from the family's call opener on (hermes, mistral), or the whole answer
    where it starts as a call does (llama3, json: a JSON object or <|python_tag|>); its calls are read at the end
    and sent whole, a delta each. A forced call (its format fixed by the schema) is streamed as it is decoded:
    the first delta names the function once its name is written, the next ones carry its arguments' text as it
    comes (all but the closing characters of the call, which are not the arguments'), so they add up to the
    arguments that ToolSet.read returns for the whole answer."""

    def __init__(self, tools: ToolSet):
        self.tools = tools
        self.marker = MARKERS.get(tools.family, "")
        self.held = ""
        self.holding = bool(tools.forced)  # everything from here on is held
        self.decided = not tools.calling  # nothing more is held: no calls asked for, or (llama3, json) text began
        self.call: dict | None = None  # a forced call whose name was sent: its id, arguments' start, text sent
        self.closer = len(_CLOSERS.get(tools.family, "}"))

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """(content to send now, tool-call deltas to send now) for the answer's next text."""
        if self.tools.forced:
            self.held += text
            return "", self._forced()
        return self._text(text), []

    def finish(self) -> tuple[str | None, list[dict], bool]:
        """(content left to send, tool-call deltas left to send, whether the answer made a call)."""
        if self.tools.forced:
            content, calls = self.tools.read(self.held)
            if self.call is None:  # the name not written yet (cut short): as the whole answer reads
                return content, _deltas(calls), bool(calls)
            rest = calls[0]["function"]["arguments"][self.call["sent"]:]
            return None, [{"index": 0, "function": {"arguments": rest}}] if rest else [], True
        if not self.holding:
            return (self.held or None), [], False
        content, calls = self.tools.read(self.held)
        return content, _deltas(calls), bool(calls)

    def _forced(self) -> list[dict]:
        if self.call is None:
            head = _FORCED_HEAD.match(self.held)
            if head is None or head.group(1) not in self.tools.names:
                return []
            self.call = {"start": head.end(), "sent": 0}
            first = {"index": 0, "id": call_id(self.tools.family), "type": "function",
                     "function": {"name": head.group(1), "arguments": ""}}
            return [first, *self._forced()]
        ready = self.held[self.call["start"]:len(self.held) - self.closer]  # the call's closing held back
        if len(ready) <= self.call["sent"]:
            return []
        piece, self.call["sent"] = ready[self.call["sent"]:], len(ready)
        return [{"index": 0, "function": {"arguments": piece}}]

    def _text(self, text: str) -> str:
        if self.holding:
            self.held += text
            return ""
        buffer, self.held = self.held + text, ""
        if self.decided:
            return buffer
        if self.tools.family in ("hermes", "mistral"):
            at = buffer.find(self.marker)
            if at >= 0:
                self.holding, self.held = True, buffer[at:]
                return buffer[:at]
            keep = next((n for n in range(min(len(buffer), len(self.marker) - 1), 0, -1)
                         if self.marker.startswith(buffer[-n:])), 0)  # a marker may be arriving
            self.held = buffer[len(buffer) - keep:] if keep else ""
            return buffer[:len(buffer) - keep]
        start = buffer.lstrip()
        if start.startswith("{") or (self.marker and start.startswith(self.marker)):
            self.holding, self.held = True, buffer
            return ""
        if not start or (self.marker and self.marker.startswith(start)):
            self.held = buffer
            return ""
        self.decided = True
        return buffer


def _deltas(calls: list[dict]) -> list[dict]:
    """Whole calls as stream deltas, one each."""
    return [{"index": i, **call} for i, call in enumerate(calls)]
