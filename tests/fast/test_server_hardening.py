"""The server under bad input and load, in-process on a fake engine: lone surrogates and unparseable bodies are
400s in OpenAI's error shape, a full queue is a 429 with Retry-After, a request past its time limit is stopped
with a 504 (or a stream's last event), and /metrics counts what happened. Blocking fakes fill the queue and
hold the engine, and time limits fall when a test moves the server's clock past them, so nothing here depends on
how fast the machine is."""

import asyncio
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest
from fake import FakeBackend, controller, deterministic_table

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from edgespec.api import Engine  # noqa: E402
from edgespec.drafts.base import PromptLookupDrafter  # noqa: E402
from edgespec.server import create_app  # noqa: E402

V = 5
CHAIN = {1: 2, 2: 3, 3: 4, 4: 1}  # tokens cycle 1 2 3 4 (texts b c d e) and never end: answers run to max_tokens
PROMPT = [{"role": "user", "content": "bcdebcdebcde"}]  # on the chain: prompt lookup drafts its continuation


class Utf8Fake(FakeBackend):
    """Tokenizes the UTF-8 bytes of the text, as llama.cpp does, so a lone surrogate cannot be tokenized."""

    def __init__(self):
        super().__init__(deterministic_table(CHAIN, V))

    def tokenize(self, text, *, special):
        return [1 + (b - ord("b")) % 4 for b in text.encode("utf-8")]  # b c d e are tokens 1 2 3 4


class GatedFake(Utf8Fake):
    """Holds the engine: after `free` forward passes (the prefill is one, then one per token), each pass waits
    for `gate`; `blocked` is set once one waits."""

    def __init__(self, free: int):
        super().__init__()
        self.free, self.gate, self.blocked = free, threading.Event(), threading.Event()

    def forward(self, tokens, n_logits, **options):
        if len(self.calls) >= self.free:
            self.blocked.set()
            if not self.gate.wait(timeout=60):  # the bound only keeps a broken server from hanging the test
                self.gate.set()
        return super().forward(tokens, n_logits, **options)


LIMIT = 60.0  # a request's time limit in the tests that reach it: they skip the server's clock past it


class LoopClock:
    """The clock of the served app's event loop (which times requests' limits): the machine's monotonic time
    plus whatever a test skips. A limit falls when the test moves the clock past it, never because a busy
    machine was slow to serve the tokens before it."""

    def __init__(self):
        self.skipped = 0.0
        self.loop: asyncio.AbstractEventLoop | None = None

    def new_loop(self) -> asyncio.AbstractEventLoop:
        clock = self

        class Loop(asyncio.SelectorEventLoop):
            def time(self):
                return super().time() + clock.skipped

        self.loop = Loop()
        return self.loop

    def skip(self, seconds: float) -> None:
        """Move the loop's clock on (from the test's thread), in the loop's own turn: what it was given before
        (tokens handed over by the engine's thread) it has taken in by then."""
        moved = threading.Event()

        def move():
            self.skipped += seconds
            moved.set()

        self.loop.call_soon_threadsafe(move)
        assert moved.wait(timeout=60), "the server's event loop is stuck"


@contextmanager
def served(backend, drafter=None, clock=None, engine=None, **options):
    """(raw HTTP client, openai client) for the app on an engine over `backend` (or on `engine`), served by uvicorn
    on loopback in this process, on an event loop that reads `clock` (a LoopClock). Clients time out, and the
    server runs on a daemon thread, so a server that never answers fails its test instead of hanging it. A gated
    backend is opened on the way out, so its thread ends."""
    app = create_app(engine or Engine(backend, drafter, controller()), **options)
    # idle connections stay open however far a test skips the clock
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1,
                                           timeout_keep_alive=3600))
    clock = clock or LoopClock()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def run():
        with asyncio.Runner(loop_factory=clock.new_loop) as runner:
            runner.run(server.serve(sockets=[sock]))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        until(lambda: server.started)
        with httpx.Client(base_url=url, timeout=60) as http:
            yield http, openai.OpenAI(base_url=f"{url}/v1", api_key="any", max_retries=0, timeout=60)
    finally:
        if isinstance(backend, GatedFake):
            backend.gate.set()
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def scrape(http) -> dict[str, float]:
    """/metrics as {sample name with labels: value}, checking the Prometheus text format on the way."""
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in r.text.splitlines():
        if line.startswith("# "):
            assert line.split()[1] in ("HELP", "TYPE"), line
        else:
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def until(condition) -> None:
    """Wait for a condition another thread makes true (a bound only so that a broken server fails the test)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def assert_openai_error(r, status: int, kind: str = "invalid_request_error") -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == kind and body["error"]["message"]
    return body["error"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "ab\\udcffcd"}]}', "messages.0.content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}',
     "messages.0.content.0.text"),
    ("/v1/completions", '{"prompt": "ab\\udcff"}', "prompt"),
    ("/v1/completions", '{"prompt": "abcd", "stop": ["\\udfff"]}', "stop.0"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field_and_never_reaches_the_engine(path, body, param):
    backend = Utf8Fake()
    with served(backend) as (http, _):
        error = assert_openai_error(http.post(path, content=body, headers={"Content-Type": "application/json"}),
                                    400)
        assert error["param"] == param and "lone surrogate" in error["message"]
        raw = body.replace("\\udcff", "\udcff").replace("\\ud800", "\ud800").replace("\\udfff", "\udfff")
        r = http.post(path, content=raw.encode("utf-8", "surrogatepass"),  # the same, as raw (invalid) UTF-8
                      headers={"Content-Type": "application/json"})
        assert assert_openai_error(r, 400)["param"] == param
    assert backend.calls == []


USER = [{"role": "user", "content": "ab"}]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", {"messages": USER, "top_p": 0.0}, "top_p"),
    ("/v1/chat/completions", {"messages": USER, "top_p": 1.5}, "top_p"),
    ("/v1/chat/completions", {"messages": USER, "min_p": 1.0}, "min_p"),
    ("/v1/chat/completions", {"messages": USER, "top_k": -1}, "top_k"),
    ("/v1/chat/completions", {"messages": USER, "draft_max": 16}, "draft_max"),
    ("/v1/chat/completions", {"messages": USER, "temperature": -0.5}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "ab"}]}, "messages.0.role"),
    ("/v1/chat/completions", {"messages": [*USER, {"role": "tool", "content": "4"}]}, "messages.1"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": "ab", "max_tokens": 0}, "max_tokens"),
])
def test_a_value_out_of_its_range_is_a_400_naming_its_field_and_never_reaches_the_engine(path, body, param):
    """The sampling fields' ranges (a top_p of 0 keeps nothing, a min_p of 1 only ties with the top), a draft
    longer than one verify pass checks, a role or a tool message a chat template cannot place, an empty prompt."""
    backend = Utf8Fake()
    with served(backend) as (http, _):
        error = assert_openai_error(http.post(path, json={"model": "any", "max_tokens": 2, **body}), 400)
        assert error["param"] == param, error
    assert backend.calls == []


def test_the_openapi_schema_says_what_the_server_answers():
    """Clients generated from /openapi.json get the statuses and content types the server sends: a refused body is
    a 400 in OpenAI's error shape (no 422, which FastAPI documents by default and the server never sends), a
    streamed completion is text/event-stream, /metrics is text; the refusals sent validate against the schema."""
    jsonschema = pytest.importorskip("jsonschema")
    with served(Utf8Fake(), api_key="k") as (http, _):
        spec = http.get("/openapi.json").json()
        statuses = {path: {method: set(op["responses"]) for method, op in ops.items()}
                    for path, ops in spec["paths"].items()}
        assert statuses == {"/health": {"get": {"200"}}, "/metrics": {"get": {"200"}},
                            "/v1/models": {"get": {"200", "401"}},
                            "/v1/chat/completions": {"post": {"200", "400", "401", "429", "500", "504"}},
                            "/v1/completions": {"post": {"200", "400", "401", "429", "500", "504"}}}
        chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
        assert set(chat["200"]["content"]) == {"application/json", "text/event-stream"}
        assert set(spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
        error_schema = {**chat["400"]["content"]["application/json"]["schema"],
                        "components": spec["components"]}
        key = {"Authorization": "Bearer k"}
        for r in (http.post("/v1/chat/completions", json={"messages": []}, headers=key),
                  http.post("/v1/completions", json={"prompt": "ab"}),  # no key
                  http.post("/v1/completions", content=b"{", headers=key)):
            assert r.status_code in (400, 401) and r.headers["content-type"] == "application/json"
            jsonschema.validate(r.json(), error_schema)
        streamed = http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "stream": True},
                             headers=key)
        assert streamed.headers["content-type"].split(";")[0] in chat["200"]["content"]


def test_a_surrogate_pair_is_text_and_is_served():
    with served(Utf8Fake()) as (http, client):
        r = http.post("/v1/chat/completions", content='{"messages": [{"role": "user", "content": "ab\\ud83d\\ude00"}],'
                      ' "max_tokens": 3}', headers={"Content-Type": "application/json"})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert client.completions.create(model="any", prompt="ab\U0001F600", max_tokens=2).usage.completion_tokens == 2


@pytest.mark.parametrize("body", [b"{not json", b'{"messages": [{"role": "user", "content": "ab"}]',
                                  b'{"messages": [{"role": "user", "content": "\xff"}]}', b"\x00\x00\x00{"])
def test_an_unparseable_body_is_a_400_in_openai_shape(body):
    backend = Utf8Fake()
    with served(backend) as (http, _):
        error = assert_openai_error(http.post("/v1/chat/completions", content=body,
                                              headers={"Content-Type": "application/json"}), 400)
        assert "not valid JSON" in error["message"] and error["param"] is None
    assert backend.calls == []


def test_unknown_endpoints_answer_in_openai_shape():
    with served(Utf8Fake()) as (http, client):
        assert assert_openai_error(http.get("/v1/nothing"), 404)["code"] == "unknown_url"
        assert_openai_error(http.get("/v1/chat/completions"), 405)
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="any", input="ab")


def test_a_full_queue_is_a_429_with_retry_after_and_the_queued_are_served():
    backend = GatedFake(free=1)  # the prefill passes, the first token waits
    ask = dict(model="any", messages=PROMPT, max_tokens=6, temperature=0)
    pool = ThreadPoolExecutor(2)
    with served(backend, max_queue=2) as (http, client):
        first = pool.submit(client.chat.completions.create, **ask)
        backend.blocked.wait(timeout=60)
        second = pool.submit(client.chat.completions.create, **ask)
        until(lambda: scrape(http)["edgespec_queue_depth"] == 1)
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(**ask)
        assert int(refused.value.response.headers["retry-after"]) >= 1
        assert refused.value.body["code"] == "queue_full" and "--max-queue" in refused.value.body["message"]
        metrics = scrape(http)
        assert (metrics["edgespec_requests_in_flight"], metrics["edgespec_queue_depth"]) == (1, 1)
        assert metrics['edgespec_requests_total{status="429"}'] == 1
        backend.gate.set()
        answers = [first.result(timeout=60), second.result(timeout=60)]
        assert [a.choices[0].message.content for a in answers] == ["bcdebc"] * 2
        metrics = scrape(http)
        assert (metrics["edgespec_requests_in_flight"], metrics["edgespec_queue_depth"]) == (0, 0)
        assert metrics['edgespec_requests_total{status="200"}'] == 2
        assert client.chat.completions.create(**ask).choices[0].message.content == "bcdebc"  # room again
    pool.shutdown(wait=False)  # not waited for when the server failed the test: its requests may never end


def test_a_request_past_its_time_limit_is_stopped_with_a_504():
    backend, clock = GatedFake(free=1), LoopClock()  # the prefill passes, the first token waits
    pool = ThreadPoolExecutor(2)
    with served(backend, clock=clock, request_timeout=LIMIT) as (http, client):
        late = pool.submit(client.chat.completions.create, model="any", messages=PROMPT, max_tokens=50)
        assert backend.blocked.wait(timeout=60)
        clock.skip(LIMIT)
        with pytest.raises(openai.InternalServerError) as stopped:
            late.result(timeout=60)
        assert stopped.value.status_code == 504 and stopped.value.body["code"] == "request_timeout"
        assert scrape(http)["edgespec_requests_in_flight"] == 1  # its thread waits in forward until the gate opens
        waited = pool.submit(client.completions.create, model="any", prompt="abcd", max_tokens=4)
        until(lambda: scrape(http)["edgespec_queue_depth"] == 1)
        clock.skip(LIMIT)  # the time spent queued counts too
        with pytest.raises(openai.InternalServerError) as queued:
            waited.result(timeout=60)
        assert queued.value.status_code == 504
        backend.gate.set()
        until(lambda: not http.get("/health").json()["busy"])
        assert http.get("/health").json()["last_finish_reason"] == "cancelled"  # stopped, not run to 50 tokens
        metrics = scrape(http)
        assert metrics["edgespec_generated_tokens_total"] <= 1 and metrics["edgespec_queue_depth"] == 0
        assert metrics['edgespec_requests_total{status="504"}'] == 2
        r = client.chat.completions.create(model="any", messages=PROMPT, max_tokens=4)
        assert r.choices[0].message.content == "bcde"  # the engine serves the next request from its own prompt
    pool.shutdown(wait=False)  # not waited for when the server failed the test: its requests may never end


def test_a_stream_past_its_time_limit_ends_with_an_error_event():
    backend, clock = GatedFake(free=3), LoopClock()  # the prefill and two tokens pass, the third waits
    body = {"messages": PROMPT, "max_tokens": 50, "stream": True}
    pool = ThreadPoolExecutor(1)
    with served(backend, clock=clock, request_timeout=LIMIT) as (http, _):
        def read():
            with http.stream("POST", "/v1/chat/completions", json=body) as r:
                return r.status_code, [line[6:] for line in r.iter_lines() if line.startswith("data: ")]

        answer = pool.submit(read)
        assert backend.blocked.wait(timeout=60)  # two tokens handed over, the third pass waiting
        clock.skip(LIMIT)
        status, events = answer.result(timeout=60)
        assert status == 200 and events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "request_timeout" and error["type"] == "timeout_error"
        text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-2])
        assert text == "bc"  # the tokens before the limit, exactly
        backend.gate.set()
        until(lambda: not http.get("/health").json()["busy"])
        assert http.get("/health").json()["last_finish_reason"] == "cancelled"
    pool.shutdown(wait=False)


def test_metrics_count_statuses_tokens_and_drafts():
    with served(Utf8Fake(), PromptLookupDrafter(V)) as (http, client):
        answers = [client.chat.completions.create(model="any", messages=PROMPT, max_tokens=12, temperature=0),
                   client.completions.create(model="any", prompt="bcdebcde", max_tokens=7, temperature=0)]
        chunks = list(client.chat.completions.create(model="any", messages=PROMPT, max_tokens=5, stream=True))
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="any", messages=PROMPT, n=2)
        stats = [a.model_extra["edgespec"] for a in answers] + [chunks[-1].model_extra["edgespec"]]
        metrics = scrape(http)
    assert metrics["edgespec_generated_tokens_total"] == sum(s["generated_tokens"] for s in stats) == 12 + 7 + 5
    assert metrics["edgespec_draft_tokens_total"] == sum(s["drafted"] for s in stats)
    assert metrics["edgespec_draft_tokens_accepted_total"] == sum(s["accepted"] for s in stats) > 0
    assert metrics['edgespec_requests_total{status="200"}'] == 3
    assert metrics['edgespec_requests_total{status="400"}'] == 1
    assert (metrics["edgespec_queue_depth"], metrics["edgespec_requests_in_flight"]) == (0, 0)
    assert metrics["edgespec_queue_limit"] == 16


def test_serve_passes_the_queue_and_time_limit_options_on(monkeypatch):
    from click.testing import CliRunner

    import edgespec.parallel
    import edgespec.server
    from edgespec import cli

    served_with = {}
    monkeypatch.setattr(edgespec.parallel, "open_run", lambda run: Engine(Utf8Fake(), None, None))
    monkeypatch.setattr(edgespec.server, "serve", lambda engine, **options: served_with.update(options))
    result = CliRunner().invoke(cli.main, ["serve", "--draft", "none", "--parallel", "1", "--max-queue", "3",
                                           "--request-timeout", "2.5"])
    assert result.exit_code == 0, result.output
    assert (served_with["max_queue"], served_with["request_timeout"]) == (3, 2.5)
    result = CliRunner().invoke(cli.main, ["serve", "--draft", "none", "--max-queue", "0"])
    assert result.exit_code == 1 and "--max-queue" in result.output


def test_serve_runs_as_many_streams_as_fit_unless_told(monkeypatch):
    """Without --parallel: 4 streams where the memory plan and the trained context hold them, fewer where not, one
    request at a time where the draft runs one stream; the startup line says which and why."""
    from click.testing import CliRunner

    import edgespec.parallel
    import edgespec.server
    from edgespec import cli

    opened = []

    class Opened:  # what serve reads of a Parallel: its streams, over fakes
        def __init__(self, run):  # the CLI resolved the run once (run.Run)
            self.engines = [Engine(Utf8Fake(), None, None) for _ in range(run.streams)]
            self.draft_choice = dict(run.pair.choice)

        def close(self):
            pass

    def open_run(run):
        opened.append(run.streams)
        return Engine(Utf8Fake(), None, None) if run.streams == 1 else Opened(run)

    monkeypatch.setattr(edgespec.parallel, "open_run", open_run)
    monkeypatch.setattr(edgespec.server, "serve", lambda engine, **options: None)
    for args, streams, why in ((["--draft", "none"], 4, "4 contexts of 2048 tokens"),
                               (["--draft", "ngram", "--ctx", "4096"], 2, "was trained for 8192 tokens"),
                               (["--draft", "none", "--parallel", "3"], 3, ""),
                               (["--draft", "eagle"], 1, "run one stream at a time"),
                               (["--draft", "eagle", "--tree-width", "2"], 1, "draft trees run one stream at a time")):
        result = CliRunner().invoke(cli.main, ["serve", *args])
        assert result.exit_code == 0, result.output
        assert opened.pop() == streams and why in result.output and opened == []
        assert ("--parallel auto" in result.output) == (args[-2] != "--parallel")


class Streams:
    """What the server needs of a Parallel: an engine per stream (here each over its own gated fake), begin/end."""

    def __init__(self, backends):
        self.engines = [Engine(b, None, None) for b in backends]
        self.name, self.draft_name, self.draft_choice = "fake", "none", {}
        self.begun = []

    def begin(self, stream):
        self.begun.append(stream)

    def end(self, stream):
        pass


def test_with_two_streams_two_requests_generate_at_once_and_the_queue_counts_past_them():
    backends = [GatedFake(free=1), GatedFake(free=1)]  # each stream's prefill passes, its first token waits
    streams = Streams(backends)
    ask = dict(model="any", messages=PROMPT, max_tokens=6, temperature=0)
    pool = ThreadPoolExecutor(3)
    with served(None, engine=streams, max_queue=3) as (http, client):
        running = [pool.submit(client.chat.completions.create, **ask) for _ in range(2)]
        for backend in backends:
            backend.blocked.wait(timeout=60)
        waiting = pool.submit(client.chat.completions.create, **ask)
        until(lambda: scrape(http)["edgespec_queue_depth"] == 1)
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(**ask)
        metrics = scrape(http)
        assert (metrics["edgespec_requests_in_flight"], metrics["edgespec_slots"]) == (2, 2)
        assert http.get("/health").json()["slots_busy"] == 2 and sorted(streams.begun) == [0, 1]
        backends[1].gate.set()  # stream 1's request finishes first: the waiting one takes stream 1
        assert waiting.result(timeout=60).choices[0].message.content == "bcdebc"
        assert sorted(streams.begun[:2]) == [0, 1] and streams.begun[2] == 1
        until(lambda: sum(r.done() for r in running) == 1)  # the one on stream 0 still waits for its gate
        backends[0].gate.set()
        assert [r.result(timeout=60).choices[0].message.content for r in running] == ["bcdebc"] * 2
        until(lambda: scrape(http)["edgespec_requests_in_flight"] == 0)
    pool.shutdown(wait=False)


def test_admission_hands_free_slots_out_first_come_first_served():
    from edgespec.server.limits import Admission

    async def scenario():
        admission = Admission(size=5, slots=2)
        assert all(admission.admit() for _ in range(5)) and not admission.admit()
        first, second = await admission.turn(None), await admission.turn(None, pick=max)
        assert (first, second) == (0, 1) and admission.in_flight == 2
        late = asyncio.ensure_future(admission.turn(asyncio.get_running_loop().time() + 0.01))
        third = asyncio.ensure_future(admission.turn(None))
        fourth = asyncio.ensure_future(admission.turn(None))
        with pytest.raises(TimeoutError):  # gave up waiting: it leaves the queue and the admitted count
            await late
        assert (admission.admitted, admission.waiting) == (4, 2)
        admission.leave(1)
        assert await third == 1 and not fourth.done()  # in order of arrival
        fourth.cancel()  # a client that went away while waiting
        with pytest.raises(asyncio.CancelledError):
            await fourth
        assert (admission.admitted, admission.waiting) == (2, 0)
        admission.leave(0)
        admission.leave(1)
        assert (admission.admitted, admission.free) == (0, {0, 1})

    asyncio.run(scenario())


def test_a_tool_conversations_next_turn_picks_the_slot_holding_it():
    """The template gives the model the tools before the conversation, so the slot holding an agent's conversation
    is found only by the prompt with its tools: its next turn (a tool result) goes there, not to the least
    recently used slot."""
    from edgespec.server import Slots

    tools = {"tools": [{"type": "function", "function": {"name": "move"}}], "tool_choice": "auto",
             "parallel_tool_calls": True}
    streams = Streams([FakeBackend(deterministic_table({}, V), n_ctx=4096) for _ in range(2)])
    slots = Slots(streams)
    first = [{"role": "user", "content": "bcde"}]
    call = {"id": "call_1", "type": "function", "function": {"name": "move", "arguments": "{}"}}
    held = streams.engines[1].prompt_tokens(first, chat=True, **tools)
    streams.engines[1].target.tokens = [*held, 1, 2]  # slot 1 answered the first turn
    streams.engines[0].target.tokens = [3, 3]
    slots._used = [0, 1]  # slot 0 was used longest ago
    turn = [*first, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"}]
    assert slots.pick(turn, True, **tools)([0, 1]) == 1
    slots._used = [0, 1]
    assert slots.pick(turn, True)([0, 1]) == 0  # without the tools the conversation is not recognised
    slots.executor.shutdown()
