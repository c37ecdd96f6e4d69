"""Bad values get one clear error, never a crash or a generation (issue 43).

The CLI refuses them while it reads its options, before it loads a model or writes a file: exit status 1 with
click's usage message, no traceback. The server answers every bad sampling field of both completion endpoints
with a 400 in OpenAI's error shape naming the field, and the engine's backend never sees the request. The
sampling parameters themselves refuse an infinite temperature (which would make every weight nan).
"""

import json
import math

import pytest
from click.testing import CliRunner
from fake import FakeBackend, controller, deterministic_table

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.decode.sampling import SamplingParams
from edgespec.errors import EdgespecError

# --- the sampling parameters -------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [math.inf, -math.inf, math.nan])
def test_sampling_params_refuse_a_temperature_that_is_not_finite(temperature):
    with pytest.raises(EdgespecError, match="temperature must be a finite number"):
        SamplingParams(temperature=temperature)


# --- the CLI -----------------------------------------------------------------------------------------------------


@pytest.fixture
def work(monkeypatch):
    """What a command started: loading models, training, exporting. Each is recorded instead of done, so a test can
    say that a bad value stopped the command before any of it."""
    started = []

    def record(name):
        def started_work(*args, **kwargs):
            started.append(name)
            raise AssertionError(f"{name} ran on a bad value")
        return started_work

    import edgespec.parallel
    import edgespec.train.distill
    import edgespec.train.heads

    monkeypatch.setattr(edgespec.parallel, "open_run", record("load"))  # what every command opens a run with
    monkeypatch.setattr(edgespec.train.distill, "distill", record("distill"))
    monkeypatch.setattr(edgespec.train.heads, "train_heads", record("train_heads"))
    return started


def refused(args, work, words):
    """Run `edgespec ARGS`; check that it exited 1 through click (the message, no traceback) having started
    nothing."""
    result = CliRunner().invoke(main, args)
    assert isinstance(result.exception, SystemExit), (result.exception, result.output)  # not a crash
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and words in result.output, result.output
    assert work == []


@pytest.mark.parametrize("args, words", [
    (["generate", "hi", "--seed", "-1"], "give a whole number from 0 up"),
    (["generate", "hi", "--seed", "1.5"], "give a whole number from 0 up"),
    (["chat", "--seed", "-7"], "give a whole number from 0 up"),
    (["advise", "--seed", "-1"], "give a whole number from 0 up"),
    (["generate", "hi", "-t", "inf"], "inf is not a finite number"),
    (["generate", "hi", "-t", "nan"], "nan is not a finite number"),
    (["generate", "hi", "--top-p", "nan"], "nan is not a finite number"),
    (["generate", "hi", "--min-p", "nan"], "nan is not a finite number"),
    (["chat", "-t", "inf"], "inf is not a finite number"),
    (["bench", "-t", "inf"], "inf is not a finite number"),
    (["generate", "hi", "-t", "1e-9"], "below the smallest temperature"),
    (["doctor", "-t", "1e-300"], "below the smallest temperature"),
    (["doctor", "--top-p", "nan"], "nan is not a finite number"),
    (["advise", "-t", "nan"], "nan is not a finite number"),
    (["plan", "--acceptance", "nan"], "nan is not a finite number"),
    (["serve", "--request-timeout", "nan"], "nan is not a finite number"),
    (["serve", "--prompt-cache", "lots"], "cannot read the prompt cache size"),
    (["serve", "--parallel", "0"], "0 is neither auto nor a number of streams from 1 to 16"),
    (["serve", "--parallel", "abc"], "abc is neither auto nor a number of streams from 1 to 16"),
    (["serve", "--parallel", "17"], "17 is neither auto nor a number of streams from 1 to 16"),
])
def test_a_bad_value_is_refused_before_loading(args, words, work):
    refused(args, work, words)


@pytest.mark.parametrize("command", ["distill", "train-heads"])
@pytest.mark.parametrize("option, value, words", [("--seed", "-1", "give a whole number from 0 up"),
                                                  ("-t", "inf", "inf is not a finite number"),
                                                  ("--lr", "nan", "nan is not a finite number")])
def test_a_training_command_refuses_a_bad_value_and_writes_nothing(command, option, value, words, work, tmp_path):
    out = tmp_path / ("draft.gguf" if command == "distill" else "h.medusa.npz")
    refused([command, "--out", str(out), "--corpus", str(tmp_path / "corpus"), option, value], work, words)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, words", [(["generate", "hi", "--no-such-option"], "No such option"),
                                         (["generate"], "Missing argument"),
                                         (["no-such-command"], "No such command"),
                                         (["--no-such-option"], "No such option")])
def test_click_usage_errors_exit_1_like_every_other_user_error(args, words, work):
    """The README's promise: a bad option exits 1, whether click or edgespec finds it."""
    refused(args, work, words)


# --- the server ----------------------------------------------------------------------------------------------------

V = 6
PROMPT = [{"role": "user", "content": "abcd"}]  # FakeBackend tokenizes a..e as 1..5


@pytest.fixture
def server():
    """(a TestClient of the app, its backend) on a fake engine: target only, a chain that never ends."""
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from edgespec.server import create_app

    backend = FakeBackend(deterministic_table({1: 2, 2: 3, 3: 4, 4: 1}, V))
    with TestClient(create_app(Engine(backend, None, controller()), request_timeout=60)) as client:
        yield client, backend


def test_the_server_serves_good_values(server):
    """The control: the fields below, well given, generate (so a 400 below is the value's doing)."""
    client, backend = server
    body = {"messages": PROMPT, "max_tokens": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 3, "min_p": 0.05,
            "seed": 0, "draft_max": 0, "stop": ["zz"], "stream": False, "n": 1, "tools": [],
            "response_format": {"type": "text"}}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3 and backend.calls


# cases the old server let through: to a generation (an infinite temperature, a string or a flag read as a number, a
# flag read from a number), to a 500 (a negative seed, a json_schema that is no object) or to a 400 that named no field
INF = float("inf")  # sent as Infinity, which Python's JSON parser reads
BAD = [
    ("temperature", INF, "temperature"), ("temperature", "0.7", "temperature"), ("temperature", True, "temperature"),
    ("temperature", 1e-9, "temperature"),
    ("top_p", "0.9", "top_p"),
    ("top_k", "3", "top_k"), ("top_k", True, "top_k"),
    ("min_p", "0.1", "min_p"),
    ("draft_max", "2", "draft_max"),
    ("seed", -1, "seed"), ("seed", "42", "seed"), ("seed", True, "seed"),
    ("max_tokens", "16", "max_tokens"), ("max_tokens", True, "max_tokens"),
    ("max_completion_tokens", "8", "max_completion_tokens"),
    ("n", 2, "n"), ("n", "1", "n"), ("n", True, "n"),
    ("stream", "yes", "stream"), ("stream", 1, "stream"),
    ("stop", 5, "stop"), ("stop", [1], "stop"), ("stop", {"a": "b"}, "stop"),
    ("logprobs", True, "logprobs"), ("logprobs", "x", "logprobs"),
    ("tools", [{"type": "function", "function": {"name": "two words"}}], "tools"), ("tools", [1], "tools"),
    ("tools", {"type": "function"}, "tools"), ("tool_choice", "sometimes", "tool_choice"),
    ("parallel_tool_calls", "yes", "parallel_tool_calls"),
    ("response_format", {"type": "xml"}, "response_format.type"), ("response_format", {}, "response_format.type"),
    ("response_format", {"type": "json_schema", "json_schema": "x"}, "response_format.json_schema"),
    ("response_format", {"type": "json_schema", "json_schema": {"schema": "x"}}, "response_format.json_schema"),
]


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", {"messages": PROMPT}),
                                        ("/v1/completions", {"prompt": "abcd"})], ids=["chat", "completions"])
@pytest.mark.parametrize("field, value, param", BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_a_bad_sampling_field_is_a_400_naming_it_and_generates_nothing(server, path, body, field, value, param):
    client, backend = server
    r = client.post(path, content=json.dumps({**body, "max_tokens": 2, field: value}),
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and error["message"], error
    assert backend.calls == []


@pytest.mark.parametrize("seed", [-1, 1.5, "7", True])
def test_the_python_api_refuses_a_bad_seed_before_any_work(seed):
    backend = FakeBackend(deterministic_table({1: 2, 2: 3}, V))
    with pytest.raises(EdgespecError, match="seed must be a whole number"):
        Engine(backend, None, controller()).stream("ab", seed=seed, chat=False)
    assert backend.calls == []
