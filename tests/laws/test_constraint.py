"""Constrained decoding: the exact law of the constrained target on a fake model (valid JSON on the real one:
real/test_constraint_real.py)."""

import itertools

import numpy as np
import pytest
from fake import EOS, FakeBackend, controller, random_table, tokens_of
from stats_util import ALPHA, goodness_of_fit, target_instead_of_residual

from edgespec.decode import rule as rule_module
from edgespec.decode.loop import Stats, speculate
from edgespec.decode.sampling import SamplingParams, to_probs
from edgespec.drafts.base import ModelDrafter, PromptLookupDrafter

V = 5


class NoRepeat:
    """A grammar for tests: token 3 never, and never the token just emitted."""

    def __init__(self):
        self.seq: list[int] = []

    def allowed(self):
        mask = np.ones(V, bool)
        mask[3] = False
        if self.seq:
            mask[self.seq[-1]] = False
        return mask

    def consume(self, token):
        if not self.allowed()[token]:
            return False
        self.seq.append(token)
        return True

    def rollback(self, n):
        del self.seq[len(self.seq) - n:]


def constrained_law(table, params, n):
    """Exact law of n tokens of the chain after token 1 when the NoRepeat grammar starts with the answer."""
    law = {}
    for seq in itertools.product(range(V), repeat=n):
        p, grammar, prev = 1.0, NoRepeat(), 1
        for tok in seq:
            logits = np.where(grammar.allowed(), table[prev], -np.inf)
            p *= to_probs(logits[None], params)[0][tok]
            if p == 0:
                break
            grammar.consume(tok)
            prev = tok
        if p > 0:
            law[seq] = p
    return law


@pytest.mark.parametrize("kind, broken", [("model", False), ("model-unaware", False), ("ngram", False),
                                          ("model", True)])
def test_constrained_output_follows_the_constrained_target(monkeypatch, kind, broken):
    """Four tokens under a grammar, with a grammar-aware draft model, an unaware one (its drafts are cut at
    the first forbidden token) and prompt lookup: the law is the masked target chain's; without the residual
    step it is not."""
    rng = np.random.default_rng(3)
    table = random_table(rng, V, 1.5)
    table[:, EOS] = -1e9
    params = SamplingParams(temperature=1.0)
    if broken:
        monkeypatch.setattr(rule_module, "residual", target_instead_of_residual)
    target = FakeBackend(table)
    if kind == "ngram":
        drafter = PromptLookupDrafter(V)
        prompt = [1, 2, 4, 2, 1]  # something to look up
    else:
        drafter = ModelDrafter(FakeBackend(random_table(np.random.default_rng(5), V, 1.5)))
        if kind == "model-unaware":
            monkeypatch.setattr(drafter, "grammar_aware", False)
        prompt = [1]
    draws, drafted = [], 0
    for seed in range(6000):
        stats = Stats()
        events = list(speculate(target, drafter, controller(), prompt, params, np.random.default_rng(seed),
                                max_tokens=4, draft_max=3, stats=stats, constraint=NoRepeat()))
        draws.append(tuple(tokens_of(events)))
        drafted += stats.drafted
    assert all(3 not in d and all(a != b for a, b in zip(d, d[1:], strict=False)) for d in draws)
    assert drafted > 1000
    p = goodness_of_fit(draws, constrained_law(table, params, 4))  # both prompts end with token 1
    assert (p < ALPHA) == broken, p
