"""What a draft model's steps cost after a pause: back to back, after a target pass, after sleeping or spinning.

The controller prices a drafting round as a start plus a step per draft (decode/cost.py) because a round's first
step costs more than the next: this measures by how much, and after what. Both models are loaded as the engine
loads them; after each kind of pause the draft takes five one-token steps, timed one by one, then rolls back. Prints
the median of each step over --reps pauses, in ms.

usage: python experiments/draft_pause.py --target target-f32.gguf --draft draft-qat-q4_0.gguf [--reps 30]
"""

from __future__ import annotations

import argparse
import time

STEPS = 5


def spin(seconds: float) -> None:
    """Keep one core busy without touching memory."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import numpy as np

    from edgespec import api

    engine = api.load(args.target, args.draft, threads=args.threads, n_ctx=2048)
    target, draft = engine.target, engine.draft_backend
    context = target.tokenize("Give me three tips for sleeping better. " * 8, special=False)[:100]
    for backend in (target, draft):
        backend.rollback(0)
        backend.forward(context, 1)

    def target_pass() -> None:
        target.forward(context[:3], 3, copy=False)
        target.rollback(len(context))

    pauses = {
        "another draft step (back to back)": lambda: None,
        "a target pass over 3 tokens": target_pass,
        "30 ms asleep": lambda: time.sleep(0.03),
        "30 ms of a busy loop touching no memory": lambda: spin(0.03),
        "1 ms asleep": lambda: time.sleep(0.001),
        "1 ms of a busy loop": lambda: spin(0.001),
    }
    try:
        print(f"{'what came before the draft steps':42s}" + "".join(f"{f'step {i + 1}':>9s}" for i in range(STEPS)))
        for name, pause in pauses.items():
            times = np.empty((args.reps, STEPS))
            for r in range(args.reps):
                pause()
                for i in range(STEPS):
                    t = time.perf_counter()
                    draft.forward([context[(r + i) % 50]], 1, copy=False)
                    times[r, i] = time.perf_counter() - t
                draft.rollback(len(context))
            print(f"{name:42s}" + "".join(f"{m * 1e3:9.2f}" for m in np.median(times, axis=0)))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
