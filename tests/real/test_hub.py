"""Models by hub name, on a hub cache laid out here as huggingface-hub lays it out (blobs, refs, snapshots of links),
offline: no test reaches the network."""

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgespec.backends import gguf_file
from edgespec.backends.protocol import VOCAB_PADDING
from edgespec.cli import main
from edgespec.errors import EdgespecError
from edgespec.models import draft_search, hub

COMMIT = "0123456789abcdef0123456789abcdef01234567"
COMMIT_V2 = "fedcba9876543210fedcba9876543210fedcba98"
TARGET = "test-org/SmolLM2-135M-Instruct-GGUF"  # the default model's bytes under quant-named files
DRAFT = "test-org/Tiny-GGUF"  # a random tiny model with the default model's vocabulary
OTHER = "test-org/Other-Vocab-GGUF"  # the same tokenizer padded by 129 tokens, one past VOCAB_PADDING: no draft


@pytest.fixture(scope="session")
def ggufs(tmp_path_factory, default_gguf):
    """Real GGUF files to link into caches: the default model, a tiny model of its vocabulary (whole and split in two
    parts, as gguf-py splits), a wider one (a target that loads and measures in a moment), the wider one and a tiny
    one with that vocabulary padded by VOCAB_PADDING tokens (as Qwen2.5 7B-72B pad the 0.5B-3B's), and one padded
    by a token more: another vocabulary."""
    import gguf

    from edgespec.models.random_gguf import Shape, write_random_gguf

    folder = tmp_path_factory.mktemp("ggufs")
    (folder / "default.gguf").write_bytes(Path(default_gguf).read_bytes())
    tiny = write_random_gguf(folder / "tiny.gguf", shape="tiny", n_vocab=49152, dtype="f32")
    other = write_random_gguf(folder / "other.gguf", shape="tiny", n_vocab=49152 + VOCAB_PADDING + 1, dtype="f32")
    wide = write_random_gguf(folder / "wide.gguf", shape=Shape(2, 256, 4, 2, 512), n_vocab=49152, dtype="f32")
    wide_padded = write_random_gguf(folder / "wide-padded.gguf", shape=Shape(2, 256, 4, 2, 512),
                                    n_vocab=49152 + VOCAB_PADDING, dtype="f32")
    tiny_padded = write_random_gguf(folder / "tiny-padded.gguf", shape="tiny", n_vocab=49152 + VOCAB_PADDING,
                                    dtype="f32")
    reader = gguf_file.open_gguf(tiny)  # gguf-py's reader through a plain view of its map
    writer = gguf.GGUFWriter(folder / "split.gguf", "llama", split_max_tensors=10)
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            kind = field.types[0]
            writer.add_key_value(field.name, field.contents(), kind,
                                 sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parts = sorted(folder.glob("split-0000*-of-00002.gguf"))
    assert len(parts) == 2
    return {"default": folder / "default.gguf", "tiny": tiny, "other": other, "wide": wide,
            "wide_padded": wide_padded, "tiny_padded": tiny_padded, "split": parts}


@lru_cache
def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def add_repo(cache: Path, repo_id: str, files: dict, commit: str = COMMIT, ref: str | None = "main") -> Path:
    """A repository in a huggingface-hub cache: blobs by content hash (hard links of `files`' sources, no copies),
    snapshots/<commit>/<name> relative links to them, refs/<ref> naming the commit. Returns the snapshot."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = repo / "snapshots" / commit
    for name, source in files.items():
        blob = repo / "blobs" / _sha256(source)
        if not blob.exists():
            os.link(source, blob)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty hub cache, offline, for huggingface-hub (which read its environment at import) and the environment."""
    from huggingface_hub import constants

    root = tmp_path / "hub"
    root.mkdir()
    for name, value in (("HF_HUB_CACHE", str(root)), ("HF_HUB_OFFLINE", True)):
        monkeypatch.setattr(constants, name, value)
        monkeypatch.setenv(name, "1" if value is True else value)
    return root


@pytest.fixture
def populated(cache, ggufs):
    add_repo(cache, TARGET, {"SmolLM2-135M-Instruct-Q4_K_M.gguf": ggufs["default"],
                             "smollm2-135m-instruct-q8_0.gguf": ggufs["default"], "README.md": ggufs["tiny"]})
    add_repo(cache, DRAFT, {"tiny.gguf": ggufs["tiny"]})
    add_repo(cache, OTHER, {"other-Q4_K_M.gguf": ggufs["other"]})
    return cache


def tree(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): (p.is_symlink(), p.stat().st_mtime_ns if p.exists() else None)
            for p in root.rglob("*")}


# --- names and quantizations: pure ---------------------------------------------------------------------------------


# --- the cache, offline --------------------------------------------------------------------------------------------

def test_names_resolve_offline_from_the_cached_snapshot(populated, ggufs):
    from edgespec.drafts.spec import parse_draft
    from edgespec.pair import resolve_model

    snapshot = populated / f"models--{TARGET.replace('/', '--')}" / "snapshots" / COMMIT
    assert hub.resolve_gguf(f"{TARGET}:q8_0") == snapshot / "smollm2-135m-instruct-q8_0.gguf"
    assert hub.resolve_gguf(TARGET) == snapshot / "SmolLM2-135M-Instruct-Q4_K_M.gguf"  # Q4_K_M first
    assert resolve_model(f"{TARGET}:Q8_0") == snapshot / "smollm2-135m-instruct-q8_0.gguf"
    assert str(parse_draft(f"ngram+{DRAFT}").resolved()) == f"ngram+{hub.resolve_gguf(DRAFT)}"
    assert resolve_model("ngram") == "ngram"
    pulled = hub.pull(f"{TARGET}:Q4_K_M")
    assert pulled.name == f"{TARGET}:Q4_K_M" and pulled.commit == COMMIT
    assert pulled.size == ggufs["default"].stat().st_size and pulled.path.read_bytes()[:4] == b"GGUF"


def test_a_split_model_is_pulled_whole_and_llama_cpp_opens_its_first_part(cache, ggufs):
    from edgespec.backends.llama.backend import LlamaBackend

    names = [p.name.replace("split", "Tiny-Q8_0") for p in ggufs["split"]]
    add_repo(cache, "test-org/Split-GGUF", dict(zip(names, ggufs["split"], strict=True)))
    pulled = hub.pull("test-org/Split-GGUF:Q8_0")
    assert pulled.path.name == "Tiny-Q8_0-00001-of-00002.gguf" and pulled.gguf.files == tuple(sorted(names))
    assert pulled.size == sum(p.stat().st_size for p in ggufs["split"])
    model = LlamaBackend(pulled.path, n_ctx=32, n_threads=1)  # it finds part 2 beside part 1
    try:
        assert model.vocab.n_vocab == 49152
    finally:
        model.close()
    add_repo(cache, "test-org/Half-GGUF", {names[0]: ggufs["split"][0]})
    with pytest.raises(EdgespecError, match="split in 2 parts, 1 of them in the hub cache"):
        hub.pull("test-org/Half-GGUF")


def test_a_revision_picks_another_snapshot(populated, ggufs):
    add_repo(populated, TARGET, {"SmolLM2-135M-Instruct-Q8_0.gguf": ggufs["tiny"]}, commit=COMMIT_V2, ref="v2")
    snapshot_v2 = populated / f"models--{TARGET.replace('/', '--')}" / "snapshots" / COMMIT_V2
    assert hub.resolve_gguf(f"{TARGET}:Q8_0", revision="v2") == snapshot_v2 / "SmolLM2-135M-Instruct-Q8_0.gguf"
    assert hub.resolve_gguf(f"{TARGET}@v2") == hub.resolve_gguf(TARGET, revision=COMMIT_V2)  # by name, by commit
    assert hub.resolve_gguf(TARGET).parent.name == COMMIT  # main is where it was
    with pytest.raises(EdgespecError, match=rf"{TARGET} has no Q4_K_M GGUF in its cached snapshot .*; it has Q8_0"):
        hub.pull(f"{TARGET}:Q4_K_M@v2")
    names = {m.name for m in hub.cached_models()}
    assert f"{TARGET}:Q8_0@v2" in names and f"{TARGET}:Q4_K_M" in names


@pytest.mark.parametrize("name, message", [
    ("test-org/Absent-GGUF:Q4_K_M", "is not in the hub cache .* and HF_HUB_OFFLINE is set"),
    (f"{TARGET}:Q4_K_M@v9", r"@v9 is not in the hub cache"),
    (f"{TARGET}:Q5_K_M", f"{TARGET} has no Q5_K_M GGUF in its cached snapshot .*; it has Q4_K_M, Q8_0"),
    ("test-org/Checkpoint", "test-org/Checkpoint has no GGUF file"),
    ("test-org/Twins-GGUF:Q8_0", "2 GGUF models of Q8_0"),
])
def test_errors_are_one_clear_message_and_change_nothing(populated, ggufs, name, message):
    add_repo(populated, "test-org/Checkpoint", {"config.json": ggufs["tiny"]})
    add_repo(populated, "test-org/Twins-GGUF", {"a/m-Q8_0.gguf": ggufs["tiny"], "b/m-Q8_0.gguf": ggufs["tiny"]})
    before = tree(populated)
    with pytest.raises(EdgespecError, match=message):
        hub.pull(name)
    result = CliRunner().invoke(main, ["pull", name])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert tree(populated) == before


# --- the commands --------------------------------------------------------------------------------------------------

def test_pull_prints_the_path_and_models_lists_the_cache_and_its_pairs(populated):
    runner = CliRunner()
    result = runner.invoke(main, ["pull", f"{TARGET}:q8_0"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(hub.resolve_gguf(f"{TARGET}:Q8_0"))
    data = json.loads(runner.invoke(main, ["pull", DRAFT, "--json"]).stdout)
    assert data["name"] == f"{DRAFT}:tiny.gguf" and data["files"] == ["tiny.gguf"] and data["commit"] == COMMIT

    listing = json.loads(runner.invoke(main, ["models", "--json"]).stdout)
    assert listing["offline"] and {m["name"] for m in listing["models"]} == {
        f"{TARGET}:Q4_K_M", f"{TARGET}:Q8_0", f"{DRAFT}:tiny.gguf", f"{OTHER}:Q4_K_M"}
    by_name = {m["name"]: m for m in listing["models"]}
    assert by_name[f"{TARGET}:Q8_0"]["vocab"] == by_name[f"{DRAFT}:tiny.gguf"]["vocab"] != by_name[
        f"{OTHER}:Q4_K_M"]["vocab"]
    assert by_name[f"{OTHER}:Q4_K_M"]["n_vocab"] == 49152 + VOCAB_PADDING + 1
    assert by_name[f"{TARGET}:Q4_K_M"]["quant"] == "Q4_K_M"
    # the draft with each of the target's files, and with the other vocabulary (129 tokens more: not padded, so
    # another tokenizer's, every token of the draft's spelling one of its); not two files of one repository
    assert sorted((p["target"], p["draft"], p["vocabulary"]) for p in listing["pairs"]) == [
        (f"{OTHER}:Q4_K_M", f"{DRAFT}:tiny.gguf", "cross-tokenizer"),
        (f"{TARGET}:Q4_K_M", f"{OTHER}:Q4_K_M", "cross-tokenizer"), (f"{TARGET}:Q4_K_M", f"{DRAFT}:tiny.gguf", "exact"),
        (f"{TARGET}:Q8_0", f"{OTHER}:Q4_K_M", "cross-tokenizer"), (f"{TARGET}:Q8_0", f"{DRAFT}:tiny.gguf", "exact")]
    assert sorted(p["shared_tokens"] for p in listing["pairs"] if "shared_tokens" in p) == [49152] * 3
    text = runner.invoke(main, ["models"]).output
    assert f"{TARGET}:Q4_K_M <- {DRAFT}:tiny.gguf (" in text and "other-Q4_K_M.gguf" in text
    assert "x smaller, exact vocabulary)" in text and "padded vocabulary)" not in text
    assert f"{OTHER}:Q4_K_M <- {DRAFT}:tiny.gguf (" in text and "another tokenizer, 49152 tokens shared)" in text


def test_models_says_whether_each_pair_is_exact_or_padded(cache, ggufs):
    """A target with the tiny model's vocabulary padded by VOCAB_PADDING tokens pairs with the tiny draft and with a
    model of the unpadded vocabulary, "padded"; those two pair "exact"."""
    padded, wide = "test-org/Padded-GGUF", "test-org/Wide-GGUF"
    add_repo(cache, padded, {"padded-F32.gguf": ggufs["wide_padded"]})
    add_repo(cache, wide, {"wide-F32.gguf": ggufs["wide"]})
    add_repo(cache, DRAFT, {"tiny.gguf": ggufs["tiny"]})
    runner = CliRunner()
    listing = json.loads(runner.invoke(main, ["models", "--json"]).stdout)
    repo = {m["name"]: m["repo"] for m in listing["models"]}
    assert {m["repo"]: m["n_vocab"] for m in listing["models"]} == {
        padded: 49152 + VOCAB_PADDING, wide: 49152, DRAFT: 49152}
    assert sorted((repo[p["target"]], repo[p["draft"]], p["vocabulary"]) for p in listing["pairs"]) == [
        (padded, DRAFT, "padded"), (padded, wide, "padded"), (wide, DRAFT, "exact")]
    text = runner.invoke(main, ["models"]).output
    assert "(target <- draft; exact: the same vocabulary, padded: the same tokens, sizes up to 128 apart;" in text
    for p in listing["pairs"]:
        assert f"  {p['target']} <- {p['draft']} ({p['size_ratio']}x smaller, {p['vocabulary']} vocabulary)" in text


def test_models_lists_the_drafts_in_llama_cpps_formats_beside_the_targets_they_fit(cache, ggufs, tmp_path):
    """A DFlash draft converted for the 256-wide model pairs with it (not with the 576-wide default model, and not as
    a draft model of its vocabulary); a Qwen3.5 GGUF carrying an MTP layer pairs with "mtp"."""
    from edgespec.models.random_dflash import write_random_dflash
    from edgespec.models.random_mtp import write_random_qwen35_mtp

    block = write_random_dflash(tmp_path / "block.gguf", ggufs["wide"], layers=[1, 2], n_layer=1, ff=64)
    qwen = write_random_qwen35_mtp(tmp_path / "qwen.gguf", tokenizer=ggufs["default"])
    add_repo(cache, "test-org/Wide-GGUF", {"wide-F32.gguf": ggufs["wide"]})
    add_repo(cache, TARGET, {"smollm2-Q8_0.gguf": ggufs["default"]})
    add_repo(cache, "test-org/Wide-DFlash-GGUF", {"block.gguf": block})
    add_repo(cache, "test-org/Qwen35-GGUF", {"qwen-F32.gguf": qwen})
    runner = CliRunner()
    listing = json.loads(runner.invoke(main, ["models", "--json"]).stdout)
    heads = sorted((h["target"], h["draft"], h["kind"]) for h in listing["heads"])
    assert heads == [("test-org/Qwen35-GGUF:F32", "mtp", "mtp"),
                     ("test-org/Wide-GGUF:F32", "test-org/Wide-DFlash-GGUF:block.gguf", "dflash")]
    assert not any("DFlash" in p["draft"] or "DFlash" in p["target"] for p in listing["pairs"])
    text = runner.invoke(main, ["models"]).output
    assert ("test-org/Wide-GGUF:F32 <- test-org/Wide-DFlash-GGUF:block.gguf (a DFlash block draft (GGUF "
            "architecture dflash, reading its layers 1, 2))") in text
    assert "test-org/Qwen35-GGUF:F32 <- mtp (its own MTP layer (qwen35))" in text


# --- draft auto ----------------------------------------------------------------------------------------------------

def test_auto_finds_a_smaller_cached_model_with_the_targets_vocabulary(populated):
    from edgespec.drafts.auto import auto_draft, choose_draft

    choice = choose_draft(f"{TARGET}:Q4_K_M")
    assert choice["draft"] == f"{DRAFT}:tiny.gguf" and "cached, with the target's vocabulary" in choice["reason"]
    assert "padded" not in choice["reason"]
    assert auto_draft(f"{TARGET}:Q4_K_M") == choice["path"] == str(hub.resolve_gguf(DRAFT))


def test_auto_drafts_a_padded_target_and_says_the_vocabulary_is_padded(cache, ggufs):
    """The Qwen2.5 case in miniature: a "7B" whose vocabulary is the "0.5B"'s padded by 128 tokens, the 0.5B cached."""
    from edgespec.drafts.auto import choose_draft

    target, draft = "test-org/Qwen2.5-7B-Instruct-GGUF", "Qwen/Qwen2.5-0.5B-Instruct-GGUF"
    add_repo(cache, target, {"Qwen2.5-7B-Instruct-Q4_K_M.gguf": ggufs["wide_padded"]})
    add_repo(cache, draft, {"qwen2.5-0.5b-instruct-q8_0.gguf": ggufs["tiny"]})
    add_repo(cache, OTHER, {"other-Q4_K_M.gguf": ggufs["other"]})  # padded by 1 to the target's: a draft, not preferred
    ratio = ggufs["wide_padded"].stat().st_size / ggufs["tiny"].stat().st_size
    choice = choose_draft(target)
    assert choice["draft"] == f"{draft}:Q8_0" and choice["path"] == str(hub.resolve_gguf(draft))
    assert choice["reason"] == (f"cached, with a padded vocabulary (49152 tokens to the target's 49280), {ratio:.1f}x "
                                "smaller; published as a draft for Qwen2.5 Instruct "
                                "(https://lmstudio.ai/docs/advanced/speculative-decoding)")


@pytest.mark.parametrize("target_file, reason", [
    ("tiny_padded", "published as a draft for Qwen2.5 Instruct (https://lmstudio.ai/docs/advanced/speculative-decoding)"
                    "; pulled into the hub cache, with a padded vocabulary (49152 tokens to the target's 49280)"),
    ("other", None),  # 129 tokens apart: not the draft's vocabulary padded
])
def test_the_catalogued_draft_is_checked_padded_or_not(cache, ggufs, monkeypatch, target_file, reason):
    """The catalogue's draft for a target no cached model drafts (the draft is more than half its size), fetched: here
    from the cache, as pull finds a cached file without the network."""
    monkeypatch.setattr(draft_search, "offline", lambda: False)
    target, draft = "test-org/Qwen2.5-3B-Instruct-GGUF", "Qwen/Qwen2.5-0.5B-Instruct-GGUF"
    add_repo(cache, target, {"Qwen2.5-3B-Instruct-Q4_K_M.gguf": ggufs[target_file]})
    add_repo(cache, draft, {"qwen2.5-0.5b-instruct-q8_0.gguf": ggufs["tiny"]})
    found, why = draft_search.find_draft(target, progress=False)
    if reason:
        assert found == {"draft": f"{draft}:Q8_0", "path": str(hub.resolve_gguf(draft)), "reason": reason} and not why
    else:
        assert found is None and why.endswith(f"the catalogue's draft {draft}:Q8_0 does not share its vocabulary, "
                                              "padded or not")


def test_auto_prefers_the_catalogued_draft_and_never_downloads_offline(cache, ggufs):
    from edgespec.drafts.auto import choose_draft

    # SmolLM2-1.7B-Instruct: catalogued with HuggingFaceTB/SmolLM2-360M-Instruct-GGUF (here: the tiny model, split)
    add_repo(cache, "test-org/SmolLM2-1.7B-Instruct-GGUF", {"SmolLM2-1.7B-Instruct-Q4_K_M.gguf": ggufs["default"]})
    add_repo(cache, OTHER, {"other-Q4_K_M.gguf": ggufs["other"]})
    before = tree(cache)
    choice = choose_draft("test-org/SmolLM2-1.7B-Instruct-GGUF")
    assert choice == {"draft": "ngram", "reason": "prompt lookup: no cached GGUF has test-org/SmolLM2-1.7B-Instruct-"
                      "GGUF:Q4_K_M's vocabulary, padded or not, at 50% of its size or less, and the catalogue's draft "
                      "HuggingFaceTB/SmolLM2-360M-Instruct-GGUF:Q8_0 is not cached (HF_HUB_OFFLINE is set)"}
    assert tree(cache) == before
    names = [p.name.replace("split", "SmolLM2-360M-Instruct-Q8_0") for p in ggufs["split"]]
    add_repo(cache, "HuggingFaceTB/SmolLM2-360M-Instruct-GGUF", dict(zip(names, ggufs["split"], strict=True)))
    add_repo(cache, DRAFT, {"tiny.gguf": ggufs["tiny"]})
    assert sum(p.stat().st_size for p in ggufs["split"]) > ggufs["tiny"].stat().st_size
    choice = choose_draft("test-org/SmolLM2-1.7B-Instruct-GGUF:Q4_K_M")  # another name: chosen afresh
    assert choice["draft"] == "HuggingFaceTB/SmolLM2-360M-Instruct-GGUF:Q8_0", choice  # catalogued over smaller
    assert choice["path"].endswith("-00001-of-00002.gguf") and "published as a draft for SmolLM2" in choice["reason"]


def test_auto_keeps_prompt_lookup_for_files_and_the_default_model(default_gguf, populated):
    from edgespec.drafts.auto import auto_draft, choose_draft

    assert auto_draft(default_gguf) == choose_draft(None)["draft"] == "ngram"  # even with a draft in the cache
    assert "model file or folder" in choose_draft(default_gguf)["reason"]


def test_generate_reports_the_auto_choice_and_the_fallback(populated, ggufs):
    from edgespec.api import load

    add_repo(populated, "test-org/Wide-GGUF", {"wide-F32.gguf": ggufs["wide"]})  # 3.9 times the tiny draft
    runner = CliRunner()
    args = ["generate", "Hi", "-n", "2", "--draft-max", "1", "--cpu"]
    result = runner.invoke(main, [*args, "-m", "test-org/Wide-GGUF"])
    assert result.exit_code == 0, result.output
    assert f"draft (auto): {DRAFT}:tiny.gguf: cached, with the target's vocabulary, 3.9x smaller" in result.stderr
    assert ", draft tiny.gguf (llama.cpp on cpu" in result.stderr  # and it ran
    fallback = {"draft": "ngram", "auto": True, "reason": f"prompt lookup: no cached GGUF has {OTHER}:Q4_K_M's "
                f"vocabulary, padded or not, at 50% of its size or less, and the catalogue pairs no draft with {OTHER}"}
    data = json.loads(runner.invoke(main, [*args, "--json", "-m", OTHER]).stdout)
    assert data["draft_choice"] == fallback and data["placement"]["draft"] is None
    engine = load(OTHER, "none", n_ctx=64)
    try:
        assert engine.draft_choice == {"draft": "none", "reason": "asked for", "auto": False}
    finally:
        engine.close()


def test_chat_runs_a_model_by_hub_name_from_the_cache_offline(populated):
    """What the issue asks for, as a user types it: edgespec chat -m org/repo:QUANT with HF_HUB_OFFLINE set."""
    result = CliRunner().invoke(main, ["chat", "-m", f"{TARGET}:Q8_0", "--draft", "none", "-n", "4", "--cpu"],
                                input="Hi\n/exit\n")
    assert result.exit_code == 0, result.output
    assert "smollm2-135m-instruct-q8_0.gguf (llama.cpp on cpu" in result.stderr
    assert result.stdout.count("> ") >= 2  # it answered the first line and came back for the next


def test_a_split_model_is_planned_whole(cache, ggufs):
    """The memory plan of a split model counts every part's weights, not only those of the part llama.cpp opens."""
    from edgespec.api import plan_for
    from edgespec.backends.model_info import read_model_info

    names = [p.name.replace("split", "Tiny-Q8_0") for p in ggufs["split"]]
    add_repo(cache, "test-org/Split-GGUF", dict(zip(names, ggufs["split"], strict=True)))
    whole = read_model_info(ggufs["tiny"])
    split = read_model_info(hub.resolve_gguf("test-org/Split-GGUF"))
    assert len(split.tensors) == len(whole.tensors) and split.weight_bytes == whole.weight_bytes
    plan = plan_for("test-org/Split-GGUF", "none", device="rpi5-8gb", measure_bandwidth=False)
    assert plan.target.weights >= whole.weight_bytes > 0
    second = hub.resolve_gguf("test-org/Split-GGUF").with_name(names[1])
    with pytest.raises(EdgespecError, match="give its first part"):
        read_model_info(second)


def test_models_on_an_empty_cache(cache):
    result = CliRunner().invoke(main, ["models"])
    assert result.exit_code == 0 and "no GGUF models cached" in result.output
    assert json.loads(CliRunner().invoke(main, ["models", "--json"]).stdout)["models"] == []
