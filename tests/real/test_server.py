"""`edgespec serve` as a real process on loopback, driven by the official openai client and raw HTTP."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

KEY = "test-key"
PROMPT = [{"role": "user", "content": "Name three colors."}]
N = 16  # tokens per answer: enough to compare, quick on two cores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(*args: str, env: dict | None = None):
    """`edgespec serve ARGS` on a free loopback port, 1 thread (the cores are shared with the test process): its
    URL once /health answers; stopped on leaving."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "edgespec.cli", "serve", *args, "--threads", "1", "--port",
                             str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(default_gguf):
    """A server process with the default model and prompt lookup, one request at a time (tests/
    test_server_parallel.py serves several), requiring an API key."""
    with serve("--target", str(default_gguf), "--draft", "ngram", "--ctx", "512", "--parallel", "1",
               env={**os.environ, "EDGESPEC_API_KEY": KEY}) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def greedy_text(client):
    r = client.chat.completions.create(model="any", messages=PROMPT, max_tokens=N, temperature=0)
    return r.choices[0].message.content


@pytest.fixture(scope="module")
def target_only_text(default_gguf):
    """The default model's greedy answer to PROMPT decoded alone, in this process, with no draft."""
    from edgespec.api import load

    engine = load(default_gguf, "none", n_ctx=512, threads=1)
    try:
        return engine.generate(PROMPT, max_tokens=N).text
    finally:
        engine.close()


def test_the_speculative_server_answers_as_target_only_decoding(client, greedy_text, target_only_text):
    """Greedy, the server drafting with prompt lookup gives the text target-only decoding gives: the answer the
    other tests here compare with is the target's own."""
    assert greedy_text == target_only_text


def test_chat_completion_with_stats(client, greedy_text):
    r = client.chat.completions.create(model="any", messages=PROMPT, max_tokens=N, temperature=0)
    assert r.choices[0].message.content == greedy_text and greedy_text.strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= N and r.usage.prompt_tokens > 5
    stats = r.model_extra["edgespec"]  # the field OpenAI clients ignore
    assert stats["generated_tokens"] == r.usage.completion_tokens
    assert {"drafted", "accepted", "acceptance_rate", "mean_accepted_length"} <= set(stats)


def test_streamed_chat_equals_the_whole_answer(client, greedy_text):
    chunks = list(client.chat.completions.create(model="any", messages=PROMPT, max_tokens=N, temperature=0,
                                                 stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == greedy_text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].model_extra["edgespec"]["generated_tokens"] > 0


def test_completions_and_models(client, server):
    r = client.completions.create(model="any", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.choices[0].text.strip() and r.usage.completion_tokens <= 8
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="any", prompt="The capital of France is", max_tokens=8, temperature=0, stream=True))
    assert streamed == r.choices[0].text
    assert [m.id for m in client.models.list().data] == [r.model]
    assert httpx.get(f"{server}/health").json()["status"] == "ok"  # no key needed
    metrics = httpx.get(f"{server}/metrics")  # no key needed either
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    generated = next(line for line in metrics.text.splitlines() if line.startswith("edgespec_generated_tokens_total"))
    assert int(generated.split()[1]) >= 2 * r.usage.completion_tokens


@pytest.mark.parametrize("extra, words", [({"n": 2}, "n must be 1"), ({"temperature": -1}, "temperature"),
                                          ({"max_tokens": 0}, "max_tokens"), ({"logprobs": True}, "logprobs"),
                                          ({"response_format": {"type": "json_schema"}}, "json_schema.schema")])
def test_bad_requests_are_400_with_a_message(client, extra, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="any", messages=PROMPT, **extra)
    assert words in e.value.body["message"]


def test_malformed_requests_and_keys(server):
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    r = httpx.post(f"{server}/v1/chat/completions", content=b"{not json", headers=h)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{server}/v1/chat/completions", json={"messages": []}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(f"{server}/v1/chat/completions", headers=h,  # valid JSON, but no text llama.cpp can tokenize
                   content=b'{"messages": [{"role": "user", "content": "Hi \\udcff"}]}')
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content"
    r = httpx.post(f"{server}/v1/chat/completions", headers=h,
                   json={"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})
    assert r.status_code == 400
    r = httpx.post(f"{server}/v1/chat/completions", json={"messages": PROMPT}, headers={"Authorization": "Bearer x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0).models.list()


def test_a_prompt_longer_than_the_context_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="any", prompt="word " * 600, max_tokens=4)
    assert "context" in e.value.body["message"]


def test_a_disconnect_mid_stream_cancels_and_leaves_the_server_consistent(server, client, greedy_text):
    story = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]
    body = {"messages": story, "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as r:
        events = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
            if len(events) >= 3:
                break  # leaving the block closes the connection mid-answer
    deadline = time.monotonic() + 30
    while (health := httpx.get(f"{server}/health").json())["busy"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert health["last_finish_reason"] == "cancelled"  # stopped, not run to its 400 tokens
    r = client.chat.completions.create(model="any", messages=PROMPT, max_tokens=N, temperature=0)
    assert r.choices[0].message.content == greedy_text


def test_concurrent_clients_queue_and_all_get_the_right_answer(client, greedy_text):
    def ask(_):
        r = client.chat.completions.create(model="any", messages=PROMPT, max_tokens=N, temperature=0)
        return r.choices[0].message.content

    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(ask, range(3))) == [greedy_text] * 3


NOTES = ("Summarize these notes. The server keeps one model pair loaded and answers requests in order; each "
         "request may carry its own temperature, top-k, top-p, min-p and seed, and the answer is distributed as "
         "the target model alone would answer it. A draft proposes tokens, the target checks them in one pass, "
         "and a rejection step keeps the output exact. The draft length is chosen from costs measured on the "
         "device. A long conversation reuses the prefix its cache holds, and a prompt read before is restored.")


def conversation_turns(client, first_prompt: str, other_prompts: list[str]):
    """A conversation's first turn, other conversations one after another, then its second turn: (first, second)."""
    turn = [{"role": "user", "content": first_prompt}]
    first = client.chat.completions.create(model="any", messages=turn, max_tokens=N, temperature=0)
    for prompt in other_prompts:
        client.chat.completions.create(model="any", messages=[{"role": "user", "content": prompt}], max_tokens=N,
                                       temperature=0)
    turn += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "Now in one sentence."}]
    return first, client.chat.completions.create(model="any", messages=turn, max_tokens=N, temperature=0)


def test_a_conversation_starts_from_its_saved_state_after_another_took_the_cache(server, client):
    """One slot: another conversation overwrote the models' caches between two turns; the first one's state,
    saved in host memory as it was dropped, is copied back and only the new turn is read."""
    before = httpx.get(f"{server}/health").json()["prompt_cache"]
    first, second = conversation_turns(client, NOTES, [NOTES.replace("Summarize", "Translate to French")])
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    after = httpx.get(f"{server}/health").json()["prompt_cache"]
    assert after["restored"] > before["restored"] and 0 < after["bytes"] <= after["capacity_bytes"]
    metrics = httpx.get(f"{server}/metrics").text
    assert f"edgespec_prompt_cache_restored_total {after['restored']}" in metrics


def test_response_format_constrains_the_answer_to_the_schema(client):
    schema = {"type": "object", "properties": {"action": {"type": "string", "enum": ["move", "stop"]},
                                               "distance_m": {"type": "number"}},
              "required": ["action", "distance_m"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": "Move forward two meters. Answer in JSON."}],
        max_tokens=48, temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "cmd",
                                                                                            "schema": schema}})
    command = json.loads(r.choices[0].message.content)
    assert command["action"] in ("move", "stop") and isinstance(command["distance_m"], (int, float))
    r = client.chat.completions.create(model="any", messages=PROMPT, max_tokens=48, temperature=0,
                                       response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.lstrip().startswith("{")  # an object, complete unless max_tokens cut it
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_a_padded_target_drafted_by_another_tokenizer_answers_as_target_only(padded_gguf, retokenized_q4_0_gguf,
                                                                             target_only_text):
    """The pairs people run, served: a target with 128 padding ids (Qwen2.5 7B's) and a draft of another tokenizer
    (ids shuffled, tokens dropped) drafting every round: greedy, the answer the default model gives alone."""
    with serve("--target", str(padded_gguf), "--draft", str(retokenized_q4_0_gguf), "--ctx", "512") as url:
        pair = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        r = pair.chat.completions.create(model="any", messages=PROMPT, max_tokens=N, temperature=0,
                                         extra_body={"draft_max": 4})
        assert r.choices[0].message.content == target_only_text
        assert r.model_extra["edgespec"]["drafted"] > 0
