"""A run resolved once: the pair, each model's llama.cpp settings, the memory plan, the tree width, and how many
streams and why.

What a user asks for (CLI flags, `load`'s or `Parallel`'s arguments, serve's --parallel) is turned into a Run by
`resolve_run`, once: every check on the options (context, tree width, streams) and every default (the GPU's plan,
the onnxruntime provider, how its threads spin, the draft's window) is decided here, and nothing that opens a run
decides any of it again. `api.open_engine` opens a Run of one stream as an Engine, `parallel.Parallel` one of
several as an Engine a stream; `parallel.open_run` picks between them. The memory plan of a pair (`plan_for`,
headers only) and serve's default number of streams (`auto_streams`) live here, since a Run is made of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edgespec.backends.model_info import read_model_info
from edgespec.backends.onnx.folder import SPIN_WITHIN_RUNS
from edgespec.backends.open import is_onnx
from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.drafts.auto import AUTO_DRAFT
from edgespec.drafts.base import DRAFT_WINDOWS
from edgespec.drafts.spec import DraftSpec
from edgespec.errors import EdgespecError
from edgespec.pair import Pair, resolve_pair
from edgespec.plan import placement
from edgespec.plan.planner import CTX_STEP, DEFAULT_CTX

if TYPE_CHECKING:
    from edgespec.plan.planner import Plan

MAX_TREE_WIDTH = 4  # candidates per position of a draft tree (a fixed tree 3 deep and 4 wide fills one 16-row pass)
LONGEST_DRAFT = MAX_OUTPUTS - 1  # the longest draft one verify pass checks (its k drafts and 1 more row)
K_MAX = 8  # the longest draft the controller considers (a user's --draft-max may go to LONGEST_DRAFT)
AUTO_STREAMS = 4  # requests `edgespec serve` generates at once unless told, where they fit: llama-server's slots


@dataclass(frozen=True)
class ModelSettings:
    """One model's llama.cpp settings: its KV cache type, prompt batch and layers on the GPU."""
    kv_type: str = "f16"
    n_ubatch: int = 512
    n_gpu_layers: int = 0

    @classmethod
    def planned(cls, model) -> ModelSettings:
        """The settings a memory plan chose for a model (plan.planner.ModelPlan)."""
        return cls(model.kv_type, model.n_ubatch, model.n_gpu_layers)

    def as_kwargs(self) -> dict:
        return {"kv_type": self.kv_type, "n_ubatch": self.n_ubatch, "n_gpu_layers": self.n_gpu_layers}


@dataclass(frozen=True)
class Run:
    pair: Pair  # the target's file and the draft (pair.py)
    n_ctx: int  # one stream's context in tokens
    streams: int = 1  # generations at once on one target (1: an Engine)
    streams_why: str = "asked for"  # why that many: asked for, or what --parallel auto found
    one_pool: bool = False  # streams share one pool of KV cells (else a pool each: _layout)
    tree_width: int = 1  # candidates per position of a draft tree (1: chains)
    plan: Plan | None = None  # the memory plan loaded by (plan.planner.Plan), where a device or budget asked
    target_settings: ModelSettings = field(default_factory=ModelSettings)
    draft_settings: ModelSettings = field(default_factory=ModelSettings)
    draft_window: int = DRAFT_WINDOWS[0]  # recent tokens a draft model reads
    provider: str = "cpu"  # onnxruntime's execution provider for ONNX models
    threads: int | None = None  # CPU threads (None: the backend's default)
    k_max: int = K_MAX  # the longest draft the controller may choose
    gate: bool = True  # chains end by the draft's confidence (decode/gate.DraftGate)
    spin: bool | str = True  # how an ONNX target's threads spin (backends/onnx/folder.open_session)
    hidden: bool = False  # the target also returns its hidden states (heads read them)


def plan_for(target: str | os.PathLike | Pair | None = None, draft: str | os.PathLike | None = AUTO_DRAFT, *,
             device: str | None = None, budget: str | int | None = None, n_ctx: int | None = None,
             kv_type: str | None = None, k_max: int = K_MAX, profiles: str | os.PathLike | None = None,
             measure_bandwidth: bool = True, sequences: int = 1):
    """The memory plan for a target and a draft (or a Pair resolved already) on a device profile (default: this
    machine) and/or within a budget (bytes, or text such as "6GiB"), from the files' headers: nothing is loaded.
    sequences: those the contexts hold (streams, or MAX_OUTPUTS for draft trees' branches), which a model with
    recurrent layers keeps a state for each. See plan.planner."""
    from edgespec.plan.planner import make_plan
    from edgespec.plan.profiles import get_profile
    from edgespec.units import parse_size

    pair = resolve_pair(target, draft)
    target, spec = pair.target, pair.draft.inner  # prompt lookup in front of a draft needs no memory of its own
    target_info = read_model_info(target)
    heads_bytes = None
    if spec.kind == "eagle":
        from edgespec.drafts.eagle import eagle_bytes

        rows = {t.name: t.type for t in target_info.tensors}
        rows = rows.get("output.weight") or rows.get("token_embd.weight")
        heads_bytes = eagle_bytes(spec.source, target_info.n_vocab, n_ctx or target_info.n_ctx_train or 4096,
                                  rows_quantized=rows not in ("F32", "F16"))
    elif spec.kind == "medusa":
        from edgespec.drafts.heads import medusa_bytes

        heads_bytes = medusa_bytes(spec.source, target_info.n_vocab, target_info.n_embd)
    elif spec.in_llama:  # a decoder inside llama.cpp beside the target: an EAGLE-3 head, DFlash, an MTP layer
        from edgespec.plan.planner import DEFAULT_CTX, llama_head_bytes

        heads_bytes = llama_head_bytes(spec.in_llama, spec.source, target_info, n_ctx or DEFAULT_CTX)
    draft_info = read_model_info(spec.source) if spec.family == "model" else None
    budget = parse_size(budget) if isinstance(budget, str) else budget
    profile = get_profile(device or "auto", profiles, measure=measure_bandwidth)
    return make_plan(target_info, draft_info, profile, budget=budget, n_ctx=n_ctx,
                     kv_type=kv_type, drafter=spec.family, k_max=k_max, heads_bytes=heads_bytes, sequences=sequences)


def one_stream_reason(target: str, spec: DraftSpec) -> str | None:
    """Why `target` with the draft `spec` runs one stream at a time (None: it runs as streams)."""
    if Path(target).is_dir() or Path(target).suffix.lower() != ".gguf":
        return (f"{target}: several streams at once need a GGUF target (llama.cpp); an ONNX target answers one "
                "request at a time")
    if (spec.kind not in ("none", "lookup", "model", "mtp") and not spec.in_llama) or spec.lookup_first:
        return (f"draft {spec}: several streams draft with prompt lookup, a draft model, an EAGLE-3 head, a DFlash "
                "draft or MTP layers; EAGLE-1 and Medusa heads and prompt lookup in front of a draft run one stream "
                "at a time")
    return None


def _layout(spec: DraftSpec, layers: int | None, n_ctx: int) -> tuple[bool, int]:
    """(whether the streams share one pool of KV cells, the cells each stream's context takes).

    Streams keep a pool of cells each (llama-server's slots' layout): a row's attention then reads its own stream's
    cells, not all of them (on the CPU a 4-stream pass at 1,000 tokens each 14 % cheaper, a prompt's prefill
    beside three such streams 18 %: docs/results/2026-11-27-long-prompts.md). But llama.cpp then computes the rows
    a stream's draft adds beyond the others' one token as a pass of their own, which a GPU pays as a whole pass
    where the same rows in one pool cost little; and a draft model's streams step their draft model together. So
    on a GPU (prompt lookup, heads inside llama.cpp), and with a draft model, drafting streams share one pool."""
    on_gpu = placement.gpu_name() is not None and layers != 0
    unified = spec.kind == "model" or ((spec.kind == "lookup" or spec.family == "heads") and on_gpu)
    return unified, n_ctx if unified else -(-n_ctx // CTX_STEP) * CTX_STEP  # a pool rounded up as llama.cpp does


def auto_streams(target: str | os.PathLike | Pair | None = None, draft: str | os.PathLike | None = "ngram", *,
                 n_ctx: int = DEFAULT_CTX, gpu_layers: int | str | None = None, device: str | None = None,
                 budget: str | int | None = None, kv_type: str | None = None,
                 profiles: str | os.PathLike | None = None, tree_width: int = 1) -> tuple[int, str]:
    """How many requests `edgespec serve` generates at once unless told (--parallel auto), and why: AUTO_STREAMS,
    as llama-server's slots, where the target is a GGUF file, the draft runs as streams (chains: tree_width 1),
    the model was trained for that many contexts of n_ctx tokens and their KV caches fit: the memory plan for the
    device (this machine unless `device`) within `budget`, with as many of the target's layers on a GPU as one
    stream's plan; fewer streams where that many do not fit; 1 (one Engine, one request at a time) otherwise.
    Reads headers only. target: also a Pair resolved already (pair.resolve_pair), `draft` then unread."""
    if tree_width > 1:
        return 1, "draft trees run one stream at a time"
    pair = resolve_pair(target, draft)
    target, spec = pair.target, pair.draft
    refused = one_stream_reason(target, spec)
    if refused:
        return 1, refused
    _, cells = _layout(spec, placement.parse_gpu_layers(gpu_layers), n_ctx)
    trained = read_model_info(target).n_ctx_train or 0
    most = min(AUTO_STREAMS, trained // cells) if trained else AUTO_STREAMS
    if most < 2:
        return 1, f"{Path(target).name} was trained for {trained} tokens: one context of {n_ctx}"
    planned = device is not None or budget is not None  # else loaded as asked: f16 KV cache, every layer on a GPU

    def plan(streams: int):
        return plan_for(pair, device=device, budget=budget, n_ctx=cells * streams,
                        kv_type=kv_type or (None if planned else "f16"), profiles=profiles, measure_bandwidth=False,
                        sequences=streams)

    one = plan(1)
    for streams in range(most, 1, -1):
        several = plan(streams)
        if several.fits and several.target.n_gpu_layers >= one.target.n_gpu_layers:
            break
    else:
        return 1, f"the KV caches of 2 contexts of {n_ctx} tokens do not fit ({one.budget_note})"
    why = "" if streams == AUTO_STREAMS else (
        f"; {AUTO_STREAMS} do not fit ({one.budget_note})" if (streams + 1) * cells <= trained or not trained
        else f"; {Path(target).name} was trained for {trained} tokens")
    return streams, f"{streams} contexts of {n_ctx} tokens{why}"


def _check_trees(pair: Pair, tree_width: int, streams: int | None) -> None:
    """Every check a tree width gets before anything loads (a drafter that cannot draft trees once open is
    refused by api.open_engine)."""
    target, draft = pair.target, pair.draft
    if not 1 <= tree_width <= MAX_TREE_WIDTH:
        raise EdgespecError(f"tree width must be between 1 and {MAX_TREE_WIDTH}, got {tree_width}")
    if tree_width == 1:
        return
    if streams is not None and streams > 1:
        raise EdgespecError("draft trees run one stream at a time: a tree width of 1, or one stream")
    if not draft.needs_memory:
        raise EdgespecError("draft trees come from a draft model or heads: pass a draft model (*.gguf), a "
                            "*.medusa.npz or *.eagle.npz draft (edgespec train-heads), or a tree width of 1")
    if is_onnx(target):
        raise EdgespecError(f"{target}: draft trees are verified in one pass by llama.cpp (GGUF targets); heads on an "
                            "ONNX target draft chains (tree width 1)")
    if draft.lookup_first:
        raise EdgespecError(f"{draft}: prompt lookup drafts chains; pass the heads alone for trees, or a tree width "
                            "of 1")


def _check_streams(pair: Pair, streams: int, n_ctx: int) -> None:
    if not 1 <= streams <= MAX_OUTPUTS:
        raise EdgespecError(f"streams must be 1 to {MAX_OUTPUTS} (the sequences a context holds), got {streams}")
    if streams == 1:
        return
    refused = one_stream_reason(pair.target, pair.draft)
    if refused:
        raise EdgespecError(refused)
    trained = read_model_info(pair.target).n_ctx_train or 0
    if trained and trained // streams < n_ctx:  # llama.cpp holds a model to it; read before any weights load
        raise EdgespecError(f"{streams} streams of {n_ctx} tokens need {streams * n_ctx} cells, more than "
                            f"{Path(pair.target).name} was trained for ({trained}): ask for fewer streams or a "
                            "shorter context")


def resolve_run(target: str | os.PathLike | Pair | Run | None = None,
                draft: str | os.PathLike | DraftSpec | None = AUTO_DRAFT, *, streams: int | None = 1,
                n_ctx: int | None = None, threads: int | None = None, k_max: int = K_MAX, provider: str | None = None,
                device: str | None = None, budget: str | int | None = None, kv_type: str | None = None,
                profiles: str | os.PathLike | None = None, hidden: bool = False, tree_width: int = 1,
                gate: bool = True, spin: bool | str | None = None, gpu_layers: int | str | None = None) -> Run:
    """The Run of a target and a draft with these options (api.load's, which documents each; a Run: itself).
    streams: generations at once (None: --parallel auto, auto_streams). Refuses, before any weights load, what
    cannot run: a context under 16 tokens, a tree width the pair cannot draft, streams the target cannot hold, a
    plan that does not fit."""
    from edgespec.plan.report import refusal

    if isinstance(target, Run):
        return target
    pair = resolve_pair(target, draft)
    if n_ctx is not None and n_ctx < 16:
        raise EdgespecError(f"context must be at least 16 tokens, got {n_ctx}")
    _check_trees(pair, tree_width, streams)
    layers = placement.parse_gpu_layers(gpu_layers)
    why = "asked for"
    if streams is None:
        streams, why = auto_streams(pair, n_ctx=n_ctx or DEFAULT_CTX, gpu_layers=layers, device=device,
                                    budget=budget, kv_type=kv_type, profiles=profiles, tree_width=tree_width)
    _check_streams(pair, streams, n_ctx or DEFAULT_CTX)
    one_pool, cells = False, n_ctx
    if streams > 1:
        n_ctx = n_ctx or DEFAULT_CTX
        one_pool, cells = _layout(pair.draft, layers, n_ctx)
    if layers is None and device is None and budget is None and placement.gpu_default(pair.target):
        device = "auto"  # GPU first: the plan for this machine puts on its GPU what fits there
    plan = None
    settings = draft_settings = ModelSettings(kv_type=kv_type or "f16")
    window = DRAFT_WINDOWS[0]
    if device is not None or budget is not None:  # several streams' cells planned as one context of their sum
        plan = plan_for(pair, device=device, budget=budget, n_ctx=cells * streams if cells else None,
                        kv_type=kv_type, k_max=k_max, profiles=profiles, measure_bandwidth=False,
                        sequences=MAX_OUTPUTS if tree_width > 1 else streams)  # as the backends open
        if not plan.fits:
            raise EdgespecError(refusal(plan) if streams == 1 else
                                f"{streams} streams of {n_ctx} tokens: {refusal(plan)}")
        if streams == 1:
            n_ctx = plan.target.n_ctx
        window = plan.draft_window
        settings = draft_settings = ModelSettings.planned(plan.target)
        if plan.draft is not None:
            draft_settings = ModelSettings.planned(plan.draft)
        gpu_providers = plan.profile.name == "auto" or set(plan.profile.onnxruntime) - {"cpu"}
        provider = provider or ("auto" if gpu_providers else "cpu")
    if layers is not None:  # asked for: over the plan's
        settings = ModelSettings(settings.kv_type, settings.n_ubatch, layers)
        draft_settings = ModelSettings(draft_settings.kv_type, draft_settings.n_ubatch, layers)
    if spin is None:
        spin = True if pair.draft.kind in ("none", "lookup") else SPIN_WITHIN_RUNS
    return Run(pair, n_ctx or DEFAULT_CTX, streams, why, one_pool, tree_width, plan, settings, draft_settings, window,
               provider or ("cpu" if layers == 0 else "auto"), threads, k_max, gate, spin,
               hidden or pair.draft.heads is not None)
