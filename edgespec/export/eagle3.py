"""EAGLE-3 heads as users get them: a SpecForge checkpoint (`LlamaForCausalLMEagle3`) converted to GGUF by the
pinned llama.cpp's own `convert_hf_to_gguf.py --target-model-dir`, the path every published head takes.

A SpecForge checkpoint is a folder with config.json (one hidden layer, `draft_vocab_size`, the target layers it
reads as `eagle_aux_hidden_state_layer_ids`, `target_hidden_size`) and model.safetensors: `fc` (3 x the target's
width -> the head's), `midlayer.*` (one Llama layer whose attention reads [norm(token embedding); norm(g)], twice
the width, plus `hidden_norm`), `norm`, `lm_head` over the draft vocabulary, `d2t` (target id minus draft id, per
draft id) and `t2d` (a mask over the target's ids). llama.cpp's converter reads the target's folder for the
tokenizer, the layer count and the width.

The converter comes from llama-cpp-python's sdist of the pinned version (pip download, once, into
~/.cache/edgespec/llama-src/VERSION): the PyPI `gguf` package may predate EAGLE-3, the sdist's gguf-py does not.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError

CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion", "gguf-py")  # what conversion needs of vendor/llama.cpp
SPECFORGE_ARCH = "LlamaForCausalLMEagle3"


def vendored_llama_cpp(into: Path, parts: tuple[str, ...] | None = None) -> Path:
    """The llama.cpp tree that the installed llama-cpp-python vendors, from its sdist (pip download) extracted under
    `into`: for its converter here (only `parts` of the tree, paths under vendor/llama.cpp), for llama-server in
    benchmarks/vs_llama_cpp.py (the whole tree)."""
    version = importlib.metadata.version("llama-cpp-python")
    # the sdist alone: `--no-binary :all:` would build its build dependencies from source too (a minute on a core)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                           "-d", str(into), f"llama-cpp-python=={version}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise EdgespecError(f"could not download the llama-cpp-python {version} sdist (its llama.cpp): "
                            f"{done.stderr.strip().splitlines()[-1:] or done.returncode}")
    with tarfile.open(next(into.glob("*.tar.gz"))) as sdist:
        members = None
        if parts is not None:
            members = [m for m in sdist.getmembers()
                       if any(f"/vendor/llama.cpp/{part}/" in m.name + "/" for part in parts)]
        sdist.extractall(into, members=members, filter="data")
    return next(into.glob("llama_cpp_python-*")) / "vendor" / "llama.cpp"


def llama_source() -> Path:
    """A folder holding the pinned llama.cpp's converter (CONVERTER_PARTS), taken from llama-cpp-python's sdist."""
    version = importlib.metadata.version("llama-cpp-python")
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgespec" / "llama-src" / version
    if all((root / part).exists() for part in CONVERTER_PARTS):
        return root
    print(f"fetching llama.cpp's converter from the llama-cpp-python {version} sdist into {root}", file=sys.stderr)
    root.parent.mkdir(parents=True, exist_ok=True)
    # a folder of this process's own, renamed last: an interrupted fetch leaves no cache entry, and of two processes
    # fetching at once (two conversions, two test workers) the first to finish fills the cache, the other uses it
    with (tempfile.TemporaryDirectory() as tmp,
          tempfile.TemporaryDirectory(prefix=f".{version}.", dir=root.parent, ignore_cleanup_errors=True) as partial):
        vendor = vendored_llama_cpp(Path(tmp), CONVERTER_PARTS)
        for part in CONVERTER_PARTS:
            (vendor / part).replace(Path(partial) / part)
        if not all((root / part).exists() for part in CONVERTER_PARTS):
            shutil.rmtree(root, ignore_errors=True)  # an older layout's
            try:
                os.rename(partial, root)
            except OSError:  # another process filled it first
                if not all((root / part).exists() for part in CONVERTER_PARTS):
                    raise
    return root


def save_specforge(folder: str | os.PathLike, weights: dict[str, np.ndarray], *, target_config: dict,
                   layers: list[int], draft_ids: np.ndarray | None = None, n_ff: int | None = None) -> Path:
    """Write a SpecForge LlamaForCausalLMEagle3 checkpoint for a Llama-like target.

    weights (float32 arrays, PyTorch's [out, in] layout): fc [E, 3 Et], q/k/v [heads x D, 2E], o [E, heads x D],
    gate/up [F, E], down [E, F], the norms [E] (input_layernorm, hidden_norm, post_attention_layernorm, norm) and
    lm_head [len(draft_ids) or V, E], named as in the checkpoint (module docstring). draft_ids: the target ids the
    head drafts (sorted), None for the whole vocabulary."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    n_vocab = int(target_config["vocab_size"])
    width = int(weights["fc.weight"].shape[0])
    tensors = {name: torch.from_numpy(np.array(w, dtype=np.float32)) for name, w in weights.items()}  # own copies
    ids = np.arange(n_vocab) if draft_ids is None else np.sort(np.asarray(draft_ids, dtype=np.int64))
    if len(ids) != tensors["lm_head.weight"].shape[0]:
        raise EdgespecError(f"lm_head has {tensors['lm_head.weight'].shape[0]} rows for {len(ids)} draft ids")
    tensors["d2t"] = torch.from_numpy(ids - np.arange(len(ids)))
    mask = np.zeros(n_vocab, dtype=bool)
    mask[ids] = True
    tensors["t2d"] = torch.from_numpy(mask)
    heads, kv_heads = int(target_config["num_attention_heads"]), int(target_config["num_key_value_heads"])
    config = {
        "architectures": [SPECFORGE_ARCH], "model_type": "llama", "hidden_act": "silu", "hidden_size": width,
        "intermediate_size": int(n_ff or tensors["midlayer.mlp.gate_proj.weight"].shape[0]),
        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": tensors["midlayer.self_attn.q_proj.weight"].shape[0] // heads, "num_hidden_layers": 1,
        "rms_norm_eps": float(target_config.get("rms_norm_eps", 1e-5)),
        "rope_theta": float(target_config.get("rope_theta", 10000.0)),
        "max_position_embeddings": int(target_config.get("max_position_embeddings", 2048)),
        "vocab_size": n_vocab, "draft_vocab_size": len(ids), "tie_word_embeddings": False, "torch_dtype": "float32",
        "eagle_aux_hidden_state_layer_ids": [int(i) for i in layers],
        "target_hidden_size": int(target_config["hidden_size"]),
        "bos_token_id": target_config.get("bos_token_id"), "eos_token_id": target_config.get("eos_token_id"),
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def random_eagle3(folder: str | os.PathLike, target_folder: str | os.PathLike, *, layers: list[int] | None = None,
                  draft_vocab: int | None = None, draft_ids: np.ndarray | None = None, seed: int = 0,
                  scale: float = 0.02) -> Path:
    """A SpecForge checkpoint of random weights shaped for the target's Hugging Face folder (its width, heads and
    FFN): for costs and for the machinery, whose exactness holds for any head. layers: default llama.cpp's own
    [2, n/2, n-3]; the head drafts draft_ids, or draft_vocab random target ids, or (neither) the whole
    vocabulary."""
    from edgespec.export.hf import read_config

    config = read_config(Path(target_folder))
    config = {**config, **config.get("text_config", {})}
    n_layer, width, n_vocab = config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or width // heads
    n_ff = config["intermediate_size"]
    rng = np.random.default_rng(seed)
    ids = draft_ids if draft_ids is not None else None if draft_vocab is None else rng.choice(n_vocab, draft_vocab,
                                                                                               replace=False)
    ids = None if ids is None else np.sort(np.asarray(ids, dtype=np.int64))

    def r(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    ones = np.ones(width, dtype=np.float32)
    weights = {"fc.weight": r(width, 3 * width), "norm.weight": ones,
               "lm_head.weight": r(n_vocab if ids is None else len(ids), width),
               "midlayer.input_layernorm.weight": ones, "midlayer.hidden_norm.weight": ones,
               "midlayer.post_attention_layernorm.weight": ones,
               "midlayer.self_attn.q_proj.weight": r(heads * head_dim, 2 * width),
               "midlayer.self_attn.k_proj.weight": r(kv_heads * head_dim, 2 * width),
               "midlayer.self_attn.v_proj.weight": r(kv_heads * head_dim, 2 * width),
               "midlayer.self_attn.o_proj.weight": r(width, heads * head_dim),
               "midlayer.mlp.gate_proj.weight": r(n_ff, width), "midlayer.mlp.up_proj.weight": r(n_ff, width),
               "midlayer.mlp.down_proj.weight": r(width, n_ff)}
    return save_specforge(folder, weights, target_config=config,
                          layers=layers or [2, n_layer // 2, n_layer - 3], draft_ids=ids)


def convert_eagle3(head: str | os.PathLike, target_folder: str | os.PathLike, out: str | os.PathLike, *,
                   outtype: str = "f16") -> Path:
    """Convert a SpecForge/EAGLE-3 checkpoint folder to GGUF with the pinned llama.cpp's converter, as a user
    converts a published head. The GGUF is written beside as a .partial and renamed when whole."""
    head, target_folder, out = Path(head), Path(target_folder), Path(out)
    for folder in (head, target_folder):
        if not (folder / "config.json").is_file():
            raise EdgespecError(f"{folder} is not a Hugging Face checkpoint folder (no config.json)")
    source = llama_source()
    partial = out.with_name(out.name + ".partial")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source / "gguf-py"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(source / "convert_hf_to_gguf.py"), str(head), "--target-model-dir",
                           str(target_folder), "--outfile", str(partial), "--outtype", outtype],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = "\n".join(done.stderr.strip().splitlines()[-3:])
        raise EdgespecError(f"llama.cpp's converter refused {head}: {tail}")
    partial.replace(out)
    return out
