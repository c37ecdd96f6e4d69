"""What to run, resolved once: the target's file and the draft as one typed value, with what "auto" chose and why.

A user names a pair in several ways: a file, an ONNX export folder, a hub name (org/repo:QUANT), None for the
default model; a draft as a file, a shipped draft's name ("eagle"), "ngram", "ngram+" before a model or heads, a
hub name, or "auto", which stands for a draft chosen with the target (drafts/auto.choose_draft). `resolve_pair`
turns that into a Pair once: the target's file (a hub model fetched), the draft's DraftSpec with its files
(drafts/spec.py) and the record of the choice. A Run (run.py) is a Pair with the settings it runs with; `load`,
`plan_for`, `Parallel`, `auto_streams` and the CLI take a Pair where they are given one and resolve nothing again;
given names, they resolve them here, once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from edgespec.drafts.auto import AUTO_DRAFT, choose_draft
from edgespec.drafts.llama_kinds import MTP_DRAFT, check_draft_file, check_mtp
from edgespec.drafts.spec import DraftSpec, parse_draft


@dataclass(frozen=True)
class Pair:
    target: str  # a GGUF file or an ONNX export folder
    draft: DraftSpec  # files, not names (DraftSpec.resolved)
    # {"draft", "reason", "auto"}: the draft asked for, or what "auto" chose and why (Engine.draft_choice)
    choice: Mapping = field(default_factory=lambda: MappingProxyType({}))


def resolve_model(model):
    """A hub name (org/repo[:QUANT][@REVISION] that is no file or folder here) as its GGUF in the hub cache,
    downloaded if need be (models/hub.py); any other model as it is."""
    from edgespec.models import hub

    return hub.resolve_gguf(model) if hub.is_hub_name(model) else model


def resolve_pair(target: str | os.PathLike | Pair | None, draft: str | os.PathLike | DraftSpec | None = AUTO_DRAFT
                 ) -> Pair:
    """The Pair a target and a draft name (a Pair: itself, whatever `draft` says). target None: the default model;
    draft "auto": chosen for that target (choose_draft), the reason kept. A draft in one of llama.cpp's own
    formats that edgespec does not run (an EAGLE-3 or DFlash GGUF, "mtp") gets its error here (drafts/llama_kinds)."""
    if isinstance(target, Pair):
        return target
    if target is None:
        from edgespec.models.default import default_target

        target = default_target()
    choice = {"draft": "none" if draft is None else str(draft), "reason": "asked for", "auto": False}
    if draft == AUTO_DRAFT:
        choice = {**choose_draft(target), "auto": True}
        draft = choice.pop("path", choice["draft"])
    target = str(resolve_model(target))
    if draft == MTP_DRAFT:
        check_mtp(target)
    spec = parse_draft(draft).resolved()
    if spec.kind == "model" and Path(spec.source).suffix.lower() == ".gguf" and Path(spec.source).is_file():
        check_draft_file(spec.source, target)
    return Pair(target, spec, MappingProxyType(choice))
