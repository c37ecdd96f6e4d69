"""GGUF export: llama.cpp's converter and quantizer, parity-gated, atomic; sources; pairs."""

import json
import shutil

import pytest
from click.testing import CliRunner

from edgespec.backends.llama.backend import LlamaBackend
from edgespec.cli import main
from edgespec.errors import EdgespecError
from edgespec.export import export, export_pair, parity
from edgespec.export import gguf as gguf_export


def only_outputs(folder):
    """Files left in folder, hidden temporaries included."""
    return sorted(p.name for p in folder.iterdir())


def test_tiny_checkpoint_to_gguf_f32_passes_parity(tiny_checkpoint, tmp_path):
    out = tmp_path / "tiny-f32.gguf"
    summary = export(str(tiny_checkpoint), "gguf", "f32", out, progress=False)
    assert summary["parity"]["passed"] and summary["parity"]["overall"]["greedy_equal"] == len(parity.PARITY_PROMPTS)
    assert only_outputs(tmp_path) == ["tiny-f32.gguf", "tiny-f32.gguf.parity.json"]
    saved = json.loads((tmp_path / "tiny-f32.gguf.parity.json").read_text())
    assert saved["overall"]["kl"] < 1e-4 and all(p["tokenizer_equal"] for p in saved["prompts"])
    backend = LlamaBackend(out, n_ctx=256)
    assert backend.vocab.n_vocab == 49152 and backend.vocab.eos_id == 2


def test_every_gguf_type_from_the_converter_or_the_quantizer(tiny_checkpoint, tmp_path):
    sizes = {}
    for quant in ("f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0"):
        summary = export(str(tiny_checkpoint), "gguf", quant, tmp_path / f"tiny-{quant}.gguf", progress=False)
        assert summary["parity"]["passed"], (quant, summary["parity"]["failures"])
        sizes[quant] = summary["weight_bytes"]
    assert sizes["q4_0"] < sizes["q8_0"] < sizes["f16"]
    assert not [n for n in only_outputs(tmp_path) if n.startswith(".")]  # no temporaries left


def test_real_checkpoint_to_f32_and_q4_k_m(smollm2_checkpoint, tmp_path):
    f32 = export(str(smollm2_checkpoint), "gguf", "f32", tmp_path / "smol-f32.gguf", progress=False)
    assert f32["parity"]["passed"] and f32["parity"]["overall"]["greedy_equal"] == len(parity.PARITY_PROMPTS)
    q4 = export(str(smollm2_checkpoint), "gguf", "q4_k_m", tmp_path / "smol-q4_k_m.gguf", progress=False)
    assert q4["parity"]["passed"] and q4["weight_bytes"] < f32["weight_bytes"] / 4
    # tokenizer, special tokens and chat template travelled into the metadata
    exported, shipped = LlamaBackend(tmp_path / "smol-f32.gguf", n_ctx=256), _shipped()
    assert exported.vocab.texts == shipped.vocab.texts and exported.vocab.eog_ids == shipped.vocab.eog_ids
    assert exported.chat_template() == shipped.chat_template()


def _shipped():
    from edgespec.models.default import default_target

    return LlamaBackend(default_target(), n_ctx=256)


def test_gguf_source_is_requantized_with_parity_against_it(default_gguf, tmp_path):
    summary = export(str(default_gguf), "gguf", "q8_0", tmp_path / "smol-q8_0.gguf", progress=False)
    assert summary["parity"]["passed"] and summary["parity"]["overall"]["top1_agreement"] > 0.95


def hub_cache(root, repo_id, folder, commit="0123456789abcdef0123456789abcdef01234567"):
    """Lay a checkpoint out as huggingface-hub's cache does: blobs behind snapshots/<commit>, refs/main."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in folder.iterdir():
        (snapshot / f.name).symlink_to(f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return commit


def test_hub_id_resolves_from_the_local_cache_offline(tiny_checkpoint, tmp_path, monkeypatch):
    from huggingface_hub import constants

    commit = hub_cache(tmp_path / "hub", "edgespec-test/tiny-llama", tiny_checkpoint)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    out = tmp_path / "out" / "tiny.gguf"
    summary = export("edgespec-test/tiny-llama", "gguf", "f32", out, progress=False)
    assert summary["parity"]["passed"] and out.is_file()
    export("edgespec-test/tiny-llama", "gguf", "f32", tmp_path / "pinned.gguf", revision=commit, progress=False,
           parity=False)
    onnx = export("edgespec-test/tiny-llama", "onnx", "fp32", tmp_path / "tiny-onnx", progress=False)
    assert onnx["parity"]["passed"] and (tmp_path / "tiny-onnx" / "model.onnx").is_file()
    with pytest.raises(EdgespecError, match="not in the local hub cache"):
        export("edgespec-test/absent", "gguf", "f32", tmp_path / "x.gguf", progress=False)
    with pytest.raises(EdgespecError, match="not in the local hub cache"):
        export("edgespec-test/tiny-llama", "gguf", "f32", tmp_path / "x.gguf", revision="v9", progress=False)
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("case, message", [
    ("missing", "not found"),
    ("no-config", "no config.json"),
    ("architecture", "does not support the architecture FooForCausalLM"),
    ("quant", "unknown GGUF quantization 'q3'"),
])
def test_bad_input_is_one_clear_error_and_writes_nothing(tiny_checkpoint, tmp_path, case, message):
    src, quant = tmp_path / "src", "f16"
    if case == "no-config":
        src.mkdir()
    elif case == "architecture":
        shutil.copytree(tiny_checkpoint, src)
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, "architectures": ["FooForCausalLM"]}))
    elif case == "quant":
        src, quant = tiny_checkpoint, "q3"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(EdgespecError, match=message):
        export(str(src), "gguf", quant, out_dir / "model.gguf", progress=False)
    assert only_outputs(out_dir) == []


def test_not_enough_disk_is_refused_before_work(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_export.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, 1000))
    with pytest.raises(EdgespecError, match="not enough disk"):
        export(str(tiny_checkpoint), "gguf", "f32", tmp_path / "m.gguf", progress=False)
    assert only_outputs(tmp_path) == []


def test_a_converter_failure_is_one_error_that_leaves_logging_and_argv_as_they_were(tiny_checkpoint, tmp_path):
    """The converter runs in this process: what it raises (here: on weights that are not safetensors, which the
    checks before it do not read) becomes one EdgespecError, and the root logger and sys.argv it sets are restored."""
    import logging
    import sys

    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoint, src)
    (src / "model.safetensors").write_bytes(b"not safetensors")
    handlers, level, argv = logging.getLogger().handlers[:], logging.getLogger().level, sys.argv[:]
    with pytest.raises(EdgespecError, match="llama.cpp's converter failed on .*src"):
        gguf_export.convert(src, tmp_path / "m.gguf", "f32", progress=False)
    assert (logging.getLogger().handlers, logging.getLogger().level, sys.argv) == (handlers, level, argv)
    assert not (tmp_path / "m.gguf").exists()


def test_interrupted_conversion_leaves_nothing(tiny_checkpoint, tmp_path, monkeypatch):
    def interrupted(folder, dst, outtype, progress):
        dst.write_bytes(b"GGUF half written")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_export, "convert", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export(str(tiny_checkpoint), "gguf", "f32", tmp_path / "m.gguf", progress=False)
    assert only_outputs(tmp_path) == []


def test_failed_parity_is_an_error_that_keeps_only_the_report(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setitem(parity.THRESHOLDS, "f32", parity.Threshold(max_kl=-1.0, min_top1=1.0, greedy_equal=True))
    with pytest.raises(EdgespecError, match="parity check failed for f32"):
        export(str(tiny_checkpoint), "gguf", "f32", tmp_path / "m.gguf", progress=False)
    assert only_outputs(tmp_path) == ["m.gguf.parity.json"]
    assert json.loads((tmp_path / "m.gguf.parity.json").read_text())["passed"] is False


def test_export_pair_checks_vocabularies_before_converting(tiny_checkpoint, tmp_path, monkeypatch):
    other = tmp_path / "other"
    shutil.copytree(tiny_checkpoint, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    word = next(t for t, i in vocab.items() if i == 3000)
    vocab[word + "X"] = vocab.pop(word)
    (other / "tokenizer.json").write_text(json.dumps(tok))
    monkeypatch.setattr(gguf_export, "convert", lambda *a: pytest.fail("converted before checking the pair"))
    with pytest.raises(EdgespecError, match="draft token 3000"):
        export_pair(str(tiny_checkpoint), str(other), "gguf", tmp_path / "pair", progress=False)
    assert not (tmp_path / "pair").exists() or only_outputs(tmp_path / "pair") == []


def test_export_pair_writes_a_manifest_that_generate_loads(tiny_checkpoint, tmp_path):
    result = export_pair(str(tiny_checkpoint), str(tiny_checkpoint), "gguf", tmp_path / "pair",
                         target_quant="f32", draft_quant="q8_0", progress=False)
    manifest = json.loads((tmp_path / "pair" / "pair.json").read_text())
    assert manifest["target"]["file"] == "target-f32.gguf" and manifest["draft"]["quant"] == "q8_0"
    assert manifest["tokenizer_hash"] == result["tokenizer_hash"] and manifest["target"]["n_params"] > 0
    run = CliRunner().invoke(main, ["generate", "Hello", "--raw", "--pair", result["manifest"], "-n", "8",
                                    "--draft-max", "2", "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout)["generated_tokens"] >= 1


def test_cli_export_json_and_errors(tiny_checkpoint, tmp_path):
    runner = CliRunner()
    run = runner.invoke(main, ["export", str(tiny_checkpoint), "--to", "gguf", "--quant", "f32",
                               "--out", str(tmp_path / "t.gguf"), "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout)["parity"]["passed"]
    run = runner.invoke(main, ["export", str(tmp_path / "nope"), "--to", "gguf", "--quant", "f32",
                               "--out", str(tmp_path / "n.gguf")])
    assert run.exit_code == 1 and "not found" in run.output and "Traceback" not in run.output
    run = runner.invoke(main, ["generate", "hi", "--pair", str(tmp_path / "missing.json")])
    assert run.exit_code == 1 and "pair manifest not found" in run.output
