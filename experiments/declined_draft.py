"""What a draft model costs where the controller declines it: probing and catching up, before and after.

A declined draft still probes now and then (a round of 1 after enough idle rounds), and before a probe it reads
every token it missed. Three ways to decode the same prompts with one loaded pair, interleaved per prompt:
target-only (draft_max 0); `eager`, the rule before (a probe every 32 idle rounds, the prompt read at prefill
always); `lazy`, the rule now (probes that bring nothing back wait twice as long, up to PROBE_MAX; the prompt
read at prefill only where the controller would draft). Each way keeps its own copy of the controller, as
measured at load. Prints decode and total (prefill included) tokens/s, the time the draft took, and rounds
drafted, and the ratios to target-only.

usage: python experiments/declined_draft.py --target target-f32.gguf --draft f32-own-12l.gguf [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import copy
from collections import defaultdict

from edgespec.decode import cost

PROBE_MAX = cost.PROBE_MAX  # the rule now; `eager` sets cost.PROBE_MAX to PROBE_EVERY for its rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--every", type=int, default=1, help="every n-th built-in prompt")
    args = parser.parse_args()

    from edgespec.api import load
    from edgespec.bench import read_prompts

    engine = load(args.target, args.draft, n_ctx=1024)
    ways = ["target-only", "eager", "lazy"]
    controllers = {way: copy.deepcopy(engine.controller) for way in ways}
    controllers["eager"].begin = lambda prompt_tokens: True  # the prompt read at prefill always
    prompts = [row["prompt"] for row in read_prompts(None)][::args.every]
    engine.generate(prompts[0], max_tokens=16, draft_max=0)  # warm up
    totals = defaultdict(lambda: defaultdict(float))
    for i, prompt in enumerate(prompts):
        for way in ways[i % 3:] + ways[:i % 3]:
            engine.controller = controllers[way]
            cost.PROBE_MAX = cost.PROBE_EVERY if way == "eager" else PROBE_MAX
            result = engine.generate(prompt, max_tokens=args.max_tokens, draft_max=0 if way == "target-only"
                                     else None)
            s, t = result.stats, totals[way]
            t["tokens"] += s.generated
            t["decode_s"] += s.decode_s
            t["total_s"] += s.decode_s + s.prefill_s
            t["draft_s"] += s.draft_s
            t["rounds_drafted"] += sum(n for k, n in s.draft_lengths.items() if k)
            t["rounds"] += sum(s.draft_lengths.values())
    cost.PROBE_MAX = PROBE_MAX
    engine.close()
    base = totals["target-only"]
    print(f"target {args.target}, draft {args.draft}, {len(prompts)} prompts, {args.max_tokens} tokens")
    print(f"{'':12}{'decode tok/s':>14}{'total tok/s':>13}{'draft s':>9}{'drafted':>9}{'decode ratio':>14}"
          f"{'total ratio':>13}")
    for way in ways:
        t = totals[way]
        decode, total = t["tokens"] / t["decode_s"], t["tokens"] / t["total_s"]
        print(f"{way:12}{decode:>14.1f}{total:>13.1f}{t['draft_s']:>9.2f}{int(t['rounds_drafted']):>5}/"
              f"{int(t['rounds']):<4}{decode / (base['tokens'] / base['decode_s']):>13.3f}"
              f"{total / (base['tokens'] / base['total_s']):>13.3f}")


if __name__ == "__main__":
    main()
