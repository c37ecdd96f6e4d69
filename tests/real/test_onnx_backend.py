"""The ONNX backend: cache arithmetic on a tiny export, vocabularies equal to llama.cpp's, exactness through the
speculative loop, and the real SmolLM2 as ONNX against its GGUFs (marked slow)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import CORPUS_PROMPTS, REPEATING
from stats_util import ALPHA, first_two_p, target_instead_of_residual

from edgespec.api import Engine
from edgespec.backends.llama.backend import LlamaBackend
from edgespec.backends.onnx import backend as onnx_backend
from edgespec.backends.onnx.backend import MAX_OUTPUTS, OnnxBackend
from edgespec.backends.onnx.vocab import eog_ids, piece
from edgespec.backends.onnx.weights import export_facts, output_matrix
from edgespec.bench import read_prompts
from edgespec.decode import rule as rule_module
from edgespec.decode.cost import DraftController
from edgespec.drafts.base import ModelDrafter, PromptLookupDrafter
from edgespec.errors import EdgespecError
from edgespec.export import export

TEXTS = ["Hello world 12345, it's 3.14!", "<|im_start|>user\nHi there<|im_end|>\n", "café, naïve, 😀 and ünïcödé",
         "  two  spaces\n\n\ttab {x: [1, 2]} <reponame>"]


def controller():
    return DraftController({n: 1.0 for n in range(1, 17)}, 0.0, k_max=8)


@pytest.fixture(scope="module")
def tiny_onnx(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint (SmolLM2's tokenizer) exported to ONNX fp32, parity checked."""
    out = tmp_path_factory.mktemp("onnx-backend") / "tiny-fp32"
    export(str(tiny_checkpoint), "onnx", "fp32", out, progress=False)
    return out


@pytest.fixture
def tiny(tiny_onnx):
    backend = OnnxBackend(tiny_onnx, n_ctx=256)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def gguf_backend(default_gguf):
    """The shipped SmolLM2 GGUF: the reference for vocabulary and tokenization."""
    backend = LlamaBackend(default_gguf, n_ctx=256)
    yield backend
    backend.close()


def token_ids(backend, n):
    ids = backend.tokenize(" ".join(TEXTS) * 4, special=False)
    assert len(ids) >= n
    return ids[:n]


# --- the cache: forward, chunks, rollback ---


@pytest.fixture(params=["host", "io-binding"])
def backend(request, tiny):
    """The tiny backend with each cache: numpy arrays, or OrtValues through IO binding (on the CPU here; the
    same code keeps the cache in GPU memory under CUDA)."""
    if request.param == "io-binding":
        import onnxruntime

        tiny._cache = onnx_backend.DeviceCache(onnxruntime, tiny._session, tiny._graph, ("logits",), "cpu")
    return tiny


def test_chunks_and_pieces_give_the_logits_of_one_pass(backend, monkeypatch):
    monkeypatch.setattr(onnx_backend, "PREFILL_CHUNK", 7)  # rows asked for span chunk boundaries
    ids = token_ids(backend, 40)
    whole = backend.forward(ids, 16)  # [16, V]
    backend.rollback(0)
    parts = [backend.forward(ids[:24], 0), backend.forward(ids[24:35], 11), backend.forward(ids[35:], 5)]
    assert [p.shape[0] for p in parts] == [0, 11, 5]
    np.testing.assert_allclose(np.concatenate(parts), whole, atol=1e-4)
    assert backend.tokens == ids


def test_rollback_then_refeed_gives_the_same_logits(backend):
    ids = token_ids(backend, 30)
    backend.forward(ids[:20], 0)
    first = backend.forward(ids[20:], 4)
    backend.forward([5000, 6000, 7000], 3)  # a rejected draft
    backend.rollback(20)
    assert backend.tokens == ids[:20]
    np.testing.assert_allclose(backend.forward(ids[20:], 4), first, atol=1e-4)
    backend.rollback(len(backend.tokens))  # nothing to drop
    backend.rollback(0)
    np.testing.assert_allclose(backend.forward(ids, 4), first, atol=1e-4)
    with pytest.raises(ValueError):
        backend.rollback(31)


def test_only_the_rows_asked_for_come_back(tiny):
    ids = token_ids(tiny, 20)
    assert tiny.forward([], 0).shape == (0, tiny.vocab.n_vocab) and tiny.tokens == []
    assert tiny.forward(ids[:10], 0).shape == (0, tiny.vocab.n_vocab)
    last = tiny.forward(ids[10:], 3)
    assert last.shape == (3, tiny.vocab.n_vocab) and last.dtype == np.float32
    for n_tokens, n_logits in [(2, 3), (20, MAX_OUTPUTS + 1), (2, -1)]:
        with pytest.raises(ValueError):
            tiny.forward(ids[:n_tokens], n_logits)
    assert tiny.tokens == ids


@pytest.mark.parametrize("cache", ["host", "io-binding"])
def test_hidden_states_are_what_the_output_layer_reads(tiny_onnx, cache, monkeypatch):
    """The export's last_hidden_state output, through either cache and across prefill chunks: the rows that
    come back with logits are the states whose product with the output layer is those logits."""
    monkeypatch.setattr(onnx_backend, "PREFILL_CHUNK", 7)
    backend = OnnxBackend(tiny_onnx, n_ctx=256, hidden=True)
    if cache == "io-binding":
        import onnxruntime

        backend._cache = onnx_backend.DeviceCache(onnxruntime, backend._session, backend._graph,
                                                  ("logits", onnx_backend.HIDDEN_OUTPUT), "cpu")
    output = output_matrix(tiny_onnx)  # [V, E]
    assert output.shape == (backend.vocab.n_vocab, backend.n_embd) == (49152, 64)
    ids = token_ids(backend, 30)
    backend.forward(ids[:12], 0)
    assert backend.last_hidden is None  # no rows asked for, none kept
    logits = backend.forward(ids[12:], 10)  # the 10 rows span a chunk boundary
    assert backend.last_hidden.shape == (10, 64)
    np.testing.assert_allclose(backend.last_hidden @ output.T, logits, atol=1e-3)
    plain = OnnxBackend(tiny_onnx, n_ctx=256)  # without hidden: the same logits, no states
    np.testing.assert_allclose(plain.forward(ids, 10), logits, atol=1e-4)
    assert getattr(plain, "last_hidden", None) is None
    backend.close()
    plain.close()


def test_an_export_without_hidden_states_is_refused_for_heads(tiny_onnx, tmp_path):
    """Exports written before edgespec added the output still run, but not with heads: one clear error."""
    import shutil

    import onnx

    old = tmp_path / "old-export"
    shutil.copytree(tiny_onnx, old)
    proto = onnx.load(str(old / "model.onnx"))
    kept = [o for o in proto.graph.output if o.name != onnx_backend.HIDDEN_OUTPUT]
    del proto.graph.output[:]
    proto.graph.output.extend(kept)
    onnx.save_model(proto, str(old / "model.onnx"))
    assert OnnxBackend(old, n_ctx=64).forward([1, 2, 3], 1).shape == (1, 49152)
    with pytest.raises(EdgespecError, match="does not return hidden states.*export it again"):
        OnnxBackend(old, n_ctx=64, hidden=True)
    assert export_facts(old)["hidden"] is False and export_facts(tiny_onnx)["hidden"]
    from edgespec.train.heads import train_heads

    with pytest.raises(EdgespecError, match="does not return hidden states.*export it again"):
        train_heads(old, tmp_path / "h.medusa.npz", corpus=tmp_path / "corpus", prompts=CORPUS_PROMPTS, progress=False)
    assert not (tmp_path / "corpus").exists() and not (tmp_path / "h.medusa.npz").exists()


def test_the_target_spins_between_runs_only_where_nothing_runs_beside_it(tiny_onnx):
    """onnxruntime's threads spin between ops (faster) and, where no draft model or head runs beside the target,
    on between runs too; beside one they stop at the end of each run, so the draft's threads get the cores; `spin`
    overrides that, and a setting onnxruntime has no name for is refused."""
    from edgespec.api import load

    def spinning(backend) -> tuple[str, str]:
        options = backend._session.get_session_options()
        try:
            stop = options.get_session_config_entry("session.force_spinning_stop")
        except RuntimeError:  # not set: onnxruntime's default, spinning on between runs
            stop = "0"
        return options.get_session_config_entry("session.intra_op.allow_spinning"), stop

    for draft, expected in [("none", ("1", "0")), ("ngram", ("1", "0")), (str(tiny_onnx), ("1", "1")),
                            (f"ngram+{tiny_onnx}", ("1", "1"))]:
        engine = load(tiny_onnx, draft, n_ctx=64)
        assert spinning(engine.target) == expected, draft
        assert engine.draft_backend is None or spinning(engine.draft_backend) == ("0", "0")
        engine.close()
    for spin, expected in [(False, ("0", "0")), ("runs", ("1", "1")), (True, ("1", "0"))]:
        engine = load(tiny_onnx, "ngram", n_ctx=64, spin=spin)
        assert spinning(engine.target) == expected, spin
        engine.close()
    with pytest.raises(EdgespecError, match="spin must be one of"):
        load(tiny_onnx, "ngram", n_ctx=64, spin="always")


def test_bench_times_target_only_on_the_target_loaded_alone(tiny_onnx, tmp_path, monkeypatch):
    """Beside a draft model an ONNX target's threads spin within runs only, so bench runs target-only on the
    target loaded alone (spinning on between runs, as a user without a draft runs it), loaded once; beside
    prompt lookup the engine is the same."""
    import json

    from click.testing import CliRunner

    from edgespec.cli import main

    calls, loads = [], []
    generate, close = Engine.generate, Engine.close

    def record(self, *args, **kwargs):
        calls.append((self.drafter.name.split(":")[0] if self.drafter else None, kwargs["draft_max"],
                      self.target.spin))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", record)
    monkeypatch.setattr(Engine, "close", lambda self: (loads.append(self.drafter is None), close(self)))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"cat": "a", "prompt": "Count from 1 to 5."}\n{"cat": "b", "prompt": "Say hi."}\n')
    result = CliRunner().invoke(main, ["bench", "-m", str(tiny_onnx), "--draft", str(tiny_onnx), "--also", "ngram",
                                       "--also", str(tiny_onnx), "--prompts", str(prompts), "-n", "8",
                                       "--draft-max", "2", "--json"])
    assert result.exit_code == 0, result.output
    model, ngram, again = json.loads(result.stdout)
    assert model["target_only"] == again["target_only"] == "the target loaded alone"
    assert ngram["target_only"] == "the same engine, drafting off"
    for report in (model, ngram, again):
        assert report["overall"]["identical_outputs"] == 2
    base = [(drafter, spin) for drafter, draft_max, spin in calls if draft_max == 0]
    assert base == [(None, True)] * 2 + [("ngram", True)] * 2 + [(None, True)] * 2
    spec = [(drafter, spin) for drafter, draft_max, spin in calls if draft_max != 0]
    assert spec == [("model", "runs")] * 2 + [("ngram", True)] * 2 + [("model", "runs")] * 2
    assert loads.count(True) == 1  # the target alone loaded once, closed at the end


def test_an_eagle_head_starts_from_the_exports_layer_as_from_the_gguf(tiny_checkpoint, tiny_onnx, tmp_path):
    """The layer an EAGLE head starts from, read from an ONNX export (MatMul initializers found by node name,
    q and k rows permuted for llama.cpp's RoPE), equals the f32 GGUF's of the same checkpoint bit for bit (4
    heads, 2 KV heads); a quantized export is refused by name."""
    from edgespec.train.eagle import layer_weights

    gguf = tmp_path / "tiny-f32.gguf"
    export(str(tiny_checkpoint), "gguf", "f32", gguf, progress=False, parity=False)
    for layer in (0, -1):
        ours, our_shape = layer_weights(tiny_onnx, layer)
        theirs, their_shape = layer_weights(gguf, layer)
        assert our_shape == their_shape and our_shape["n_head"] == 4 and our_shape["n_head_kv"] == 2
        assert ours.keys() == theirs.keys()
        for name, array in theirs.items():
            np.testing.assert_array_equal(ours[name], array, err_msg=name)
    int8 = tmp_path / "tiny-int8"
    export(str(tiny_checkpoint), "onnx", "int8", int8, progress=False, parity=False)
    with pytest.raises(EdgespecError, match="no float weights for .*q_proj.* train it on an fp32 or fp16 export"):
        layer_weights(int8)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_heads_train_on_an_onnx_exports_hidden_states(tiny_onnx, tmp_path, kind):
    """train-heads on an export folder: the corpus records the export's hidden states, the heads train, load
    for it (and only for a target of its width) and keep greedy output equal to target-only."""
    from edgespec.api import load
    from edgespec.train.heads import train_heads

    out = tmp_path / f"h.{kind}.npz"
    summary = train_heads(tiny_onnx, out, kind=kind, corpus=tmp_path / "corpus", prompts=CORPUS_PROMPTS, epochs=2,
                          max_tokens=16, progress=False)
    assert summary["corpus_positions"] > 20 and len(summary["training"]["epochs"]) == 2
    engine = load(tiny_onnx, out, n_ctx=256)
    drafted = 0
    for row in CORPUS_PROMPTS:
        base = engine.generate(row["prompt"], max_tokens=16, draft_max=0)
        spec = engine.generate(row["prompt"], max_tokens=16, draft_max=3)
        assert spec.tokens == base.tokens
        drafted += spec.stats.drafted
    assert drafted > 0
    engine.close()


def test_the_default_draft_is_prompt_lookup_where_the_shipped_head_does_not_fit(tiny_onnx, default_gguf, tmp_path):
    """"auto" puts the shipped EAGLE head behind prompt lookup only on an export it was trained for (the real
    export, in the slow test below); the tiny export shares the vocabulary but is 64 wide, the default model is a
    GGUF (where the head did not beat prompt lookup), and a folder that is no export is left to load's error."""
    from edgespec.api import DEFAULT_DRAFT, load
    from edgespec.drafts.auto import auto_draft

    assert DEFAULT_DRAFT == "auto"
    assert auto_draft(tiny_onnx) == auto_draft(tiny_onnx / "model.onnx") == "ngram"
    assert auto_draft(default_gguf) == auto_draft(tmp_path) == "ngram"
    engine = load(tiny_onnx, n_ctx=64)
    assert engine.drafter.name == "ngram" and not engine.target.hidden
    engine.close()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"not a model")
    assert auto_draft(broken) == "ngram"  # the target's own load says what is wrong
    with pytest.raises(EdgespecError, match="is not an ONNX model onnx can read"):
        output_matrix(broken)


def test_context_overflow_is_an_error_that_keeps_the_cache(tiny_onnx):
    backend = OnnxBackend(tiny_onnx, n_ctx=16)
    backend.forward(list(range(100, 110)), 0)
    with pytest.raises(EdgespecError, match="17 tokens do not fit the context of 16"):
        backend.forward(list(range(7)), 1)
    assert backend.tokens == list(range(100, 110))
    assert backend.forward(list(range(6)), 1).shape == (1, backend.vocab.n_vocab)


def test_context_and_memory_facts(tiny_onnx):
    backend = OnnxBackend(tiny_onnx, n_ctx=100_000)
    assert backend.n_ctx == 512  # the checkpoint's max_position_embeddings
    assert (backend.name, backend.path, backend.provider) == ("tiny-fp32", tiny_onnx, "CPUExecutionProvider")
    memory = backend.memory()
    assert memory["weights"] == (tiny_onnx / "model.onnx").stat().st_size
    assert memory["kv_cache"] == 2 * 2 * 2 * 16 * 4 * 512  # layers x (key, value) x kv heads x head dim x f32
    assert memory["logits"] == onnx_backend.PREFILL_CHUNK * backend.vocab.n_vocab * 4


# --- vocabulary and tokenizer: the same as llama.cpp's for the same model ---


def test_vocab_equals_the_gguf_of_the_same_tokenizer(tiny, gguf_backend):
    ours, theirs = tiny.vocab, gguf_backend.vocab
    assert ours.texts == theirs.texts  # GPT-2 byte-level strings: 'Ġthe', 'Ċ'
    assert ours.pieces == theirs.pieces
    assert (ours.bos_id, ours.eos_id) == (theirs.bos_id, theirs.eos_id) == (1, 2)
    # <|endoftext|>, <|im_end|> by name; <reponame> because llama.cpp reads it as a fill-in-the-middle repo token
    assert ours.eog_ids == theirs.eog_ids == {0, 2, 4}
    assert ours == theirs


@pytest.mark.parametrize("special", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_equals_the_gguf(tiny, gguf_backend, text, special):
    assert tiny.tokenize(text, special=special) == gguf_backend.tokenize(text, special=special)


def test_special_texts_parse_only_when_asked(tiny):
    assert tiny.tokenize("<|im_end|>", special=True) == [2]
    assert 2 not in tiny.tokenize("<|im_end|>", special=False)
    assert tiny.tokenize("hi", special=True) == tiny.tokenize("hi", special=False)  # SmolLM2 adds no BOS


def test_chat_template_equals_the_gguf(tiny, gguf_backend):
    assert tiny.chat_template() == gguf_backend.chat_template()


def test_pieces_follow_the_vocabulary_kind():
    assert piece("Ġcaf\u00c3\u00a9", byte_level=True) == " café".encode()  # é is the two bytes Ã ©
    assert piece("\u010a", byte_level=True) == b"\n"
    assert piece("\u2581hello", byte_level=False) == b" hello"  # SentencePiece's space
    assert piece("<0x0A>", byte_level=False) == b"\n"


@pytest.mark.parametrize("ids, eos, expected", [
    ({"<|im_end|>": 2, "<reponame>": 4, "<file_sep>": 5}, {2}, {2, 4}),
    ({"<|eot_id|>": 9, "<|end_of_text|>": 7}, {7}, {7, 9}),
    ({"<|fim_repo|>": 6, "<|repo_name|>": 3, "<|file_sep|>": 8, "<|fim_pad|>": 1}, set(), {1, 3, 8}),
    ({"<|end|>": 5, "<|return|>": 6, "<|call|>": 7}, {6}, {6, 7}),  # gpt-oss keeps <|end|> out
    ({"hello": 3}, {11, 12}, {11, 12}),  # generation_config.json may list several
])
def test_end_of_generation_ids_follow_llama_cpp(ids, eos, expected):
    assert eog_ids(ids, eos) == expected


# --- exactness through the loop ---


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_greedy_speculation_equals_target_only(tiny, tiny_onnx, draft):
    if draft == "ngram":
        drafter, draft_backend = PromptLookupDrafter(tiny.vocab.n_vocab), None
    else:
        draft_backend = OnnxBackend(tiny_onnx, n_ctx=256)
        drafter = ModelDrafter(draft_backend, tiny.vocab)
    engine = Engine(tiny, drafter, controller(), draft_backend)
    drafted = 0
    for prompt in [REPEATING, "Once upon a time", "1, 2, 3, 4, 5, 6,"]:
        base = engine.generate(prompt, max_tokens=32, chat=False, draft_max=0)
        spec = engine.generate(prompt, max_tokens=32, chat=False, draft_max=4)
        assert spec.tokens == base.tokens and spec.text == base.text, prompt
        assert base.stats.drafted == 0
        drafted += spec.stats.drafted
    assert drafted > 0


# --- errors ---


def kv_less_model(path):
    """A valid ONNX graph input_ids -> logits with no past key/values."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.eye(8, dtype=np.float32), "table")  # [V, V]
    graph = helper.make_graph([helper.make_node("Gather", ["table", "input_ids"], ["logits"])], "no-kv",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "T"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "T", 8])], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_unusable_folders_are_clear_errors(tmp_path):
    with pytest.raises(EdgespecError, match="model folder not found"):
        OnnxBackend(tmp_path / "absent")
    with pytest.raises(EdgespecError, match="has no model.onnx: export one with: edgespec export --to onnx"):
        OnnxBackend(tmp_path)
    (tmp_path / "model.onnx").write_bytes(bytes(range(256)) * 64)
    with pytest.raises(EdgespecError, match="onnxruntime could not load .*model.onnx: ") as e:
        OnnxBackend(tmp_path)
    assert "\n" not in str(e.value)
    kv_less_model(tmp_path / "model.onnx")
    with pytest.raises(EdgespecError, match="takes no past key/values: .*edgespec export --to onnx"):
        OnnxBackend(tmp_path / "model.onnx")  # the model file itself names its folder


def test_providers(tiny_onnx, monkeypatch):
    import onnxruntime

    with pytest.raises(EdgespecError, match="unknown provider 'gpu': choose one of cpu, cuda, tensorrt, coreml, auto"):
        OnnxBackend(tiny_onnx, provider="gpu")
    # a GPU build lists CUDA whether or not a GPU and its libraries are there: auto then falls back to the CPU
    assert OnnxBackend(tiny_onnx, provider="auto").provider in onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        try:
            assert OnnxBackend(tiny_onnx, provider="cuda").provider == "CUDAExecutionProvider"
        except EdgespecError as e:
            assert "could not start CUDAExecutionProvider" in str(e)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(EdgespecError, match="provider 'cuda' needs onnxruntime's CUDAExecutionProvider, but this "
                                            "onnxruntime has only CPUExecutionProvider: install onnxruntime-gpu"):
        OnnxBackend(tiny_onnx, provider="cuda")
    assert OnnxBackend(tiny_onnx, provider="auto").provider == "CPUExecutionProvider"


def test_runtime_libraries_are_imported_only_when_used():
    code = ("import sys, edgespec, edgespec.backends.onnx.backend; "
            "print(sorted({'onnxruntime', 'tokenizers', 'onnx'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_a_missing_onnxruntime_says_how_to_install_it(tiny_onnx, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` raise ImportError
    with pytest.raises(EdgespecError, match=r"ONNX models need onnxruntime: pip install 'edgespec\[onnx\]'"):
        OnnxBackend(tiny_onnx)


# --- the real SmolLM2-135M-Instruct ---


@pytest.fixture(scope="module")
def smollm2_onnx(smollm2_onnx_fp32):
    return Path(smollm2_onnx_fp32["path"])


@pytest.fixture(scope="module")
def smollm2_f32_gguf(reference_pair):
    """The same checkpoint in GGUF float32: the reference pair's target."""
    return reference_pair[0]


@pytest.fixture(scope="module")
def real_onnx(smollm2_onnx):
    backend = OnnxBackend(smollm2_onnx, n_ctx=1024)
    yield backend
    backend.close()


def test_real_export_greedy_matches_its_f32_gguf(real_onnx, smollm2_f32_gguf):
    onnx_engine = Engine(real_onnx, None, None)
    gguf_engine = Engine(LlamaBackend(smollm2_f32_gguf, n_ctx=1024), None, None)
    assert real_onnx.vocab == gguf_engine.target.vocab
    for prompt in [row["prompt"] for row in read_prompts(None)][:3]:  # chat-templated, as the CLI runs them
        expected = gguf_engine.generate(prompt, max_tokens=24)
        assert onnx_engine.generate(prompt, max_tokens=24).tokens == expected.tokens, prompt
    gguf_engine.close()


@pytest.mark.parametrize("draft_file", ["default_gguf", "padded_q4_0_gguf"])
def test_mixed_pair_onnx_target_gguf_draft_is_exact(request, real_onnx, draft_file):
    """An ONNX target drafted by a GGUF of its vocabulary, and by one with 128 padding ids it lacks."""
    draft = LlamaBackend(request.getfixturevalue(draft_file), n_ctx=1024)
    drafter = ModelDrafter(draft, real_onnx.vocab)  # vocabularies checked
    assert drafter.pairing == ("padded" if draft_file.startswith("padded") else "exact")
    engine = Engine(real_onnx, drafter, controller(), draft)
    drafted = accepted = 0
    for prompt in [row["prompt"] for row in read_prompts(None)][::8]:
        base = engine.generate(prompt, max_tokens=32, draft_max=0)
        spec = engine.generate(prompt, max_tokens=32, draft_max=4)
        assert spec.tokens == base.tokens, prompt
        drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
    assert drafted > 0 and 0 < accepted <= drafted
    draft.close()


def lookup_first_tokens(backend, seeds, draft_max):
    """The first two tokens at t=1 of the repeating prompt, one generation a seed, prompt lookup drafting."""
    engine = Engine(backend, PromptLookupDrafter(backend.vocab.n_vocab), controller())
    return [tuple(engine.generate(REPEATING, max_tokens=2, temperature=1.0, seed=seed, chat=False,
                                  draft_max=draft_max).tokens) for seed in seeds]


def test_temperature_one_first_tokens_follow_the_target_law(real_onnx):
    """As in test_real_model: the first two tokens of 300 answers at t=1, ngram drafting, against the ONNX target's
    exact law of them (its power: the next test)."""
    answers = lookup_first_tokens(real_onnx, range(1000, 1300), 3)
    first, both = first_two_p(real_onnx, real_onnx.tokenize(REPEATING, special=True), answers)
    assert first > ALPHA and both > ALPHA
    assert len({a[0] for a in answers}) > 3


def test_the_first_tokens_check_catches_a_broken_rule(monkeypatch, real_onnx):
    """The check above fails at the same alpha on the ONNX target when the rule draws from the target's law instead
    of the residual after a rejection (p about 1e-9 on the first token): its passing means something."""
    monkeypatch.setattr(rule_module, "residual", target_instead_of_residual)
    answers = lookup_first_tokens(real_onnx, range(1000, 1300), 3)
    first, _ = first_two_p(real_onnx, real_onnx.tokenize(REPEATING, special=True), answers)
    assert first < ALPHA


@pytest.mark.parametrize("draft", ["ngram", "onnx"])
def test_real_onnx_greedy_speculation_equals_target_only(real_onnx, smollm2_onnx, draft):
    """On the ONNX export of the real checkpoint, with prompt lookup and with an ONNX draft model (a second
    backend over the same export: same vocabulary, its own cache)."""
    draft_backend = OnnxBackend(smollm2_onnx, n_ctx=1024) if draft == "onnx" else None
    drafter = (ModelDrafter(draft_backend, real_onnx.vocab) if draft_backend
               else PromptLookupDrafter(real_onnx.vocab.n_vocab))
    engine = Engine(real_onnx, drafter, controller(), draft_backend)
    drafted = 0
    for prompt in [row["prompt"] for row in read_prompts(None)][4::8]:
        base = engine.generate(prompt, max_tokens=32, draft_max=0)
        spec = engine.generate(prompt, max_tokens=32, draft_max=4)
        assert spec.tokens == base.tokens, prompt
        drafted += spec.stats.drafted
    assert drafted > 0
    if draft_backend:
        draft_backend.close()


def test_heads_on_the_onnx_export_read_what_llama_cpp_gives_and_stay_exact(real_onnx, smollm2_onnx,
                                                                           smollm2_f32_gguf):
    """The EAGLE head that ships (trained on llama.cpp's hidden states) on the ONNX export of the same checkpoint:
    the export's hidden states and output layer equal the f32 GGUF's, and greedy output equals target-only."""
    from edgespec.api import load
    from edgespec.drafts.auto import auto_draft
    from edgespec.drafts.heads import output_matrix
    from edgespec.run import resolve_run

    assert auto_draft(smollm2_onnx) == "ngram+eagle"  # the default draft here: bench measured it faster
    gguf = LlamaBackend(smollm2_f32_gguf, n_ctx=256, hidden=True)
    onnx = OnnxBackend(smollm2_onnx, n_ctx=256, hidden=True)
    ids = gguf.tokenize("The capital of France is Paris, and the capital of Italy is", special=True)
    for ours, theirs in [(onnx.forward(ids, 4), gguf.forward(ids, 4)), (onnx.last_hidden, gguf.last_hidden)]:
        # two runtimes sum in different orders: measured 0.025 on logits of 29, 0.013 on states of 21
        assert np.abs(ours - theirs).max() < 2e-3 * np.abs(theirs).max()
    np.testing.assert_allclose(output_matrix(smollm2_onnx), output_matrix(smollm2_f32_gguf), atol=1e-6)
    gguf.close()
    onnx.close()
    default = resolve_run(smollm2_onnx, n_ctx=256)  # what load opens (the eagle engine below opens one)
    draft = default.pair.draft  # the shipped EAGLE head behind prompt lookup, on a target giving hidden states
    assert (draft.lookup_first, draft.kind, default.hidden) == (True, "eagle", True)
    engine = load(smollm2_onnx, "eagle", n_ctx=1024)
    drafted = accepted = 0
    for prompt in [row["prompt"] for row in read_prompts(None)][1::5]:
        base = engine.generate(prompt, max_tokens=32, draft_max=0)
        spec = engine.generate(prompt, max_tokens=32, draft_max=3)
        assert spec.tokens == base.tokens, prompt
        drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
    assert drafted > 0 and accepted / drafted > 0.3  # the head reads real states here (an untrained one: ~0)
    engine.close()
    with pytest.raises(EdgespecError, match="draft trees are verified in one pass by llama.cpp"):
        load(smollm2_onnx, "eagle", tree_width=2)


def test_an_eagle_head_trains_on_the_real_export(smollm2_onnx, tmp_path):
    """train-heads on the real fp32 export: the head starts from its last layer (read as the f32 GGUF's: the tiny
    test above holds the reading to that bit for bit), trains on the export's states, and keeps greedy output
    equal to target-only."""
    from edgespec.api import load
    from edgespec.train.heads import train_heads

    out = tmp_path / "real.eagle.npz"
    summary = train_heads(smollm2_onnx, out, kind="eagle", corpus=tmp_path / "corpus", prompts=CORPUS_PROMPTS,
                          epochs=1, max_tokens=24, progress=False)
    assert summary["corpus_positions"] > 30 and summary["training"]["subset"] == 8192
    engine = load(smollm2_onnx, out, n_ctx=256)
    for row in CORPUS_PROMPTS:
        base = engine.generate(row["prompt"], max_tokens=24, draft_max=0)
        spec = engine.generate(row["prompt"], max_tokens=24, draft_max=3)
        assert spec.tokens == base.tokens and spec.stats.drafted > 0
    engine.close()


def test_temperature_one_with_the_eagle_head_on_onnx_follows_the_target_law(smollm2_onnx):
    """The first two tokens of 300 answers at t=1, the shipped EAGLE head drafting, against the target's exact law."""
    from edgespec.api import load

    engine = load(smollm2_onnx, "eagle", n_ctx=256)
    results = [engine.generate("Name a colour.", max_tokens=2, temperature=1.0, seed=seed, draft_max=2)
               for seed in range(1000, 1300)]
    assert sum(r.stats.drafted for r in results) > 100  # the second token goes through the rule
    answers = [tuple(r.tokens) for r in results]
    first, both = first_two_p(engine.target, engine.prompt_tokens("Name a colour."), answers)
    assert first > ALPHA and both > ALPHA
    assert len({a[0] for a in answers}) > 3
    engine.close()
