"""The statistics of the exactness tests, in one place: the significance level, the chi-square tests, the exact
law of a fake target's chain and the harness that checks the loop's draws against it, and the broken rules each
law test must catch (its wrong-rule twins)."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
from fake import controller, tokens_of
from scipy import stats

from edgespec.decode import rule as rule_module
from edgespec.decode.gate import DraftGate
from edgespec.decode.loop import Stats, speculate
from edgespec.decode.sampling import sample
from edgespec.decode.verify import acceptance_prob, residual

ALPHA = 1e-3  # a correct rule fails a test at this rate; a wrong one fails it almost surely


def goodness_of_fit(draws: list, expected: dict) -> float:
    """p-value of a chi-square test of draws against a known law {outcome: probability}.

    Outcomes with small expected counts are pooled into one cell, so the test stays valid.
    """
    n = len(draws)
    counts = Counter(draws)
    assert set(counts) <= {k for k, p in expected.items() if p > 0}, "an impossible outcome was drawn"
    big = [k for k, p in expected.items() if p * n >= 5]
    obs = [counts[k] for k in big]
    exp = [expected[k] * n for k in big]
    rest_exp = n - sum(exp)
    if rest_exp >= 1e-9:
        obs.append(n - sum(obs))
        exp.append(rest_exp)
    return float(stats.chisquare(obs, exp).pvalue)


def without_residual(target_probs, draft_probs, draft_tokens, rng):
    """A wrong rule: on rejection, resample from the target instead of the residual."""
    for i, token in enumerate(draft_tokens):
        if rng.random() >= acceptance_prob(target_probs[i], draft_probs[i], token):
            return i, sample(target_probs[i], rng)
    return len(draft_tokens), sample(target_probs[-1], rng)


def target_instead_of_residual(target, draft, token, n_vocab):
    """The same wrong rule on laws (decode/rule.residual's place): after a rejection, the target's own law."""
    return target


def judged_with_replacement(target_row, draft_row, candidates, rng):
    """A wrong rule for distinct candidates: the rule for i.i.d. ones, which judges every candidate by the full
    draft law. The tree tests patch it in for verify_candidates to show they catch it."""
    law = target_row
    for j, token in enumerate(candidates):
        if rng.random() < acceptance_prob(law, draft_row, token):
            return j, int(token)
        law = residual(law, draft_row)
    return None, sample(law, rng)


def markov_law(table, params, start, n):
    """Exact law of the next n tokens of the target chain after `start` (EOS made impossible)."""
    from edgespec.decode.sampling import to_probs

    probs = to_probs(table, params)
    law = {}
    for seq in itertools.product(range(1, table.shape[0]), repeat=n):
        p, last = 1.0, start
        for tok in seq:
            p, last = p * probs[last, tok], tok
        law[seq] = p
    return law


class RandomGate(DraftGate):
    """Keeps a drawn token with probability 0.6 and takes another step with 0.7, by its own generator: a
    stopping rule blind to the draws, under which the output law must stay the target's."""

    def __init__(self, controller, rng):
        super().__init__(controller)
        self.rng = rng

    def keep(self, confidence):
        kept = self.rng.random() < 0.6
        if kept:
            self.confidences.append(confidence)
        return kept

    def go_on(self):
        return self.rng.random() < 0.7


def random_gates(seed=0):
    """A gate factory for check_target_law: RandomGates drawing from one generator."""
    rng = np.random.default_rng(seed)
    return lambda controller: RandomGate(controller, rng)


RUNS = 6000  # draws of a law test; its broken twin draws a third of them (law_runs)


def law_runs(must_fail: bool, runs: int = RUNS) -> int:
    """Draws for a law test: `runs`, or a third of them for a broken twin, whose wrong law fails at a p-value far
    below ALPHA (1e-15 or less at a third of the draws, for every twin that check_target_law runs)."""
    return runs // 3 if must_fail else runs


def check_target_law(monkeypatch, target, drafter, table, params, *, width, broken, n_tokens, runs=RUNS,
                     gate=None, caught=None, draft_max=3) -> float:
    """Draw n_tokens from the loop `runs` times, drafting chains (width 1) or trees 3 deep, and assert their
    joint law is the target chain's (table), or, with `broken`, that the test catches a wrong rule: chains
    without the residual step, trees judging distinct candidates by the full draft law (the rule for i.i.d.
    candidates). gate(controller) -> a DraftGate: chains drafted under it, as far as it lets them (it must
    have both kept tokens and ended chains, many times). caught: whether the test must fail (default: broken),
    for a drafter broken on purpose. draft_max: the rounds' fixed length without a gate (None: the controller's
    choice; for trees, the shapes it plans). runs: the exact test's draws (a twin draws law_runs of them). Returns
    the tokens the rounds drafted per answer (tree nodes for trees)."""
    from edgespec.decode import verify as verify_module

    if broken and width == 1:
        monkeypatch.setattr(rule_module, "residual", target_instead_of_residual)
    elif broken:
        monkeypatch.setattr(verify_module, "verify_candidates", judged_with_replacement)
    must_fail = broken if caught is None else caught
    runs = law_runs(must_fail, runs)
    draws, drafted, verdicts = [], 0, Counter()  # verdicts: the gate's, keep (True) or end the chain

    def counted_gate(ctl):
        g = gate(ctl)
        keep = g.keep

        def counted(confidence):
            verdict = keep(confidence)
            verdicts[verdict] += 1
            return verdict

        g.keep = counted
        return g

    for seed in range(runs):
        stats = Stats()
        ctl = controller()
        if gate is not None:
            ctl.gate = lambda ctl=ctl: counted_gate(ctl)
        events = speculate(target, drafter, ctl, [1], params, np.random.default_rng(seed), max_tokens=n_tokens,
                           draft_max=None if gate is not None else draft_max, stats=stats, tree_width=width)
        draws.append(tuple(tokens_of(list(events))))
        drafted += stats.tree_nodes if width > 1 else stats.drafted
    p = goodness_of_fit(draws, markov_law(table, params, 1, n_tokens))
    assert (p < ALPHA) == must_fail, p
    if gate is not None:
        assert min(verdicts[True], verdicts[False]) > runs // 10, verdicts
    return drafted / runs


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return e / e.sum()


def first_logits(model, prompt: str) -> np.ndarray:
    """A GGUF target's logits (float64) of the first token after `prompt` (no chat template)."""
    from edgespec.backends.llama.backend import LlamaBackend

    target = LlamaBackend(model, n_ctx=256, n_threads=2, sequences=1)
    try:
        return target.forward(target.tokenize(prompt, special=False), 1)[-1].astype(np.float64)
    finally:
        target.close()


def drafted_first_token_p(engine, prompt: str, law: np.ndarray, runs: int, temperature: float, **options
                          ) -> tuple[float, int]:
    """(p-value, drafts kept) of the first token of `runs` answers to `prompt` (seeds 0..runs-1, draft_max 1: the loop
    drafts it, its prefill pass verifying it) against the target's law there: cells for the tokens likely enough,
    and the rest. options: generate's (chat=False for a raw prompt). Each answer is closed at its first token: after
    a rejected draft its second would cost a pass of its own, which nothing here reads."""
    draws, accepted = [], 0
    for seed in range(runs):
        stream = engine.stream(prompt, max_tokens=2, temperature=temperature, seed=seed, draft_max=1, **options)
        draws.append(next(event.token for event in stream if event.token is not None))
        stream.close()
        assert stream.stats.drafted >= 1
        accepted += stream.stats.accepted
    return goodness_of_fit(draws, {int(x): float(p) for x, p in enumerate(law)}), accepted


def first_two_p(backend, ids: list[int], answers: list[tuple], temperature: float = 1.0) -> tuple[float, float]:
    """p-values (first token, first two tokens) of answers sampled after `ids` at `temperature` (no filters) against
    the backend's exact law there: one pass for the first token's law, one for the second's after each first token
    expected at least once in len(answers) draws. An answer ends before an end-of-generation id, which it leaves out
    (cells "end" and (t1,)); outcomes expected less than once pool into one cell ("rest"). The backend may be an
    engine's target: it knows what its cache holds, which ends empty."""
    n, eog = len(answers), sorted(backend.vocab.eog_ids)

    def law(rows: np.ndarray) -> np.ndarray:
        return softmax(rows[-1].astype(np.float64) / temperature)

    backend.rollback(0)
    first = law(backend.forward(ids, 1))
    firsts = {int(t): float(first[t]) for t in np.flatnonzero(first * n >= 1) if t not in eog}
    pairs = {(): float(first[eog].sum())}
    for t1, p1 in firsts.items():
        backend.rollback(len(ids))
        second = law(backend.forward([t1], 1)) * p1
        pairs[(t1,)] = float(second[eog].sum())
        pairs.update({(t1, int(t2)): float(second[t2]) for t2 in np.flatnonzero(second * n >= 1) if t2 not in eog})
    backend.rollback(0)
    firsts["end"] = pairs[()]
    firsts["rest"], pairs["rest"] = max(0.0, 1 - sum(firsts.values())), max(0.0, 1 - sum(pairs.values()))

    def cell(outcome, cells: dict):
        return outcome if outcome in cells else "rest"

    one = [cell(a[0] if a else "end", firsts) for a in answers]
    two = [cell(tuple(a[:2]), pairs) for a in answers]
    return goodness_of_fit(one, firsts), goodness_of_fit(two, pairs)
