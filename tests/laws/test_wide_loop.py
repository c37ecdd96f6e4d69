"""The loop's exactness on the path generation runs: float32 rows of real vocabulary sizes (49,152 and 152,064 ids),
through decode/laws.py and the C row passes, for each draft kind and sampling mode.

laws/test_loop_laws.py checks the same laws on float64 rows of 6 ids, where every row takes the small-row paths. Here
a Markov chain lives on a few ids of a real-size vocabulary, over a background of every other id (a real row's
long tail, one category: the row after any background id is the same), and the end-of-text id is masked with
-inf as a grammar would. The joint law of the categories of three emitted tokens must be the target chain's
(computed with sampling.to_probs in float64), and each kind's test also runs with a wrong rule and must catch it.
"""

import itertools

import numpy as np
import pytest
from fake import EOS, FakeBackend, Sources, controller, make_vocab
from stats_util import ALPHA, RandomGate, goodness_of_fit, judged_with_replacement, target_instead_of_residual

from edgespec.decode import rule as rule_module
from edgespec.decode import verify as verify_module
from edgespec.decode.loop import Stats, speculate
from edgespec.decode.sampling import SamplingParams, to_probs
from edgespec.drafts.base import Drafter, ModelDrafter, PromptLookupDrafter, chain_with_siblings, grow_tree

LIVE = 4  # ids the chain lives on; the background is category LIVE
RUNS = 3000
N_TOKENS = 3


class WideChain:
    """rows [LIVE + 1, V] float32: the next-token logits after each live id and after any background id."""

    def __init__(self, n_vocab: int, seed: int, spread: float = 1.5):
        self.live = np.sort(np.random.default_rng(n_vocab).choice(np.arange(1, n_vocab), LIVE, replace=False))
        rng = np.random.default_rng(seed)  # the chain's own logits: the live ids are the same for every seed
        self.category = np.full(n_vocab, LIVE)  # [V]: the row an id leads to
        self.category[self.live] = np.arange(LIVE)
        small = rng.normal(scale=spread, size=(LIVE + 1, LIVE + 1))  # [from, to]: to LIVE = the background
        noise = rng.standard_normal(n_vocab).astype(np.float32)  # the tail's shape, shared by the rows
        self.rows = np.empty((LIVE + 1, n_vocab), dtype=np.float32)
        for c in range(LIVE + 1):  # the background's total weight about exp(small[c, LIVE]) at temperature 1
            self.rows[c] = noise + np.float32(small[c, LIVE] - np.log(n_vocab) - 0.5)
            self.rows[c, self.live] = small[c, :LIVE]
        self.rows[:, EOS] = -np.inf  # masked, as a grammar masks: the chain never ends

    def __getitem__(self, tokens):
        return self.rows[self.category[np.asarray(tokens, dtype=np.int64)]]  # [n, V], float32, contiguous

    def law(self, params: SamplingParams, start: int, n: int) -> dict:
        """Exact law of the categories of the next n tokens after `start`."""
        probs = to_probs(self.rows.astype(np.float64), params)  # [LIVE + 1, V]
        step = np.stack([probs[:, self.category == c].sum(axis=1) for c in range(LIVE + 1)], axis=1)
        out = {}
        for seq in itertools.product(range(LIVE + 1), repeat=n):
            p, last = 1.0, self.category[start]
            for c in seq:
                p, last = p * step[last, c], c
            out[seq] = p
        return out


class WideBackend(FakeBackend):
    """FakeBackend over a WideChain: float32 rows of the real vocabulary size."""

    def __init__(self, chain: WideChain, name: str = "wide"):
        self.table, self.vocab, self.n_ctx, self.name = chain, make_vocab(chain.rows.shape[1]), 256, name
        self.tokens, self.calls = [], []

    def memory(self):
        return {"weights": self.table.rows.nbytes, "kv_cache": 0}


class WideTreeDrafter(Drafter):
    """Trees from a WideChain, as heads draft them (drafts/base.grow_tree)."""

    name, trees, branching = "wide-tree", True, True  # a node's row depends on its own token alone

    def __init__(self, chain: WideChain):
        self.chain = chain

    def propose_tree(self, context, shape, params, rng):
        return grow_tree(shape, lambda path: self.chain[[path[-1] if path else context[-1]]][0], params, rng,
                         self.chain.rows.shape[1])


class WideHeadDrafter(Drafter):
    """Chains as Medusa and EAGLE heads draft them (chain_with_siblings one wide: dense float64 draft rows), over
    the whole vocabulary or over a subset of it (ids: the head's outputs in target ids, as a subset draft's)."""

    name, gated = "wide-head", True

    def __init__(self, chain: WideChain, ids: np.ndarray | None = None):
        self.chain, self.ids = chain, ids

    def propose(self, context, k, params, rng, gate=None):
        def row(token):
            logits = self.chain[[token]][0]
            return logits if self.ids is None else logits[self.ids]

        tree = chain_with_siblings(row(context[-1]), lambda token, i: row(token), k, 1, params, rng,
                                   self.chain.rows.shape[1], ids=self.ids, gate=gate)
        return tree.tokens, tree.probs[:len(tree.tokens)]


def subset_of(chain: WideChain) -> np.ndarray:
    """Ascending ids a subset head covers: the live ids and a third of the rest."""
    n_vocab = chain.rows.shape[1]
    return np.union1d(chain.live, np.arange(1, n_vocab, 3))


def emitted(chain, target, drafter, params, runs, *, width=1, gated=False, seed=0):
    """The categories of N_TOKENS tokens from the loop, `runs` times, and how many tokens the rounds drafted."""
    draws, drafted, gates = [], 0, np.random.default_rng(seed)
    prompt = [int(chain.live[0])] * 3  # a repeat: prompt lookup finds something to propose from the start
    for run in range(runs):
        stats, ctl = Stats(), controller()
        if gated:
            ctl.gate = lambda ctl=ctl: RandomGate(ctl, gates)
        events = speculate(target, drafter, ctl, prompt, params, np.random.default_rng(run), max_tokens=N_TOKENS,
                           draft_max=None if gated else 3, stats=stats, tree_width=width)
        draws.append(tuple(int(chain.category[e.token]) for e in events if e.token is not None))
        drafted += stats.tree_nodes if width > 1 else stats.drafted
    return draws, drafted


def pair(n_vocab):
    """The target's chain and a draft's: other logits on the same live ids."""
    return WideChain(n_vocab, 1), WideChain(n_vocab, 2)


@pytest.mark.parametrize("n_vocab, params, kind, broken", [
    (152064, SamplingParams(1.0), "model", False),
    (152064, SamplingParams(1.0), "model", True),
    (49152, SamplingParams(0.7, top_p=0.9), "gated", False),
    (49152, SamplingParams(0.7, top_p=0.9), "gated", True),
    (49152, SamplingParams(0.8, top_k=40, min_p=0.02), "model", False),
    (49152, SamplingParams(0.8, top_k=40, min_p=0.02), "model", True),
    (49152, SamplingParams(1.0), "lookup", False),
    (49152, SamplingParams(1.0), "lookup", True),
    (49152, SamplingParams(0.9, top_p=0.95), "lookup+model", False),
    (49152, SamplingParams(0.9, top_p=0.95), "lookup+model", True),
    (49152, SamplingParams(0.7, top_p=0.9), "heads", False),
    (49152, SamplingParams(1.0), "heads-subset", False),
    (49152, SamplingParams(1.0), "heads-subset", True),
    (49152, SamplingParams(1.0), "tree", False),
    (49152, SamplingParams(1.0), "tree", True),
])
def test_real_size_float32_rows_follow_the_target_chain(monkeypatch, n_vocab, params, kind, broken):
    chain, draft_chain = pair(n_vocab)
    target = WideBackend(chain)
    drafter = {"model": lambda: ModelDrafter(WideBackend(draft_chain, "draft"), target.vocab),
               "gated": lambda: ModelDrafter(WideBackend(draft_chain, "draft"), target.vocab),
               "lookup": lambda: PromptLookupDrafter(n_vocab, min_ngram=1),
               "lookup+model": lambda: Sources(ModelDrafter(WideBackend(draft_chain, "draft"), target.vocab), n_vocab,
                                               min_ngram=1),
               "heads": lambda: WideHeadDrafter(draft_chain),
               "heads-subset": lambda: WideHeadDrafter(draft_chain, subset_of(draft_chain)),
               "tree": lambda: WideTreeDrafter(draft_chain)}[kind]()
    if broken:
        if kind == "tree":
            monkeypatch.setattr(verify_module, "verify_candidates", judged_with_replacement)
        else:
            monkeypatch.setattr(rule_module, "residual", target_instead_of_residual)
    assert chain.rows.dtype == np.float32 and chain.rows.shape[1] == n_vocab
    # fewer runs where a round costs milliseconds (dense float64 draft rows, a top-p sort per draft step), enough
    # that the wrong rule is caught (the exact one needs none for its false alarm rate)
    slow = kind == "tree" or kind == "heads" and params.top_p < 1
    runs = (RUNS * 2 // 3 if broken else RUNS // 3) if slow else RUNS
    draws, drafted = emitted(chain, target, drafter, params, runs, width=3 if kind == "tree" else 1,
                             gated=kind == "gated")
    p = goodness_of_fit(draws, chain.law(params, int(chain.live[0]), N_TOKENS))
    assert (p < ALPHA) == broken, p
    assert drafted >= runs, drafted  # the rounds drafted
    if kind == "lookup+model":
        assert min(drafter.rounds.values()) > runs // 5, drafter.rounds


@pytest.mark.parametrize("kind", ["model", "lookup", "tree"])
def test_greedy_on_real_size_rows_is_target_only_greedy(kind):
    chain, draft_chain = pair(152064)
    target = WideBackend(chain)
    drafter = {"model": lambda: ModelDrafter(WideBackend(draft_chain, "draft"), target.vocab),
               "lookup": lambda: PromptLookupDrafter(152064, min_ngram=1),
               "tree": lambda: WideTreeDrafter(draft_chain)}[kind]()
    prompt, greedy = [int(chain.live[0])] * 3, SamplingParams(0.0)

    def tokens(d, width=1):
        stats = Stats()
        events = speculate(WideBackend(chain), d, controller(), prompt, greedy, np.random.default_rng(0),
                           max_tokens=24, draft_max=3, stats=stats, tree_width=width)
        return [e.token for e in events if e.token is not None], stats

    alone, _ = tokens(None)
    spec, stats = tokens(drafter, 3 if kind == "tree" else 1)
    assert spec == alone and (stats.tree_nodes if kind == "tree" else stats.drafted) > 0
