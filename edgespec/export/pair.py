"""A draft/target pair exported together, described by a manifest that generate/chat/bench load.

The vocabularies are compared before any conversion starts (reading tokenizer files or GGUF metadata,
not weights), with the same rule and messages as at load time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from edgespec.backends.protocol import Vocab, check_compatible
from edgespec.errors import EdgespecError
from edgespec.models.source import Source

MANIFEST_VERSION = 1


def read_vocab(source: Source) -> Vocab:
    """A source's vocabulary from its tokenizer files (checkpoint) or metadata (GGUF)."""
    if source.kind == "gguf":  # the one reader of a GGUF file's vocabulary (a loaded model's: llama/model.py)
        from edgespec.backends.model_info import read_gguf_vocab

        return read_gguf_vocab(source.path)
    path = source.path / "tokenizer.json"
    if not path.is_file():
        raise EdgespecError(f"{source.path} has no tokenizer.json: edgespec needs a fast tokenizer")
    tok = json.loads(path.read_text())
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    by_id.update({a["id"]: a["content"] for a in tok.get("added_tokens", [])})
    texts = tuple(by_id.get(i, "").encode() for i in range(max(by_id) + 1))
    config = json.loads((source.path / "config.json").read_text())
    eos = config.get("eos_token_id")
    bos, eos = config.get("bos_token_id", -1), (eos[0] if isinstance(eos, list) else eos)
    bos, eos = -1 if bos is None else bos, -1 if eos is None else eos
    return Vocab(texts=texts, pieces=texts, bos_id=bos, eos_id=eos, eog_ids=frozenset([eos]))


def check_pair(target: Source, draft: Source) -> str:
    """Raise unless the draft's vocabulary is the target's, or the target's padded (check_compatible); return the
    target's tokenizer hash."""
    target_vocab = read_vocab(target)
    check_compatible(target_vocab, read_vocab(draft))
    return target_vocab.digest


def write_manifest(out_dir: Path, fmt: str, tokenizer_hash: str, target: dict, draft: dict) -> Path:
    """pair.json in out_dir; file paths in it are relative to out_dir."""
    def entry(summary):
        path = Path(summary["path"])
        return {"file": os.path.relpath(path, out_dir), "quant": summary["quant"], "source": summary["source"],
                "n_params": summary.get("n_params"), "weight_bytes": summary["weight_bytes"],
                "parity": os.path.relpath(summary["parity_report"], out_dir) if summary.get("parity_report") else None}

    manifest = {"edgespec_pair": MANIFEST_VERSION, "format": fmt, "tokenizer_hash": tokenizer_hash,
                "target": entry(target), "draft": entry(draft)}
    path = out_dir / "pair.json"
    tmp = out_dir / ".pair.json.partial"
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, path)
    return path


def read_manifest(path: str | Path) -> tuple[Path, Path]:
    """(target, draft) model paths from a pair manifest."""
    path = Path(path)
    try:
        manifest = json.loads(path.read_text())
        folder = path.parent
        return folder / manifest["target"]["file"], folder / manifest["draft"]["file"]
    except FileNotFoundError:
        raise EdgespecError(f"pair manifest not found: {path}") from None
    except (json.JSONDecodeError, KeyError, TypeError):
        raise EdgespecError(f"{path} is not an edgespec pair manifest (made by edgespec export-pair)") from None
