"""How much of a head's drafts the exact rule keeps at a target temperature, for each law the head could draft
from: its logits at a temperature tau of its own (any law keeps the rule exact), or its top tokens named
outright (tau -> 0, what llama-server's sample-and-match drafts), with W candidates for one position.

The target samples answers at --temperature; for each position of them the head's laws for the first and second
draft step (the second after the real first token, as when the first draft is kept) are read from the head inside
llama.cpp (LlamaHeadDrafter._stepping), the target's law from its own pass. Per step and per tau:
  1 - TV(p, q_tau): the chance the rule keeps a token drawn from q_tau (one candidate);
  W candidates without replacement under the recursive rule: the mass it keeps (exact for the draws, by sampling);
  top-W named outright: p(x_1) + ... + p(x_W), the mass of target draws that land on one of them.

    python experiments/draft_temperature.py --target models/smollm2-f32-q4_0/target-f32.gguf \\
        --head f32-600.gguf --prompts docs/results/2026-11-28-big-pair/prompts-10.jsonl [--json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from edgespec.api import prompt_tokens
from edgespec.backends.llama.backend import LlamaBackend
from edgespec.decode.sampling import SamplingParams, sample, to_probs
from edgespec.drafts.eagle3 import Eagle3Drafter

TAUS = (0.2, 0.3, 0.4, 0.5, 0.7, 1.0)


def answer(target: LlamaBackend, prompt: list[int], params: SamplingParams, n: int, rng) -> tuple[list[int], list]:
    """The target's sampled answer and its law at each answer position."""
    target.rollback(0)
    logits = target.forward(prompt, 1)[-1]
    seq, laws = list(prompt), []
    for _ in range(n):
        p = to_probs(logits, params)
        token = sample(p, rng)
        laws.append(p)
        seq.append(token)
        if token in target.vocab.eog_ids:
            break
        logits = target.forward([token], 1)[-1]
    return seq, laws


def head_laws(drafter: Eagle3Drafter, seq: list[int], n_prompt: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each answer position n: the head's logits for token n from seq[:n], and for token n + 1 with seq[n]
    drafted first (None at the last)."""
    target = drafter.target
    target.rollback(0)
    drafter.reset()
    target.forward(seq, 1)  # the target's rows at every position feed the head (on_pass)
    out = []
    for n in range(n_prompt, len(seq)):
        def read(first, step, n=n):
            second = step(seq[n], 0) if n + 1 < len(seq) else None
            return first.copy(), None if second is None else second.copy()
        out.append(drafter._stepping(seq[:n], read))
    return out


def kept(p: np.ndarray, logits: np.ndarray, ids: np.ndarray, tau: float, width: int, rng, draws: int = 16) -> float:
    """Mass of p [V] the recursive rule keeps with `width` candidates drawn without replacement from the head's
    law at tau over `ids` (estimated over draws; one candidate: 1 - TV, exact). Worked over the head's ids and
    one bucket for the target's mass outside them, which no candidate can take."""
    q = to_probs(logits, SamplingParams(temperature=tau))
    p_in = p[ids]
    if width == 1:
        return float(np.minimum(p_in, q).sum())
    total = 0.0
    for _ in range(draws):
        law, draft, outside, mass_left = p_in.copy(), q.copy(), 1.0 - float(p_in.sum()), 1.0
        for _ in range(width):
            token = sample(draft, rng)
            a = min(1.0, law[token] / draft[token])
            total += mass_left * a
            mass_left *= 1 - a
            law = np.maximum(law - draft, 0)
            norm = float(law.sum()) + outside
            law, outside = law / norm, outside / norm
            draft = draft.copy()
            draft[token] = 0
            if draft.sum() <= 0:
                break
            draft /= draft.sum()
    return total / draws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    target = LlamaBackend(args.target, n_ctx=1024, hidden=True)
    drafter = Eagle3Drafter(args.head, target)
    ids = drafter.ids if drafter.ids is not None else np.arange(target.vocab.n_vocab)
    params = SamplingParams(temperature=args.temperature)
    rows = []  # (step, p, head logits)
    with open(args.prompts) as f:
        items = [json.loads(line) for line in f if line.strip()]
    for item in items:
        prompt = prompt_tokens(target, item["prompt"])
        seq, laws = answer(target, prompt, params, args.max_tokens, rng)
        heads = head_laws(drafter, seq, len(prompt))
        for n, (first, second) in enumerate(heads):
            rows.append((1, laws[n], first))
            if second is not None and n + 1 < len(laws):
                rows.append((2, laws[n + 1], second))
    report = {"temperature": args.temperature, "positions": sum(s == 1 for s, _, _ in rows), "steps": {}}
    for step in (1, 2):
        here = [(p, g) for s, p, g in rows if s == step]
        named = {w: float(np.mean([p[ids[np.argsort(-g)[:w]]].sum() for p, g in here])) for w in (1, 2, 3)}
        law = {tau: {w: float(np.mean([kept(p, g, ids, tau, w, rng) for p, g in here])) for w in (1, 2)}
               for tau in TAUS}
        report["steps"][step] = {"named_top": named, "law": law}
    drafter.close()
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"target t = {args.temperature}, {report['positions']} positions")
    for step, r in report["steps"].items():
        print(f"step {step}: top-W named  " + "  ".join(f"W={w} {v:.3f}" for w, v in r["named_top"].items()))
        for tau, by_w in r["law"].items():
            print(f"        tau {tau:<4}      " + "  ".join(f"W={w} {v:.3f}" for w, v in by_w.items()))


if __name__ == "__main__":
    main()
