"""Drafts in llama.cpp's own formats (drafts/llama_kinds.py): an EAGLE-3 head or DFlash draft that fits the target
resolves; one that does not, and --draft mtp on a target without a driven MTP layer, get one error saying what the
file is, whether it fits the target, and what runs instead, before anything loads; a draft model like any other
passes through."""

import numpy as np
import pytest

from edgespec.drafts.llama_kinds import check_draft_file, describe, gguf_meta, is_eagle3, mtp_layers
from edgespec.errors import EdgespecError
from edgespec.pair import resolve_pair

gguf = pytest.importorskip("gguf")


def write(path, arch, tensors: dict | None = None, **fields):
    """A GGUF of `arch` holding `fields` (lists as arrays), one small tensor and `tensors` (name: array): as much of
    a header as the checks read."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in fields.items():
        key = f"{arch}.{key}"
        if isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_uint32(key, value)
    for name, array in {"output_norm.weight": np.ones(8, dtype=np.float32), **(tensors or {})}.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def target(tmp_path):
    return write(tmp_path / "target.gguf", "llama", embedding_length=576, block_count=30)


def test_an_eagle3_head_that_fits_resolves_and_one_beside_another_runtime_says_what_it_is(tmp_path, target):
    head = write(tmp_path / "head.gguf", "eagle3", target_hidden_size=576, target_layers=[2, 15, 27],
                 embedding_length=576)
    assert gguf_meta(head)["eagle3.target_layers"] == [2, 15, 27]
    assert describe(gguf_meta(head)) == ("an EAGLE-3 head (GGUF architecture eagle3, for a target 576 wide, reading "
                                         "its layers 2, 15, 27)")
    assert is_eagle3(head) and not is_eagle3(target)
    assert resolve_pair(target, head).draft.source == str(head)  # drafts/eagle3.py runs it
    onnx = tmp_path / "model-onnx"
    onnx.mkdir()
    with pytest.raises(EdgespecError) as error:
        check_draft_file(head, onnx)
    text = str(error.value)
    assert text.startswith("draft head.gguf is an EAGLE-3 head") and "beside a GGUF target" in text
    assert "--draft ngram" in text and "converted for another target" not in text


def test_a_head_for_another_target_says_so(tmp_path, target):
    head = write(tmp_path / "head.gguf", "eagle3", target_hidden_size=4096, target_layers=[2, 16, 29])
    with pytest.raises(EdgespecError, match="converted for another target \\(this target is 576 wide\\)"):
        resolve_pair(target, head)


def test_a_dflash_block_draft_resolves_beside_its_target_and_says_what_it_is_elsewhere(tmp_path, target):
    block = write(tmp_path / "block.gguf", "dflash", block_size=16, embedding_length=576, target_layers=[2, 15, 28])
    assert resolve_pair(target, block).draft.source == str(block)  # drafts/dflash.py runs it
    wide = write(tmp_path / "wide.gguf", "dflash", block_size=16, embedding_length=4096, target_layers=[2, 15, 28])
    with pytest.raises(EdgespecError, match="is a DFlash block draft \\(GGUF architecture dflash, reading its layers "
                                            "2, 15, 28\\); it was converted for another target"):
        resolve_pair(target, wide)


def test_draft_mtp_names_the_targets_architecture(tmp_path, target):
    assert mtp_layers(target) == ("llama", 0)
    with pytest.raises(EdgespecError, match="target.gguf \\(architecture llama\\) carries no MTP layers"):
        resolve_pair(target, "mtp")
    with_mtp = write(tmp_path / "qwen.gguf", "qwen35", embedding_length=576, nextn_predict_layers=1)
    assert mtp_layers(with_mtp) == ("qwen35", 1)
    assert resolve_pair(with_mtp, "mtp").draft.kind == "mtp"  # drafts/mtp.py drives it
    chained = write(tmp_path / "step.gguf", "step35", embedding_length=576, nextn_predict_layers=3)
    with pytest.raises(EdgespecError, match="step.gguf \\(architecture step35\\) carries 3 chained MTP layers"):
        resolve_pair(chained, "mtp")
    kept = write(tmp_path / "glm.gguf", "glm4", embedding_length=576, nextn_predict_layers=1)
    with pytest.raises(EdgespecError, match="MTP layers llama.cpp keeps for glm4 but does not run"):
        resolve_pair(kept, "mtp")
    with pytest.raises(EdgespecError, match="not a GGUF file"):
        resolve_pair(tmp_path, "mtp")


def test_a_draft_model_passes_through(tmp_path, target):
    draft = write(tmp_path / "draft.gguf", "llama", embedding_length=576, block_count=2)
    pair = resolve_pair(target, draft)
    assert pair.draft.kind == "model" and pair.draft.source == str(draft)
    assert describe(gguf_meta(draft)) is None


def test_dflash2_and_dspark_files_are_refused_before_anything_loads(tmp_path):
    from edgespec.drafts.dflash import DFlashDrafter

    selector = write(tmp_path / "selector.gguf", "dflash", embedding_length=576, selector_top_k=4)
    with pytest.raises(EdgespecError, match="not DFlash2 selectors or DSpark Markov heads"):
        DFlashDrafter(selector, None)
    writer = gguf.GGUFWriter(str(tmp_path / "dspark.gguf"), "dflash")
    writer.add_uint32("dflash.embedding_length", 576)
    writer.add_tensor("markov_w1.weight", np.ones((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(EdgespecError, match="not DFlash2 selectors or DSpark Markov heads"):
        DFlashDrafter(tmp_path / "dspark.gguf", None)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_a_heads_d2t_map_is_read_from_the_header_as_absolute_ids(tmp_path, dtype):
    """head_ids finds the d2t tensor from the streamed header and reads it from the file as written (int64 as the
    converter writes it, or int32); a map of floats, repeats or ids past the vocabulary is refused by name."""
    from edgespec.drafts.eagle3 import head_ids

    def head(name, d2t):
        return write(tmp_path / name, "eagle3", tensors={"d2t": d2t})

    ids = np.array([2, 17, 18, 40, 41, 99], dtype=dtype)
    got = head_ids(head("ok.gguf", ids), 100)
    assert got.dtype == np.int64 and got.tolist() == ids.tolist()
    assert head_ids(write(tmp_path / "full.gguf", "eagle3"), 100) is None  # no map: the whole vocabulary
    for name, bad, message in [("floats.gguf", ids.astype(np.float32), "F32, not integer ids"),
                               ("repeats.gguf", np.array([3, 3], dtype=dtype), "not a set of distinct ids"),
                               ("past.gguf", np.array([5, 100], dtype=dtype), "not a set of distinct ids under 100")]:
        with pytest.raises(EdgespecError, match=f"{name}: its d2t map is {message}"):
            head_ids(head(name, bad), 100)
