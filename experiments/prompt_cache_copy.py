"""What a saved prompt state costs against reading the prompt: for prompts of several lengths, the time to read
them on a stream of a SharedContext (a pool per stream, as `serve --parallel` opens target-only streams), to save
the sequence's state (PromptCache's save) and to copy it into another stream (its restore), and the state's bytes.
The numbers behind PROMPT_TOKENS, GAIN_TOKENS and COPY_SHARE in edgespec/backends/llama/states.py.

usage: python experiments/prompt_cache_copy.py --target T.gguf [--lengths 141 730] [--threads 2] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--lengths", type=int, nargs="+", default=[141, 730])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.backends.llama.states import PromptCache
    from edgespec.backends.llama.streams import SharedContext
    from edgespec.backends.protocol import MAX_OUTPUTS, sync

    longest = max(args.lengths)
    backend = LlamaBackend(args.target, n_ctx=2 * (longest + 256), n_threads=args.threads, sequences=2,
                           overlap=False, outputs=2 * MAX_OUTPUTS, unified=False)
    shared = SharedContext(backend)
    text = (Path(__file__).parents[1] / "docs" / "server.md").read_text(encoding="utf-8")
    tokens = backend.tokenize(text, special=False)
    rows = []
    try:
        for n in args.lengths:
            prompt = tokens[:n]
            read, save, copy, size = [], [], [], 0
            for _ in range(args.reps):
                shared.stream(0).rollback(0)
                t = time.perf_counter()
                sync(shared.stream(0), prompt, 0)
                read.append(time.perf_counter() - t)
                cache = PromptCache(1 << 34)
                shared.stream(0).keep_states(cache)
                t = time.perf_counter()
                sync(shared.stream(0), [], 0)  # drops the prompt: saved
                save.append(time.perf_counter() - t)
                shared.stream(1).rollback(0)
                t = time.perf_counter()
                sync(shared.stream(1), prompt, 0)  # copied in: nothing read
                copy.append(time.perf_counter() - t)
                size = cache.used
                assert cache.saved == 1 and cache.restored == 1, cache.stats()
                shared.stream(0).keep_states(None)
            rows.append({"tokens": n, "state_bytes": size, "read_s": statistics.median(read),
                         "save_s": statistics.median(save), "copy_s": statistics.median(copy)})
    finally:
        backend.close()
    if args.json:
        print(json.dumps({"target": args.target, "threads": args.threads, "rows": rows}, indent=1))
        return
    print("| prompt tokens | state MB | read s | save ms | copy in ms | copy / read |")
    print("|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['tokens']} | {r['state_bytes'] / 1e6:.1f} | {r['read_s']:.3f} | {r['save_s'] * 1e3:.2f} | "
              f"{r['copy_s'] * 1e3:.2f} | 1/{r['read_s'] / r['copy_s']:.0f} |")


if __name__ == "__main__":
    main()
