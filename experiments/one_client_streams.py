"""One client against `edgespec serve --parallel 1` and `--parallel 4`, request by request: what running as streams
costs a lone client (issue 45: "with one client it is unchanged").

A busy or throttled machine moves a server's speed by 10-20 % from one minute to the next, more than the effect
looked for, so cells run one after another (benchmarks/serve_load.py) cannot tell it. Here every configuration's
server is started first and stays up (idle between its requests); then each prompt is sent to every server in
turn, in an order rotated per prompt, and each answer's decode speed (the `edgespec` field's tokens_per_second,
prompt reading excluded) and its latency are paired with the same prompt's on the other servers. Reported per
draft: the median ratio of --parallel 4 to --parallel 1 over the prompts, and their range; then per --parallel,
each draft against target-only (a declined draft should cost nothing, issue 43).

usage: python experiments/one_client_streams.py --target T.gguf [--draft D.gguf] [--prompts 8] [--rounds 3]
       [--max-tokens 96] [--threads 2] [--ctx 1024]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from serve_load import EdgespecServer  # noqa: E402


def ask(port: int, prompt: str, max_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0.0,
            "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.load(r)["edgespec"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", help="a draft GGUF (besides none and ngram)")
    ap.add_argument("--prompts", type=int, default=8, help="the first n built-in prompts")
    ap.add_argument("--rounds", type=int, default=3, help="times each prompt goes to every server")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024)
    args = ap.parse_args()

    from edgespec.bench import read_prompts

    prompts = [row["prompt"] for row in read_prompts(None)][:args.prompts]
    drafts = ["none", "ngram"] + ([args.draft] if args.draft else [])
    configs = [(draft, streams) for draft in drafts for streams in (1, 4)]
    servers = {}
    try:
        for draft, streams in configs:
            servers[draft, streams] = EdgespecServer(args.target, draft, args.threads, args.ctx, streams,
                                                     args.max_tokens)
            ask(servers[draft, streams].port, "Say hello.", args.max_tokens)  # warm up
        speeds = {c: [] for c in configs}  # per config: (prompt round, tok/s, drafted)
        turn = 0
        for r in range(args.rounds):
            for i, prompt in enumerate(prompts):
                for config in configs[turn % len(configs):] + configs[:turn % len(configs)]:
                    stats = ask(servers[config].port, prompt, args.max_tokens)
                    speeds[config].append(((r, i), stats["tokens_per_second"], stats["drafted"]))
                turn += 1
    finally:
        for server in servers.values():
            server.close()
    print(f"target {args.target}, {len(prompts)} prompts x {args.rounds} rounds, {args.max_tokens} tokens, greedy, "
          f"{args.threads} threads; decode tok/s per answer, paired by prompt and round")
    print(f"{'draft':>24s}  {'--parallel 1':>12s}  {'--parallel 4':>12s}  {'x: median (range)':>24s}  drafted 1 / 4")
    for draft in drafts:
        one, four = speeds[draft, 1], speeds[draft, 4]
        ratios = [b[1] / a[1] for a, b in zip(one, four, strict=True)]
        print(f"{Path(draft).name:>24s}  {statistics.median(s for _, s, _ in one):12.1f}  "
              f"{statistics.median(s for _, s, _ in four):12.1f}  {statistics.median(ratios):8.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})  {sum(d for *_, d in one)} / {sum(d for *_, d in four)}")
    print(f"\n{'draft':>24s}  {'x target-only, --parallel 1':>28s}  {'x target-only, --parallel 4':>28s}")
    for draft in drafts[1:]:
        cells = []
        for streams in (1, 4):
            ratios = [b[1] / a[1] for a, b in zip(speeds["none", streams], speeds[draft, streams], strict=True)]
            cells.append(f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
        print(f"{Path(draft).name:>24s}  {cells[0]:>28s}  {cells[1]:>28s}")


if __name__ == "__main__":
    main()
