"""Commands that measure and plan: bench, plan, profiles, doctor, advise."""

from __future__ import annotations

import json
import sys

import click

from edgespec.api import DEFAULT_DRAFT, LONGEST_DRAFT, Engine
from edgespec.cli.models import print_choice
from edgespec.cli.options import Finite, Seed, Temperature, model_options, plan_options, read_schema, status
from edgespec.drafts.spec import open_drafter, parse_draft
from edgespec.errors import EdgespecError


@click.command()
@model_options
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False),
              help="JSONL with {'cat': ..., 'prompt': ...} per line [default: the built-in set]")
@click.option("-n", "--max-tokens", type=click.IntRange(1), default=128, show_default=True)
@click.option("-t", "--temperature", type=Temperature(), default=0.0, show_default=True)
@click.option("--draft-max", type=click.IntRange(0, LONGEST_DRAFT), default=None,
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
                status("loading models and measuring draft costs ...")
            engine: Engine = load_engine(other, gate=not no_gate)
            try:
                baseline = None
                if not runs_as_alone(engine):
                    alone = alone or load_engine("none")
                    baseline = alone
                choice = engine.draft_choice
                if not as_json:
                    print_choice(choice)
                reports.append(run_bench(engine, prompts, max_tokens=max_tokens, temperature=temperature,
                                         draft_max=draft_max, progress=not as_json and sys.stderr.isatty(),
                                         json_schema=schema, grammar_drafts=not grammar_unaware, baseline=baseline))
                reports[-1]["draft_choice"] = choice
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


@click.command()
@click.option("--pair", "pair", type=click.Path(dir_okay=False),
              help="A pair manifest (pair.json): its target and draft")
@click.option("-m", "--target", envvar="EDGESPEC_TARGET", type=click.Path(),
              help="Target: a GGUF file or an ONNX export folder [default: the default model]")
@click.option("--draft", default=DEFAULT_DRAFT, show_default=True, envvar="EDGESPEC_DRAFT",
              help="Draft: 'auto', a model file/folder, heads, 'ngram' or 'none' (see edgespec chat --help)")
@plan_options
@click.option("--acceptance", type=Finite(0, 1, max_open=True), default=0.7, show_default=True,
              help="Per-token acceptance rate assumed for the speed prediction")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON")
def plan(pair, target, draft, device, budget, n_ctx, kv_type, profiles, threads, acceptance, as_json):
    """Plan memory for a target and a draft on a device, from the files' headers (nothing loads).

    Prints each model's weights, KV cache, buffers and runtime against the device's memory, the settings
    that fit (context, KV cache type, prompt batch, GPU layers), or what is missing and which changes would
    fit; a roofline prediction of decode speed; and how many requests `serve` would decode at once (--parallel
    auto, each stream --ctx tokens, 2048 by default). Exits 1 when the models do not fit.
    """
    from edgespec.pair import resolve_pair
    from edgespec.plan.report import format_plan, predict, to_dict
    from edgespec.run import auto_streams, plan_for

    if pair:
        from edgespec.export.pair import read_manifest

        target, draft = read_manifest(pair)
    resolved = resolve_pair(target, draft)  # once, for the plan and for serve's streams
    result = plan_for(resolved, device=device, budget=budget, n_ctx=n_ctx, kv_type=kv_type, profiles=profiles)
    prediction = predict(result, acceptance)
    report = to_dict(result, prediction)
    if result.fits:  # what `edgespec serve` would run at once with these settings (--parallel auto)
        streams, why = auto_streams(resolved, n_ctx=n_ctx or 2048, device=device, budget=budget,
                                    kv_type=kv_type, profiles=profiles)
        report["serve_streams"] = {"streams": streams, "why": why}
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(format_plan(result, prediction))
        if result.fits:
            click.echo(f"serve: {streams} request{'s' * (streams > 1)} at once unless told (--parallel auto: {why})")
    if not result.fits:
        sys.exit(1)


@click.command()
@click.option("--profiles", type=click.Path(dir_okay=False), default=None, envvar="EDGESPEC_PROFILES",
              help="A TOML file of your own device profiles [env EDGESPEC_PROFILES]")
@click.option("--json", "as_json", is_flag=True, help="Print the profiles as JSON")
def profiles(profiles, as_json):
    """List the device profiles the planner knows (auto, this machine, is measured when used)."""
    from dataclasses import asdict

    from edgespec.plan.profiles import load_profiles

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


@click.command()
@model_options
@click.option("-t", "--temperature", type=Temperature(greedy=False), default=1.0, show_default=True,
              help="Sampling temperature of the self-test (the rule is tested on the distributions it makes)")
@click.option("--top-p", type=Finite(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--draws", type=click.IntRange(1000), default=10000, show_default=True,
              help="Rule runs per tested position")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON")
def doctor(load_engine, temperature, top_p, draws, as_json):
    """Check this device: versions and build of the backends, devices, memory, that the pair loads, and
    an exactness self-test of the verification rule on its distributions (exit 1 if anything fails)."""
    from edgespec.decode.sampling import SamplingParams
    from edgespec.doctor import run_doctor

    if not as_json:
        status("checking the environment, loading the models, testing the rule ...")
    report = run_doctor(load_engine, SamplingParams(temperature=temperature, top_p=top_p), draws)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        env = report["environment"]
        llama, ort = env["llama_cpp"], env["onnxruntime"]
        click.echo(f"edgespec {env['edgespec']}, Python {env['python']}, {env['platform']}, {env['cpus']} CPUs "
                   f"({env['cores']} for this process: the default threads), "
                   f"{env['memory']['available'] / 2**30:.1f} of {env['memory']['total'] / 2**30:.1f} GiB free")
        if llama:
            devices = ", ".join(f"{d['name']} ({d['type']})" for d in llama["devices"]) or "none found"
            click.echo(f"llama-cpp-python {llama['version']}, build {llama['build']}, GPU offload "
                       f"{'yes' if llama['gpu_offload'] else 'no'}; devices: {devices}")
            click.echo(f"  {llama['system_info']}")
        click.echo(f"onnxruntime {ort['version']}: {', '.join(ort['providers'])}" if ort
                   else "onnxruntime: not installed")
        click.echo(f"llguidance {env['llguidance'] or 'not installed'}, torch {env['torch'] or 'not installed'}")
        passes = env["row_passes"]
        click.echo(f"sampling's passes over a row: {passes}" + (" (edgespec's C module was not built: slower at "
                                                                "128k-152k tokens; install with a C compiler)"
                                                                if passes == "numpy" else ""))
        for check in report["checks"]:
            detail = check.get("summary") or check["detail"]
            click.echo(f"{'ok  ' if check['ok'] else 'FAIL'} {check['name']}: {detail}")
            if check["name"] == "load" and check["ok"]:
                click.echo(f"     {where_and_cost(report['placement'], report['costs'])}")
        if any(c["name"] == "exactness" for c in report["checks"]):
            click.echo("     the guarantee is about the target's processed distribution (its quantization, a "
                       "grammar, temperature/top-p as given)")
    if not report["ok"]:
        sys.exit(1)


def where_and_cost(placement: dict, costs: dict) -> str:
    """One line: where each model runs (layers on a GPU) and what its steps cost."""
    def where(p):
        layers = f", {p['gpu_layers']}/{p['layers']} layers on the GPU" if "gpu_layers" in p else ""
        return f"{p['runtime']} on {p['device']}{layers}"

    passes = "/".join(f"{ms:.1f}" for ms in costs["target_pass_ms"].values())
    line = (f"target: {where(placement['target'])}, a pass over {'/'.join(map(str, costs['target_pass_ms']))} "
            f"tokens {passes} ms")
    if placement["draft"] is not None:
        line += f"; draft: {where(placement['draft'])}"
    if "draft_step_ms" in costs:
        line += f", a draft step {costs['draft_step_ms']:.1f} ms (reading a skipped token {costs['draft_read_ms']:.1f})"
    return line


@click.command()
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
@click.option("-t", "--temperature", type=Temperature(), default=0.0, show_default=True, help="0 = greedy")
@click.option("--top-p", type=Finite(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--draft-max", "k_max", type=click.IntRange(1, LONGEST_DRAFT), default=6, show_default=True,
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
@click.option("--seed", type=Seed(), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON")
def advise(load_engine, also, prompts_file, per_category, max_tokens, temperature, top_p, k_max, check,
           check_per_category, check_file, seed, as_json):
    """Predict acceptance and speed-up per category and draft length from a calibration sample, recommend a
    draft and a draft length (or not to speculate); --check measures the prediction on held-out prompts."""
    from edgespec.decode.sampling import SamplingParams
    from edgespec.plan import advise as advice

    options = load_engine.options
    # a shipped draft's name or a hub name: its file, which advise reads
    also = [str(parse_draft(other).resolved()) for other in also]
    names = [str(load_engine.pair().draft), *also]
    if "none" in names:
        raise EdgespecError("advise compares a draft with target-only decoding: give a draft, not 'none'")
    if len(set(names)) < len(names):
        raise EdgespecError("each draft once, please: " + ", ".join(names))
    mixed = [n for n in names if parse_draft(n).lookup_first]
    if mixed:  # its model has no per-position law for lookup rounds; bench measures such a draft instead
        raise EdgespecError(f"advise models one kind of draft at a time, not {', '.join(mixed)}: advise on its parts "
                            "(ngram and the draft), and measure the two together with edgespec bench")
    params = SamplingParams(temperature=temperature, top_p=top_p)
    calibration, held_out = advice.choose_prompts(prompts_file, per_category, check_per_category, check_file)
    if check and not held_out:
        raise EdgespecError(f"{prompts_file} leaves no prompt to hold out for --check: give two or more per category")
    if not as_json:
        status("loading models ...")
    engine = load_engine(hidden=any(parse_draft(d).heads for d in names))
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

