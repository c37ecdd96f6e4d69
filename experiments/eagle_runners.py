"""What a drafted EAGLE token costs with each runner, side by side in one process: back to back, and right
after a 4-token verify pass of the target (whose pass evicts the head's weights from the CPU caches, as in
the loop). The cost does not depend on training, so without --head the target's untrained start is used.

    python experiments/eagle_runners.py [--target models/smollm2-f32-q4_0/target-f32.gguf] [--head H.eagle.npz]

Run it alone: nothing else should compete for the machine while it measures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from edgespec.backends.llama.backend import LlamaBackend
from edgespec.decode.sampling import SamplingParams
from edgespec.drafts.eagle import EagleDrafter, save_eagle

RUNNERS = (("numpy", "f32"), ("ggml", "f16"), ("ggml", "q8_0"))


def untrained_head(target: LlamaBackend, folder: Path) -> Path:
    from edgespec.train.eagle import SUBSET_SIZE, initial_weights

    weights, meta = initial_weights(target.path)
    subset = np.arange(min(SUBSET_SIZE, target.vocab.n_vocab))
    return save_eagle(folder / "untrained.eagle.npz", weights, subset,
                      {**meta, "vocab_digest": target.vocab.digest, "n_embd": target.n_embd})


def per_token_ms(drafter: EagleDrafter, context: list[int], k: int, before=None, reps: int = 21) -> float:
    params, rng, times = SamplingParams(), np.random.default_rng(0), []
    for _ in range(reps):
        if before:
            before()
        t = time.perf_counter()
        drafter.propose(context, k, params, rng)
        times.append(time.perf_counter() - t)
    return sorted(times)[reps // 2] / k * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="models/smollm2-f32-q4_0/target-f32.gguf")
    parser.add_argument("--head", default=None, help="a trained .eagle.npz [default: the target's untrained start]")
    parser.add_argument("-k", type=int, default=3, help="drafted tokens per proposal")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    target = LlamaBackend(args.target, hidden=True, n_ctx=2048)
    context = list(range(100, 400))
    target.forward(context, 1)

    def verify_pass():
        n = len(target.tokens)
        target.forward([5, 6, 7, 8], 4)
        target.rollback(n)

    t0 = time.perf_counter()
    for _ in range(10):
        verify_pass()
    verify_ms = (time.perf_counter() - t0) / 10 * 1e3
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        head = args.head or untrained_head(target, Path(tmp))
        for runner, weight_type in RUNNERS:
            drafter = EagleDrafter(head, target, runner=runner, weight_type=weight_type)
            drafter.catch_up(context)
            rows[f"{runner} {weight_type}"] = {"alone_ms": per_token_ms(drafter, context, args.k),
                                               "after_verify_ms": per_token_ms(drafter, context, args.k, verify_pass)}
    if args.json:
        print(json.dumps({"verify_4_ms": verify_ms, "runners": rows}, indent=2))
        return
    print(f"target {Path(args.target).name}: a 4-token verify pass {verify_ms:.1f} ms; "
          f"ms per drafted token (k={args.k})")
    print(f"{'runner':12} {'alone':>8} {'after verify':>13} {'share of verify':>16}")
    for name, r in rows.items():
        print(f"{name:12} {r['alone_ms']:8.2f} {r['after_verify_ms']:13.2f} {r['after_verify_ms'] / verify_ms:16.3f}")


if __name__ == "__main__":
    main()
