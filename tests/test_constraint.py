"""Constrained decoding: exact law of the constrained target on a fake model; valid JSON on the real one."""

import itertools
import json
from importlib import resources

import numpy as np
import pytest
from fake import EOS, FakeBackend, random_table
from stats_util import ALPHA, goodness_of_fit
from test_loop import controller, tokens_of
from test_verify import target_instead_of_residual

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


@pytest.mark.laws
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


ROBOT_SCHEMA = json.loads(resources.files("edgespec").joinpath("data/robot.schema.json").read_text())


@pytest.mark.real
@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_robot_prompts_give_valid_json_and_greedy_output_is_the_constrained_targets(default_gguf, q4_0_gguf,
                                                                                   draft):
    from edgespec.api import load
    from edgespec.bench import read_prompts

    engine = load(default_gguf, q4_0_gguf if draft == "model" else "ngram", n_ctx=512)
    prompts = [p["prompt"] for p in read_prompts(None) if p["cat"] == "robot"]
    for prompt in prompts:
        base = engine.generate(prompt, max_tokens=64, draft_max=0, json_schema=ROBOT_SCHEMA)
        spec = engine.generate(prompt, max_tokens=64, draft_max=3, json_schema=ROBOT_SCHEMA)
        assert spec.tokens == base.tokens
        command = json.loads(spec.text)
        assert command["action"] in ROBOT_SCHEMA["properties"]["action"]["enum"]
        assert set(command) <= set(ROBOT_SCHEMA["properties"])
        assert spec.stats.finish_reason == "stop"
    assert spec.stats.drafted > 0
