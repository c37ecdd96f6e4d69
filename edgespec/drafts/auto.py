"""What the draft "auto" stands for with a target, and why (the CLI prints the reason, --json carries it)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from edgespec.drafts.spec import LOOKUP_FIRST
from edgespec.errors import EdgespecError

# "auto": prompt lookup; on an ONNX export the shipped EAGLE head was trained for, prompt lookup with the head behind
# it, which bench measured faster there (docs/drafts.md, "Every kind, trained on the f32 target's own answers"); on
# llama.cpp targets the head did not beat prompt lookup
AUTO_DRAFT = "auto"


def auto_draft(target: str | os.PathLike) -> str:
    """The draft "auto" stands for with this target (choose_draft says which and why): a draft model's file, or a spec
    ("ngram", "ngram+eagle")."""
    choice = choose_draft(target)
    return choice.get("path", choice["draft"])


def choose_draft(target: str | os.PathLike | None) -> dict:
    """What "auto" stands for with this target, and why: {"draft", "reason"}, and "path" for a draft model.

    A target by hub name (org/repo:QUANT): a smaller GGUF with its vocabulary or that padded, cached or catalogued
    (models/draft_search.find_draft), else prompt lookup. A GGUF file carrying an MTP layer edgespec drives: that
    layer ("mtp"). Another file or folder: prompt lookup, with the shipped EAGLE head behind it on an ONNX export
    that returns hidden states and shares the head's vocabulary and width. A hub target's choice is made once per
    process (and hub cache), so a CLI that resolves "auto" before loading reports the same.
    """
    from edgespec.models import hub

    if target is None:
        from edgespec.models.default import default_target

        target = default_target()
    if hub.is_hub_name(str(target)):
        return dict(_hub_draft(str(target), hub.cache_dir(), hub.offline()))
    if _mtp_runs(target):
        return {"draft": "mtp", "reason": "the MTP layer this target's GGUF carries, trained with it (drafts/mtp.py)"}
    if _eagle_fits(target):
        return {"draft": f"{LOOKUP_FIRST}eagle", "reason": "prompt lookup, then the EAGLE head shipped for this "
                "export's model, which bench measured faster there (docs/drafts.md)"}
    return {"draft": "ngram", "reason": "prompt lookup: auto's draft beside a model file or folder"}


@lru_cache(maxsize=32)
def _hub_draft(target: str, cache: str, offline: bool) -> dict:
    from edgespec.models.draft_search import find_draft

    found, why = find_draft(target)
    return found or {"draft": "ngram", "reason": f"prompt lookup: {why}"}


def _mtp_runs(target: str | os.PathLike) -> bool:
    """True for a GGUF file whose MTP layer --draft mtp drives (drafts/llama_kinds.check_mtp). Reads its header."""
    from edgespec.drafts.llama_kinds import check_mtp

    if not (str(target).lower().endswith(".gguf") and Path(target).is_file()):
        return False
    try:
        check_mtp(target)
    except EdgespecError:
        return False
    return True


def _eagle_fits(target: str | os.PathLike) -> bool:
    """True for an ONNX export the shipped EAGLE head fits. Reads the export's graph and tokenizer, loads nothing."""
    from edgespec.backends.onnx.folder import MODEL_FILE
    from edgespec.backends.onnx.weights import export_facts
    from edgespec.drafts.eagle import load_eagle
    from edgespec.models.default import shipped_draft

    path = Path(target)
    folder = path.parent if path.name == MODEL_FILE else path
    if not (folder / MODEL_FILE).is_file():
        return False
    try:
        facts = export_facts(folder)
        _, _, meta = load_eagle(shipped_draft("eagle"))
    except EdgespecError:
        return False  # loading the target says what is wrong with it, if anything
    return bool(facts["hidden"]) and (facts["vocab_digest"], facts["n_embd"]) == (meta["vocab_digest"], meta["n_embd"])
