"""Planned against measured peak memory: each configuration loads under its plan in a fresh process, fills
its context with a prompt, generates 64 tokens, and reports the process's peak resident memory.

    python benchmarks/memory.py [--pair models/smollm2-f32-q4_0/pair.json] [--json]

Run it alone: nothing else should compete for the machine while it measures.
"""

from __future__ import annotations

import argparse
import json

from edgespec.bench import format_memory, measure_peak
from edgespec.export.pair import read_manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="models/smollm2-f32-q4_0/pair.json", help="the f32 + q4_0 reference pair")
    parser.add_argument("--onnx", default=None, help="an ONNX export folder to include as a target with ngram")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    target, draft = read_manifest(args.pair)
    configs = [
        ("default Q4_1 + ngram, ctx 2048", dict(target=None, draft="ngram")),
        ("default Q4_1 + ngram, ctx 8192", dict(target=None, draft="ngram", ctx=8192)),
        ("f32 + q4_0 draft, ctx 2048", dict(target=target, draft=draft)),
        ("f32 + q4_0 draft, budget 820MiB", dict(target=target, draft=draft, budget="820MiB")),
        ("f32 + q4_0 draft, budget 790MiB", dict(target=target, draft=draft, budget="790MiB")),
    ]
    if args.onnx:
        configs.append((f"ONNX {args.onnx.rstrip('/').split('/')[-1]} + ngram", dict(target=args.onnx, draft="ngram")))
    rows = [(name, measure_peak(**kwargs)) for name, kwargs in configs]
    if args.json:
        print(json.dumps({name: r for name, r in rows}, indent=2))
        return
    print(format_memory(rows))
    for name, r in rows:
        t = r["plan"]["models"][0]
        batch = f", batch {t['prompt_batch']}" if t["runtime"] == "llama.cpp" else ""
        changes = "".join(f"; {c}" for c in r["plan"]["changes"])
        print(f"  {name}: ctx {t['context']}, KV {t['kv_type']}{batch}{changes}")


if __name__ == "__main__":
    main()
