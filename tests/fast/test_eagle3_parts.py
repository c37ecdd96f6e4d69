"""The pieces of EAGLE-3 training that need no model (train/eagle3.py): the q/k row order undone exactly, the
entries' features and target rows lined up as drafting reads them, train-heads refusing an EAGLE-3 head it could
not convert, and the converter's cache filled once by two fetches at once."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edgespec.errors import EdgespecError
from edgespec.train.eagle import rope_rows
from edgespec.train.eagle3 import default_layers, eagle3_batch, unrope_rows
from edgespec.train.heads import train_heads


def test_the_gguf_row_order_is_undone_exactly():
    w = np.random.default_rng(0).normal(size=(3 * 64, 2 * 576)).astype(np.float32)
    assert np.array_equal(unrope_rows(rope_rows(w, 3), 3), w)
    assert not np.array_equal(rope_rows(w, 3), w)


def test_entry_p_reads_the_features_at_p_and_gives_the_law_of_token_p_plus_2():
    torch = pytest.importorskip("torch")
    tokens = np.array([5, 6, 7, 8, 9])  # 2 prompt tokens, 3 answer tokens: corpus rows for positions 1..3
    seq = SimpleNamespace(tokens=tokens, n_prompt=2, lse=np.zeros(3))
    features = np.arange(4 * 6, dtype=np.float16).reshape(4, 6)  # one row per entry, positions 0..3
    embeddings = np.arange(10 * 2, dtype=np.float32).reshape(10, 2)
    feats, embs, real, valid, rows = eagle3_batch(torch, [seq, SimpleNamespace(tokens=tokens[:3], n_prompt=2,
                                                                               lse=np.zeros(1))],
                                                  embeddings, [features, features[:2]])
    assert feats.shape == (2, 4, 6) and torch.equal(feats[0], torch.from_numpy(features.astype(np.float32)))
    assert torch.equal(embs[0], torch.from_numpy(embeddings[tokens[1:]]))  # entry P pairs token P + 1
    assert rows[0].tolist() == [0, 1, 2, -1]  # entry 0 gives token 2's law (the first answer token's): row 0
    assert rows[1].tolist() == [0, -1, -1, -1] and valid[1].tolist() == [True, True, False, False]
    assert torch.equal(real, valid)


def test_llama_cpp_s_default_layers():
    assert default_layers(30) == [2, 15, 27]


def test_an_eagle3_head_needs_a_gguf_target_and_its_hugging_face_folder(tmp_path):
    target = tmp_path / "target.gguf"
    target.write_bytes(b"GGUF")
    with pytest.raises(EdgespecError, match="--hf-target DIR"):
        train_heads(target, tmp_path / "head.gguf", kind="eagle3")
    with pytest.raises(EdgespecError, match="--hf-target DIR"):
        train_heads(target, tmp_path / "head.gguf", kind="eagle3", hf_target=tmp_path)  # no config.json
    assert not (tmp_path / "head.gguf").exists() and not (tmp_path / "head.corpus").exists()


def test_two_fetches_of_the_converter_at_once_leave_one_complete_cache_entry(tmp_path, monkeypatch):
    """Two conversions (or two test workers) fetching llama.cpp's converter at the same moment: both get the
    complete folder, whichever renamed its copy first, and no half-written folder is left beside it."""
    import threading

    from edgespec.export import eagle3

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    both_fetched = threading.Barrier(2)

    def fetched(into, parts):  # the sdist's tree, each fetch waiting until the other has one too
        assert parts == eagle3.CONVERTER_PARTS
        tree = into / "llama.cpp"
        for part in eagle3.CONVERTER_PARTS:
            (tree / part).mkdir(parents=True)
            (tree / part / "f").write_text(threading.current_thread().name)
        both_fetched.wait(timeout=10)
        return tree

    monkeypatch.setattr(eagle3, "vendored_llama_cpp", fetched)
    roots = []
    fetches = [threading.Thread(target=lambda: roots.append(eagle3.llama_source()), name=f"fetch{i}") for i in (0, 1)]
    for fetch in fetches:
        fetch.start()
    for fetch in fetches:
        fetch.join(timeout=20)
    assert len(roots) == 2 and roots[0] == roots[1]
    assert sorted(p.name for p in roots[0].iterdir()) == sorted(eagle3.CONVERTER_PARTS)
    assert [p.name for p in roots[0].parent.iterdir()] == [roots[0].name]  # no partial folder left


def test_the_converter_is_taken_from_the_sdist_alone(tmp_path, monkeypatch):
    """pip downloads llama-cpp-python's sdist and no other package's source (`--no-binary :all:` built the build
    dependencies from source too, a minute on a core), and only the converter's parts of its tree are extracted."""
    import subprocess
    import tarfile

    from edgespec.export import eagle3

    root = "llama_cpp_python-0.0.0/vendor/llama.cpp"
    names = [f"{root}/convert_hf_to_gguf.py", f"{root}/conversion/llama.py", f"{root}/gguf-py/gguf/__init__.py",
             f"{root}/convert_hf_to_gguf_update.py", f"{root}/src/llama.cpp", f"{root}/gguf-py-old/x.py"]
    asked = []

    def download(command, **kwargs):
        asked.append(command)
        into = Path(command[command.index("-d") + 1])
        into.mkdir()
        with tarfile.open(into / "llama_cpp_python-0.0.0.tar.gz", "w:gz") as sdist:
            for name in names:
                source = tmp_path / "file"
                source.write_text(name)
                sdist.add(source, arcname=name)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(eagle3.subprocess, "run", download)
    tree = eagle3.vendored_llama_cpp(tmp_path / "sdist", eagle3.CONVERTER_PARTS)
    (command,) = asked
    assert command[command.index("--no-binary") + 1] == "llama-cpp-python" and "--no-deps" in command
    kept = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
    assert kept == ["conversion/llama.py", "convert_hf_to_gguf.py", "gguf-py/gguf/__init__.py"]
