"""Saved sequence states (backends/llama/states.py): a prompt read once is not read again when it comes back, in
whatever stream, and continues exactly as if it had been; the cache keeps to its bytes, drops what a longer state
holds, and a state that cannot be copied back costs a read, not a wrong answer."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edgespec.backends.llama.backend import LlamaBackend
from edgespec.backends.llama.states import (
    COPY_SHARE,
    DEFAULT_BYTES,
    GAIN_TOKENS,
    PROMPT_TOKENS,
    PromptCache,
    prompt_cache_bytes,
)
from edgespec.backends.llama.streams import SharedContext
from edgespec.backends.protocol import MAX_OUTPUTS, sync
from edgespec.errors import EdgespecError

TEXT = (Path(__file__).parents[2] / "docs" / "server.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def texts(default_gguf):
    """Four token lists of 150 tokens, each from another part of docs/server.md."""
    backend = LlamaBackend(default_gguf, n_ctx=256, n_threads=2, sequences=1)
    try:
        tokens = backend.tokenize(TEXT, special=False)
    finally:
        backend.close()
    assert len(tokens) >= 600
    return [tokens[i * 150:(i + 1) * 150] for i in range(4)]


@pytest.fixture(scope="module")
def single(default_gguf):
    backend = LlamaBackend(default_gguf, n_ctx=1024, n_threads=2, sequences=1)
    yield backend
    backend.close()


def test_a_state_saved_from_one_stream_continues_exactly_in_another(default_gguf, texts):
    a, b = texts[0], texts[1]
    backend = LlamaBackend(default_gguf, n_ctx=3 * 512, n_threads=2, sequences=3, overlap=False,
                           outputs=3 * MAX_OUTPUTS, unified=False)
    shared = SharedContext(backend)
    try:
        sync(shared.stream(2), a, 0)  # read without a cache, then a one-row pass as after a restore
        expected = shared.stream(2).forward(b[:1], 1)  # [1, V]
        cache = PromptCache(1 << 28)
        assert shared.stream(0).keep_states(cache)
        sync(shared.stream(0), a, 0)
        sync(shared.stream(0), b, 0)  # drops a: saved first
        assert cache.saved == 1 and shared.stream(0).tokens == b
        rows = shared.rows_decoded
        got = sync(shared.stream(1), a + b[:1], 1)  # a copied in: one token read
        assert shared.rows_decoded - rows == 1
        assert cache.restored == 1 and cache.restored_tokens == len(a)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
        assert shared.stream(1).tokens == a + b[:1]
    finally:
        backend.close()


def test_the_cache_keeps_to_its_bytes_and_drops_what_a_longer_state_holds(single, texts):
    a, b, c, _ = texts
    single.rollback(0)
    sync(single, a, 0)
    cache = PromptCache(1 << 28)
    single.keep_states(cache)
    try:
        sync(single, b, 0)
        size = cache.used  # one state of 150 tokens
        assert cache.saved == 1 and size > 0
        sync(single, a + c[:PROMPT_TOKENS], 0)  # a restored, its state extended
        assert cache.restored == 1 and single.tokens == a + c[:PROMPT_TOKENS]
        sync(single, b, 0)  # the extended a saved: the shorter one it leads dropped; b restored
        assert sorted((s.tokens.tolist() for s in cache._states), key=len) == [b, a + c[:PROMPT_TOKENS]]
        assert cache.restored == 2

        small = PromptCache(size * 3 // 2)  # room for one state of 150 tokens
        single.keep_states(small)
        sync(single, a, 0)  # b saved
        sync(single, c, 0)  # a saved, b dropped for it
        assert small.saved == 2 and [s.tokens.tolist() for s in small._states] == [a]
        assert small.used <= small.capacity
    finally:
        single.keep_states(None)


def test_short_exchanges_are_not_saved_and_short_gains_not_restored(single, texts):
    a, b, c, _ = texts
    single.rollback(0)
    cache = PromptCache(1 << 28)
    single.keep_states(cache)
    try:
        sync(single, a[:PROMPT_TOKENS - 1], 0)
        sync(single, b[:PROMPT_TOKENS - 1], 0)
        assert cache.saved == 0 and len(cache) == 0
        sync(single, a, 0)
        sync(single, b, 0)  # a saved
        few = max(GAIN_TOKENS, -(-len(a) // COPY_SHARE))  # the fewest tokens a's state is copied in to spare
        sync(single, a[:few - 1], 0)  # b saved; a read: its state would spare too few tokens for its copy
        assert cache.saved == 2 and cache.restored == 0
        sync(single, c, 0)
        sync(single, a[:few] + c[:5], 0)  # a's state copied in, then rolled back
        assert cache.restored == 1 and cache.restored_tokens == few
        assert single.tokens == a[:few] + c[:5]
    finally:
        single.keep_states(None)


def test_a_state_that_cannot_be_copied_back_costs_a_read_not_a_wrong_row(single, texts):
    a, b = texts[0], texts[1]
    single.rollback(0)
    expected = sync(single, a + b[:1], 1)
    single.rollback(0)
    cache = PromptCache(1 << 28)
    single.keep_states(cache)
    try:
        sync(single, a, 0)
        sync(single, b, 0)
        state = cache._states[0]
        state.data = state.data[:state.data.nbytes // 2]  # llama.cpp refuses a truncated state
        got = sync(single, a + b[:1], 1)
        assert cache.failed == 1 and cache.restored == 0
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
        assert single.tokens == a + b[:1]
    finally:
        single.keep_states(None)


def test_the_cache_size_is_what_was_asked_within_the_budget():
    assert prompt_cache_bytes("0") == 0
    assert prompt_cache_bytes("512MiB") == 512 << 20
    assert 0 < prompt_cache_bytes("auto") <= DEFAULT_BYTES
    host = SimpleNamespace(discrete=False, capacity=1000 << 20, used=900 << 20)  # a CPU or unified memory plan
    assert prompt_cache_bytes(None, host) <= 100 << 20
    with pytest.raises(EdgespecError, match="does not fit the memory budget"):
        prompt_cache_bytes("200MiB", host)
    vram = SimpleNamespace(discrete=True, capacity=1000 << 20, used=900 << 20)  # the budget is the GPU's
    assert prompt_cache_bytes("200MiB", vram) == 200 << 20
    with pytest.raises(EdgespecError, match="cannot read the prompt cache size"):
        prompt_cache_bytes("lots")


@pytest.mark.parametrize("saving, slot", [(False, 1), (True, 0)])
def test_a_request_takes_the_slot_holding_most_of_its_prompt_where_what_it_drops_is_saved(saving, slot):
    """Slot 0 holds 20 of the prompt's tokens in 100 (not its next turn), slot 1, used longer ago, 10: without a
    prompt cache the request takes slot 1 (slot 0's conversation may come back); with one, slot 0, whose
    conversation is saved before it is overwritten."""
    pytest.importorskip("fastapi")
    from edgespec.server import Slots

    class Stream:
        def __init__(self, tokens):
            self.target = SimpleNamespace(tokens=tokens)

        def prompt_tokens(self, prompt, chat, **tools):
            return prompt

    streams = SimpleNamespace(engines=[Stream(list(range(100))), Stream(list(range(10)) + [7] * 50)], name="t",
                              draft_name="none", begin=lambda slot: None, end=lambda slot: None)
    slots = Slots(streams)
    slots._used, slots.saving = [2, 1], saving
    assert slots.pick(list(range(20)) + [999], chat=False)([0, 1]) == slot
