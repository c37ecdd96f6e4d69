"""Servers under several clients at once: llama-server with N slots against edgespec serve --parallel N (issue 45).

Apps that put a local model behind an HTTP endpoint send it several conversations at once; what they see is the
throughput of the whole server and the wait of each request. For each client count C (--clients), every system is
started on its own, one at a time, on a free loopback port with room for C streams: llama-server with `-np C` slots
(its `-c` the total context, --ctx per slot) plain, with the draft (`--spec-type draft-simple` for a draft model,
`draft-eagle3` / `draft-dflash` for an EAGLE-3 head or DFlash draft, as vs_llama_cpp.py runs them; --server-draft
adds flags) and with prompt lookup (`--spec-type ngram-simple`); edgespec serve --parallel C
target-only, with the same draft and with prompt lookup (--ctx per stream). Both with --threads threads and
--gpu-layers layers on the GPU (0: the CPU only). After one warm-up request, C client threads each send
--per-client chat requests in turn (non-streaming; greedy with no top-k, top-p or min-p; a fixed seed per
request): client i takes prompts i, i+C, i+2C, ... of the list, cycling, so every system answers the same
requests. With --turns T each client holds conversations of T turns instead: a first turn from the list, then
short follow-ups, each sent with the conversation so far (an app's chat); with --slots S fewer than the clients,
a conversation's next turn often finds its slot taken by another, and what the server kept of its earlier turns
(a slot's cache, a host-memory prompt cache: llama-server's --cache-ram, edgespec's --prompt-cache, both on by
default) decides how much of it is read again.

A cell (system, clients) reports the completion tokens of all its answers (usage.completion_tokens, as each server
counts them) over the wall time from the first request sent to the last answer received, prompt processing and
queueing included; its latencies (send to answer, per request) at the median and the 95th percentile; the share of
prompt tokens the server says it did not read (usage.prompt_tokens_details.cached_tokens); and its failed
requests, which make the cell invalid. Systems run in a rotated order for each client count and each repetition
(--reps), so a drift in the machine's speed falls on each in turn; repetitions are pooled.

usage: python benchmarks/serve_load.py --target T.gguf [--draft D.gguf] [--clients 1 2 4 8] [--per-client 6]
       [--max-tokens 96] [--threads 2] [--ctx 1024] [--systems llama llama+draft ...] [--reps 1] [--turns 1]
       [--slots N]
       [--prompts FILE] [--llama-bin DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from vs_llama_cpp import Server, free_port, llama_bin, server_draft_args

SYSTEMS = {  # --systems name -> table label
    "llama": "llama-server",
    "llama+draft": "llama-server + draft",
    "llama+ngram": "llama-server + ngram",
    "edgespec": "edgespec",
    "edgespec+draft": "edgespec + draft",
    "edgespec+ngram": "edgespec + ngram",
    "edgespec-cache": "edgespec --prompt-cache 0",  # what its prompt cache is worth (--turns, --slots)
}


def slots_of(system: str) -> tuple[str, int | None]:
    """A --systems entry, NAME or NAME@S (S slots whatever --slots and the clients say: one client on 1 slot and
    on 4 in one run, interleaved), as (NAME, S or None)."""
    name, at, slots = system.partition("@")
    if at and not (slots.isdigit() and int(slots) > 0):
        return system, None  # not a system: refused by name
    return name, int(slots) if slots else None


def label(system: str) -> str:
    name, slots = slots_of(system)
    return SYSTEMS[name] + (f" on {slots} slot{'s' * (slots > 1)}" if slots else "")


class EdgespecServer(Server):
    """edgespec serve on a free loopback port, with `streams` requests decoding at once and gpu_layers layers on
    the GPU (0: the CPU only)."""

    def __init__(self, target: str, draft: str, threads: int, ctx: int, streams: int, max_tokens: int,
                 gpu_layers: int = 0, extra: tuple[str, ...] = ()):
        self.port = free_port()
        place = ["--cpu"] if gpu_layers == 0 else ["--gpu-layers", str(gpu_layers)]
        command = [sys.executable, "-m", "edgespec.cli", "serve", "-m", target, "--draft", draft,
                   "--parallel", str(streams), "--port", str(self.port), "--threads", str(threads), "--ctx", str(ctx),
                   "-n", str(max_tokens), "--max-queue", "64", *place, *extra]
        self.spawn(command)
        self.wait_healthy(shlex.join(command))


def start(system: str, args: argparse.Namespace, streams: int) -> Server:
    """The server of `system` (a key of SYSTEMS) with room for `streams` requests at once."""
    system = slots_of(system)[0]
    if system.startswith("edgespec"):
        draft = {"edgespec+draft": args.draft, "edgespec+ngram": "ngram"}.get(system, "none")
        extra = ("--prompt-cache", "0") if system == "edgespec-cache" else ()
        return EdgespecServer(args.target, draft, args.threads, args.ctx, streams, args.max_tokens, args.gpu_layers,
                              extra)
    layers = str(args.gpu_layers)
    if system == "llama+draft":
        extra = [*server_draft_args(args.draft, args.gpu_layers), *shlex.split(args.server_draft)]
    else:
        extra = {"llama": [], "llama+ngram": ["--spec-type", "ngram-simple"]}[system]
    return Server(args.binary, args.target, args.threads, args.ctx * streams, ["-ngl", layers, *extra],
                  slots=streams)


# a conversation's later turns (--turns): short questions about what came before, whose prefix is the whole
# conversation so far
FOLLOW_UPS = ["Now say that in one sentence.", "Which word there matters most, and why?",
              "Give one question a reader might ask next.", "Say it again for a child."]


def chat(port: int, messages: list[dict], max_tokens: int, seed: int) -> dict:
    """One greedy chat answer: {"tokens": completion tokens, "prompt": prompt tokens, "cached": the prompt tokens
    the server reports it did not read (usage.prompt_tokens_details.cached_tokens, where it says), "text"}."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
            "min_p": 0.0, "seed": seed}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        answer = json.load(r)
    usage = answer["usage"]
    return {"tokens": int(usage["completion_tokens"]), "prompt": int(usage["prompt_tokens"]),
            "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "text": answer["choices"][0]["message"]["content"]}


def load(port: int, prompts: list[str], clients: int, per_client: int, max_tokens: int, turns: int = 1) -> dict:
    """`clients` threads, started together, each sending `per_client` requests in turn; the wall time from the first
    request sent to the last answer received and every request's record. turns: each client's requests are the
    turns of conversations of that many turns (the first turn a prompt of the list, then FOLLOW_UPS, each turn
    sent with the conversation so far)."""
    records: list[list[dict]] = [[] for _ in range(clients)]  # one list per client: no lock needed
    ready = threading.Barrier(clients)

    def client(i: int) -> None:
        ready.wait()
        messages: list[dict] = []
        for k in range(per_client):  # request n: seed n; a first turn takes prompt i + clients * conversation
            n, turn = i + k * clients, k % turns
            if turn == 0:
                messages = [{"role": "user", "content": prompts[(i + clients * (k // turns)) % len(prompts)]}]
            else:
                messages.append({"role": "user", "content": FOLLOW_UPS[(turn - 1) % len(FOLLOW_UPS)]})
            sent = time.perf_counter()
            answer, error = {"tokens": 0, "prompt": 0, "cached": None, "text": ""}, None
            try:
                answer = chat(port, messages, max_tokens, seed=n)
            except (OSError, ValueError, KeyError, TypeError) as e:  # HTTP and connection errors are OSErrors
                error = f"{type(e).__name__}: {e}"
            messages.append({"role": "assistant", "content": answer["text"]})
            records[i].append({"client": i, "request": n, "turn": turn, "sent": sent, "received": time.perf_counter(),
                               "tokens": answer["tokens"], "prompt_tokens": answer["prompt"],
                               "cached_tokens": answer["cached"], "error": error})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    requests = [r for rs in records for r in rs]
    first = min(r["sent"] for r in requests)
    for r in requests:
        r["latency_s"] = r["received"] - r["sent"]
        r["sent_s"] = r["sent"] - first
        del r["sent"], r["received"]  # perf_counter's origin means nothing outside this process
    return {"wall_s": max(r["sent_s"] + r["latency_s"] for r in requests), "requests": requests}


def run_cell(system: str, args: argparse.Namespace, prompts: list[str], clients: int) -> dict:
    """One server of `system` for `clients` clients: started, warmed up with one request, loaded, stopped."""
    server = start(system, args, slots_of(system)[1] or args.slots or clients)
    try:
        try:
            chat(server.port, [{"role": "user", "content": "Say hello."}], args.max_tokens, seed=0)
        except (OSError, ValueError, KeyError, TypeError) as e:
            return {"wall_s": 0.0, "requests": [], "warmup_error": f"{type(e).__name__}: {e}"}
        return load(server.port, prompts, clients, args.per_client, args.max_tokens, args.turns)
    finally:
        server.close()


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank q-quantile (0 < q <= 1) of `values`, None for none."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1] if ordered else None


def summarize(cells: list[dict], clients: int, systems: list[str]) -> list[dict]:
    """One row per system for `clients` clients, its repetitions pooled."""
    rows = []
    for system in systems:
        runs = [c for c in cells if (c["clients"], c["system"]) == (clients, system)]
        requests = [r for c in runs for r in c["requests"]]
        latencies = [r["latency_s"] for r in requests if r["error"] is None]
        errors = sum(r["error"] is not None for r in requests) + sum("warmup_error" in c for c in runs)
        wall = sum(c["wall_s"] for c in runs)
        tokens = sum(r["tokens"] for r in requests)
        cached = [r for r in requests if r.get("cached_tokens") is not None]
        share = sum(r["cached_tokens"] for r in cached) / max(sum(r["prompt_tokens"] for r in cached), 1)
        rows.append({"clients": clients, "system": system, "requests": len(requests), "tokens": tokens,
                     "prompt_cached": round(share, 3) if cached else None,
                     "wall_s": round(wall, 3), "tok_s": round(tokens / wall, 2) if wall else 0.0,
                     "p50_s": percentile(latencies, 0.5), "p95_s": percentile(latencies, 0.95), "errors": errors})
    llama = [r["tok_s"] for r in rows if r["system"].startswith("llama") and not r["errors"]]
    for r in rows:
        valid = llama and max(llama) and not r["errors"]
        r["vs_best_llama_server"] = round(r["tok_s"] / max(llama), 3) if valid else None
    return rows


def table(rows: list[dict], args: argparse.Namespace) -> str:
    """The markdown table of one client count."""
    clients = rows[0]["clients"]
    slots = args.slots or clients
    heading = (f"### {clients} client{'s' * (clients > 1)} on {slots} slot{'s' * (slots > 1)}, {args.per_client} "
               f"request{'s' * (args.per_client > 1)} each"
               + (f" (conversations of {args.turns} turns)" if args.turns > 1 else "")
               + f", up to {args.max_tokens} tokens")
    lines = [heading, "", "| system | tok/s | x best llama-server | p50 s | p95 s | prompt cached | errors |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        x = f"{r['vs_best_llama_server']:.2f}" if r["vs_best_llama_server"] is not None else "-"
        p50, p95 = (f"{v:.2f}" if v is not None else "-" for v in (r["p50_s"], r["p95_s"]))
        cached = f"{r['prompt_cached']:.0%}" if r["prompt_cached"] is not None else "-"
        errors = f"{r['errors']} (invalid)" if r["errors"] else "0"
        lines.append(f"| {label(r['system'])} | {r['tok_s']:.1f} | {x} | {p50} | {p95} | {cached} | {errors} |")
    return "\n".join(lines)


def machine() -> str:
    """The CPU's model name (lscpu) and how many logical CPUs there are."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    model = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                 "unknown CPU")
    return f"{model}, {os.cpu_count()} logical CPUs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", metavar="T.gguf", help="target GGUF [default: the default model]")
    ap.add_argument("--draft", metavar="D.gguf", help="a draft GGUF, for the +draft systems")
    ap.add_argument("--server-draft", default="", metavar="FLAGS",
                    help='more llama-server flags for llama+draft (e.g. "--spec-draft-n-max 8 --spec-draft-p-min 0.5")')
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024, help="context per stream")
    ap.add_argument("--gpu-layers", type=int, default=0, help="layers on the GPU, both sides (0: the CPU only)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8], help="client counts, a table each")
    ap.add_argument("--per-client", type=int, default=6, help="requests each client sends, one after another")
    ap.add_argument("--turns", type=int, default=1,
                    help="each client's requests are conversations of this many turns, each sent with the turns "
                         "before it [default: 1, every request a new conversation]")
    ap.add_argument("--slots", type=int, default=None,
                    help="requests each server decodes at once (-np, --parallel) [default: as many as clients]")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--systems", nargs="+", metavar="SYSTEM",
                    help=f"from {' '.join(SYSTEMS)}, each also as SYSTEM@S: on S slots whatever --slots says "
                         "[default: all; the +draft ones with --draft]")
    ap.add_argument("--reps", type=int, default=1, help="repetitions of every cell, in a rotated order")
    ap.add_argument("--prompts", metavar="FILE", help="JSONL with a 'prompt' field [default: edgespec's built-in set]")
    ap.add_argument("--llama-bin", metavar="DIR",
                    help="a folder with llama-server [default: built from the vendored llama.cpp]")
    ap.add_argument("--json", metavar="FILE", help="write every request's numbers here")
    args = ap.parse_args()

    from edgespec.bench import read_prompts
    from edgespec.models.default import default_target

    systems = args.systems or [s for s in SYSTEMS if (args.draft or not s.endswith("+draft")) and s != "edgespec-cache"]
    unknown = [s for s in systems if slots_of(s)[0] not in SYSTEMS]
    if unknown:
        ap.error(f"unknown system {unknown[0]}: choose from {' '.join(SYSTEMS)}, or SYSTEM@S")
    if not args.draft and any(slots_of(s)[0].endswith("+draft") for s in systems):
        ap.error("the +draft systems need --draft D.gguf")
    if min(args.clients) < 1 or args.per_client < 1 or args.reps < 1 or args.turns < 1 or (args.slots or 1) < 1:
        ap.error("--clients, --per-client, --reps, --turns and --slots must be at least 1")
    args.target = args.target or str(default_target())
    args.binary = llama_bin(args.llama_bin) / "llama-server" if any(s.startswith("llama") for s in systems) else None
    prompts = [row["prompt"] for row in read_prompts(args.prompts)]

    print(f"machine: {machine()}")
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"target: {args.target}\ndraft: {args.draft or '-'}\nllama-server: {args.binary or '-'}\n"
          f"prompts: {args.prompts or 'built-in'} ({len(prompts)})")

    cells = []
    for ci, clients in enumerate(args.clients):
        for rep in range(args.reps):
            shift = (ci * args.reps + rep) % len(systems)
            for system in systems[shift:] + systems[:shift]:
                cell = run_cell(system, args, prompts, clients)
                cells.append({"clients": clients, "system": system, "rep": rep, **cell})
                tokens = sum(r["tokens"] for r in cell["requests"])
                print(f"{clients} client{'s' * (clients > 1)}, rep {rep + 1}/{args.reps}, {label(system)}: "
                      f"{tokens} tokens in {cell['wall_s']:.1f} s", file=sys.stderr)
    summary = [row for clients in args.clients for row in summarize(cells, clients, systems)]
    for clients in args.clients:
        print("\n" + table([r for r in summary if r["clients"] == clients], args))
    if args.json:
        report = {"machine": machine(), "command": sys.argv, "target": args.target, "draft": args.draft,
                  "llama_server": str(args.binary) if args.binary else None, "prompts": args.prompts,
                  "threads": args.threads, "ctx_per_stream": args.ctx, "per_client": args.per_client,
                  "turns": args.turns, "slots": args.slots,
                  "max_tokens": args.max_tokens, "reps": args.reps, "summary": summary, "cells": cells}
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
