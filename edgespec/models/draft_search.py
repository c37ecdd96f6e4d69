"""A draft found for a target named on the hub (`--draft auto`): a smaller cached GGUF with the target's
vocabulary, else the draft the catalogue edgespec/data/draft_pairs.toml pairs with the target's repository."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from edgespec.backends.model_info import read_gguf_vocab
from edgespec.backends.protocol import Vocab, check_compatible
from edgespec.errors import EdgespecError
from edgespec.models.hub import MAX_DRAFT_SHARE, cached_models, offline, pull


@lru_cache(maxsize=256)
def _vocab(path: str) -> Vocab:
    return read_gguf_vocab(path)


def gguf_vocab(path: str | os.PathLike) -> Vocab:
    """The vocabulary facts check_compatible compares, streamed from a GGUF's metadata as export/pair.read_vocab
    states them (gguf-py's reader would take seconds on a 150k-token vocabulary). Cached by the file a cache link
    points at: hub blobs never change."""
    return _vocab(str(Path(path).resolve()))


@dataclass(frozen=True)
class Pair:
    """A catalogued pairing (edgespec/data/draft_pairs.toml)."""

    family: str
    draft: str  # hub name
    targets: tuple[str, ...]  # regular expressions, searched in a target repository's name
    sources: tuple[str, ...]


def catalogue(text: str | None = None) -> list[Pair]:
    """The pairs in draft_pairs.toml (or in `text`, TOML of the same form)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        import tomli as tomllib
    from importlib import resources

    if text is None:
        text = resources.files("edgespec").joinpath("data/draft_pairs.toml").read_text("utf-8")
    return [Pair(p["family"], p["draft"], tuple(p["targets"]), tuple(p["sources"]))
            for p in tomllib.loads(text).get("pair", [])]


def catalogued(repo_id: str, pairs: list[Pair] | None = None) -> Pair | None:
    """The catalogued pair whose targets match a repository's name (after org/), if any."""
    name = repo_id.split("/", 1)[-1]
    return next((p for p in (catalogue() if pairs is None else pairs)
                 if any(re.search(t, name, re.IGNORECASE) for t in p.targets)), None)


def _fits(target_vocab: Vocab, path) -> bool:
    try:
        check_compatible(target_vocab, gguf_vocab(path))
        return True
    except EdgespecError:  # another vocabulary, or a file that cannot be read: not a draft for this target
        return False


def find_draft(name: str, *, progress: bool = True) -> tuple[dict | None, str]:
    """A draft model for the target a hub name picks: ({"draft": hub name, "path": its file, "reason": ...}, "") or
    (None, why there is none).

    First a cached GGUF of another repository with the target's vocabulary (check_compatible) and at most
    MAX_DRAFT_SHARE of its size, the catalogue's draft for the target first, then the smallest; else the catalogue's
    draft, pulled into the cache (never with HF_HUB_OFFLINE set) and checked the same way."""
    target = pull(name, progress=progress)
    target_vocab = gguf_vocab(target.path)
    pair = catalogued(target.repo_id)
    paired = pair.draft.split(":")[0].lower() if pair else None
    cached = [c for c in cached_models() if c.repo_id != target.repo_id and c.complete
              and c.size <= MAX_DRAFT_SHARE * target.size and _fits(target_vocab, c.path)]
    if cached:
        best = min(cached, key=lambda c: (c.repo_id.lower() != paired, c.size))
        why = (f"cached, with the target's vocabulary, {target.size / best.size:.1f}x smaller"
               + (f"; published as a draft for {pair.family} ({pair.sources[0]})" if best.repo_id.lower() == paired
                  else ""))
        return {"draft": best.name, "path": str(best.path), "reason": why}, ""
    none_cached = (f"no cached GGUF has {target.name}'s vocabulary at {MAX_DRAFT_SHARE:.0%} of its size or less")
    if pair is None:
        return None, f"{none_cached}, and the catalogue pairs no draft with {target.repo_id}"
    if offline():
        return None, f"{none_cached}, and the catalogue's draft {pair.draft} is not cached (HF_HUB_OFFLINE is set)"
    try:
        draft = pull(pair.draft, progress=progress)
    except EdgespecError as e:
        return None, f"{none_cached}, and pulling the catalogue's draft {pair.draft} failed: {e}"
    if not _fits(target_vocab, draft.path):
        return None, f"{none_cached}, and the catalogue's draft {draft.name} does not share its vocabulary"
    return {"draft": draft.name, "path": str(draft.path),
            "reason": f"published as a draft for {pair.family} ({pair.sources[0]}); pulled into the hub cache"}, ""
