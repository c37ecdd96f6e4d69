"""The loop's own cost per token: edgespec's speculative loop over a backend whose forward only hands back rows.

On the devices edgespec targets a target pass costs 1-10 ms, so the host work around it (processing rows into
laws, the rule, drafting bookkeeping, text) must stay at tens of microseconds. Here the model costs nothing: the
backend returns rows of logits from a bank, so what is timed is the loop itself, and generated / time is the
ceiling on tokens per second that the loop allows at that vocabulary and sampling.

Rows: `model` (default) are the default model's own logits rows (SmolLM2-135M, sampled along an answer),
widened to the vocabulary by drawing extra ids from each row's own bulk (below its 99th percentile); `flat`
are N(0, 0.5) rows, what a random-weight model gives (the worst case for top-p, whose kept set is then most
of the vocabulary). Modes:
- target-only: every round one pass, one row;
- lookup-accept / lookup-reject: prompt lookup (edgespec's PromptLookupDrafter) drafting 4 tokens a round over
  a text that repeats; the target's rows make every draft certain (accept) or impossible (reject);
- model-accept / model-reject: a draft model (edgespec's ModelDrafter) over a second row bank, drafting 4
  tokens a round from its laws, every draft certain or impossible under the target.
Greedy accept rounds keep 4 drafts and a bonus (5 tokens a round); reject rounds emit 1 token a round.

usage: python benchmarks/loop_overhead.py [--vocab 152064 ...] [--sampling top-p ...] [--mode target-only ...]
       [--rows model|flat] [--tokens 400] [--passes built|numpy] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np

from edgespec.backends.protocol import Backend, Vocab
from edgespec.decode.cost import DraftController
from edgespec.decode.loop import Stats, speculate
from edgespec.decode.sampling import SamplingParams
from edgespec.drafts.base import ModelDrafter, PromptLookupDrafter

VOCABS = (32000, 49152, 128256, 152064)
SAMPLINGS = {"greedy": SamplingParams(0.0), "t=0.7": SamplingParams(0.7),
             "t=0.7 top-p 0.95": SamplingParams(0.7, top_p=0.95),
             "t=0.7 top-k 40 top-p 0.95": SamplingParams(0.7, top_k=40, top_p=0.95),
             "t=0.7 min-p 0.05": SamplingParams(0.7, min_p=0.05)}
MODES = ("target-only", "lookup-accept", "lookup-reject", "model-accept", "model-reject")
K = 4  # drafts a speculative round
ALPHABET = 64  # the ids the repeating text is written in (lookup finds every one of them earlier)
BANK = 16  # rows per bank
SURE = 40.0  # logits added to make a token certain
# the ceilings at V = 152,064 on a 2-core CPU: target-only tok/s, and lookup rounds in ms
GOALS = {("target-only", "greedy"): ("tok/s", 10000), ("target-only", "t=0.7"): ("tok/s", 2500),
         ("target-only", "t=0.7 top-p 0.95"): ("tok/s", 1500), ("lookup-accept", "greedy"): ("ms/round", 0.3),
         ("lookup-accept", "t=0.7 top-p 0.95"): ("ms/round", 1.5)}


def model_rows(n_rows: int = 32, seed: int = 0) -> np.ndarray:
    """Logits rows [n_rows, 49152] of the default model along its own answer at temperature 1."""
    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.decode.sampling import sample, to_probs
    from edgespec.models.default import default_target

    backend = LlamaBackend(default_target(), n_ctx=256, n_threads=2)
    prompt = ("<|im_start|>user\nExplain why the sky is blue, then write a short poem about it.<|im_end|>\n"
              "<|im_start|>assistant\n")
    rng, rows = np.random.default_rng(seed), []
    logits = backend.forward(backend.tokenize(prompt, special=True), 1)[0]
    for _ in range(n_rows):
        rows.append(logits.copy())
        logits = backend.forward([sample(to_probs(logits, SamplingParams(1.0)), rng)], 1)[0]
    backend.close()
    return np.array(rows, dtype=np.float32)


def widen(rows: np.ndarray, n_vocab: int, rng: np.random.Generator) -> np.ndarray:
    """Rows [n, n_vocab]: each row's values at random ids, extra ids drawn from the row's own bulk."""
    out = np.empty((len(rows), n_vocab), dtype=np.float32)
    for i, row in enumerate(rows):
        if n_vocab <= len(row):  # keep the head (top 256), drop bulk ids at random
            order = np.argsort(row)
            keep = np.concatenate([order[-256:], rng.choice(order[:-256], n_vocab - 256, replace=False)])
            values = row[keep]
        else:
            bulk = row[row < np.quantile(row, 0.99)]
            values = np.concatenate([row, rng.choice(bulk, n_vocab - len(row))])
        out[i] = values[rng.permutation(n_vocab)]
    return out


class RowsBackend(Backend):
    """A Backend whose forward hands back rows from a bank: the row after token t at position i is bank[(t + i)
    % BANK], with `mode` deciding the next fed token's fate: "accept" makes it certain, "reject" impossible
    (and another id of the alphabet certain), None leaves the bank's row as it is."""

    def __init__(self, bank: np.ndarray, vocab: Vocab, n_ctx: int, mode: str | None, alphabet: np.ndarray):
        self.bank, self.vocab, self.n_ctx, self.mode, self.alphabet = bank, vocab, n_ctx, mode, alphabet
        self.name, self.tokens = "rows", []
        self.spent = 0.0  # seconds in forward: the model's share, left out of the loop's
        self._next = {int(a): int(alphabet[(i + 1) % len(alphabet)]) for i, a in enumerate(alphabet)}
        self._out = np.empty((16, bank.shape[1]), dtype=np.float32)

    def forward(self, tokens, n_logits, *, copy=True):  # rows in its own buffer, whatever copy says
        t0 = time.perf_counter()
        try:
            return self._rows(tokens, n_logits)
        finally:
            self.spent += time.perf_counter() - t0

    def _rows(self, tokens, n_logits):
        start = len(self.tokens)
        self.tokens.extend(tokens)
        out = self._out[:n_logits]
        first = len(tokens) - n_logits
        for j in range(n_logits):
            i = first + j
            row = self.bank[(tokens[i] + start + i) % BANK]
            if self.mode is None:
                out[j] = row
                continue
            out[j] = row
            top = row.max()
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            follow = self._next.get(tokens[i], int(self.alphabet[0]))
            if self.mode == "accept" or nxt is None:
                out[j, nxt if nxt is not None and self.mode == "accept" else follow] = top + SURE
            else:  # reject: the draft impossible, the text still in the alphabet
                out[j, nxt] = -1e30
                out[j, follow if follow != nxt else self._next[follow]] = top + SURE
        return out

    def rollback(self, n_past):
        del self.tokens[n_past:]

    def memory(self):
        return {"weights": self.bank.nbytes, "kv_cache": 0}


def vocab_of(n_vocab: int) -> Vocab:
    pieces = tuple(bytes([97 + i % 26]) for i in range(n_vocab))
    return Vocab(texts=pieces, pieces=pieces, bos_id=0, eos_id=n_vocab - 1, eog_ids=frozenset([n_vocab - 1]))


def run(bank: np.ndarray, draft_bank: np.ndarray, n_vocab: int, params: SamplingParams, mode: str,
        tokens: int) -> dict:
    """One mode at one vocabulary and sampling: host time per token and per round."""
    vocab = vocab_of(n_vocab)
    rng = np.random.default_rng(0)
    alphabet = np.sort(rng.choice(n_vocab - 1, ALPHABET, replace=False))
    prompt = [int(a) for a in alphabet] * 2
    fate = None if mode == "target-only" else mode.split("-")[1]
    target = RowsBackend(bank, vocab, len(prompt) + tokens + 2 * K + 4, fate, alphabet)
    if mode.startswith("lookup"):
        drafter = PromptLookupDrafter(n_vocab)
    elif mode.startswith("model"):
        drafter = ModelDrafter(RowsBackend(draft_bank, vocab, target.n_ctx, None, alphabet), vocab)
    else:
        drafter = None
    controller = DraftController({n: 1.0 for n in range(1, 17)}, draft_cost=0.01, k_max=K)
    stats = Stats()
    t0 = time.perf_counter()
    for _ in speculate(target, drafter, controller, prompt, params, rng, max_tokens=tokens,
                       draft_max=0 if drafter is None else K, stats=stats):
        pass
    # the loop's time: the backends' forwards (copying and editing rows) left out
    wall = time.perf_counter() - t0 - target.spent - (drafter.backend.spent if mode.startswith("model") else 0.0)
    rounds = max(stats.target_passes, 1)
    return {"tokens": stats.generated, "rounds": rounds, "us_per_token": wall / stats.generated * 1e6,
            "ms_per_round": wall / rounds * 1e3, "ceiling_tok_s": stats.generated / wall,
            "accepted_per_round": stats.accepted / rounds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, action="append", help=f"vocabulary sizes (default {VOCABS})")
    ap.add_argument("--sampling", action="append", choices=list(SAMPLINGS), help="default: all")
    ap.add_argument("--mode", action="append", choices=MODES, help="default: all")
    ap.add_argument("--rows", choices=("model", "flat"), default="model")
    ap.add_argument("--tokens", type=int, default=400, help="tokens per run (greedy and accept runs: 4x this)")
    ap.add_argument("--passes", choices=("built", "numpy"), default="built",
                    help="the row passes: this build's (decode/rows.py kind) or numpy's, what a checkout without the "
                         "compiled module runs")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()
    from edgespec.decode import rows

    if args.passes == "numpy":
        rows._rows = None
    rng = np.random.default_rng(1)
    source = model_rows() if args.rows == "model" else None
    results = []
    for n_vocab in args.vocab or VOCABS:
        if source is not None:
            bank, draft_bank = widen(source[:BANK], n_vocab, rng), widen(source[BANK:2 * BANK], n_vocab, rng)
        else:
            bank, draft_bank = (rng.standard_normal((2, BANK, n_vocab)) * 0.5).astype(np.float32)
        bank[:, n_vocab - 1] = draft_bank[:, n_vocab - 1] = -1e30  # never the end of generation
        for name in args.sampling or SAMPLINGS:
            for mode in args.mode or MODES:
                fast = name == "greedy" or mode.endswith("accept")
                r = run(bank, draft_bank, n_vocab, SAMPLINGS[name], mode, args.tokens * (4 if fast else 1))
                results.append({"vocab": n_vocab, "sampling": name, "mode": mode, **r})
                if not args.json:
                    print(f"V={n_vocab:>6}  {name:26s} {mode:14s} {r['us_per_token']:8.1f} us/token "
                          f"{r['ms_per_round']:7.3f} ms/round {r['ceiling_tok_s']:9.0f} tok/s", file=sys.stderr)
    goals = []
    for r in results:
        goal = GOALS.get((r["mode"], r["sampling"])) if r["vocab"] == 152064 else None
        if goal:
            unit, bound = goal
            value = r["ceiling_tok_s"] if unit == "tok/s" else r["ms_per_round"]
            goals.append({"mode": r["mode"], "sampling": r["sampling"], "unit": unit, "goal": bound,
                          "value": round(value, 3), "met": value >= bound if unit == "tok/s" else value <= bound})
    report = {"machine": platform.processor() or platform.machine(), "rows": args.rows, "passes": rows.kind(),
              "results": results, "goals": goals}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"\nrow passes: {rows.kind()}")
    print(f"{'V':>7} {'sampling':26s} {'mode':14s} {'us/token':>9} {'ms/round':>9} {'ceiling tok/s':>14}")
    for r in results:
        print(f"{r['vocab']:>7} {r['sampling']:26s} {r['mode']:14s} {r['us_per_token']:9.1f} "
              f"{r['ms_per_round']:9.3f} {r['ceiling_tok_s']:14.0f}")
    for g in goals:
        print(f"goal at V=152064, {g['mode']}, {g['sampling']}: {g['value']} {g['unit']} "
              f"({'>=' if g['unit'] == 'tok/s' else '<='} {g['goal']}): {'met' if g['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
