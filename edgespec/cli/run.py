"""Commands that run a pair: generate, chat, serve."""

from __future__ import annotations

import json

import click

from edgespec.backends.open import is_onnx
from edgespec.cli.models import print_choice
from edgespec.cli.options import Finite, Streams, describe, model_options, read_schema, sampling_options, status
from edgespec.errors import EdgespecError


@click.command()
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
        status("loading models and measuring draft costs ...")
    engine = load_engine()
    choice = engine.draft_choice
    if not as_json:
        status(describe(engine))
        print_choice(choice)
    stream = engine.stream(prompt, chat=chat, json_schema=read_schema(schema_file), **sampling)
    if as_json:
        for _ in stream:
            pass
        click.echo(json.dumps({"text": stream.text, "tokens": stream.tokens, **stream.stats.to_dict(),
                               "placement": engine.placement(), "draft_choice": choice}))
        return
    for event in stream:
        click.echo(event.text, nl=False)
    click.echo()
    status(_summary(stream.stats))



def _summary(stats) -> str:
    s = stats.to_dict()
    return (f"[{s['generated_tokens']} tokens, {s['tokens_per_second']} tok/s, acceptance {s['acceptance_rate']:.2f}"
            f" ({s['accepted']}/{s['drafted']}), mean accepted {s['mean_accepted_length']:.2f},"
            f" {s['target_passes']} target passes, finish: {s['finish_reason']}]")


CHAT_HELP = """commands: /stats  statistics of the last answer
          /reset  forget the conversation
          /help   this text
          /exit   leave (Ctrl-D too); Ctrl-C stops an answer"""


@click.command()
@model_options
@sampling_options
@click.option("--system", default=None, help="System message")
def chat(load_engine, system, **sampling):
    """Multi-turn chat in the terminal, streamed, over the model's chat template."""
    status("loading models and measuring draft costs ...")
    engine = load_engine()
    status(f"edgespec chat: {describe(engine)}. /help for commands.")
    print_choice(engine.draft_choice)
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


@click.command()
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
@click.option("--request-timeout", type=Finite(0, min_open=True), default=600.0, show_default=True,
              help="Seconds a request may take from its arrival, waiting included; past it, a 504")
@click.option("--parallel", type=Streams(16), default="auto", show_default=True,
              help="Requests generated at once, each a stream of one llama.cpp context with its own drafts, their "
                   "passes joined into one decode a round (GGUF targets; prompt lookup or a draft model); --ctx is "
                   "each stream's. auto: 4, as llama-server's slots, where the memory plan and the model's trained "
                   "context hold them (fewer where not), else 1")
@click.option("--prompt-cache", default="auto", show_default=True, metavar="SIZE|auto|0",
              help="Host memory for the saved states of prompts read before (GGUF), e.g. 2GiB: a conversation's "
                   "next turn starts from its state after other requests took its slot; auto: up to 1 GiB, a "
                   "quarter of the free memory, within --budget")
def serve(load_engine, host, port, api_key, default_max_tokens, max_queue, request_timeout, parallel, prompt_cache):
    """An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics).

    One model pair, loaded once; --parallel requests are answered at once (by default 4 where they fit), the
    others wait in order.
    """
    try:
        from edgespec.server import loading_thread
        from edgespec.server import serve as run_server
    except ImportError as e:
        raise EdgespecError(f"the server needs its extra: pip install 'edgespec[serve]' ({e.name} is missing)") \
            from None
    from edgespec.backends.llama.states import PromptCache, prompt_cache_bytes
    from edgespec.parallel import open_run
    from edgespec.units import mib_text

    target = load_engine.options["target"]
    onnx = target is not None and is_onnx(target)
    if prompt_cache != "auto":
        prompt_cache_bytes(prompt_cache)  # a size it cannot read, refused before loading
    # the run resolved once: --parallel auto's streams and why, the plan and settings its engines open with
    run = load_engine.run(streams=1 if onnx and parallel is not None else parallel)
    status("loading models and measuring draft costs ...")
    executor = loading_thread() if run.streams == 1 else None  # an Engine is served from the thread it loaded on
    engine = executor.submit(open_run, run).result() if executor else open_run(run)
    how = (f"; {run.streams} streams at once, their passes joined" if run.streams > 1 else "; one request at a time"
           + (" (an ONNX target: --parallel needs a GGUF one)" if onnx and (parallel or 1) > 1 else ""))
    if parallel is None:
        how += f" (--parallel auto: {run.streams_why})"
    first = engine.engines[0]
    try:
        size = prompt_cache_bytes(prompt_cache, first.plan)
    except EdgespecError:
        engine.close()
        raise
    cache = PromptCache(size) if size and not onnx else None
    if cache is not None:
        how += f"; prompt cache {mib_text(size)}"
    status(f"{describe(first)}{how}\nserving on http://{host}:{port}/v1" + (" (API key required)" if api_key else ""))
    print_choice(engine.draft_choice)
    try:
        run_server(engine, host=host, port=port, api_key=api_key, default_max_tokens=default_max_tokens,
                   max_queue=max_queue, request_timeout=request_timeout, executor=executor, prompt_cache=cache)
    finally:
        engine.close()
