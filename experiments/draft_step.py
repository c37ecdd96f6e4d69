"""What a draft model's step costs relative to its target's, side by side in one process: the draft's step back to
back (as the controller's start-up measurement times it) and right after a 4-token verify pass of the target
(whose pass reads the target's weights and may evict the draft's from the CPU caches, as in the loop).

    python experiments/draft_step.py --target models/smollm2-onnx-fp32 \
        --draft models/smollm2-f32-q4_0/draft-qat-q4_0.gguf --draft models/smollm2-f32-q4_0/draft-q4_0.gguf

A draft whose GGUF carries a token subset (edgespec draft-vocab) runs as it does in the loop (SubsetDraft).
Run it alone: nothing else should compete for the machine while it measures.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from edgespec.backends.onnx.folder import SPIN_WITHIN_RUNS
from edgespec.backends.open import open_model
from edgespec.decode.calibrate import measure_pass_costs
from edgespec.drafts.spec import open_drafter

CONTEXT = 64  # tokens in both caches before timing: a short answer's worth


def step_ms(backend, context: list[int], token: int, before=None, reps: int = 41) -> float:
    """Median ms of one 1-token forward after `context`, each preceded by before() where given (untimed)."""
    times = []
    for _ in range(reps):
        if before:
            before()
        t0 = time.perf_counter()
        backend.forward([token], 1)
        times.append(time.perf_counter() - t0)
        backend.rollback(len(context))
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="a GGUF file or an ONNX export folder")
    ap.add_argument("--draft", action="append", required=True, help="a draft model GGUF (repeatable)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    # an ONNX target's threads spin as api.load sets them beside a draft (a GGUF target ignores spin)
    target = open_model(args.target, n_ctx=512, threads=args.threads, spin=SPIN_WITHIN_RUNS)
    n_vocab = target.vocab.n_vocab
    context = [(i * 7919 + 13) % n_vocab for i in range(CONTEXT)]
    verify = [(i * 104729 + 7) % n_vocab for i in range(4)]
    passes = {n: s * 1e3 for n, s in measure_pass_costs(target, 4, reps=7, context=CONTEXT).items()}  # n -> ms
    target.forward(context, 1)

    def target_verify() -> None:
        target.forward(verify, len(verify))
        target.rollback(len(context))

    rows = []
    try:
        for path in args.draft:
            _, backend, _ = open_drafter(path, target, threads=args.threads)
            try:
                backend.forward(context, 1)
                alone = step_ms(backend, context, verify[0])
                after = step_ms(backend, context, verify[0], before=target_verify)
            finally:
                backend.close()
            rows.append({"draft": Path(path).name, "kind": type(backend).__name__, "back_to_back_ms": alone,
                         "after_verify_ms": after, "back_to_back_cost": alone / passes[1],
                         "after_verify_cost": after / passes[1]})
    finally:
        target.close()
    if args.json:
        print(json.dumps({"target": str(args.target), "target_pass_ms": passes, "drafts": rows}, indent=2))
        return
    print(f"target {Path(args.target).name}: a pass of 1/2/3/4 tokens "
          + "/".join(f"{passes[n]:.1f}" for n in sorted(passes)) + " ms")
    print(f"{'draft':32} {'runs as':12} {'back to back':>14} {'after a verify':>16}   (ms, and cost: / a target step)")
    for r in rows:
        print(f"{r['draft']:32} {r['kind']:12} {r['back_to_back_ms']:7.2f} {r['back_to_back_cost']:5.2f}  "
              f"{r['after_verify_ms']:9.2f} {r['after_verify_cost']:5.2f}")


if __name__ == "__main__":
    main()
