"""`edgespec serve --parallel N` as a real process: several requests decode at once, each answered as it is alone, a
cancelled one leaves the others' answers alone, and a conversation's next turn reuses its slot's cache."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from test_server import NOTES, conversation_turns, serve  # noqa: E402 (after the skips: the server's extra is optional)

from edgespec.cli import main  # noqa: E402

N = 16
PROMPTS = ["Name three colors.", "Count to five.", "What is the capital of France?", "Say hello in Spanish.",
           "List two fruits."]


def ask(client, prompt: str, **extra):
    r = client.chat.completions.create(model="any", messages=[{"role": "user", "content": prompt}], max_tokens=N,
                                       temperature=0, **extra)
    return r.choices[0].message.content


@pytest.fixture(scope="module")
def server(reference_pair):
    """Three streams of the reference pair's f32 target (llama.cpp's rounding alone moves its rows between pass
    shapes, test_streams.py), drafted by its q4_0 draft model."""
    target, draft = reference_pair
    with serve("--target", str(target), "--draft", str(draft), "--ctx", "512", "--parallel", "3") as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def alone(client):
    """Each prompt's greedy answer with no other request in the server."""
    return {prompt: ask(client, prompt) for prompt in PROMPTS}


def target_only(target, prompts: list[str]) -> dict[str, str]:
    """Each prompt's greedy target-only answer in this process: no draft, no server."""
    from edgespec.api import load

    engine = load(target, "none", n_ctx=512, threads=1)
    try:
        return {p: engine.generate([{"role": "user", "content": p}], max_tokens=N).text for p in prompts}
    finally:
        engine.close()


def test_each_answer_alone_is_target_only_decoding(reference_pair, alone):
    """The answers the tests here compare with are the target's own."""
    assert alone == target_only(reference_pair[0], PROMPTS)


def test_requests_at_once_are_answered_as_each_alone(server, client, alone):
    """Five requests at once on three streams (two wait for a free one)."""
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: ask(client, p), PROMPTS))
    assert together == [alone[p] for p in PROMPTS]
    health = httpx.get(f"{server}/health").json()
    assert health["slots"] == 3 and health["slots_busy"] == 0 and health["waiting"] == 0
    assert "edgespec_slots 3" in httpx.get(f"{server}/metrics").text


def test_a_cancelled_stream_leaves_the_others_answers_unchanged(server, client, alone):
    story = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]

    def cancel_one():
        body = {"messages": story, "max_tokens": 300, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=120) as r:
            events = 0
            for line in r.iter_lines():
                events += line.startswith("data: ")
                if events >= 4:
                    return  # leaving the block closes the connection mid-answer

    with ThreadPoolExecutor(3) as pool:
        cancelled = pool.submit(cancel_one)
        others = list(pool.map(lambda p: ask(client, p), PROMPTS[:2]))
        cancelled.result()
    assert others == [alone[p] for p in PROMPTS[:2]]
    deadline = time.monotonic() + 60
    while httpx.get(f"{server}/health").json()["slots_busy"]:  # the cancelled stream frees its slot
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_conversations_next_turn_reuses_its_cache_after_other_requests(client):
    """The second turn lands on the slot holding the first (new requests took the other slots meanwhile, sharing
    the template's system prompt with it) and reads only what is new: usage.prompt_tokens_details.cached_tokens,
    as OpenAI reports a cached prefix."""
    turn = [{"role": "user", "content": "Tell me about the moon in two sentences."}]
    first = client.chat.completions.create(model="any", messages=turn, max_tokens=N, temperature=0)
    with ThreadPoolExecutor(2) as pool:
        meanwhile = list(pool.map(
            lambda p: client.chat.completions.create(model="any", messages=[{"role": "user", "content": p}],
                                                     max_tokens=N, temperature=0),
            ["Describe a cat.", "Describe a dog."]))
    turn += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And the sun?"}]
    second = client.chat.completions.create(model="any", messages=turn, max_tokens=N, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    assert all(r.usage.prompt_tokens_details.cached_tokens < first.usage.prompt_tokens for r in meanwhile)


def test_a_conversation_displaced_from_every_slot_starts_from_its_saved_state(server, client):
    """New conversations take the slots least recently used, one after another, until none holds the first: its
    next turn starts from the state saved as its slot was taken (both models'), in whichever slot is free."""
    before = httpx.get(f"{server}/health").json()["prompt_cache"]
    others = [NOTES.replace("Summarize", verb) for verb in ("Translate to French", "Shorten", "Criticize")]
    first, second = conversation_turns(client, NOTES, others)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    assert httpx.get(f"{server}/health").json()["prompt_cache"]["restored"] > before["restored"]


def test_streams_drafting_with_an_eagle3_head_answer_as_target_only(reference_pair, smollm2_checkpoint, tmp_path):
    """`serve --parallel 2` with an EAGLE-3 GGUF as the draft: both streams draft from one decoder context beside
    the target (tests/real/test_eagle3_real.py checks its drafts and laws); requests at once are answered as greedy
    target-only decoding in this process."""
    import numpy as np

    from edgespec.export.eagle3 import convert_eagle3, random_eagle3

    head = convert_eagle3(random_eagle3(tmp_path / "head", smollm2_checkpoint, draft_ids=np.arange(4096), seed=2),
                          smollm2_checkpoint, tmp_path / "head.gguf")
    target = reference_pair[0]
    with serve("--target", str(target), "--draft", str(head), "--ctx", "512", "--parallel", "2") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
        with ThreadPoolExecutor(3) as pool:
            together = list(pool.map(lambda p: ask(client, p), PROMPTS[:3]))
        assert httpx.get(f"{url}/health").json()["slots"] == 2
    assert together == list(target_only(target, PROMPTS[:3]).values())


@pytest.mark.parametrize("args, message", [
    (["--draft", "eagle"], "heads and prompt lookup in front of a draft run one stream at a time"),
    (["--draft", "ngram", "--tree-width", "2"], "draft trees"),
    (["--ctx", "8192"], "4 streams of 8192 tokens need 32768 cells"),
])
def test_what_several_streams_cannot_run_is_refused_in_one_line(default_gguf, args, message):
    result = CliRunner().invoke(main, ["serve", "--target", str(default_gguf), "--parallel", "4", "--threads", "1",
                                       *args])
    assert result.exit_code == 1 and message in result.output, result.output
    assert "Traceback" not in result.output
