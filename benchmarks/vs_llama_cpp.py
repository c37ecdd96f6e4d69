"""edgespec against llama.cpp's own server on the same GGUF files and prompts, interleaved in one run.

The alternative our users weigh is llama-server itself (plain, or with a draft: what most local apps wrap).
For each prompt in turn, every system answers it: llama-server plain; llama-server with the draft where --draft is a
GGUF (`--spec-type draft-simple` for a draft model, `draft-eagle3` for an EAGLE-3 head, `draft-dflash` for a
DFlash draft, `draft-mtp` for --draft mtp; its defaults); llama-server
with prompt lookup (`--spec-type ngram-simple`); edgespec target-only; edgespec speculative (the controller's
choice, with the same draft or prompt lookup); with --also-edgespec DRAFT, edgespec with other drafts too; with
--tree-width W, edgespec drafting trees of up to W guesses a position too (a second engine on the same files).
Beside each drafting system its acceptance (llama-server's draft_n_accepted
over draft_n), and beside edgespec's the chain bound its costs and acceptance allow (plan/bound.py). Speeds are
decode speeds, prompt processing left out on both sides, and both count a
token for every pass that produced one, the end-of-generation token included: llama-server's own
`timings.predicted_per_second` (its predicted_n counts the end token; its clock starts at the first token, which
the prompt's pass produced), edgespec's generated tokens and its end token, if the answer ended on one, over its
decode time (which starts with the pass that produces the first token). Same chat template (the GGUF's), max
tokens, temperature (no top-k, top-p or min-p on either side), seed and threads.

llama-server comes from the llama.cpp that the installed llama-cpp-python vendors, built with the project's
flags into ~/.cache/edgespec/llama-bin/ on first use (about 5 minutes on 2 cores), or from --llama-bin DIR.

usage: python benchmarks/vs_llama_cpp.py [--pair pair.json | --target T.gguf [--draft ngram|D.gguf]] [-t 0 -t 0.7]
       [--edgespec-draft ngram+D.gguf] [--per-category 2] [--max-tokens 128] [--threads 2] [--llama-bin DIR] [--json]
       [--server-draft '--spec-draft-n-max 8 --spec-draft-p-min 0.5' ...] [--no-ngram] [--no-default-draft]
       [--also-edgespec D.gguf ...] [--tree-width 3]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

FLAGS = ("-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF")


def llama_bin(given: str | None) -> Path:
    """A folder holding llama-server: the one given, or one built once from the vendored llama.cpp."""
    if given:
        if not (Path(given) / "llama-server").is_file():
            sys.exit(f"no llama-server in {given}")
        return Path(given)
    version = importlib.metadata.version("llama-cpp-python")
    key = hashlib.sha256(" ".join((version, *FLAGS)).encode()).hexdigest()[:12]
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgespec" / "llama-bin"
    cache = root / f"{version}-{key}"
    if (cache / "llama-server").is_file():
        return cache
    print(f"building llama-server from llama-cpp-python {version}'s llama.cpp into {cache} (about 5 minutes on "
          "2 cores)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        from edgespec.export.eagle3 import vendored_llama_cpp

        source = vendored_llama_cpp(Path(tmp))
        build = Path(tmp) / "build"
        subprocess.run(["cmake", "-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release", *FLAGS], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", build, "-j", str(os.cpu_count() or 2), "--target", "llama-server",
                        "llama-bench"], check=True, stdout=subprocess.DEVNULL)
        partial = cache.with_name(cache.name + ".partial")
        partial.mkdir(parents=True, exist_ok=True)
        for name in ("llama-server", "llama-bench"):
            (build / "bin" / name).replace(partial / name)
        partial.rename(cache)  # last, so an interrupted build leaves no cache entry
    return cache


def free_port() -> int:
    """A loopback port that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A llama-server on a free loopback port, for one configuration. ctx: the context of all slots together
    (llama-server's -c); slots: requests it decodes at once (-np)."""

    def __init__(self, binary: Path, target: str, threads: int, ctx: int, extra: list[str], slots: int = 1):
        self.port = free_port()
        self.spawn([str(binary), "-m", target, "--port", str(self.port), "-t", str(threads), "-tb", str(threads),
                    "-c", str(ctx), "-np", str(slots), *extra])
        self.wait_healthy(f"llama-server {' '.join(extra)}")

    def spawn(self, command: list[str]) -> None:
        """Start the server; what it writes to stderr is kept for the message of a start that fails."""
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=self.log)

    def wait_healthy(self, what: str) -> None:
        """Return once GET /health answers 200; exit naming `what` if the process ends first or 120 s pass."""
        deadline = time.time() + 120
        while time.time() < deadline and self.process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.log.seek(0)
        tail = self.log.read().decode(errors="replace").strip().splitlines()[-15:]
        self.close()
        sys.exit(f"{what} did not start; the end of its stderr:\n" + "\n".join(tail))

    def answer(self, prompt: str, max_tokens: int, temperature: float, seed: int) -> tuple[int, float, int, int]:
        """(tokens generated, decode tok/s, draft tokens proposed, of them accepted) for one chat answer."""
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": seed}
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions",
                                         data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as r:
            timings = json.load(r)["timings"]
        return (timings["predicted_n"], timings["predicted_per_second"], timings.get("draft_n", 0),
                timings.get("draft_n_accepted", 0))

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.log.close()


def server_draft_args(draft: str, gpu_layers: int) -> list[str]:
    """llama-server's flags for a draft: an EAGLE-3 head or DFlash draft as draft-eagle3 / draft-dflash (beside the
    target), the target's MTP layer ("mtp") as draft-mtp, a draft model as draft-simple."""
    from edgespec.drafts.llama_kinds import MTP_DRAFT, llama_kind

    if draft == MTP_DRAFT:
        return ["--spec-type", "draft-mtp"]
    kind = f"draft-{llama_kind(draft)}" if llama_kind(draft) else "draft-simple"
    return ["-md", draft, "-ngld", str(gpu_layers), "--spec-type", kind]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", help="a pair manifest (make pair): its target and draft")
    ap.add_argument("--target", help="target GGUF [default: the default model]")
    ap.add_argument("--draft", default="ngram", help="a draft GGUF, or ngram (prompt lookup only)")
    ap.add_argument("-t", "--temperature", type=float, action="append", help="default: 0 and 0.7")
    ap.add_argument("--prompts", help="JSONL {cat, prompt} [default: edgespec's built-in set]")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--gpu-layers", type=int, default=0, help="layers on the GPU, both sides (llama-server -ngl)")
    ap.add_argument("--edgespec-draft", help="edgespec's draft, e.g. ngram+D.gguf (prompt lookup in front of the "
                    "draft) [default: --draft, as llama-server gets it]")
    ap.add_argument("--server-draft-max", type=int, action="append", default=[],
                    help="also llama-server with the draft at this --spec-draft-n-max (repeatable)")
    ap.add_argument("--server-draft", action="append", default=[], metavar="FLAGS",
                    help="also llama-server with the draft and these speculative flags, e.g. "
                    "'--spec-draft-n-max 8 --spec-draft-p-min 0.5' (repeatable)")
    ap.add_argument("--also-edgespec", action="append", default=[], metavar="DRAFT",
                    help="also edgespec speculative with this draft (a model, heads, ngram; repeatable), a second "
                    "engine on the same target")
    ap.add_argument("--tree-width", type=int, default=1,
                    help="also edgespec drafting trees of up to this many guesses a position (a second engine)")
    ap.add_argument("--no-ngram", action="store_true", help="leave llama-server + ngram out")
    ap.add_argument("--no-default-draft", action="store_true",
                    help="leave llama-server + draft at its defaults out (where --server-draft gives its best)")
    ap.add_argument("--llama-bin", help="a folder with llama-server [default: built from the vendored llama.cpp]")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from edgespec import api
    from edgespec.bench import chain_bound_of, first_of_each, read_prompts
    from edgespec.models.default import default_target

    if args.pair:
        from edgespec.export.pair import read_manifest

        args.target, args.draft = (str(p) for p in read_manifest(args.pair))
    target = args.target or str(default_target())
    binary = llama_bin(args.llama_bin) / "llama-server"
    configs = {"llama-server": ["-ngl", str(args.gpu_layers)]}
    if args.draft != "ngram":
        drafted = [*configs["llama-server"], *server_draft_args(args.draft, args.gpu_layers)]
        if not args.no_default_draft:
            configs["llama-server + draft"] = drafted
        for n_max in args.server_draft_max:
            configs[f"llama-server + draft, n-max {n_max}"] = [*drafted, "--spec-draft-n-max", str(n_max)]
        for flags in args.server_draft:
            configs[f"llama-server + draft {flags}"] = [*drafted, *flags.split()]
    if not args.no_ngram:
        configs["llama-server + ngram"] = [*configs["llama-server"], "--spec-type", "ngram-simple"]
    prompts = first_of_each(read_prompts(args.prompts), args.per_category)

    servers = {name: Server(binary, target, args.threads, args.ctx, extra) for name, extra in configs.items()}
    engine = api.load(target, args.edgespec_draft or args.draft, threads=args.threads, n_ctx=args.ctx,
                      gpu_layers=args.gpu_layers)
    engines = {"edgespec speculative": engine}
    for draft in args.also_edgespec:
        engines[f"edgespec speculative ({Path(draft).name})"] = api.load(target, draft, threads=args.threads,
                                                                          n_ctx=args.ctx, gpu_layers=args.gpu_layers)
    if args.tree_width > 1:
        engines[f"edgespec trees ({args.tree_width})"] = api.load(
            target, args.edgespec_draft or args.draft, threads=args.threads, n_ctx=args.ctx,
            gpu_layers=args.gpu_layers, tree_width=args.tree_width)
    totals = defaultdict(lambda: [0, 0.0])  # (temperature, system, category) -> [tokens, seconds]
    # (temperature, system) -> [drafted, accepted, judged, rounds that drafted] (llama-server: judged and rounds 0)
    drafts = defaultdict(lambda: [0, 0, 0, 0])
    bounds = {}  # temperature -> the chain bound from edgespec's costs and acceptance there (plan/bound.py)
    try:
        for temperature in args.temperature or [0.0, 0.7]:
            for i, row in enumerate(prompts):
                for name, server in servers.items():
                    n, tps, n_drafted, n_accepted = server.answer(row["prompt"], args.max_tokens, temperature, i)
                    for cat in (row["cat"], "overall"):
                        totals[temperature, name, cat][0] += n
                        totals[temperature, name, cat][1] += n / tps if tps else 0.0
                    drafts[temperature, name][0] += n_drafted
                    drafts[temperature, name][1] += n_accepted
                for name, draft_max in (("edgespec target-only", 0), *((name, None) for name in engines)):
                    result = engines.get(name, engine).generate(row["prompt"], max_tokens=args.max_tokens,
                                                                temperature=temperature, seed=i, draft_max=draft_max)
                    for cat in (row["cat"], "overall"):
                        totals[temperature, name, cat][0] += result.stats.produced  # counted as llama-server does
                        totals[temperature, name, cat][1] += result.stats.decode_s
                    s = result.stats
                    judged, rounds = s.accepted + s.rejected, sum(s.accept_counts.values())
                    for j, x in enumerate((s.drafted, s.accepted, judged, rounds)):
                        drafts[temperature, name][j] += x
                print(f"t={temperature} {i + 1}/{len(prompts)} {row['cat']}", file=sys.stderr)
            if engine.controller is not None:
                spec = drafts[temperature, "edgespec speculative"]
                bounds[temperature] = chain_bound_of(engine, spec[1] / spec[2] if spec[2] else 0.0)
    finally:
        for server in servers.values():
            server.close()
        for each in engines.values():
            each.close()

    systems = [*configs, "edgespec target-only", *engines]
    cats = [*dict.fromkeys(row["cat"] for row in prompts), "overall"]
    rows = []
    for (temperature, name, cat), (n, seconds) in totals.items():
        base_n, base_s = totals[temperature, "llama-server", cat]
        tps, base = n / seconds if seconds else 0.0, base_n / base_s if base_s else 0.0
        row = {"temperature": temperature, "system": name, "category": cat, "tokens": n,
               "tok_s": round(tps, 2), "vs_llama_server": round(tps / base, 3) if base else None}
        if cat == "overall":
            drafted, accepted, judged, rounds = drafts[temperature, name]
            row.update(drafted=drafted, acceptance=round(accepted / drafted, 3) if drafted else None,
                       token_acceptance=round(accepted / judged, 3) if judged else None,
                       mean_accepted_length=round(accepted / rounds, 3) if rounds else None)
        rows.append(row)
    for temperature, bound in bounds.items():
        measured = {r["system"]: r["tok_s"] for r in rows
                    if (r["temperature"], r["category"]) == (temperature, "overall")}
        speedup = measured["edgespec speculative"] / measured["edgespec target-only"]
        bound.update(measured=round(speedup, 3), of_bound=round(speedup / bound["speedup"], 3))
    report = {"target": target, "draft": args.draft, "edgespec_draft": args.edgespec_draft or args.draft,
              "threads": args.threads, "max_tokens": args.max_tokens,
              "prompts": len(prompts), "llama_server": str(binary), "configs": configs, "results": rows,
              "chain_bound": {str(t): b for t, b in bounds.items()}}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for temperature in args.temperature or [0.0, 0.7]:
        print(f"\nt={temperature}: tok/s (x plain llama-server)")
        print(f"{'system':32s}" + "".join(f"{c:>16s}" for c in cats))
        for name in systems:
            cells = [next(r for r in rows if (r["temperature"], r["system"], r["category"]) == (temperature, name, c))
                     for c in cats]
            accept = cells[-1]
            drafted = (f"   acceptance {accept['acceptance']:.2f}" if accept.get("acceptance") is not None else "") + \
                (f", judged {accept['token_acceptance']:.2f}, mean accepted {accept['mean_accepted_length']:.2f}"
                 if accept.get("token_acceptance") is not None else "")
            print(f"{name:32s}" + "".join(f"{c['tok_s']:8.1f} ({c['vs_llama_server']:.2f})" for c in cells) + drafted)
        if temperature in bounds:
            b = bounds[temperature]
            print(f"chain bound (edgespec's costs, judged acceptance {b['alpha']:.2f}): {b['speedup']:.3f}x "
                  f"target-only with chains of {b['k']}; edgespec speculative {b['measured']:.3f}x = "
                  f"{b['of_bound']:.2f} of it "
                  f"(pass costs {' '.join(f'{n}:{r}' for n, r in b['pass_cost_ratios'].items())})")


if __name__ == "__main__":
    main()
