"""What a load spends reading GGUF files before llama.cpp runs, medians of a few repetitions each: edgespec's
streamed header of the target, gguf-py's whole-file read of it (gguf_file.open_gguf, which subset drafts, widening
and vocabulary edits use), and, given a draft, edgespec.load of the pair (with its pass-cost calibration).

Run it from two checkouts in turn to compare them (docs/results/2026-11-29-header-reads.md).

usage: python benchmarks/load_reads.py [--model FILE.gguf] [--draft FILE|KIND] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def median_seconds(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        if hasattr(result, "close"):
            result.close()
    return statistics.median(times)


def main() -> None:
    import edgespec
    from edgespec.backends import gguf_file
    from edgespec.backends.model_info import read_gguf_header
    from edgespec.models.default import default_target

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="target GGUF (default: the default model)")
    parser.add_argument("--draft", default=None, help="a draft to load with it (a file, or a kind such as ngram)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model = Path(args.model or default_target())
    seconds = {"streamed header": median_seconds(lambda: read_gguf_header(model), max(args.reps, 5)),
               "gguf-py read (open_gguf)": median_seconds(lambda: gguf_file.open_gguf(model), args.reps)}
    if args.draft:
        seconds["load with the draft"] = median_seconds(lambda: edgespec.load(model, args.draft, n_ctx=256),
                                                        args.reps)
    if args.json:
        print(json.dumps({"model": str(model), "draft": args.draft, "seconds": seconds}))
    else:
        for name, value in seconds.items():
            print(f"{name:28}{value:8.3f} s")


if __name__ == "__main__":
    main()
