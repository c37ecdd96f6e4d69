"""How often an EAGLE head's first draft step names the target's greedy token, per category, on the same
held-out training prompts read two ways: the corpus's answers (written by whoever answered them, e.g. a
quantization of the target) and the target's own greedy answers, generated here. A gap between the two
says the corpus's text is not the text the head meets at run time. Also counts answers that ran to the
corpus's token cap (repetition loops a quantized answerer falls into and the target does not).

    python experiments/head_agreement.py --target models/smollm2-f32-q4_0/target-f32.gguf \\
        --head f32-1800.eagle.npz --corpus f32-1800.corpus [--per-category 6] [--json]

The held-out prompts are train_eagle's (seed 0, 10 %), so the head never trained on them.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

from edgespec.backends.llama.backend import LlamaBackend
from edgespec.drafts.eagle import EagleDrafter
from edgespec.train.corpus import holdout_split, read_corpus


def first_step_hits(drafter: EagleDrafter, tokens: list[int], n_prompt: int, hidden: np.ndarray,
                    top1: np.ndarray) -> tuple[int, int]:
    """Teacher-forced: entry t reads the target's state at t and token t+1 and guesses token t+2; hidden[r] and
    top1[r] are the target's state and greedy choice at position n_prompt-1+r. Prompt positions read the
    no-feature vector, as in training. Returns (hits, guesses) over the answer."""
    drafter.reset()
    first = n_prompt - 1
    features = np.stack([drafter.no_feature] * first).astype(np.float32)
    drafter.head.append(features, drafter._embed(tokens[1:first + 1]), np.arange(first))
    hits = 0
    for t in range(first, len(tokens) - 2):
        _, logits = drafter.head.append(hidden[t - first][None].astype(np.float32), drafter._embed([tokens[t + 1]]),
                                        np.array([t]))
        hits += int(drafter.subset[np.argmax(logits)] == top1[t + 2 - n_prompt])
    return hits, max(len(tokens) - 2 - first, 0)


def own_answer(target: LlamaBackend, prompt: list[int], max_tokens: int):
    """The target's greedy answer, one token a pass, with its state and choice at each position."""
    target.rollback(0)
    target.forward(prompt[:-1], 0)
    seq, hidden, top1, token = list(prompt), [], [], prompt[-1]
    for _ in range(max_tokens):
        logits = target.forward([token], 1)
        hidden.append(target.last_hidden[-1].copy())
        token = int(np.argmax(logits[-1]))
        top1.append(token)
        seq.append(token)
        if token in target.vocab.eog_ids:
            break
    target.rollback(0)
    return seq, np.stack(hidden), np.array(top1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--head", required=True)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--per-category", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    manifest, seqs = read_corpus(args.corpus)
    cap = manifest["settings"]["max_tokens"]
    held, _ = holdout_split(seqs, 0.1, np.random.default_rng(0))  # train_eagle's split (seed 0, 10 %)
    by_cat = defaultdict(list)
    for s in held:
        if len(by_cat[s.cat]) < args.per_category:
            by_cat[s.cat].append(s)
    target = LlamaBackend(args.target, n_ctx=1024, hidden=True)
    drafter = EagleDrafter(args.head, target)
    report = {}
    for cat, group in sorted(by_cat.items()):
        corpus_hits = own_hits = corpus_n = own_n = corpus_capped = own_capped = 0
        for s in group:
            tokens = [int(t) for t in s.tokens]
            h, n = first_step_hits(drafter, tokens, s.n_prompt, s.hidden, s.topk_ids[:, 0])
            corpus_hits, corpus_n = corpus_hits + h, corpus_n + n
            corpus_capped += int(tokens[-1] not in target.vocab.eog_ids)
            seq, hidden, top1 = own_answer(target, tokens[:s.n_prompt], cap)
            h, n = first_step_hits(drafter, seq, s.n_prompt, hidden, top1)
            own_hits, own_n = own_hits + h, own_n + n
            own_capped += int(seq[-1] not in target.vocab.eog_ids)
        report[cat] = {"prompts": len(group), "corpus_agreement": round(corpus_hits / max(corpus_n, 1), 3),
                       "own_agreement": round(own_hits / max(own_n, 1), 3), "corpus_positions": corpus_n,
                       "own_positions": own_n, "corpus_capped": corpus_capped, "own_capped": own_capped}
        if not args.json:
            r = report[cat]
            print(f"{cat:<8} corpus text {r['corpus_agreement']:.3f} ({corpus_n} positions, {corpus_capped} at the "
                  f"cap)  own answers {r['own_agreement']:.3f} ({own_n}, {own_capped} at the cap)", flush=True)
    target.close()
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
