"""Drafters: who proposes the next k tokens. The loop verifies; a drafter only guesses.

A drafter returns tokens [<=k] and the laws it drew them from: a list of decode/laws.Law (a draft model),
dense probability rows [<=k, V] (heads), or None for a deterministic guess (prompt lookup): each token had
probability 1, for which the verification rule reduces to "accept with the target's probability of that
token", and stays exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgespec.backends.padded import PaddedDraft
from edgespec.backends.protocol import MAX_OUTPUTS, Backend, check_compatible, common_prefix, sync
from edgespec.decode.laws import Law, NoLaw, law
from edgespec.decode.sampling import SamplingParams, candidates, to_probs
from edgespec.decode.shape import TreeShape, tree_depth
from edgespec.drafts.ngram import NgramIndex

MAX_DRAFT = MAX_OUTPUTS  # room a draft model keeps in its context for a proposal
DRAFT_WINDOWS = (1024, 512, 256)  # recent tokens a draft model reads (the planner tries them in turn)


class Drafter:
    """What the loop asks of a drafter, every optional ability declared here with what a drafter without it does,
    so that the loop never asks whether a drafter has one:
    - propose (each drafter's own): up to k tokens continuing `context`, and their laws (the module docstring);
    - propose_tree, where `trees`: the tree a TreeShape plans (decode/shape.py), drawn as a DraftTree and verified
      in one pass (heads); where not also `branching`, the shape's guesses past the first at a node are leaves;
    - reset, before each generation; catch_up, to read context[:-1] before proposing (a cache of its own);
    - observe_target, after each verify pass: the target's state that produced the committed token (heads);
    - offer: how many tokens prompt lookup has to propose next (None: the next proposal is not lookup's); the
      controller decides the length from it (decode/loop.draft_length);
    - ahead: after a round the controller declined, once the next pass is under way: work for the next round
      done while the target computes (prompt lookup's search, which its shadow score reads).
    Flags: free (proposing costs no model call: the loop scores its guesses in rounds it does not draft, and the
    controller weighs what it offers), gated (knows how sure it is: drafts under the controller's DraftGate),
    grammar_aware (drafts under a grammar's mask: propose takes constraint=), last_free (its last proposal was
    prompt lookup's, taught to the controller's lookup_rounds). A drafter holds no controller."""

    name = "draft"
    free = False
    gated = False
    grammar_aware = False
    trees = False
    branching = False
    last_free = False

    def propose(self, context: list[int], k: int, params: SamplingParams, rng: np.random.Generator,
                **options) -> tuple[list[int], list[Law] | np.ndarray | None]:
        """Up to k tokens continuing `context`, and the laws they were drawn from (see the module docstring)."""
        raise NotImplementedError

    def propose_tree(self, context: list[int], shape: TreeShape, params: SamplingParams,
                     rng: np.random.Generator) -> DraftTree:
        raise NotImplementedError(f"{self.name} drafts chains, not trees")

    def reset(self) -> None:
        """Before a generation (another text)."""

    def catch_up(self, context: list[int]) -> None:
        """Read `context[:-1]` before proposing, so that proposing costs k steps and not the tokens missed while the
        loop did not draft."""

    def observe_target(self, target: Backend, n_accepted: int, position: int) -> None:
        """After a verify pass: the target's state at `position` produced the committed token (heads read it)."""

    def offer(self, context: list[int], k: int) -> int | None:
        """How many tokens (up to k) prompt lookup would propose after `context` (0: it found none), or None where
        the next proposal is not lookup's (a model's or heads')."""
        return None

    def ahead(self, context: list[int]) -> None:
        """The next round will read `context`: a chance to prepare while the target's pass computes."""

    def close(self) -> None:
        """Free what the drafter holds itself (llama.cpp contexts beside the target's); before the target closes."""


@dataclass(frozen=True)
class DraftTree:
    """Draft tokens as a tree under the last committed token (the root), for decode/verify.verify_tree.

    Nodes follow their parents; the children of a node are in the order they were drawn."""

    tokens: list[int]  # [n]
    parents: list[int]  # [n]: -1 for a child of the root, else the index of an earlier node
    probs: np.ndarray  # [n+1, V]: the law each node's children were drawn from; row 0 the root's, row i+1 node i's

    @property
    def depth(self) -> int:
        """Nodes on the longest path from the root: the most tokens a round can accept."""
        return tree_depth(self.parents)


def confidence(logits: np.ndarray) -> float:
    """How sure a draft is at a position: the top probability of its raw logits there (temperature 1, no
    filters; greedy drafting makes every law one-hot), what a DraftGate reads.

    It must not depend on the token drawn there: keeping a draw for what it is would keep some tokens more
    often than the draft law says, and the rule, judging them by that law, would no longer be exact (a test
    checks this is caught). A function of the position's logits is a function of the tokens before it."""
    logits = np.asarray(logits)  # float32 from a model: a bin of the calibration needs no more
    return float(1.0 / np.exp(logits - logits.max()).sum())


def head_chain_cost(drafter: Drafter, context: list[int], reps: int = 5, k: int = 4) -> float:
    """Seconds per drafted token of a head's k-token chain after `context` (the median of reps; the entries for
    the context written before the clock starts), for the controller's prior. The drafter is reset after."""
    return _median_proposal(drafter, [*context, context[-1]], context, k, reps) / k


def head_round_costs(drafter: Drafter, context: list[int], reps: int = 5, k: int = 4) -> tuple[float, float]:
    """(start, step): seconds a drafting round of a head spends besides its steps, and per step, from chains of 1 and
    k tokens after `context` (medians of reps), each round writing the entry of the context's last token first as a
    round after a verify pass does; the controller's prior (DraftController.draft_start, draft_cost)."""
    one = _median_proposal(drafter, context, context, 1, reps)
    step = max(_median_proposal(drafter, context, context, k, reps) - one, 0.0) / (k - 1)
    return max(one - step, 0.0), step


def _median_proposal(drafter: Drafter, read: list[int], context: list[int], k: int, reps: int) -> float:
    """The median seconds of propose(context, k) after a reset and catch_up(read); the drafter is reset after."""
    import time

    times = []
    for _ in range(reps):
        drafter.reset()
        drafter.catch_up(read)
        t = time.perf_counter()
        drafter.propose(context, k, SamplingParams(), np.random.default_rng(0))
        times.append(time.perf_counter() - t)
    drafter.reset()
    return sorted(times)[reps // 2]


def chain_with_siblings(first_logits: np.ndarray, step: Callable[[int, int], np.ndarray], k: int, width: int,
                        params: SamplingParams, rng: np.random.Generator, n_vocab: int,
                        ids: np.ndarray | None = None, gate=None) -> DraftTree:
    """The tree a head drafts: a chain of k tokens, each with up to width - 1 siblings that are leaves.

    At each depth the candidates come from the head's distribution there (sampling.candidates); the first
    continues the chain, so the head runs once per depth as for a chain, and the siblings only widen the
    verify pass. first_logits: the head's logits [S] for the first draft position; step(token, i): its
    logits for position i + 1 once the chain has `token` at position i; ids maps the S outputs to vocabulary
    ids (None: S is the vocabulary). gate (gate.DraftGate): asked with each depth's confidence whether to keep
    that depth, and before each further step whether to take it."""
    ids = np.arange(len(first_logits)) if ids is None else ids
    tokens: list[int] = []
    parents: list[int] = []
    laws: list[tuple[int, np.ndarray]] = []  # (tree row, the law over ids its children came from)
    logits, parent = first_logits, -1
    for i in range(k):
        q = to_probs(logits, params)  # [S]
        picks = candidates(logits, q, width, params, rng)
        if gate is not None and not gate.keep(confidence(logits)):
            break
        laws.append((parent + 1, q))
        chain = len(tokens)
        for pick in picks:
            tokens.append(int(ids[pick]))
            parents.append(parent)
        parent = chain
        if i + 1 < k:
            if gate is not None and not gate.go_on():
                break
            logits = step(tokens[chain], i)
    probs = np.zeros((len(tokens) + 1, n_vocab))
    for row, q in laws:
        probs[row, ids] = q
    return DraftTree(tokens, parents, probs)


def grow_tree(shape: TreeShape, expand: Callable[[list[int]], np.ndarray | None], params: SamplingParams,
              rng: np.random.Generator, n_vocab: int, ids: np.ndarray | None = None) -> DraftTree:
    """The tree `shape` plans, drawn. Each node the shape gives children draws them from expand(path), its logits
    [S] given the tokens from the root to it (path; [] at the root): its first, second, ... candidates
    (sampling.candidates, the law verify_tree assumes), in the shape's rank order. Nodes are drawn breadth first,
    so a drafter that steps along one chain (branching False: only first guesses have children) is asked for each
    depth in turn. Where a law has fewer tokens than the node's planned children, or expand returns None (deeper
    than a drafter reaches), the node gets fewer, and the planned subtrees under the missing ones go too.
    ids maps the S outputs to vocabulary ids (None: S is the vocabulary)."""
    planned: list[list[int]] = [[] for _ in range(shape.size + 1)]  # by row: 0 = the root
    for node, parent in enumerate(shape.parents):
        planned[parent + 1].append(node)
    tokens: list[int] = []
    parents: list[int] = []
    laws: list[tuple[int, np.ndarray]] = []  # (tree row, the law over ids its children came from)
    queue: list[tuple[int, int, list[int]]] = [(-1, -1, [])]  # (shape node, drafted node, tokens root to it)
    for shape_node, drafted, path in queue:  # grows while read: breadth first
        children = sorted(planned[shape_node + 1], key=lambda c: shape.ranks[c])
        logits = expand(path) if children else None
        if logits is None:
            continue
        q = to_probs(logits, params)
        picks = candidates(logits, q, len(children), params, rng)
        laws.append((drafted + 1, q))
        for child, pick in zip(children, picks, strict=False):  # fewer picks where the law has fewer tokens
            token = int(pick if ids is None else ids[pick])
            queue.append((child, len(tokens), [*path, token]))
            tokens.append(token)
            parents.append(drafted)
    probs = np.zeros((len(tokens) + 1, n_vocab))
    for row, q in laws:
        if ids is None:
            probs[row] = q
        else:
            probs[row, ids] = q
    return DraftTree(tokens, parents, probs)


# the shortest repeated n-gram a LookupFirstDrafter trusts over its inner drafter: from three tokens on, a
# match is right first 65 % of the time, from one or two 19 % and 43 % (experiments/lookup.py)
LOOKUP_FIRST_MIN_NGRAM = 3

CATCH_UP_LAG = 2  # tokens a draft model may lag behind and still read them in its proposal's first pass


class ModelDrafter(Drafter):
    """A smaller (or quantized) model sharing the target's vocabulary, or that vocabulary padded (backends/padded.py);
    it keeps its own KV cache.

    Its context may be shorter than the target's: it then reads a window of recent tokens. The window
    starts at a fixed token and jumps forward by half the draft's context when the text outgrows it, so
    the draft's cache is rebuilt once per n_ctx / 2 tokens, not every step. Which tokens a draft reads
    changes its guesses, never the output (the rule verifies whatever it proposes).
    """

    def __init__(self, backend: Backend, target_vocab=None):
        # "exact", or "padded": the target's tokens up to padding ids more or fewer, rows handed over in its ids
        self.pairing = "exact" if target_vocab is None else check_compatible(target_vocab, backend.vocab)
        if self.pairing == "padded":
            backend = PaddedDraft(backend, target_vocab)
        self.backend = backend
        self.name = f"model:{backend.name}"
        self._start = 0  # index in the context of the first token the draft reads
        self._room = min(MAX_DRAFT, backend.n_ctx // 2)  # context kept free for what it drafts

    def vocabulary(self) -> dict:
        """How its vocabulary pairs with the target's, for placements."""
        return {"vocabulary": self.pairing}

    def visible(self, context: list[int]) -> list[int]:
        """The tail of `context` the draft reads, leaving room for a draft after it."""
        n_ctx, room = self.backend.n_ctx, self._room
        if len(context) + room <= n_ctx:
            self._start = 0
        elif not self._start < len(context) <= self._start + n_ctx - room:
            self._start = len(context) - (n_ctx - room) // 2
        return context[self._start:]

    grammar_aware = True  # proposes from its distribution masked by a constraint, when given one

    def catch_up(self, context: list[int]) -> None:
        """A draft model that lags by at most CATCH_UP_LAG tokens (after any drafting round: the target's token, and
        the last draft when all were accepted) is left as it is: its proposal reads them in one pass with the token
        it must score, cheaper than two passes (measured here, SmolLM2 Q4_0: 11.5 ms for 2 tokens and a row of
        logits against 7.9 + 10.1 ms)."""
        seen = self.visible(context)
        if len(seen) - common_prefix(self.backend.tokens, seen) > CATCH_UP_LAG:
            sync(self.backend, seen[:-1], 0)

    gated = True  # knows how sure it is: the loop may end its chain by confidence (gate.DraftGate)

    def propose(self, context, k, params, rng, constraint=None, gate=None):
        seen = self.visible(context)
        k = min(k, self.backend.n_ctx - len(seen))
        if k <= 0:
            return [], []
        logits = sync(self.backend, seen, 1)[0]  # [V]
        tokens, laws = [], []
        eog = self.backend.vocab.eog_ids
        consumed = 0  # tokens the constraint advanced by, undone at the end
        while True:
            if constraint is not None:  # the grammar's mask before sampling, as the loop does for the target
                logits = np.where(constraint.allowed(), logits, -np.inf)
            try:
                row_law = law(logits, params)
            except NoLaw:  # the draft's row allows no token (its grammar's mask, a NaN): the chain ends here
                break
            token = draw(row_law, rng)
            if gate is not None and not gate.keep(confidence(logits)):
                break
            tokens.append(token)
            laws.append(row_law)
            if constraint is not None:
                if not constraint.consume(token):
                    break
                consumed += 1
            if len(tokens) == k or token in eog:  # nothing worth drafting past the end
                break
            if gate is not None and not gate.go_on():
                break
            logits = self.backend.forward([token], 1, copy=False)[0]  # read before the next step
        if constraint is not None:
            constraint.rollback(consumed)
        return tokens, laws


    trees = True  # proposes trees too (propose_tree), whose guesses past the first at a node are leaves

    def propose_tree(self, context, shape, params, rng):
        """The tree `shape` plans (grow_tree): the draft steps along its first guesses, one pass per depth as for a
        chain, and its later guesses at each depth come from the same row, as leaves (branching False), so only the
        target's verify pass grows. Nothing is drafted past an end-of-generation token."""
        seen = self.visible(context)
        depth = min(shape.depth, self.backend.n_ctx - len(seen))
        if depth <= 0:
            return DraftTree([], [], np.zeros((1, self.backend.vocab.n_vocab)))
        first = sync(self.backend, seen, 1)[0]  # [V]
        eog = self.backend.vocab.eog_ids

        def expand(path):
            if not path:
                return first
            if len(path) >= depth or path[-1] in eog:
                return None
            return self.backend.forward([path[-1]], 1, copy=False)[0]

        return grow_tree(shape, expand, params, rng, len(first))


class PromptLookupDrafter(Drafter):
    """Prompt lookup decoding: find the latest earlier occurrence of the context's last n-gram
    (longest n first) and propose the tokens that followed it. Costs no model call."""

    def __init__(self, n_vocab: int, max_ngram: int = 3, min_ngram: int = 1):
        self.n_vocab, self.max_ngram, self.min_ngram = n_vocab, max_ngram, min_ngram
        self.name = "ngram"
        self.free = True  # proposing costs no model call: the loop may score guesses it did not verify
        self._index = NgramIndex(max_ngram, min_ngram)

    def offer(self, context: list[int], k: int) -> int:
        return len(self._index.lookup(context, k))

    def ahead(self, context: list[int]) -> None:
        """The search the next round's guess reads (scored in a round lookup sits out), made while the pass computes
        rather than before it starts."""
        self._index.lookup(context, 1)

    def propose(self, context, k, params, rng):
        """Tokens with probability 1 each: no law."""
        return self._index.lookup(context, k), None

    def reset(self) -> None:
        """Before a generation (another text)."""
        self._index.reset()


class LookupFirstDrafter(Drafter):
    """Prompt lookup where the text repeats itself, another drafter (a draft model or heads) elsewhere.

    Where the context's last min_ngram or more tokens occurred before, the tokens that followed them are the
    proposal (free, one-hot); otherwise the inner drafter proposes. Which one proposes depends on the context
    only, so the output law is untouched. Lookup rounds have a controller of their own (the inner drafter's
    controller's lookup_rounds: its acceptance, no draft cost, the same pass costs), which picks their length,
    also where the inner drafter would not pay; they teach the inner one's nothing.
    The inner drafter's cache and its view of the target's states stay its own business."""

    def __init__(self, inner: Drafter, n_vocab: int, min_ngram: int = LOOKUP_FIRST_MIN_NGRAM, max_ngram: int = 4):
        self.inner, self.n_vocab = inner, n_vocab
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.name = f"ngram+{inner.name}"
        self.gated, self.grammar_aware = inner.gated, inner.grammar_aware
        self.last_free = False  # the last proposal came from lookup
        self._index = NgramIndex(max_ngram, min_ngram)

    def offer(self, context: list[int], k: int) -> int | None:
        """Lookup's match up to k where the context has one (the next proposal is lookup's), else None."""
        return len(self._index.lookup(context, k)) or None

    def catch_up(self, context: list[int]) -> None:
        """The inner drafter catches up only for a round it drafts: after lookup rounds it reads what it missed
        in one pass, not one pass a round."""
        if not self._index.lookup(context, 1):
            self.inner.catch_up(context)

    def propose(self, context, k, params, rng, **options):
        """options (constraint, gate) go to the inner drafter; a lookup proposal needs neither."""
        tokens = self._index.lookup(context, k)
        self.last_free = bool(tokens)
        if tokens:
            return tokens, None
        return self.inner.propose(context, k, params, rng, **options)

    def reset(self) -> None:
        """Before a generation (another text)."""
        self._index.reset()
        self.inner.reset()

    def observe_target(self, target, n_accepted: int, position: int) -> None:
        self.inner.observe_target(target, n_accepted, position)

    def close(self) -> None:
        self.inner.close()


def draw(row_law: Law, rng: np.random.Generator) -> int:
    """A draft token from its law (a greedy law draws nothing from rng)."""
    return row_law.sample(rng)
