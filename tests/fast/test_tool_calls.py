"""Tool calls read out of each family's answer format, and a request's `tools` checked (edgespec/tool_calls.py)."""

import json
from pathlib import Path

import pytest

from edgespec.decode.text import render_chat
from edgespec.errors import EdgespecError
from edgespec.tool_calls import (
    ARGUMENTS,
    CallReader,
    ToolSet,
    chat_history,
    check_choice,
    check_tools,
    family_of,
    parse_calls,
)

TEMPLATES = {p.stem: p.read_text(encoding="utf-8")
             for p in (Path(__file__).parents[1] / "data" / "chat_templates").glob("*.jinja")}

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
NAMES = {"get_weather", "move"}


def calls(text, family):
    content, found = parse_calls(text, family, NAMES)
    assert all(c["type"] == "function" for c in found)
    # Mistral's templates take only ids of 9 letters and digits back
    assert all(c["id"].isalnum() and len(c["id"]) == 9 if family == "mistral" else c["id"].startswith("call_")
               for c in found)
    assert len({c["id"] for c in found}) == len(found)
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in found]


@pytest.mark.parametrize("text, family, expected", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "hermes",
     (None, [("get_weather", {"city": "Paris"})])),
    ('Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
     '<tool_call>{"name": "move", "arguments": {"distance": 1.5}}</tool_call>', "hermes",
     ("Let me check.", [("get_weather", {"city": "Paris"}), ("move", {"distance": 1.5})])),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}', "hermes",  # ended before the close tag
     (None, [("get_weather", {"city": "Oslo"})])),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}', "llama3",
     (None, [("get_weather", {"city": "Rome"})])),
    ('{"name": "get_weather", "parameters": {"city": "Rome"}}; {"name": "move", "parameters": {}}', "llama3",
     (None, [("get_weather", {"city": "Rome"}), ("move", {})])),
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Bern"}}]', "mistral",
     (None, [("get_weather", {"city": "Bern"})])),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": {"name": "Bern"}}[TOOL_CALLS]move[ARGS]{"distance": 2}', "mistral",
     (None, [("get_weather", {"city": {"name": "Bern"}}), ("move", {"distance": 2})])),
    ('{"name": "move", "arguments": "{\\"distance\\": 1}"}', "json", (None, [("move", {"distance": 1})])),
])
def test_each_familys_calls_are_read_into_openais_shape(text, family, expected):
    assert calls(text, family) == expected


@pytest.mark.parametrize("text, family", [
    ("The weather in Paris is mild.", "hermes"),
    ('<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>', "hermes"),  # not a listed function
    ("<tool_call>{not json}</tool_call>", "hermes"),
    ('{"name": "get_weather"} and more', "llama3"),
    ('{"city": "Paris"}', "json"),  # JSON, but no call
    ("[TOOL_CALLS] nothing", "mistral"),
])
def test_text_that_is_not_a_call_stays_the_answers_content(text, family):
    content, found = parse_calls(text, family, NAMES)
    assert found == [] and content == text.strip()


def test_the_family_is_told_from_the_chat_template():
    assert family_of("{% for m in messages %}<tool_call>{{ m }}</tool_call>{% endfor %}") == "hermes"
    assert family_of("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert family_of("{{ '<|python_tag|>' }}{% if m.role == 'ipython' %}") == "llama3"
    assert family_of("{{ '<|im_start|>' + m.content }}") == "json"
    assert family_of(None) == "json"
    with pytest.raises(ValueError, match="unknown tool-call family"):
        parse_calls("", "gemma")


def test_tools_are_checked_entry_by_entry_with_one_clear_error():
    assert check_tools([WEATHER]) == [{"name": "get_weather", "description": "The weather in a city.",
                                       "parameters": WEATHER["function"]["parameters"]}]
    bare = check_tools([{"type": "function", "function": {"name": "stop"}}])
    assert bare == [{"name": "stop", "description": "", "parameters": {"type": "object", "properties": {}}}]
    for tools, message in [
        ([], "non-empty list"),
        ({"type": "function"}, "non-empty list"),
        ([{"type": "retrieval"}], r"tools\[0\] must be"),
        ([WEATHER, {"type": "function", "function": {"name": "two words"}}], r"tools\[1\].function.name must be"),
        ([WEATHER, WEATHER], "listed twice"),
        ([{"type": "function", "function": {"name": "f", "description": 3}}], "description must be a string"),
        ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}], "schema of an object"),
    ]:
        with pytest.raises(EdgespecError, match=message):
            check_tools(tools)


# --- what a generation does with a request's tools (ToolSet, chat_history, CallReader) ---

TOOLS = [WEATHER, {"type": "function", "function": {"name": "move", "parameters": {
    "type": "object", "properties": {"distance": {"type": "number"}, "to": {"type": "object", "properties": {
        "x": {"type": "number"}}}}, "required": ["distance"]}}}]


def test_tool_choice_is_read_as_openai_defines_it():
    names = {"get_weather", "move"}
    assert check_choice("auto", names) == () and check_choice(None, names) == ()
    assert check_choice("none", names) is None
    assert check_choice("required", names) == ("get_weather", "move")
    assert check_choice({"type": "function", "function": {"name": "move"}}, names) == ("move",)
    for bad, message in [(3, "must be"), ({"type": "function"}, "must be"), ("launch", "not among")]:
        with pytest.raises(EdgespecError, match=message):
            check_choice(bad, names)
    with pytest.raises(EdgespecError, match="tool_choice needs tools"):
        ToolSet.of(None, "required", True, None)
    assert ToolSet.of([], "auto", True, None) is None and ToolSet.of(None, None, True, None) is None


@pytest.mark.parametrize("family, template", [("hermes", "qwen2.5"), ("llama3", "llama-3.1"),
                                              ("mistral", "mistral-nemo"), ("json", "smollm2")])
def test_a_forced_call_begins_with_the_familys_opener_and_its_schema_closes_every_object(family, template):
    tools = ToolSet.of(TOOLS, {"type": "function", "function": {"name": "move"}}, False, TEMPLATES[template])
    assert tools.family == family and tools.forced == ("move",)
    assert tools.opener() == {"hermes": "<tool_call>\n", "mistral": "[TOOL_CALLS]"}.get(family, "")
    schema = tools.schema()
    call = schema["items"] if family == "mistral" else schema
    key = "parameters" if family == "llama3" else "arguments"
    assert call["properties"]["name"] == {"const": "move"} and call["required"] == ["name", key]
    arguments = call["properties"][key]
    # an object that does not say may not grow properties it does not list: else a call can run to max_tokens
    assert arguments["additionalProperties"] is False
    assert arguments["properties"]["to"]["additionalProperties"] is False
    assert TOOLS[1]["function"]["parameters"]["properties"]["to"] == {"type": "object", "properties": {
        "x": {"type": "number"}}}  # the request's own schema is left as it was
    if family == "mistral":
        assert schema["maxItems"] == 1
    required = ToolSet.of(TOOLS, "required", True, TEMPLATES[template]).schema()
    assert len((required["items"] if family == "mistral" else required)["anyOf"]) == 2
    text = json.dumps([{"name": "move", key: {"distance": 2}}] if family == "mistral" else
                      {"name": "move", key: {"distance": 2}})
    content, found = tools.read(text)
    assert content is None and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in found] == [
        ("move", {"distance": 2})]


ANSWERS = [  # (family, what the model wrote); each is streamed in pieces below
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("hermes", "No call here, though < and <tool are written."),
    ("hermes", "It ends on a partial tag <tool_"),
    ("mistral", '[TOOL_CALLS][{"name": "move", "arguments": {"distance": 1}}]'),
    ("mistral", "Plain [text] answer."),
    ("llama3", '<|python_tag|>{"name": "move", "parameters": {"distance": 3}}'),
    ("llama3", "  Paris is sunny."),
    ("json", '  {"name": "get_weather", "arguments": {"city": "Oslo"}}'),
    ("json", '{"city": "Oslo"}'),  # JSON, but no call: content, sent at the end
    ("json", "Three colors: red, green, blue."),
]


def reassemble(deltas: list[dict]) -> list[dict]:
    """Tool-call deltas added up as OpenAI's clients add them: by index, the name and arguments' text joined."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        call = calls.setdefault(delta["index"], {"id": None, "name": "", "arguments": ""})
        call["id"] = delta.get("id") or call["id"]
        call["name"] += delta.get("function", {}).get("name") or ""
        call["arguments"] += delta.get("function", {}).get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


def stream_through(reader: CallReader, answer: str, piece: int):
    """(the content sent as it came, the content sent at the end, every delta, whether it called)."""
    sent, deltas = [], []
    for i in range(0, len(answer), piece):
        content, more = reader.feed(answer[i:i + piece])
        sent.append(content)
        deltas.append(more)
    rest, last, called = reader.finish()
    return sent, rest, [*(d for more in deltas for d in more), *last], called


@pytest.mark.parametrize("family, answer", ANSWERS)
@pytest.mark.parametrize("piece", [1, 3, 7])
def test_a_streamed_answer_sends_its_text_at_once_and_its_calls_as_the_whole_answer_reads(family, answer, piece):
    tools = ToolSet(tuple(TOOLS), family, listed=True, forced=(), parallel=True)
    sent, rest, deltas, called = stream_through(CallReader(tools), answer, piece)
    content, expected = parse_calls(answer, family, tools.names)
    assert ("".join(sent) + (rest or "")).strip() == (content or "")
    assert [{"name": c["name"], "arguments": c["arguments"]} for c in reassemble(deltas)] == [
        c["function"] for c in expected] and called == bool(expected)
    if not expected and not answer.lstrip().startswith("{"):  # text goes out as it comes, but for a possible tag
        assert "".join(sent) == answer.removesuffix("<tool_")


@pytest.mark.parametrize("family, template", [("hermes", "qwen2.5"), ("mistral", "mistral-nemo"),
                                              ("llama3", "llama-3.1"), ("json", "smollm2")])
@pytest.mark.parametrize("cut", [0, 9, 30])  # characters the answer lost to max_tokens
def test_a_forced_call_streams_its_arguments_as_they_come_and_they_add_up_to_the_whole_answers(family, template,
                                                                                            cut):
    tools = ToolSet.of(TOOLS, "required", True, TEMPLATES[template])
    key = ARGUMENTS.get(family, "arguments")
    call = f'{{"name": "move", "{key}": {{"distance": 1.5, "to": {{"x": -2}}}}}}'
    answer = f"[{call}]" if family == "mistral" else call
    answer = answer[:len(answer) - cut]
    _, expected = tools.read(answer)
    sent, rest, deltas, called = stream_through(CallReader(tools), answer, 1)
    assert "".join(sent) == "" and rest is None and called
    assert deltas[0] == {"index": 0, "id": deltas[0]["id"], "type": "function",
                         "function": {"name": "move", "arguments": ""}}
    (whole,) = reassemble(deltas)
    # the arguments came as they were written, a delta a character here, not at the end
    assert len(deltas) - 1 >= len(whole["arguments"]) - 2
    assert (whole["name"], whole["arguments"]) == ("move", expected[0]["function"]["arguments"])
    if cut == 0:
        assert json.loads(whole["arguments"]) == {"distance": 1.5, "to": {"x": -2}}
    else:  # cut short, as OpenAI's: the arguments written so far
        assert whole["arguments"] == answer[answer.index(f'"{key}": ') + len(key) + 4:]


def test_tool_choice_none_reads_no_call():
    none = ToolSet.of(TOOLS, "none", True, TEMPLATES["qwen2.5"])
    assert none.calling is False and none.rendered() == list(none.tools)  # the model still sees the tools
    call = '<tool_call>{"name": "move", "arguments": {}}</tool_call>'
    assert CallReader(none).feed(call) == (call, []) and none.read(call) == (call, [])


def test_one_call_is_kept_where_parallel_calls_are_off():
    two = '<tool_call>{"name": "move", "arguments": {}}</tool_call><tool_call>{"name": "move", "arguments": {}}'
    assert len(ToolSet.of(TOOLS, "auto", True, TEMPLATES["qwen2.5"]).read(two)[1]) == 2
    assert len(ToolSet.of(TOOLS, "auto", False, TEMPLATES["qwen2.5"]).read(two)[1]) == 1


CALL = {"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
AGENT = [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "abcDEF123", "content": '{"temp_c": 18}'}]


@pytest.mark.parametrize("family", ["llama-3.1", "qwen2.5", "qwen3", "mistral-nemo"])
def test_an_agents_history_renders_as_transformers_renders_it(family):
    """OpenAI's history (arguments as JSON text, content null) reaches a template that lists tools as transformers
    passes it: arguments as an object."""
    from test_chat_families import reference, special_tokens, template

    ours = render_chat(template(family), chat_history(AGENT, template(family)), **special_tokens(family),
                       tools=TOOLS)
    theirs = [AGENT[0], {"role": "assistant", "content": "", "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, AGENT[2]]
    assert ours == reference(family, theirs, add_generation_prompt=True, tools=TOOLS)
    assert '"city": "Paris"' in ours and 'temp_c' in ours  # Llama 3.1 writes a result as a JSON string


def test_a_template_without_tools_is_told_of_them_and_reads_calls_as_the_json_it_is_asked_for():
    tools = ToolSet.of(TOOLS, "auto", True, TEMPLATES["smollm2"])
    history = chat_history(AGENT, TEMPLATES["smollm2"], tools)
    assert history[0]["role"] == "system" and '"name": "get_weather"' in history[0]["content"]
    assert history[2] == {"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Paris"}}'}
    assert history[3]["role"] == "tool"  # SmolLM2's template writes any role
    gemma = chat_history([{"role": "system", "content": "Be brief."}, *AGENT], TEMPLATES["gemma-2"], tools)
    assert [m["role"] for m in gemma] == ["system", "user", "assistant", "user"]
    assert gemma[0]["content"].startswith("Be brief.\n\nYou can call these tools")
    assert gemma[3]["content"] == 'Result of get_weather: {"temp_c": 18}'
    alone = chat_history(AGENT[:1], TEMPLATES["gemma-2"], tools)  # no system turn there: the user's carries it
    assert [m["role"] for m in alone] == ["user"] and alone[0]["content"].endswith("Weather in Paris?")


def test_a_call_opener_that_is_a_control_token_reaches_the_text():
    """Mistral's [TOOL_CALLS] is a control token, which prints nothing: the stream writes it, so the call is read."""
    import numpy as np
    from fake import FakeBackend, controller, deterministic_table

    from edgespec.api import Engine
    from edgespec.backends.protocol import Vocab

    V, opener = 30, 28
    letters = [bytes([ord("a") + i - 1]) for i in range(1, V)]
    texts = (b"</s>", *letters[:opener - 1], b"[TOOL_CALLS]", *letters[opener:])
    vocab = Vocab(texts=texts, pieces=tuple(b"" if i in (0, opener) else t for i, t in enumerate(texts)),
                  bos_id=0, eos_id=0, eog_ids=frozenset([0]))

    class Mistralish(FakeBackend):
        def chat_template(self):
            return "{% for m in messages %}{{ m['content'] }}{% endfor %}{# a [TOOL_CALLS] family #}"

    # the prompt ends in "a" (token 1); then the opener, "b", "c", the end
    backend = Mistralish(deterministic_table({1: opener, opener: 2, 2: 3, 3: 0}, V), vocab=vocab, n_ctx=4096)
    engine = Engine(backend, None, controller())
    stream = engine.stream("a", tools=TOOLS, max_tokens=8, draft_max=0)
    assert "".join(e.text for e in stream) == "[TOOL_CALLS]bc"
    assert stream.tools.family == "mistral" and stream.content == "[TOOL_CALLS]bc" and stream.tool_calls == []
    quiet = engine.stream("a", tools=TOOLS, tool_choice="none", max_tokens=8, draft_max=0)
    assert "".join(e.text for e in quiet) == "bc"  # no calls read: the control token stays silent
    assert np.array_equal(quiet.tokens, stream.tokens)
