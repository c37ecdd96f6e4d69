"""What a lone request pays for running as one of a Parallel's streams rather than on one Engine, in one process
(issue 45: "with one client it is unchanged"); the server's figure is experiments/one_client_streams.py.

1. Per one-token pass of a lone stream: the time before the decode is handed to the decode thread (the stream's
   Python: its pass asked, the decode built), the hand-over there, the decode itself (and its rows copied), the
   hand-over back, and the time after it until forward returns. Medians over --passes passes.
2. Whole answers: each prompt answered by stream 0 of a Parallel (4 streams) and by one Engine, in alternating
   order, both decoding on the one decode thread (as the server does: its Engine decodes on the thread it loaded
   on); per answer the ratio of decode tok/s, and over all answers the time a token took (prompts included).

usage: python experiments/lone_stream.py --target T.gguf [--draft none|ngram|D.gguf] [--prompts 12] [--ctx 1024]
"""

from __future__ import annotations

import argparse
import statistics
import time


def pass_parts(target: str, threads: int, ctx: int, passes: int) -> dict[str, float]:
    """Microseconds of each part of a lone stream's one-token pass (medians)."""
    import edgespec.backends.llama.streams as streams
    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.backends.protocol import MAX_OUTPUTS

    shared = streams.SharedContext(LlamaBackend(target, n_ctx=4 * ctx, n_threads=threads, sequences=4, overlap=False,
                                                outputs=4 * MAX_OUTPUTS, unified=False))
    stream = shared.stream(0)
    shared.begin(0)
    marks = []  # per decode handed over: (asked, started there, done there, back)
    call = streams.DECODER.call

    def timed_call(fn):
        inner = []

        def run():
            inner.append(time.perf_counter())
            result = fn()
            inner.append(time.perf_counter())
            return result

        asked = time.perf_counter()
        result = call(run)
        marks.append((asked, *inner, time.perf_counter()))
        return result

    streams.DECODER.call = timed_call
    try:
        stream.forward(list(range(1000, 1100)), 1)
        parts = {"before": [], "there": [], "decode": [], "back": [], "after": [], "forward": []}
        for i in range(passes):
            start = time.perf_counter()
            stream.forward([2000 + i], 1)
            end = time.perf_counter()
            asked, began, done, back = marks[-1]
            for name, seconds in zip(parts, (asked - start, began - asked, done - began, back - done, end - back,
                                             end - start), strict=True):
                parts[name].append(seconds)
            stream.rollback(len(stream.tokens) - 1)
    finally:
        streams.DECODER.call = call
        shared.close()
    return {name: statistics.median(v) * 1e6 for name, v in parts.items()}


def answers(target: str, draft: str, threads: int, ctx: int, n: int) -> None:
    from edgespec import api
    from edgespec.backends.llama.streams import DECODER
    from edgespec.bench import read_prompts
    from edgespec.parallel import Parallel

    prompts = [row["prompt"] for row in read_prompts(None)][:n]
    settings = {"max_tokens": 96, "temperature": 0.0}
    with Parallel(target, draft, streams=4, n_ctx=ctx, threads=threads) as parallel:
        engine = DECODER.call(lambda: api.load(target, draft, n_ctx=ctx, threads=threads))

        def stream(prompt):
            parallel.begin(0)
            try:
                return parallel.engines[0].generate(prompt, **settings)
            finally:
                parallel.end(0)

        def alone(prompt):
            return DECODER.call(lambda: engine.generate(prompt, **settings))

        ways = {"stream": stream, "engine": alone}
        for way in ways.values():
            way("Say hello.")  # warm up
        ratios, spent = [], {name: [0.0, 0, 0] for name in ways}  # seconds, tokens, drafted
        for i, prompt in enumerate(prompts):
            speed = {}
            for name in (list(ways) if i % 2 == 0 else list(ways)[::-1]):
                stats = ways[name](prompt).stats
                speed[name] = stats.generated / stats.decode_s
                spent[name][0] += stats.prefill_s + stats.decode_s
                spent[name][1] += stats.generated
                spent[name][2] += stats.drafted
            ratios.append(speed["stream"] / speed["engine"])
        engine.close()
    print(f"{len(prompts)} answers of up to 96 tokens, draft {draft}: stream / engine decode tok/s, median "
          f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    for name, (seconds, tokens, drafted) in spent.items():
        print(f"  {name}: {seconds / tokens * 1e6:.0f} us a token, prompts included ({drafted} drafted)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", default="none")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--passes", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024)
    args = ap.parse_args()
    parts = pass_parts(args.target, args.threads, args.ctx, args.passes)
    print(f"a lone stream's one-token pass, medians of {args.passes}: " + ", ".join(
        f"{name} {us:.0f} us" for name, us in parts.items()))
    print(f"  around the decode: {parts['forward'] - parts['decode']:.0f} us, of which the hand-over "
          f"{parts['there'] + parts['back']:.0f}")
    if args.prompts:
        answers(args.target, args.draft, args.threads, args.ctx, args.prompts)


if __name__ == "__main__":
    main()
