"""What a `--draft` names, parsed once into a DraftSpec: no draft, prompt lookup, a draft model, Medusa or EAGLE
heads, the target's own MTP layer ("mtp"), each of the last four optionally behind prompt lookup ("ngram+DRAFT":
lookup where the text repeats itself, DRAFT elsewhere). Parsing reads no file; `resolved` turns the names a user
may write for a file (a shipped draft such as "eagle", a hub name org/repo:QUANT) into the file, downloading a hub
model if need be.
"auto" is not a spec: load decides what it stands for with a target first (api.choose_draft).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from edgespec.drafts.eagle import EAGLE_SUFFIX
from edgespec.drafts.heads import HEADS_SUFFIX
from edgespec.errors import EdgespecError

LOOKUP_FIRST = "ngram+"
KINDS = ("none", "lookup", "model", "medusa", "eagle", "mtp")  # mtp: the target's own MTP layers


@dataclass(frozen=True)
class DraftSpec:
    kind: str  # one of KINDS
    source: str | None = None  # what names the model or heads: a path, a shipped draft's name, a hub name
    lookup_first: bool = False  # prompt lookup in front of it

    @property
    def heads(self) -> str | None:
        """"medusa" or "eagle" for heads, else None."""
        return self.kind if self.kind in ("medusa", "eagle") else None

    @cached_property
    def in_llama(self) -> str | None:
        """The kind of a draft that decodes inside llama.cpp beside the target: "mtp", or a draft file's
        architecture "eagle3" or "dflash" (its header read: drafts/llama_kinds.llama_kind); None for any other."""
        from edgespec.drafts.llama_kinds import llama_kind

        return "mtp" if self.kind == "mtp" else llama_kind(self.source) if self.kind == "model" else None

    @property
    def family(self) -> str:
        """What the planner and the simulator price: "none", "lookup", "model" or "heads" (EAGLE and Medusa, and
        the drafts inside llama.cpp: in_llama); with prompt lookup in front, the draft behind it (it is what holds
        memory and costs a step)."""
        return "heads" if self.heads or self.in_llama else self.kind

    @property
    def inner(self) -> DraftSpec:
        """The draft behind prompt lookup (itself where there is no lookup in front)."""
        return replace(self, lookup_first=False)

    @property
    def needs_memory(self) -> bool:
        """Whether the draft holds weights of its own (a model or heads)."""
        return self.kind in ("model", "medusa", "eagle", "mtp")

    def resolved(self) -> DraftSpec:
        """The spec with a shipped draft's name or a hub name replaced by its file (a hub model is downloaded
        into the hub cache if it is not there)."""
        from edgespec.models import hub
        from edgespec.models.default import SHIPPED_DRAFTS, shipped_draft

        if self.source in SHIPPED_DRAFTS:
            return replace(self, source=str(shipped_draft(self.source)))
        if self.kind == "model" and hub.is_hub_name(self.source):
            return replace(self, source=str(hub.resolve_gguf(self.source)))
        return self

    def __str__(self) -> str:
        """The spec as a user writes it."""
        text = {"none": "none", "lookup": "ngram", "mtp": "mtp"}.get(self.kind, self.source)
        return LOOKUP_FIRST + text if self.lookup_first else text


def parse_draft(draft: str | os.PathLike | DraftSpec | None) -> DraftSpec:
    """A --draft value as a DraftSpec (None: no draft). Reads no file."""
    from edgespec.models.default import SHIPPED_DRAFTS

    if isinstance(draft, DraftSpec):
        return draft
    text = "none" if draft is None else os.fspath(draft)
    if text == "auto":
        raise EdgespecError("'auto' stands for a draft chosen with the target: resolve it with the target first")
    lookup_first = text.startswith(LOOKUP_FIRST)
    inner = text[len(LOOKUP_FIRST):] if lookup_first else text
    if lookup_first and inner in ("ngram", "none", "", "auto"):
        raise EdgespecError(f"{text!r}: after 'ngram+' name a draft model or heads file (ngram+draft.gguf)")
    if inner in ("none", ""):
        return DraftSpec("none")
    if inner == "ngram":
        return DraftSpec("lookup")
    if inner == "mtp":
        return DraftSpec("mtp", lookup_first=lookup_first)
    name = inner if inner not in SHIPPED_DRAFTS else SHIPPED_DRAFTS[inner]
    kind = "medusa" if name.endswith(HEADS_SUFFIX) else "eagle" if name.endswith(EAGLE_SUFFIX) else "model"
    return DraftSpec(kind, inner, lookup_first)


def open_drafter(draft: str | os.PathLike | DraftSpec | None, target, *, window: int | None = None,
                 threads: int | None = None, provider: str = "cpu", **settings):
    """The drafter for a draft against a loaded target: (drafter or None, its own backend if it is a model, seconds
    per drafted token measured here). window: recent tokens a draft model reads (default 1024); settings:
    llama.cpp settings of a draft model (kv_type, n_ubatch, n_gpu_layers)."""
    from edgespec.backends.llama.subset import SubsetDraft
    from edgespec.backends.model_info import read_model_info
    from edgespec.backends.open import open_model
    from edgespec.decode.calibrate import measure_pass_costs
    from edgespec.drafts.base import DRAFT_WINDOWS, MAX_DRAFT, LookupFirstDrafter, PromptLookupDrafter

    spec = parse_draft(draft).resolved()
    if spec.kind == "none":
        return None, None, 0.0
    if spec.kind == "lookup":
        return PromptLookupDrafter(target.vocab.n_vocab), None, 0.0
    if spec.lookup_first:
        inner, backend, cost = open_drafter(spec.inner, target, window=window, threads=threads, provider=provider,
                                            **settings)
        return LookupFirstDrafter(inner, target.vocab.n_vocab), backend, cost
    if spec.kind == "eagle":
        from edgespec.drafts.eagle import EagleDrafter

        drafter = EagleDrafter(spec.source, target, n_threads=threads)
        return drafter, None, drafter.measure_cost()
    if spec.kind == "medusa":
        from edgespec.drafts.heads import MedusaDrafter

        drafter = MedusaDrafter(spec.source, target)
        return drafter, None, drafter.measure_cost()
    if spec.kind == "mtp" or spec.in_llama:
        drafter = llama_head(spec, target, threads=threads)
        return drafter, None, drafter.measure_cost()
    # a draft model reads a window of recent tokens, and needs room for what it drafts
    draft_ctx = min(target.n_ctx, window or DRAFT_WINDOWS[0]) + MAX_DRAFT
    path = Path(spec.source)
    if path.suffix.lower() == ".gguf" and path.is_file() and read_model_info(path).draft_vocab:
        # drafts from the subset its file carries (edgespec draft-vocab); on the CPU, as llama.cpp vector input
        backend = SubsetDraft(path, n_ctx=draft_ctx, n_threads=threads, kv_type=settings.get("kv_type", "f16"))
    else:
        backend = open_model(path, n_ctx=draft_ctx, threads=threads, provider=provider, **settings)
    try:
        return model_drafter(backend, target.vocab), backend, measure_pass_costs(backend, 1)[1]
    except BaseException:
        backend.close()
        raise


def llama_head(spec: DraftSpec, target, *, threads: int | None = None):
    """The drafter of a draft that decodes inside llama.cpp beside a LlamaBackend target (an MTP layer, the target
    opened with them; an EAGLE-3 head or a DFlash draft, which pair.resolve_pair checked fit it), its costs not
    measured yet (measure_cost: for streams, once its calls run where the streams' do, for_streams)."""
    if spec.kind == "mtp":
        from edgespec.drafts.mtp import MtpDrafter

        return MtpDrafter(target, n_threads=threads)
    if spec.in_llama == "eagle3":
        from edgespec.drafts.eagle3 import Eagle3Drafter as Head
    else:
        from edgespec.drafts.dflash import DFlashDrafter as Head
    return Head(spec.source, target, n_threads=threads)


def model_drafter(backend, target_vocab, *, quiet: bool = False):
    """The drafter for a draft model: a ModelDrafter where its vocabulary is the target's or the target's padded
    (check_compatible), else a CrossDrafter drafting the tokens both vocabularies spell alike (drafts/cross.py),
    which says so on stderr (unless quiet: a stream after the first); an error naming both reasons where neither
    can draft."""
    from edgespec.drafts.base import ModelDrafter
    from edgespec.drafts.cross import CrossDrafter
    from edgespec.progress import say

    try:
        return ModelDrafter(backend, target_vocab)
    except EdgespecError as error:
        other = str(error)
    try:
        drafter = CrossDrafter(backend, target_vocab)
    except EdgespecError as cross:
        raise EdgespecError(f"{other}; and as a draft of another tokenizer: {cross}") from None
    say(not quiet, f"draft {backend.name}: another tokenizer ({other}): drafting the {drafter.map.shared} of its "
        f"{backend.vocab.n_vocab} tokens that spell a target token (token-level intersection)")
    return drafter
