"""Models by hub name, through huggingface-hub's cache: the only module importing huggingface_hub.

A name is `org/repo[:QUANT][@REVISION]`. QUANT picks one GGUF of the repository by its quantization, matched
case-insensitively in the file name (Q4_K_M finds Qwen2.5-1.5B-Instruct-Q4_K_M.gguf and qwen2.5-1.5b-instruct-
q4_k_m.gguf, not Q4_K_M_L); without it, the first of DEFAULT_QUANTS the repository has, else its first GGUF. A model
split in parts (name-00001-of-00003.gguf) is downloaded whole and named by its first part, which llama.cpp opens and
finds the others beside. Files land in huggingface-hub's own cache (HF_HOME, HF_HUB_CACHE, HF_TOKEN as everywhere)
with its progress bars; with HF_HUB_OFFLINE=1, or when the hub cannot be reached, a repository's files are listed
from its cached snapshot and nothing is fetched. Errors are raised before anything is written.

The same cache serves `--draft auto` (models/draft_search.py). Checkpoints for export come through here too
(download_snapshot).
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from edgespec.backends.model_info import SPLIT_NAME
from edgespec.errors import EdgespecError

# QUANT may also be a file of the repository (dir/name.gguf) where a quantization names more than one
NAME = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?::(?P<quant>[\w./-]+))?(?:@(?P<revision>[\w./-]+))?$")
MODEL_SUFFIXES = (".gguf", ".onnx", ".npz", ".json")  # "dir/model.gguf" that is not there is a missing file
DEFAULT_QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")  # a name without QUANT: the first of these the repository has

# a quantization label in a file name: Q4_K_M, IQ4_XS, Q8_0, F16, BF16, UD-Q4_K_XL (unsloth), MXFP4
QUANT_LABEL = re.compile(r"(?:^|[-._/])((?:UD-)?(?:I?Q\d(?:_[A-Z0-9]+)*|BF16|FP16|F16|F32|TQ\d_\d|MXFP4))(?=$|[-.])",
                         re.IGNORECASE)
# a draft pass reads about its file's bytes, as a target pass does: a draft over half the target's size cannot pay
MAX_DRAFT_SHARE = 0.5


def _hub():
    try:
        import huggingface_hub
        import huggingface_hub.constants  # submodules the package does not load on its own
        import huggingface_hub.errors
        import huggingface_hub.utils
    except ImportError as e:
        raise EdgespecError("hub names need huggingface-hub: pip install huggingface-hub") from e
    return huggingface_hub


def offline() -> bool:
    """HF_HUB_OFFLINE, as huggingface-hub read it."""
    return bool(_hub().constants.HF_HUB_OFFLINE)


def cache_dir() -> str:
    """The hub cache (HF_HUB_CACHE, or HF_HOME/hub)."""
    return str(_hub().constants.HF_HUB_CACHE)


# --- names and quantizations ---------------------------------------------------------------------------------------

def is_hub_name(name) -> bool:
    """True for `org/repo[:QUANT][@REVISION]` that is no file or folder here."""
    if not isinstance(name, str) or name.startswith((".", "/", "~")) or Path(name).expanduser().exists():
        return False
    match = NAME.match(name)
    return bool(match) and not match["repo"].lower().endswith(MODEL_SUFFIXES)


def parse_name(name: str) -> tuple[str, str | None, str | None]:
    """(repo id, QUANT or None, REVISION or None) of a hub name."""
    match = NAME.match(name)
    if not match:
        raise EdgespecError(f"{name!r} is not a hub name: give org/repo, org/repo:QUANT or org/repo:QUANT@REVISION")
    return match["repo"], match["quant"], match["revision"]


def quant_of(path: str) -> str | None:
    """The quantization a GGUF file's name states (its last label: Q4_K_M, IQ4_XS, F16, ...), upper-case."""
    labels = QUANT_LABEL.findall(os.path.basename(path))
    return labels[-1].upper() if labels else None


@dataclass(frozen=True)
class GGUF:
    """One model in a repository: a GGUF file, or the parts of a split one, first part first."""

    files: tuple[str, ...]  # paths in the repository
    parts: int = 1  # how many the split says there are (more than files: parts missing from a cached snapshot)

    @property
    def first(self) -> str:
        return self.files[0]

    def label(self, others: list[GGUF] = ()) -> str:
        """What picks it among `others` (its repository's GGUFs) after org/repo: its QUANT, or its file name where the
        name states none or another model has the same."""
        quant = quant_of(self.first)
        if quant and sum(quant_of(g.first) == quant for g in others) <= 1:
            return quant
        return os.path.basename(self.first)


def group_ggufs(files) -> list[GGUF]:
    """The GGUF models among a repository's files, by first file name; vision projectors (mmproj) left out."""
    singles, splits = [], {}
    for f in files:
        base = os.path.basename(f).lower()
        if not base.endswith(".gguf") or base.startswith("mmproj"):
            continue
        split = SPLIT_NAME.match(f)
        if split:
            splits.setdefault((split["stem"], int(split["parts"])), []).append(f)
        else:
            singles.append(GGUF((f,)))
    models = singles + [GGUF(tuple(sorted(parts)), n) for (_, n), parts in splits.items()]
    return sorted(models, key=lambda g: g.first.lower())


def _matches(gguf: GGUF, quant: str) -> bool:
    if quant.lower() in (gguf.first.lower(), os.path.basename(gguf.first).lower()):  # named by its file
        return True
    return re.search(rf"(?:^|[-._/]){re.escape(quant)}(?=$|[-.])", gguf.first, re.IGNORECASE) is not None


def pick(ggufs: list[GGUF], quant: str | None, repo_id: str, where: str = "") -> GGUF:
    """The model `quant` names among a repository's GGUFs (see the module's docstring); a clear error when there is
    none, or more than one. where: a note on where the files were listed, for messages."""
    if not ggufs:
        raise EdgespecError(f"{repo_id} has no GGUF file{where}: edgespec runs GGUF models from the hub (convert a "
                            "checkpoint with edgespec export)")
    available = ", ".join(dict.fromkeys(g.label(ggufs) for g in ggufs))
    for wanted in [quant] if quant else DEFAULT_QUANTS:
        found = [g for g in ggufs if _matches(g, wanted)]
        if len(found) > 1:
            files = ", ".join(g.first for g in found)
            raise EdgespecError(f"{repo_id} has {len(found)} GGUF models of {wanted}: {files}; name one by its file, "
                                f"e.g. {repo_id}:{found[0].first}")
        if found:
            return found[0]
    if quant:
        raise EdgespecError(f"{repo_id} has no {quant} GGUF{where}; it has {available} (e.g. {repo_id}:"
                            f"{ggufs[0].label(ggufs)})")
    return ggufs[0]


# --- listing and downloading --------------------------------------------------------------------------------------

@contextlib.contextmanager
def _progress(show: bool):
    """huggingface-hub's progress bars on or off for a block."""
    utils = _hub().utils
    was_off = utils.are_progress_bars_disabled()
    if not show:
        utils.disable_progress_bars()
    try:
        yield
    finally:
        if not show and not was_off:
            utils.enable_progress_bars()


def _at(repo_id: str, revision: str | None) -> str:
    return repo_id + (f"@{revision}" if revision else "")


def _cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cached snapshot of a repository at a revision (a branch, tag or commit), if there is one."""
    hub = _hub()
    try:
        return Path(hub.snapshot_download(repo_id, revision=revision, local_files_only=True))
    except (hub.errors.LocalEntryNotFoundError, hub.errors.HFValidationError, OSError):
        return None


def _list_files(repo_id: str, revision: str | None) -> tuple[list[str], str, str]:
    """(the repository's files at revision, its commit, a note on where they were listed for messages): from the hub,
    or from the cached snapshot when HF_HUB_OFFLINE is set or the hub cannot be reached."""
    hub = _hub()
    reason = "HF_HUB_OFFLINE is set"
    if not offline():
        try:
            info = hub.HfApi().model_info(repo_id, revision=revision)
            return [s.rfilename for s in info.siblings or ()], info.sha, ""
        except hub.errors.RepositoryNotFoundError:  # gated repositories too
            raise EdgespecError(f"hub repository {repo_id} not found (or private or gated: set HF_TOKEN); no file or "
                                "folder of that name here either") from None
        except hub.errors.RevisionNotFoundError:
            raise EdgespecError(f"revision {revision} not found in {repo_id}") from None
        except hub.errors.HFValidationError as e:
            raise EdgespecError(f"{repo_id} is not a valid hub repository id ({e})") from None
        except OSError as e:  # no network, a proxy, the hub down (requests' errors are OSErrors)
            reason = f"the hub cannot be reached ({type(e).__name__})"
    snapshot = _cached_snapshot(repo_id, revision)
    if snapshot is None:
        raise EdgespecError(f"{_at(repo_id, revision)} is not in the hub cache ({cache_dir()}) and {reason}: pull it "
                            "where the hub can be reached (edgespec pull NAME), or check the name")
    files = [p.relative_to(snapshot).as_posix() for p in sorted(snapshot.rglob("*")) if not p.is_dir()]
    return files, snapshot.name, f" in its cached snapshot ({reason})"


@dataclass(frozen=True)
class Pulled:
    """A hub GGUF in the local cache."""

    name: str  # org/repo:QUANT (or :FILE) that picks it
    repo_id: str
    commit: str
    gguf: GGUF
    path: Path  # the first part in the snapshot: what llama.cpp opens
    size: int  # bytes, all parts


def pull(name: str, *, revision: str | None = None, progress: bool = True) -> Pulled:
    """The GGUF a hub name picks, downloaded (every part) into the hub cache unless it is there already.

    revision: a branch, tag or commit (over the name's @REVISION); progress: huggingface-hub's progress bars."""
    repo_id, quant, named_revision = parse_name(name)
    revision = revision or named_revision
    files, commit, where = _list_files(repo_id, revision)
    ggufs = group_ggufs(files)
    gguf = pick(ggufs, quant, repo_id, where)
    if len(gguf.files) < gguf.parts:
        raise EdgespecError(f"{gguf.first} is split in {gguf.parts} parts, {len(gguf.files)} of them in the hub "
                            f"cache{where}: pull it where the hub can be reached")
    from_cache = bool(where)  # then by its commit: the branch the cache knows may have moved on
    hub = _hub()
    try:
        with _progress(progress):
            paths = [Path(hub.hf_hub_download(repo_id, f, revision=commit if from_cache else revision))
                     for f in gguf.files]
    except hub.errors.LocalEntryNotFoundError:
        raise EdgespecError(f"{gguf.first} of {_at(repo_id, revision)} is not in the hub cache and cannot be "
                            "downloaded now") from None
    except (hub.errors.HfHubHTTPError, OSError) as e:
        raise EdgespecError(f"downloading {gguf.first} from {repo_id} failed: {e}") from None
    return Pulled(f"{repo_id}:{gguf.label(ggufs)}", repo_id, commit, gguf, paths[0],
                  sum(p.stat().st_size for p in paths))


def resolve_gguf(name: str, *, revision: str | None = None, progress: bool = True) -> Path:
    """The local path of the GGUF a hub name picks (its first part), downloaded if need be; see pull."""
    return pull(name, revision=revision, progress=progress).path


def download_snapshot(repo_id: str, patterns: list[str], *, revision: str | None = None,
                      progress: bool = True) -> Path:
    """snapshot_download of the files matching patterns (a checkpoint for export); honours HF_HUB_OFFLINE."""
    hub = _hub()
    try:
        with _progress(progress):
            return Path(hub.snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except hub.errors.RepositoryNotFoundError:
        raise EdgespecError(f"hub repository {repo_id} not found (or private: set HF_TOKEN)") from None
    except hub.errors.RevisionNotFoundError:
        raise EdgespecError(f"revision {revision} not found in {repo_id}") from None
    except hub.errors.LocalEntryNotFoundError:
        raise EdgespecError(f"{_at(repo_id, revision)} is not in the local hub cache and the hub cannot be reached "
                            "(HF_HUB_OFFLINE is set or there is no network)") from None
    except (hub.errors.HfHubHTTPError, OSError) as e:
        raise EdgespecError(f"downloading {repo_id} failed: {e}") from None


# --- what the cache holds -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cached:
    """A GGUF model in one cached snapshot."""

    name: str  # the hub name that picks it again: org/repo:QUANT, with @REVISION unless it is main's
    repo_id: str
    refs: tuple[str, ...]  # branches and tags pointing at the snapshot ("main", ...)
    commit: str
    gguf: GGUF
    path: Path  # the first part in the snapshot
    size: int  # bytes of the parts cached

    @property
    def complete(self) -> bool:
        return len(self.gguf.files) == self.gguf.parts


def cached_models() -> list[Cached]:
    """Every GGUF model in the hub cache, by repository and file (none when there is no cache)."""
    hub = _hub()
    try:  # the cache as huggingface-hub reads it now (scan_cache_dir's default is the one at its import)
        info = hub.scan_cache_dir(cache_dir())
    except hub.errors.CacheNotFound:
        return []
    models = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model":
            continue
        for revision in sorted(repo.revisions, key=lambda r: ("main" not in r.refs, r.commit_hash)):
            sizes = {f.file_path.relative_to(revision.snapshot_path).as_posix(): f.size_on_disk
                     for f in revision.files}
            refs = tuple(sorted(revision.refs))
            at = "" if "main" in refs else f"@{refs[0] if refs else revision.commit_hash}"
            ggufs = group_ggufs(sizes)
            for gguf in ggufs:
                models.append(Cached(f"{repo.repo_id}:{gguf.label(ggufs)}{at}", repo.repo_id, refs,
                                     revision.commit_hash, gguf, revision.snapshot_path / gguf.first,
                                     sum(sizes[f] for f in gguf.files)))
    return models
