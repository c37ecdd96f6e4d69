"""Hub names: how org/repo[:QUANT][@REVISION] reads, and what is refused, without a download."""

import re

import pytest

from edgespec.errors import EdgespecError
from edgespec.models import draft_search, hub


def test_quant_picking_is_case_insensitive_exact_and_defaults_to_q4_k_m(tmp_path):
    files = ["Qwen2.5-1.5B-Instruct-Q4_K_M.gguf", "qwen2.5-1.5b-instruct-q8_0.gguf", "Qwen2.5-1.5B-Instruct-Q4_0.gguf",
             "Qwen2.5-1.5B-Instruct-Q4_K_M_L.gguf", "mmproj-f16.gguf", "README.md", "config.json"]
    ggufs = hub.group_ggufs(files)
    assert [g.first for g in ggufs] == sorted(files[:4], key=str.lower)  # the vision projector is no model
    pick = lambda quant: hub.pick(ggufs, quant, "org/repo").first  # noqa: E731
    assert pick("q4_k_m") == pick("Q4_K_M") == "Qwen2.5-1.5B-Instruct-Q4_K_M.gguf"  # not Q4_K_M_L
    assert pick("Q8_0") == "qwen2.5-1.5b-instruct-q8_0.gguf"
    assert pick("Qwen2.5-1.5B-Instruct-Q4_K_M_L.gguf") == "Qwen2.5-1.5B-Instruct-Q4_K_M_L.gguf"  # by its file
    assert pick(None) == "Qwen2.5-1.5B-Instruct-Q4_K_M.gguf"
    assert hub.pick(hub.group_ggufs(files[1:3]), None, "o/r").first.endswith("Q4_0.gguf")  # then Q4_0, then Q8_0
    assert hub.pick(hub.group_ggufs(["b-F16.gguf", "a-IQ2_XS.gguf"]), None, "o/r").first == "a-IQ2_XS.gguf"  # first
    assert [hub.quant_of(f) for f in files[:4]] == ["Q4_K_M", "Q8_0", "Q4_0", "Q4_K_M_L"]
    with pytest.raises(EdgespecError, match=r"org/repo has no Q5_K_M GGUF; it has Q4_0, Q4_K_M, Q4_K_M_L, Q8_0"):
        pick("Q5_K_M")
    twins = hub.group_ggufs(["a/x-Q8_0.gguf", "b/x-Q8_0.gguf"])
    with pytest.raises(EdgespecError, match=r"2 GGUF models of q8_0: a/x-Q8_0.gguf, b/x-Q8_0.gguf; name one by its "
                       "file, e.g. org/repo:a/x-Q8_0.gguf"):
        hub.pick(twins, "q8_0", "org/repo")
    assert hub.pick(twins, "b/x-Q8_0.gguf", "o/r").first == "b/x-Q8_0.gguf"
    with pytest.raises(EdgespecError, match="org/repo has no GGUF file"):
        hub.pick(hub.group_ggufs(["model.safetensors"]), None, "org/repo")


def test_split_files_are_one_model_named_by_its_first_part():
    files = ["Q4_K_M/big-Q4_K_M-00002-of-00003.gguf", "Q4_K_M/big-Q4_K_M-00001-of-00003.gguf",
             "Q4_K_M/big-Q4_K_M-00003-of-00003.gguf", "big-Q8_0.gguf"]
    (split, single) = sorted(hub.group_ggufs(files), key=lambda g: g.parts, reverse=True)
    assert split.files == tuple(sorted(files[:3])) and split.parts == 3 and split.label() == "Q4_K_M"
    assert hub.pick([single, split], "q4_k_m", "o/r") is split and hub.pick([single, split], None, "o/r") is split
    assert hub.group_ggufs(files[:2])[0].parts == 3  # two of three parts: incomplete, and it says so


def test_hub_names_are_what_is_no_file_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hub.parse_name("Qwen/Qwen2.5-1.5B-Instruct-GGUF:q4_k_m@v1.0") == (
        "Qwen/Qwen2.5-1.5B-Instruct-GGUF", "q4_k_m", "v1.0")
    assert hub.parse_name("org/repo") == ("org/repo", None, None)
    assert hub.is_hub_name("org/repo:Q4_K_M") and hub.is_hub_name("org/repo.v2")
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "repo").write_bytes(b"GGUF")
    for name in ("org/repo", "dir/missing.gguf", "./org/x", "/abs/path", "ngram", "eagle", "ngram+x.gguf", None):
        assert not hub.is_hub_name(name), name


def test_the_catalogue_pairs_families_with_a_source_each():
    pairs = draft_search.catalogue()
    assert {p.family for p in pairs} >= {"Qwen2.5 Instruct", "Qwen2.5-Coder Instruct", "Qwen3",
                                         "Gemma 2 instruction-tuned", "SmolLM2 Instruct"}
    for pair in pairs:
        assert pair.sources and all(s.startswith("https://") for s in pair.sources), pair.family
        assert hub.parse_name(pair.draft)[1], pair.draft  # a quant, so the file is known
        assert pair.targets and all(re.compile(t) for t in pair.targets), pair.family
        assert draft_search.catalogued(pair.draft.split(":")[0], [pair]) is None, pair.draft  # no target of itself
    catalogued = draft_search.catalogued
    assert catalogued("bartowski/Llama-3.3-70B-Instruct-GGUF").draft.startswith("bartowski/Llama-3.2-1B-Instruct")
    assert catalogued("Qwen/Qwen3-8B-GGUF").draft.startswith("Qwen/Qwen3-0.6B-GGUF")
    assert catalogued("Qwen/Qwen3-0.6B-GGUF") is None and catalogued("org/phi-4-GGUF") is None


@pytest.mark.parametrize("repo_id", [
    "Qwen/Qwen2.5-1.5B-Instruct-GGUF", "Qwen/Qwen2.5-3B-Instruct-GGUF",  # 151936 tokens, as the 0.5B: exact
    "Qwen/Qwen2.5-7B-Instruct-GGUF", "bartowski/Qwen2.5-14B-Instruct-GGUF", "Qwen/Qwen2.5-32B-Instruct-GGUF",
    "Qwen/Qwen2.5-72B-Instruct-GGUF", "Qwen/Qwen2.5-7B-Instruct",  # 152064: the same tokens padded by 128
])
def test_the_qwen2_5_pair_drafts_every_instruct_size(repo_id):
    assert draft_search.catalogued(repo_id).draft == "Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q8_0"


@pytest.mark.parametrize("repo_id", [
    "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF", "bartowski/Qwen2.5-Coder-14B-Instruct-GGUF",
    "Qwen/Qwen2.5-Coder-32B-Instruct-GGUF", "bartowski/Qwen2.5.1-Coder-7B-Instruct-GGUF",
])
def test_the_coder_pair_drafts_coder_7b_to_32b(repo_id):
    pair = draft_search.catalogued(repo_id)
    assert pair.family == "Qwen2.5-Coder Instruct" and "ggml-org/Qwen2.5-Coder-1.5B-32B-speculative-GGUF" in pair.draft
    assert pair.sources[0] == "https://huggingface.co/ggml-org/Qwen2.5-Coder-1.5B-32B-speculative-GGUF"


@pytest.mark.parametrize("repo_id", [
    "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "Qwen/Qwen2.5-7B-GGUF", "Qwen/Qwen2.5-Math-7B-Instruct-GGUF",  # no Instruct
    "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "Qwen/Qwen2.5-Coder-32B-GGUF",  # the draft; a base (FIM) model
    "ggml-org/Qwen2.5-Coder-1.5B-32B-speculative-GGUF", "Qwen/Qwen2.5-Coder-3B-Instruct-GGUF",
])
def test_the_qwen_pairs_leave_other_qwen_models_alone(repo_id):
    assert draft_search.catalogued(repo_id) is None


def test_the_coder_draft_is_named_by_its_file_in_a_repository_of_two_q4_k_m():
    """ggml-org's repository holds the 1.5B and the 32B, both Q4_K_M: the catalogue names the draft's file."""
    draft = draft_search.catalogued("Qwen/Qwen2.5-Coder-32B-Instruct-GGUF").draft
    files = hub.group_ggufs(["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-32b-instruct-q4_k_m.gguf",
                             "README.md"])
    repo_id, quant, _ = hub.parse_name(draft)
    assert hub.pick(files, quant, repo_id).first == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    with pytest.raises(EdgespecError, match="2 GGUF models of Q4_K_M"):
        hub.pick(files, "Q4_K_M", repo_id)
