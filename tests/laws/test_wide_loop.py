"""The loop's exactness on the path generation runs: float32 rows of real vocabulary sizes (49,152 and 152,064 ids),
through decode/laws.py and the C row passes, for each draft kind and sampling mode.

laws/test_loop_laws.py checks the same laws on float64 rows of 6 ids, where every row takes the small-row paths. Here
a Markov chain lives on a few ids of a real-size vocabulary, over a background of every other id (a real row's
long tail, one category: the row after any background id is the same), and the end-of-text id is masked with
-inf as a grammar would. The joint law of the categories of three emitted tokens must be the target chain's
(computed with sampling.to_probs in float64), and each kind's test also runs with a wrong rule and must catch it.
The kinds: a draft model (padded either way: fewer ids than the target, or more, which it would propose most),
gated, of another tokenizer (OtherTokenizer: shuffled ids and words of its own, which also catches a rule that
divides by the unrestricted law), prompt lookup alone and in front of a model, heads over the vocabulary or a
subset (stand-ins, and the EAGLE and Medusa drafters themselves over a target with hidden states: EAGLE's
ggml runner on random weights, Medusa heads over an output layer that gives them a draft's law), trees, and a
grammar's masks with a grammar-aware draft and an unaware one (the law is then the masked chain's,
NoRepeatLive.law).
With a third of the exact runs a wrong rule gives p-values of 1e-9 to 1e-43 here (ALPHA is 1e-3), so the twins
draw that many; the trees' subtler wrong rule (judged as if drawn with replacement) two thirds, caught at 2e-5.
"""

import copy
import itertools

import numpy as np
import pytest
from fake import EOS, FakeBackend, Sources, controller, make_vocab
from stats_util import ALPHA, RandomGate, goodness_of_fit, judged_with_replacement, target_instead_of_residual
from test_cross_laws import Unrenormalised
from test_eagle import random_head

from edgespec.backends.protocol import Vocab
from edgespec.decode import rule as rule_module
from edgespec.decode import verify as verify_module
from edgespec.decode.loop import Stats, speculate
from edgespec.decode.sampling import SamplingParams, to_probs
from edgespec.drafts.base import Drafter, ModelDrafter, PromptLookupDrafter, chain_with_siblings, grow_tree
from edgespec.drafts.cross import CrossDrafter
from edgespec.drafts.eagle import EagleDrafter, save_eagle
from edgespec.drafts.heads import MedusaDrafter, save_heads

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

    def __init__(self, chain: WideChain, name: str = "wide", vocab: Vocab | None = None):
        self.table, self.n_ctx, self.name = chain, 256, name
        self.vocab = vocab or make_vocab(chain.rows.shape[1])
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


def padded(chain: WideChain, n_vocab: int) -> WideChain:
    """The chain as a padded draft's vocabulary has it (backends/padded.py): cut to n_vocab ids (the ids it lacks are
    background ids the target gives mass) or widened with ids the target lacks, each at a logit that would make them
    its likeliest proposals."""
    out = copy.copy(chain)
    extra = n_vocab - chain.rows.shape[1]
    if extra <= 0:
        out.rows, out.category = chain.rows[:, :n_vocab].copy(), chain.category[:n_vocab]
    else:
        out.rows = np.concatenate([chain.rows, np.full((LIVE + 1, extra), 4.0, dtype=np.float32)], axis=1)
        out.category = np.concatenate([chain.category, np.full(extra, LIVE)])
    return out


class NoRepeatLive:
    """A grammar for a WideChain (decode/constraint.Constraint): its last live id never, and never the live id just
    emitted; background ids always. Its state is the category of the last token it consumed."""

    def __init__(self, chain: WideChain):
        self.chain, self.seq = chain, []

    def mask(self, last: int | None) -> np.ndarray:
        allowed = np.ones(self.chain.rows.shape[1], bool)
        allowed[self.chain.live[LIVE - 1]] = False
        if last is not None and last < LIVE:
            allowed[self.chain.live[last]] = False
        return allowed

    def allowed(self) -> np.ndarray:
        return self.mask(self.seq[-1] if self.seq else None)

    def consume(self, token: int) -> bool:
        if not self.allowed()[token]:
            return False
        self.seq.append(int(self.chain.category[token]))
        return True

    def rollback(self, n: int) -> None:
        del self.seq[len(self.seq) - n:]

    def law(self, params: SamplingParams, start: int, n: int) -> dict:
        """Exact law of the categories of the next n tokens after `start` (which the grammar has not consumed)."""
        chain, out = self.chain, {}
        steps = {}
        for last in (None, *range(LIVE + 1)):
            for prev in range(LIVE + 1):
                probs = to_probs(np.where(self.mask(last), chain.rows[prev].astype(np.float64), -np.inf), params)
                steps[last, prev] = [probs[chain.category == c].sum() for c in range(LIVE + 1)]
        for seq in itertools.product(range(LIVE + 1), repeat=n):
            p, last, prev = 1.0, None, chain.category[start]
            for c in seq:
                p, last, prev = p * steps[last, prev][c], c, c
            out[seq] = p
        return out


PIECE = 7  # bytes each token of a spelled vocabulary prints: b"000042|" for id 42
WORD_BOOST = 4.0  # a draft word's logit over its second token's: a quarter of the draft's mass off the intersection


def spelled(n_vocab: int, extra: list[bytes] = ()) -> Vocab:
    """A vocabulary whose ids print distinct text (make_vocab's print letters), with `extra` tokens after them."""
    pieces = [b"" if i == EOS else b"%06d|" % i for i in range(n_vocab)] + list(extra)
    texts = tuple(b"<eos>" if i == EOS else p for i, p in enumerate(pieces))
    return Vocab(texts=texts, pieces=tuple(pieces), bos_id=EOS, eos_id=EOS, eog_ids=frozenset([EOS]))


class OtherTokenizer(WideBackend):
    """A draft of another tokenizer over a WideChain's text: the target's tokens at shuffled ids, then words of two
    background tokens the target has no token for, which its tokenizer prefers (longest match). The chain's
    logits follow the text: a shuffled id takes the target id's logit, a word its second token's plus WORD_BOOST (mass
    outside the intersection, which the cross drafter's restriction removes)."""

    def __init__(self, chain: WideChain, n_words: int = 500):
        n_vocab = chain.rows.shape[1]
        rng = np.random.default_rng(7)
        order = np.concatenate([[EOS], 1 + rng.permutation(n_vocab - 1)])  # draft id -> the target id it spells
        background = np.setdiff1d(np.arange(1, n_vocab), chain.live)
        pairs = rng.choice(background, size=(n_words, 2))
        words = [b"%06d|%06d|" % tuple(pair) for pair in pairs]
        own = copy.copy(chain)
        own.rows = np.concatenate([chain.rows[:, order], chain.rows[:, pairs[:, 1]] + np.float32(WORD_BOOST)], axis=1)
        own.category = np.concatenate([chain.category[order], chain.category[pairs[:, 1]]])
        super().__init__(own, "draft")
        self.vocab = Vocab(texts=tuple(b"<eos>" if t == EOS else b"%06d|" % t for t in order) + tuple(words),
                           pieces=tuple(b"" if t == EOS else b"%06d|" % t for t in order) + tuple(words),
                           bos_id=EOS, eos_id=EOS, eog_ids=frozenset([EOS]))
        self.ids = {piece: i for i, piece in enumerate(self.vocab.pieces) if piece}

    def tokenize(self, text, *, special):
        data, out, at = text.encode(), [], 0
        while at < len(data):
            word = self.ids.get(data[at:at + 2 * PIECE]) if at + 2 * PIECE <= len(data) else None
            size = 2 * PIECE if word is not None and len(self.vocab.pieces[word]) == 2 * PIECE else PIECE
            out.append(self.ids[data[at:at + size]])
            at += size
        return out


E = 32  # the hidden width of HiddenWide, whose heads are the real drafters


class HiddenWide(WideBackend):
    """A WideBackend with hidden states for heads to read: a fixed random state per category of the row's token,
    and an output layer [V, E] (random, the live ids' rows 80 times longer, so that heads put most of their mass on
    live ids, as a real draft puts it where its target does, and not on the thousands of background ids)."""

    hidden, path, n_embd = True, None, E

    def __init__(self, chain: WideChain):
        super().__init__(chain)
        rng = np.random.default_rng(11)
        self.states = rng.normal(size=(LIVE + 1, E)).astype(np.float32)
        self.states[:, 0] = 1.0  # a constant component: an output row can give its id a logit of its own
        self.output = rng.normal(scale=0.05, size=(chain.rows.shape[1], E)).astype(np.float32)
        self.output[chain.live] = rng.normal(scale=4.0, size=(LIVE, E))
        self.last_hidden = None

    def forward(self, tokens, n_logits, *, copy=True):
        rows = super().forward(tokens, n_logits)
        self.last_hidden = self.states[self.table.category[self.tokens[len(self.tokens) - n_logits:]]] \
            if n_logits else None
        return rows


def eagle_head(target: HiddenWide, folder) -> EagleDrafter:
    """The EAGLE drafter (the ggml runner, production's) on random weights for `target`, drafting a subset of its
    ids (the live ones among them)."""
    weights, meta = random_head(np.random.default_rng(5), E, n_head=4, n_head_kv=2, n_ff=64)
    path = save_eagle(folder / "wide.eagle.npz", weights, subset_of(target.table),
                      {**meta, "vocab_digest": target.vocab.digest, "n_embd": E})
    return EagleDrafter(path, target, target.output.astype(np.float16))


def medusa_heads(target: HiddenWide, draft_chain: WideChain, folder) -> MedusaDrafter:
    """The Medusa drafter on near-zero heads (each head's state about the target's) over an output layer built so
    that a state of category c gives the live ids draft_chain's logits after c and the background ids about -12:
    a draft law like a real draft's, whose mass is where the target's is but not in its proportions."""
    rng = np.random.default_rng(6)
    output = target.output.copy()
    output[:, 0] = -12.0
    output[draft_chain.live] = np.linalg.lstsq(target.states, draft_chain.rows[:, draft_chain.live], rcond=None)[0].T
    path = save_heads(folder / "wide.medusa.npz", rng.normal(scale=0.02, size=(3, E, E)), np.zeros((3, E)),
                      {"vocab_digest": target.vocab.digest, "n_embd": E}, subset=subset_of(target.table))
    return MedusaDrafter(path, target, output)


def subset_of(chain: WideChain) -> np.ndarray:
    """Ascending ids a subset head covers: the live ids and a third of the rest."""
    n_vocab = chain.rows.shape[1]
    return np.union1d(chain.live, np.arange(1, n_vocab, 3))


def emitted(chain, target, drafter, params, runs, *, width=1, gated=False, seed=0, grammar=None):
    """The categories of N_TOKENS tokens from the loop, `runs` times, and how many tokens the rounds drafted."""
    draws, drafted, gates = [], 0, np.random.default_rng(seed)
    prompt = [int(chain.live[0])] * 3  # a repeat: prompt lookup finds something to propose from the start
    for run in range(runs):
        stats, ctl = Stats(), controller()
        if gated:
            ctl.gate = lambda ctl=ctl: RandomGate(ctl, gates)
        events = speculate(target, drafter, ctl, prompt, params, np.random.default_rng(run), max_tokens=N_TOKENS,
                           draft_max=None if gated else 3, stats=stats, tree_width=width,
                           constraint=grammar() if grammar else None)
        draws.append(tuple(int(chain.category[e.token]) for e in events if e.token is not None))
        drafted += stats.tree_nodes if width > 1 else stats.drafted
    return draws, drafted


def pair(n_vocab):
    """The target's chain and a draft's: other logits on the same live ids."""
    return WideChain(n_vocab, 1), WideChain(n_vocab, 2)


def drafter_of(kind: str, target: WideBackend, draft_chain: WideChain, folder) -> Drafter:
    """The drafter of a kind of test_real_size_float32_rows_follow_the_target_chain, drafting from draft_chain."""
    n_vocab = draft_chain.rows.shape[1]

    def model(chain=draft_chain):
        return ModelDrafter(WideBackend(chain, "draft"), target.vocab)

    if kind in ("model", "gated", "grammar", "grammar-unaware"):
        return model()
    return {"cross": lambda: CrossDrafter(OtherTokenizer(draft_chain), target.vocab),
            "cross-unrenormalised": lambda: Unrenormalised(OtherTokenizer(draft_chain), target.vocab),
            "lookup": lambda: PromptLookupDrafter(n_vocab, min_ngram=1),
            "lookup+model": lambda: Sources(model(), n_vocab, min_ngram=1),
            "heads": lambda: WideHeadDrafter(draft_chain),
            "heads-subset": lambda: WideHeadDrafter(draft_chain, subset_of(draft_chain)),
            "eagle": lambda: eagle_head(target, folder),
            "medusa": lambda: medusa_heads(target, draft_chain, folder),
            "tree": lambda: WideTreeDrafter(draft_chain),
            "padded-fewer": lambda: model(padded(draft_chain, n_vocab - 100)),
            "padded-more": lambda: model(padded(draft_chain, n_vocab + 128))}[kind]()


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
    (49152, SamplingParams(0.7, top_p=0.9), "heads", True),
    (49152, SamplingParams(1.0), "heads-subset", False),
    (49152, SamplingParams(1.0), "heads-subset", True),
    (49152, SamplingParams(0.8, top_p=0.95), "eagle", False),
    (49152, SamplingParams(0.8, top_p=0.95), "eagle", True),
    (49152, SamplingParams(1.0), "medusa", False),
    (49152, SamplingParams(1.0), "medusa", True),
    (49152, SamplingParams(1.0), "tree", False),
    (49152, SamplingParams(1.0), "tree", True),
    (49152, SamplingParams(1.0), "padded-fewer", False),
    (49152, SamplingParams(1.0), "padded-fewer", True),
    (152064, SamplingParams(0.8, top_p=0.95), "padded-more", False),
    (152064, SamplingParams(0.8, top_p=0.95), "padded-more", True),
    (49152, SamplingParams(1.0), "cross", False),
    (49152, SamplingParams(1.0), "cross", True),
    (49152, SamplingParams(1.0), "cross-unrenormalised", True),
    (49152, SamplingParams(1.0), "grammar", False),
    (49152, SamplingParams(1.0), "grammar", True),
    (49152, SamplingParams(0.9, top_k=40), "grammar-unaware", False),
    (49152, SamplingParams(0.9, top_k=40), "grammar-unaware", True),
])
def test_real_size_float32_rows_follow_the_target_chain(tmp_path, monkeypatch, n_vocab, params, kind, broken):
    chain, draft_chain = pair(n_vocab)
    if kind in ("eagle", "medusa"):
        target = HiddenWide(chain)
    else:
        target = WideBackend(chain, vocab=spelled(n_vocab) if kind.startswith("cross") else None)
    drafter = drafter_of(kind, target, draft_chain, tmp_path)
    if kind.startswith(("padded", "cross")):
        assert drafter.pairing == ("cross-tokenizer" if kind.startswith("cross") else "padded")
    if kind == "grammar-unaware":  # its drafts are cut at the first token the grammar forbids
        monkeypatch.setattr(drafter, "grammar_aware", False)
    grammar = (lambda: NoRepeatLive(chain)) if kind.startswith("grammar") else None
    if broken:
        if kind == "tree":
            monkeypatch.setattr(verify_module, "verify_candidates", judged_with_replacement)
        elif kind != "cross-unrenormalised":  # that drafter's laws are the broken part
            monkeypatch.setattr(rule_module, "residual", target_instead_of_residual)
    assert chain.rows.dtype == np.float32 and chain.rows.shape[1] == n_vocab
    # fewer runs where a round costs milliseconds (dense float64 draft rows, a top-p sort or a ggml head per draft
    # step), and for a wrong rule (caught at p < 1e-8 with a third of the runs; the exact one needs none for its false
    # alarm rate)
    slow = kind in ("tree", "eagle") or kind == "heads" and params.top_p < 1
    runs = RUNS * 2 // 3 if broken and kind == "tree" else RUNS // 3 if slow or broken else RUNS
    draws, drafted = emitted(chain, target, drafter, params, runs, width=3 if kind == "tree" else 1,
                             gated=kind == "gated", grammar=grammar)
    law = (grammar() if grammar else chain).law(params, int(chain.live[0]), N_TOKENS)
    p = goodness_of_fit(draws, law)
    assert (p < ALPHA) == broken, p
    if kind.startswith("cross"):  # the words only the draft has held mass, which the restriction removed
        assert drafter.intersection_mass < 0.9, drafter.intersection_mass
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
