"""Where a model comes from: a local Hugging Face folder, a hub id, or a GGUF file.

Hub ids go through huggingface-hub into its normal cache (models/hub.py, the only module importing it), so
HF_HUB_OFFLINE, HF_HUB_CACHE and HF_TOKEN behave as everywhere else; `revision` pins a branch, tag
or commit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import EdgespecError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# what a conversion reads; skips other formats' weights (.bin, .onnx, .gguf) a repository may also hold
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


@dataclass(frozen=True)
class Source:
    kind: str  # "hf" (a checkpoint folder) or "gguf" (a file)
    path: Path
    ref: str  # what the user named, for reports and manifests


def resolve(src: str, *, revision: str | None = None, progress: bool = True) -> Source:
    """Find `src` locally or in (or through) the hub cache; raise a clear error otherwise."""
    path = Path(src).expanduser()
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise EdgespecError(f"{path} is neither a GGUF file nor a Hugging Face checkpoint folder")
        return Source("gguf", path, src)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise EdgespecError(f"{path} is not a Hugging Face checkpoint folder (no config.json)")
        return Source("hf", path, src)
    if HUB_ID.match(src) and not src.startswith((".", "/", "~")):
        return Source("hf", download(src, revision=revision, progress=progress), src)
    raise EdgespecError(f"{src} not found: give a checkpoint folder, a GGUF file or a hub id like org/name")


def download(repo_id: str, *, revision: str | None = None, progress: bool = True) -> Path:
    """snapshot_download of the files a conversion needs (HUB_PATTERNS); honours HF_HUB_OFFLINE."""
    from edgespec.models.hub import download_snapshot

    return download_snapshot(repo_id, HUB_PATTERNS, revision=revision, progress=progress)
