"""Tool calls read out of each family's answer format, and a request's `tools` checked (edgespec/tool_calls.py)."""

import json

import pytest

from edgespec.errors import EdgespecError
from edgespec.tool_calls import check_tools, family_of, parse_calls

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
NAMES = {"get_weather", "move"}


def calls(text, family):
    content, found = parse_calls(text, family, NAMES)
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in found)
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
