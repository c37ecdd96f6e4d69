"""What a draft the controller declines costs: target-only, an idle draft model and prompt lookup, side by side.

One target backend is shared by three engines: no drafter (target-only), the draft model with the controller
measured at load (`model`), prompt lookup with a controller of its own (`lookup`). Each built-in prompt is answered
by all three in an order that rotates per prompt, so the machine's load hits them alike: the same prompts, seeds
and token count for each. Per way: decode tokens/s; its ratio to target-only per repetition (median and range);
the same ratio in the process's CPU time (`cpu x`: the work done, which other processes on a shared machine
inflate less; prefill included); rounds drafted; and where the decode time went: the target's verify passes with
the rule (`target s`), the draft (`draft s`), and the rest of the loop per round (`other us`: the controller, the
drafter's bookkeeping, the text); and of that, the part a device waits on (`gap us`: per pass, from the moment the
rows of one pass were in hand to the start of the next; work done after a pass was started ahead overlaps it on a
GPU and does not count there).

Before that, `--raw` one-token target passes (as target-only decoding runs them) are timed with no draft model in
the process and with one loaded beside the target just after it ran, interleaved per repetition: what a loaded
draft costs the target's own passes (threads, memory), apart from anything the loop does with it.

usage: python experiments/declined_draft.py --target r2l.gguf --draft draft.gguf [-t 0] [--max-tokens 128]
       [--prompts 3] [--reps 3] [--raw 200] [--threads 1] [--gpu-layers 99]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when run by path from elsewhere (gpu_check.sh)
from prepass_gap import PassGaps  # noqa: E402

WAYS = ("target-only", "model", "lookup")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4f} ({min(values):.4f}-{max(values):.4f})"


def raw_passes(target: str, draft: str, n: int, reps: int, threads: int, gpu_layers: int) -> dict[str, list[float]]:
    """Seconds per one-token target pass, per repetition, without and with a draft model loaded (and just run)."""
    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.decode.calibrate import measure_pass_costs

    backend = LlamaBackend(target, n_ctx=1024, n_threads=threads, n_gpu_layers=gpu_layers)
    tokens = [(i * 7919 + 13) % backend.vocab.n_vocab for i in range(n + 1)]

    def passes() -> float:
        backend.rollback(0)
        backend.forward(tokens[:1], 1)
        t0 = time.perf_counter()
        for tok in tokens[1:]:
            backend.forward([tok], 1, copy=False)
        return (time.perf_counter() - t0) / n

    out: dict[str, list[float]] = {"alone": [], "draft loaded": []}
    for _ in range(reps):
        out["alone"].append(passes())
        beside = LlamaBackend(draft, n_ctx=1024, n_threads=threads, n_gpu_layers=gpu_layers)
        measure_pass_costs(beside, 4)  # as load runs it: its threads have just worked
        out["draft loaded"].append(passes())
        beside.close()
    backend.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("-t", "--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=3, help="the first n built-in prompts")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--raw", type=int, default=200, help="one-token passes per raw timing (0: none)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gpu-layers", type=int, default=0, help="layers of each model on the GPU (99: all)")
    args = parser.parse_args()

    from edgespec import api
    from edgespec.bench import read_prompts
    from edgespec.decode.cost import DraftController
    from edgespec.drafts.base import PromptLookupDrafter

    if args.raw:
        raw = raw_passes(args.target, args.draft, args.raw, args.reps, args.threads, args.gpu_layers)
        print(f"raw one-token target passes, ms ({args.raw} a timing, {args.reps} timings each, interleaved):")
        for name, times in raw.items():
            print(f"  {name:13s} {spread([t * 1e3 for t in times])}")
        ratios = [a / b for a, b in zip(raw["alone"], raw["draft loaded"], strict=True)]
        print(f"  alone / draft loaded (speed with the draft loaded, x alone): {spread(ratios)}")

    engine = api.load(args.target, args.draft, n_ctx=1024, threads=args.threads, gpu_layers=args.gpu_layers)
    target = engine.target
    lookup = DraftController(dict(engine.controller.target_costs), 0.0, engine.controller.k_max)
    engines = {"target-only": api.Engine(target, None, None), "model": engine,
               "lookup": api.Engine(target, PromptLookupDrafter(target.vocab.n_vocab), lookup)}
    prompts = [row["prompt"] for row in read_prompts(None)][:args.prompts]
    engine.generate(prompts[0], max_tokens=16, draft_max=0)  # warm up
    gaps = PassGaps(target)  # experiments/prepass_gap.py
    sums = defaultdict(lambda: defaultdict(float))  # (rep, way) -> sums over the rep's prompts
    turn = 0
    for rep in range(args.reps):
        for i, prompt in enumerate(prompts):
            for way in WAYS[turn % 3:] + WAYS[:turn % 3]:
                cpu = time.process_time()
                gaps.take()
                s = engines[way].generate(prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                                          seed=i).stats
                t = sums[rep, way]
                t["cpu_s"] += time.process_time() - cpu
                t["tokens"] += s.produced
                t["passes"] += s.target_passes
                t["decode_s"] += s.decode_s
                t["target_s"] += s.target_s
                t["draft_s"] += s.draft_s
                t["drafted"] += sum(n for k, n in s.draft_lengths.items() if k)
                between = gaps.take()
                t["gap_s"] += sum(between)
                t["gaps"] += len(between)
            turn += 1
    engine.close()

    print(f"\ntarget {args.target}, draft {args.draft}, t={args.temperature}, {len(prompts)} prompts x "
          f"{args.max_tokens} tokens, {args.reps} repetitions, {args.threads} thread(s), ways interleaved")
    print(f"{'way':12s}{'tok/s':>8s}{'x target-only: median (range)':>32s}{'cpu x: median (range)':>26s}"
          f"{'passes':>8s}{'drafted':>8s}{'target s':>10s}{'draft s':>9s}{'other us':>9s}")
    for way in WAYS:
        reps = [sums[rep, way] for rep in range(args.reps)]
        base = [sums[rep, "target-only"] for rep in range(args.reps)]
        pairs = list(zip(reps, base, strict=True))
        ratios = [(r["tokens"] / r["decode_s"]) / (b["tokens"] / b["decode_s"]) for r, b in pairs]
        cpu = [(r["tokens"] / r["cpu_s"]) / (b["tokens"] / b["cpu_s"]) for r, b in pairs]
        total = {key: sum(r[key] for r in reps) for key in reps[0]}
        other = (total["decode_s"] - total["target_s"] - total["draft_s"]) / total["passes"]
        print(f"{way:12s}{total['tokens'] / total['decode_s']:8.1f}{spread(ratios):>32s}{spread(cpu):>26s}"
              f"{total['passes'] / args.reps:8.0f}{total['drafted'] / args.reps:8.0f}"
              f"{total['target_s'] / args.reps:10.3f}{total['draft_s'] / args.reps:9.4f}{other * 1e6:9.1f}"
              f"{total['gap_s'] / max(total['gaps'], 1) * 1e6:8.1f}")


if __name__ == "__main__":
    main()
