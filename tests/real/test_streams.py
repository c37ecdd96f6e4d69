"""Several streams on one llama.cpp context (backends/llama/streams.py, parallel.py), on the real default model:
each stream's answer is its request's alone, at t=1 too, while the others decode beside it."""

import os
import signal
import threading
import time

import numpy as np
import pytest
from conftest import REPEATING
from stats_util import ALPHA, first_two_p, target_instead_of_residual

import edgespec
from edgespec.backends.llama.backend import LlamaBackend
from edgespec.backends.llama.streams import SharedContext
from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.bench import read_prompts
from edgespec.decode import rule as rule_module
from edgespec.errors import EdgespecError
from edgespec.parallel import Parallel

PROMPTS = [row["prompt"] for row in read_prompts(None)][::6][:6]


@pytest.fixture(scope="module")
def alone(default_gguf):
    engine = edgespec.load(default_gguf, "none", n_ctx=1024, threads=1)
    yield engine
    engine.close()


@pytest.mark.parametrize("draft", ["none", "ngram", "model"])
def test_greedy_streams_answer_as_each_request_alone(reference_pair, draft):
    """Six requests on four streams (two wait for a free one) with the reference pair's f32 target: each answer is
    the request's decoded alone; their passes ran together (fewer decodes than rounds). (A quantized target's rows
    move by up to 0.7 between passes of other shapes, llama.cpp's kernels for more rows: enough to flip a greedy
    choice now and then, alone as beside others; an f32 target's move by rounding only.)"""
    target, draft_model = reference_pair
    alone = edgespec.load(target, "none", n_ctx=1024, threads=1)
    with Parallel(target, draft_model if draft == "model" else draft, streams=4, n_ctx=1024, threads=1) as p:
        before = p.target.decodes
        results = p.generate(PROMPTS, max_tokens=24, draft_max=None if draft == "none" else 3)
        rounds = sum(r.stats.target_passes for r in results)
        assert p.target.decodes - before - len(PROMPTS) < rounds, (p.target.decodes, rounds)  # prefills apart
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert result.tokens == alone.generate(prompt, max_tokens=24, draft_max=0).tokens, prompt
        assert result.stats.drafted > 0 or draft == "none"
    alone.close()


def streamed(gguf, n: int = 160) -> list[tuple]:
    """The first two tokens at t=1 of n requests (seeds 0..n-1), four streams at a time, prompt lookup drafting."""
    with Parallel(gguf, "ngram", streams=4, n_ctx=256, threads=1) as p:
        return [tuple(r.tokens) for r in p.generate([{"prompt": REPEATING, "seed": s} for s in range(n)], max_tokens=2,
                                                    temperature=1.0, chat=False, draft_max=3)]


def law_p(alone, answers: list[tuple]) -> tuple[float, float]:
    """first_two_p of answers to the repeating prompt against the target's exact law (alone's target computes it)."""
    return first_two_p(alone.target, alone.prompt_tokens(REPEATING, chat=False), answers)


def test_a_stream_samples_the_target_law_beside_others(default_gguf, alone):
    """At t=1 the first two tokens of 160 requests run four at a time follow the target's exact law of them (its
    power: the next test)."""
    together = streamed(default_gguf)
    first, both = law_p(alone, together)
    assert first > ALPHA and both > ALPHA and len({t[0] for t in together}) > 3


def test_the_streams_check_catches_a_broken_rule(monkeypatch, default_gguf, alone):
    """The check above fails at the same alpha when the streams' rule draws from the target's law instead of the
    residual after a rejection (p about 5e-7 on the first token): its passing means something."""
    monkeypatch.setattr(rule_module, "residual", target_instead_of_residual)
    first, _ = law_p(alone, streamed(default_gguf))
    assert first < ALPHA


def test_one_failing_request_leaves_the_others_answered_and_says_why(default_gguf, alone):
    with Parallel(default_gguf, "none", streams=2, n_ctx=128, threads=1) as p:
        with pytest.raises(EdgespecError, match="context"):
            p.generate([PROMPTS[0], "word " * 400, PROMPTS[1]], max_tokens=8)
        again = p.generate([PROMPTS[1]], max_tokens=8)  # the context is usable after the failure
    assert again[0].tokens == alone.generate(PROMPTS[1], max_tokens=8, draft_max=0).tokens


def test_streams_past_the_trained_context_are_refused_before_loading(default_gguf, monkeypatch):
    import edgespec.parallel

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded for a context the header refuses")

    monkeypatch.setattr(edgespec.parallel, "LlamaBackend", no_weights)
    with pytest.raises(EdgespecError, match="4 streams of 4096 tokens need 16384 cells, more than .* trained for "
                                            r"\(8192\)"):
        Parallel(default_gguf, "none", streams=4, n_ctx=4096, threads=1)


def test_an_onnx_target_or_too_many_streams_are_refused(tmp_path):
    with pytest.raises(EdgespecError, match="GGUF target"):
        Parallel(tmp_path / "model-onnx", streams=2)
    with pytest.raises(EdgespecError, match="streams must be 1 to 16"):
        Parallel(tmp_path / "m.gguf", streams=17)


def test_a_long_prompt_is_read_in_batches_between_the_decoding_streams_passes(reference_pair):
    """A request that joins with a prompt of four batches does not hold up a stream already decoding for all of
    it: that stream's passes run between the batches; the prompt's last row is the one the same batches give on a
    context of its own (the f32 target: llama.cpp's rounding only, 0.004 here)."""
    target, _ = reference_pair
    shared = SharedContext(LlamaBackend(target, n_ctx=1024, n_threads=1, n_ubatch=64, sequences=2, overlap=False,
                                        outputs=2 * MAX_OUTPUTS), wait_s=5.0)  # no scheduling luck needed
    decodes = []
    decode = shared.backend._decode
    shared.backend._decode = lambda items: decodes.append({seq for _, _, seq, _ in items}) or decode(items)
    decoding, reader = shared.stream(0), shared.stream(1)
    prompt = [(7 * i + 3) % 4000 + 100 for i in range(250)]  # 4 batches of 64
    stop = threading.Event()

    def decode_until_stopped():
        shared.begin(0)
        decoding.forward(prompt[:20], 1)
        while not stop.is_set():
            decoding.forward([int(np.argmax(decoding.forward([5], 1)[-1]))], 1)
        shared.end(0)

    thread = threading.Thread(target=decode_until_stopped)
    thread.start()
    while len(decoding.tokens) < 24:  # it decodes
        time.sleep(0.01)
    shared.begin(1)
    last_row = reader.forward(prompt, 1)[-1]
    shared.end(1)
    stop.set()
    thread.join()
    mine = [i for i, seqs in enumerate(decodes) if seqs == {1}]
    assert len(mine) == 4
    assert all(any(decodes[j] == {0} for j in range(a + 1, b)) for a, b in zip(mine, mine[1:], strict=False))
    alone = LlamaBackend(target, n_ctx=512, n_threads=1, n_ubatch=64, sequences=1)
    expected = alone.forward(prompt, 1)[-1]  # equal but for rounding: attention reads the other stream's cells too
    assert np.abs(last_row - expected).max() < 0.05 and np.argmax(last_row) == np.argmax(expected)
    alone.close()
    shared.close()


@pytest.mark.parametrize("own_pass", [True, False])
def test_each_streams_controller_prices_its_passes_among_the_generating_streams(reference_pair, own_pass):
    """Alone a stream's costs are the passes measured; among s streams a verify of n tokens costs it its share of
    the joined pass of s rows plus the rows its drafts add (in one pool of cells), or plus a pass of those rows
    (a pool per stream: llama.cpp computes them apart); and costs follow streams starting and ending."""
    from edgespec.parallel import _rows_costs

    assert _rows_costs({1: 1.0, 2: 0.9, 3: 2.0}, 5) == {1: 1.0, 2: 1.0, 3: 2.0, 4: 3.1, 5: 4.2}
    target, _ = reference_pair
    with Parallel(target, "ngram", streams=3, n_ctx=256, threads=1) as p:
        assert p._own_pass == (not p.target.backend.unified)  # a pool per stream on the CPU, one on a GPU
        p._own_pass = own_pass
        c = p._rows_cost
        controllers = [engine.controller for engine in p.engines]
        assert all(not k.learn_costs and k.target_costs == {n: c[n] for n in range(1, 10)} for k in controllers)
        p.begin(0)
        p.begin(2)
        expected = {n: c[2] / 2 + (c[n - 1] if n > 1 else 0.0) if own_pass else c[2] / 2 + c[1 + n] - c[2]
                    for n in range(1, 10)}
        assert all(k.target_costs == pytest.approx(expected) for k in controllers)
        p.end(2)
        p.end(0)
        assert controllers[1].target_costs == pytest.approx({n: c[n] for n in range(1, 10)})


def test_a_stream_generating_alone_learns_its_costs_for_every_stream(reference_pair):
    """A stream alone learns its passes' costs from its rounds, as one Engine does (a round's time holds host work
    that passes timed at load leave out), and its draft's step; once another begins, what it learnt prices every
    stream's passes and steps, and no stream learns from joined passes."""
    target, _ = reference_pair
    with Parallel(target, "ngram", streams=2, n_ctx=256, threads=1) as p:
        first, second = (engine.controller for engine in p.engines)
        measured = p._rows_cost[1]
        p.begin(0)
        assert first.learn_costs and not second.learn_costs
        for _ in range(20):
            first.observe(0, 0, 0.0, 2 * measured, pass_tokens=1)
            first.observe(2, 1, 2 * measured, first.target_costs[3])  # draft steps of a pass each
        learnt = first.target_costs[1]
        assert learnt == pytest.approx(2 * measured, rel=0.05)
        assert first.drafting_cost(2) == pytest.approx(2 * measured, rel=0.05) and second.drafting_cost(2) == 0.0
        p.begin(1)
        assert not first.learn_costs and not second.learn_costs
        assert second.drafting_cost(2) == first.drafting_cost(2)  # the step fitted alone, every stream's
        assert p._rows_cost[1] == learnt and p._rows_cost[2] >= learnt  # never less for more rows
        second.observe(0, 0, 0.0, 100 * measured, pass_tokens=1)
        assert second.target_costs == first.target_costs  # a joined pass teaches nothing
        p.end(1)
        p.end(0)
        assert second.target_costs[1] == learnt and not first.learn_costs

def test_the_streams_draft_steps_run_as_one_decode_and_their_verify_waits_for_them(reference_pair):
    """A draft model's context joined to its target's: two streams drafting step together (one decode of the draft
    a step), and a stream that verifies at once waits for the drafting stream's rows, not past it (one decode of
    the target for both). Waits of 5 s: the order is the rule's, not the scheduler's luck."""
    target_file, draft_file = reference_pair

    def opened(path, **kw):
        shared = SharedContext(LlamaBackend(path, n_ctx=512, n_threads=1, sequences=2, overlap=False,
                                            outputs=2 * MAX_OUTPUTS), wait_s=5.0, **kw)
        decode = shared.backend._decode
        shared.log = []
        shared.backend._decode = lambda items: shared.log.append({seq for _, _, seq, _ in items}) or decode(items)
        return shared

    target = opened(target_file)
    draft = opened(draft_file, drafts_for=target)
    text = [(7 * i + 3) % 4000 + 100 for i in range(8)]

    def both(steps: dict[int, int]):
        """Each stream reads the text into both models, then drafts steps[i] tokens and verifies them."""
        rows = {}

        def run(i):
            target.stream(i).forward(text, 1)
            draft.stream(i).forward(text, 1)
            drafted = [int(np.argmax(draft.stream(i).forward([text[-1] + 1], 1)[-1])) for _ in range(steps[i])]
            rows[i] = target.stream(i).forward([text[-1] + 1, *drafted], len(drafted) + 1)
            target.end(i)

        for i in steps:
            target.begin(i)
        threads = [threading.Thread(target=run, args=(i,)) for i in steps]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in steps:
            target.stream(i).rollback(0)
            draft.stream(i).rollback(0)
        return rows

    both({0: 2, 1: 2})
    assert draft.log == [{0, 1}, {0, 1}, {0, 1}] and target.log == [{0, 1}, {0, 1}]  # the text read, then a step each
    draft.log.clear()
    target.log.clear()
    rows = both({0: 2, 1: 0})
    assert draft.log == [{0, 1}, {0}, {0}] and target.log == [{0, 1}, {0, 1}]  # stream 1 verified beside stream 0
    assert rows[0].shape[0] == 3 and rows[1].shape[0] == 1
    with pytest.raises(EdgespecError, match="one draft model"):
        SharedContext(draft.backend, drafts_for=target)
    draft.close()
    target.close()


def test_a_draft_models_step_is_priced_whole_among_streams(reference_pair):
    """Among streams a draft step costs a stream what one step alone costs (its steps join the others' where they
    draft too, but where it drafts alone the others' verify waits for the whole step), as measured at load; a
    joined round's time does not move it (learn_costs off)."""
    target, draft = reference_pair
    with Parallel(target, draft, streams=2, n_ctx=256, threads=1) as p:
        controllers = [engine.controller for engine in p.engines]
        step = controllers[0].draft_cost
        assert step > 0 and controllers[1].draft_cost == step
        p.begin(0)
        p.begin(1)
        controllers[0].observe(3, 1, draft_s=1.0, target_s=1.0)
        assert controllers[0].draft_cost == step and controllers[0].draft_start == 0.0
        p.end(1)
        p.end(0)


def test_streams_with_a_pool_each_fill_the_gaps_between_them_and_take_the_filler_out(reference_pair):
    """A pool of cells per stream (target-only streams): llama.cpp computes a decode as one pass only over
    consecutive sequences with as many tokens each, so the idle stream between two decoding ones gets a filler
    token in the same decode, whose cell is taken out after: that stream's cache and its next row are as before."""
    from edgespec.backends.llama.lib import lib

    target, _ = reference_pair
    shared = SharedContext(LlamaBackend(target, n_ctx=3 * 256, n_threads=1, sequences=3, overlap=False,
                                        outputs=3 * MAX_OUTPUTS, unified=False), wait_s=5.0)
    log = []
    decode = shared.backend._decode
    shared.backend._decode = lambda items: log.append(sorted((seq, out) for _, _, seq, out in items)) or decode(items)
    texts = [[(7 * i + 3 * s) % 4000 + 100 for i in range(10 + s)] for s in range(3)]
    for s, text in enumerate(texts):
        shared.stream(s).forward(text, 1)
    idle = shared.stream(1)
    before = idle.forward([5], 1)[-1].copy()
    idle.rollback(len(texts[1]))
    rows = {}

    def one_token(s):
        rows[s] = shared.stream(s).forward([9], 1)
        shared.end(s)

    shared.begin(0)
    shared.begin(2)
    threads = [threading.Thread(target=one_token, args=(s,)) for s in (0, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert log[-1] == [(0, True), (1, False), (2, True)]  # one decode, stream 1's filler without logits
    assert lib().llama_memory_seq_pos_max(shared.backend._mem, 1) == len(texts[1]) - 1
    assert idle.tokens == texts[1] and np.array_equal(idle.forward([5], 1)[-1], before)
    assert rows[0].shape == rows[2].shape == (1, shared.backend.vocab.n_vocab)
    idle.rollback(len(texts[1]))

    def verify(s, tokens):  # stream 0 verifies a draft of two beside stream 2's one token
        rows[s] = shared.stream(s).forward(tokens, len(tokens))
        shared.end(s)

    shared.begin(0)
    shared.begin(2)
    threads = [threading.Thread(target=verify, args=(0, [9, 10, 11])), threading.Thread(target=verify, args=(2, [9]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert log[-1] == [(0, True)] * 3 + [(1, False), (2, True)]  # the gap filled as the shortest pass: a token
    assert idle.tokens == texts[1] and np.array_equal(idle.forward([5], 1)[-1], before)
    assert rows[0].shape == (3, shared.backend.vocab.n_vocab)
    shared.close()


@pytest.mark.parametrize("draft", ["none", "ngram", "model"])
def test_the_plan_counts_the_cells_a_pool_per_stream_takes(default_gguf, reference_pair, draft):
    """Streams' pools of cells are each rounded up to a multiple of 256 by llama.cpp: the memory plan counts those
    (2 x 512 for 2 x 300); streams that share one pool (a draft model's; prompt lookup's on a GPU) take N x ctx
    rounded up once (768)."""
    from edgespec.plan.placement import gpu_name

    unified = draft == "model" or (draft == "ngram" and gpu_name() is not None)
    with Parallel(default_gguf, reference_pair[1] if draft == "model" else draft, streams=2, n_ctx=300, threads=1,
                  budget="4GiB") as p:
        assert p.target.backend.unified == unified
        assert p.plan.target.n_ctx == (768 if unified else 2 * 512)


def test_every_decode_runs_on_one_thread_and_its_error_reaches_the_caller():
    """DECODER runs what any thread hands it on its one thread (llama.cpp's CPU passes slow down once a second
    thread has decoded); a call from that thread runs in place, an error raised there is raised to the caller,
    leaving the thread serving, and a child forked after the thread started starts one of its own."""
    from edgespec.backends.llama.streams import DECODER

    ran_on = []
    callers = [threading.Thread(target=lambda: ran_on.append(DECODER.call(threading.current_thread)))
               for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert len(set(ran_on)) == 1 and ran_on[0] not in callers and ran_on[0] is not threading.current_thread()
    assert DECODER.call(lambda: DECODER.call(threading.current_thread)) is ran_on[0]  # nested: in place

    def fails():
        raise EdgespecError("the context is full")

    with pytest.raises(EdgespecError, match="context is full"):
        DECODER.call(fails)
    assert DECODER.call(lambda: 7) == 7 and DECODER.pending == 0
    child = os.fork()  # a child forked after the thread started starts its own, not waits on the parent's
    if child == 0:
        signal.alarm(10)  # a child waiting on the parent's thread would wait for good: killed instead
        os._exit(0 if DECODER.call(lambda: 7) == 7 else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
