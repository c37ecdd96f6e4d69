"""A draft found for a target named on the hub (`--draft auto`): a smaller cached GGUF with the target's
vocabulary, or the target's padded (check_compatible), else the draft the catalogue edgespec/data/draft_pairs.toml
pairs with the target's repository."""

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


def pairing(target_vocab: Vocab, draft_vocab: Vocab) -> str | None:
    """How a draft's vocabulary relates to the target's: check_compatible's "exact" or "padded", or None where the
    draft is no draft for the target. The kind of pair find_draft reports and `edgespec models` lists."""
    try:
        return check_compatible(target_vocab, draft_vocab)
    except EdgespecError:
        return None


def _pairing(target_vocab: Vocab, path) -> str | None:
    try:
        return pairing(target_vocab, gguf_vocab(path))
    except EdgespecError:  # a file that cannot be read: not a draft for this target
        return None


def _vocabulary(kind: str, target_vocab: Vocab, path) -> str:
    """A pair's vocabulary as a reason words it."""
    if kind == "exact":
        return "the target's vocabulary"
    return f"a padded vocabulary ({gguf_vocab(path).n_vocab} tokens to the target's {target_vocab.n_vocab})"


def find_draft(name: str, *, progress: bool = True) -> tuple[dict | None, str]:
    """A draft model for the target a hub name picks: ({"draft": hub name, "path": its file, "reason": ...}, "") or
    (None, why there is none).

    First a cached GGUF of another repository with the target's vocabulary, or the target's padded (check_compatible:
    the same tokens on the ids both have, sizes at most VOCAB_PADDING apart), and at most MAX_DRAFT_SHARE of its
    size, the catalogue's draft for the target first, then the smallest; else the catalogue's draft, pulled into the
    cache (never with HF_HUB_OFFLINE set) and checked the same way. The reason says "padded vocabulary" for a padded
    pair."""
    target = pull(name, progress=progress)
    target_vocab = gguf_vocab(target.path)
    pair = catalogued(target.repo_id)
    paired = pair.draft.split(":")[0].lower() if pair else None
    cached = [(c, kind) for c in cached_models() if c.repo_id != target.repo_id and c.complete
              and c.size <= MAX_DRAFT_SHARE * target.size and (kind := _pairing(target_vocab, c.path))]
    if cached:
        best, kind = min(cached, key=lambda found: (found[0].repo_id.lower() != paired, found[0].size))
        why = (f"cached, with {_vocabulary(kind, target_vocab, best.path)}, {target.size / best.size:.1f}x smaller"
               + (f"; published as a draft for {pair.family} ({pair.sources[0]})" if best.repo_id.lower() == paired
                  else ""))
        return {"draft": best.name, "path": str(best.path), "reason": why}, ""
    none_cached = (f"no cached GGUF has {target.name}'s vocabulary, padded or not, at {MAX_DRAFT_SHARE:.0%} of its "
                   "size or less")
    if pair is None:
        return None, f"{none_cached}, and the catalogue pairs no draft with {target.repo_id}"
    if offline():
        return None, f"{none_cached}, and the catalogue's draft {pair.draft} is not cached (HF_HUB_OFFLINE is set)"
    try:
        draft = pull(pair.draft, progress=progress)
    except EdgespecError as e:
        return None, f"{none_cached}, and pulling the catalogue's draft {pair.draft} failed: {e}"
    kind = _pairing(target_vocab, draft.path)
    if kind is None:
        return None, (f"{none_cached}, and the catalogue's draft {draft.name} does not share its vocabulary, padded "
                      "or not")
    why = f"published as a draft for {pair.family} ({pair.sources[0]}); pulled into the hub cache"
    if kind != "exact":
        why += f", with {_vocabulary(kind, target_vocab, draft.path)}"
    return {"draft": draft.name, "path": str(draft.path), "reason": why}, ""
