"""Tool calls through `edgespec serve` on the default model, driven by the official openai client as an agent
drives it (issue 46): forced calls always validate, with a draft as without, and an agent's loop ends in text."""

import json

import pytest
from test_server import serve

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "move", "description": "Drive the robot.",
                                      "parameters": {"type": "object", "properties": {
                                          "direction": {"enum": ["forward", "back", "left", "right"]},
                                          "distance_m": {"type": "number", "minimum": 0, "maximum": 10}},
                                          "required": ["direction", "distance_m"]}}},
    {"type": "function", "function": {"name": "set_timer", "description": "Start a kitchen timer.",
                                      "parameters": {"type": "object", "properties": {
                                          "minutes": {"type": "integer", "minimum": 1, "maximum": 600},
                                          "label": {"type": "string", "maxLength": 40}},
                                          "required": ["minutes"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASKS = [  # (what the user asks, the function the request forces)
    ("What's the weather in Paris?", "get_weather"), ("Is it cold in Oslo right now, in Fahrenheit?", "get_weather"),
    ("Tell me the temperature in Tokyo.", "get_weather"), ("Will I need a coat in Berlin?", "get_weather"),
    ("How hot is it in Cairo?", "get_weather"), ("Weather for São Paulo, please.", "get_weather"),
    ("Drive forward two meters.", "move"), ("Back up half a meter.", "move"), ("Turn left and go 3 m.", "move"),
    ("Move right by 1.5 meters.", "move"), ("Go forward as far as you can.", "move"), ("Come closer.", "move"),
    ("Set a timer for 10 minutes.", "set_timer"), ("Remind me in an hour to check the oven.", "set_timer"),
    ("Timer: 3 minutes for the eggs.", "set_timer"), ("Start a 25 minute focus timer.", "set_timer"),
    ("Boil pasta for 9 minutes.", "set_timer"), ("Wake me in 90 minutes.", "set_timer"),
    ("I need a 5 minute break timer called tea.", "set_timer"), ("Count down 45 minutes.", "set_timer"),
]


@pytest.fixture(scope="module")
def client(default_gguf, q4_0_gguf):
    """A server with the default model drafted by its Q4_0 copy (a draft model: it drafts every round)."""
    with serve("--target", str(default_gguf), "--draft", str(q4_0_gguf), "--ctx", "1024") as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def ask(client, content, **extra):
    return client.chat.completions.create(model="any", messages=[{"role": "user", "content": content}],
                                          tools=TOOLS, max_tokens=64, temperature=0, **extra)


def test_a_forced_call_validates_against_its_schema_every_time_and_the_draft_changes_nothing(client):
    drafted = 0
    for content, name in ASKS[::2]:  # every other ask: each function three times or more
        choice = {"type": "function", "function": {"name": name}}
        with_draft = ask(client, content, tool_choice=choice, extra_body={"draft_max": 4})  # drafting every round
        alone = ask(client, content, tool_choice=choice, extra_body={"draft_max": 0})
        for r in (with_draft, alone):
            assert r.choices[0].finish_reason == "tool_calls", r
            (call,) = r.choices[0].message.tool_calls
            assert call.type == "function" and call.function.name == name and call.id.startswith("call_")
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[name])
        assert with_draft.choices[0].message.tool_calls[0].function == alone.choices[0].message.tool_calls[0].function
        assert alone.model_extra["edgespec"]["drafted"] == 0
        drafted += with_draft.model_extra["edgespec"]["drafted"]
    assert drafted > 0  # the draft model proposed tokens, under the grammar, and changed no answer


def test_required_picks_one_of_the_tools_and_a_stream_reassembles_to_the_same_call(client):
    whole = ask(client, "Drive forward two meters.", tool_choice="required")
    (call,) = whole.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    chunks = list(ask(client, "Drive forward two meters.", tool_choice="required", stream=True))
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:  # as the openai client's users reassemble them
            into = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            into["id"] = delta.id or into["id"]
            into["name"] += delta.function.name or ""
            into["arguments"] += delta.function.arguments or ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [(call.function.name, call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks)
    pieces = [d for c in chunks for d in c.choices[0].delta.tool_calls or [] if d.function.arguments]
    assert len(pieces) > 3  # the arguments streamed as they were decoded


def test_a_forced_call_cut_short_ends_with_length_and_the_arguments_so_far(client):
    """max_tokens ends the call inside its arguments: as OpenAI's, finish_reason length and the arguments written
    so far, the same whole and streamed."""
    content = "Weather for São Paulo, please."
    whole = client.chat.completions.create(model="any", messages=[{"role": "user", "content": content}],
                                           tools=TOOLS, tool_choice="get_weather", max_tokens=12, temperature=0)
    assert whole.choices[0].finish_reason == "length"
    (call,) = whole.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments.startswith('{"')
    with pytest.raises(ValueError):
        json.loads(call.function.arguments)  # unfinished
    chunks = list(client.chat.completions.create(model="any", messages=[{"role": "user", "content": content}],
                                                 tools=TOOLS, tool_choice="get_weather", max_tokens=12,
                                                 temperature=0, stream=True))
    streamed = "".join(d.function.arguments or "" for c in chunks for d in c.choices[0].delta.tool_calls or [])
    assert streamed == call.function.arguments and chunks[-1].choices[0].finish_reason == "length"



def test_auto_answers_in_text_where_no_tool_serves(client):
    r = ask(client, "Name three colors.", tool_choice="auto")
    assert r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls
    assert r.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in ask(client, "Name three colors.", stream=True))
    assert streamed == r.choices[0].message.content


def test_an_agent_loop_calls_runs_the_tool_and_ends_in_a_text_answer(client):
    """The loop an OpenAI-client agent runs: the model calls, the program runs the call and sends the result back,
    and the model answers; here the first turn forces the call (a 135M model chooses poorly), the next is auto."""
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    weather = {"city": "Paris", "temperature": 18, "unit": "celsius", "sky": "clear"}
    for turn in range(3):
        r = client.chat.completions.create(model="any", messages=messages, tools=TOOLS, max_tokens=48,
                                           temperature=0, tool_choice="required" if turn == 0 else "auto")
        message = r.choices[0].message
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            jsonschema.validate(arguments, SCHEMAS[call.function.name])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(weather)})
    assert turn > 0 and message.content and not message.tool_calls, messages


def test_a_malformed_tool_is_a_400_in_openais_shape(client):
    for tools, choice, param in [([{"type": "function", "function": {"name": "two words"}}], "auto", "tools"),
                                 ([{"type": "retrieval"}], "auto", "tools"),
                                 (TOOLS, {"type": "function", "function": {"name": "fly"}}, "tool_choice")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}], tools=tools,
                                           tool_choice=choice, max_tokens=4)
        assert e.value.body["param"] == param and e.value.body["type"] == "invalid_request_error"


@pytest.fixture(scope="module")
def engine(default_gguf):
    import edgespec

    engine = edgespec.load(str(default_gguf), draft="none", threads=1)
    yield engine
    engine.close()


@pytest.mark.parametrize("family", ["qwen2.5", "llama-3.1", "mistral-nemo", "smollm2"])
def test_the_python_api_forces_a_valid_call_in_each_familys_format(engine, family, monkeypatch):
    """engine.generate(messages, tools=...) on the default model's weights under each family's template: the
    answer is written in that family's format (its opener in the prompt, Llama's "parameters") and read back."""
    from test_chat_families import template

    monkeypatch.setattr(engine.target, "chat_template", lambda: template(family))
    stream = engine.stream([{"role": "user", "content": "Drive forward two meters."}], tools=TOOLS,
                           tool_choice="move", max_tokens=48)
    text = "".join(event.text for event in stream)
    (call,) = stream.tool_calls
    assert call["function"]["name"] == "move" and stream.content is None
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS["move"])
    assert ('"parameters": {' if family == "llama-3.1" else '"arguments": {') in text
    assert text.startswith("[{") == (family == "mistral-nemo")  # after [TOOL_CALLS], which ends the prompt
    result = engine.generate("Drive forward two meters.", tools=TOOLS, tool_choice="none", max_tokens=8)
    assert result.tool_calls == [] and result.content == result.text


def test_forced_calls_of_several_clients_at_once_are_each_the_call_made_alone(default_gguf, client):
    """--parallel 2: two clients' forced calls decode side by side, each stream under its own grammar, and each
    is the call the one-at-a-time server makes for the same request."""
    from concurrent.futures import ThreadPoolExecutor

    asks = ASKS[::4]
    alone = [ask(client, content, tool_choice="required").choices[0].message.tool_calls[0].function
             for content, _ in asks]
    with serve("--target", str(default_gguf), "--draft", "ngram", "--ctx", "1024", "--parallel", "2") as url:
        parallel = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda a: ask(parallel, a[0], tool_choice="required"), asks))
    assert [r.choices[0].message.tool_calls[0].function for r in together] == alone
