"""The speculative decoding loop: one generator of events, for every caller.

Invariant between rounds: the target's cache holds `committed[:-1]`; the last committed token is
fed at the head of the next verify pass, so a pass over [last, d_1..d_k] yields the k+1 rows of
target logits the rule needs. After the rule keeps n drafts, the cache is rolled back to drop the
k - n rejected ones. The draft model (if any) keeps its own cache and re-syncs at its next proposal.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from edgespec.backends.protocol import MAX_OUTPUTS, Backend, reuse
from edgespec.decode import rule
from edgespec.decode.constraint import Constraint
from edgespec.decode.cost import DraftController
from edgespec.decode.sampling import SamplingParams, to_probs
from edgespec.decode.shape import TreeShape
from edgespec.decode.text import TextStream
from edgespec.decode.verify import verify_tree
from edgespec.errors import EdgespecError

if TYPE_CHECKING:  # the drafters the loop drives (drafts/ sits above decode/: it draws from decode's laws)
    from edgespec.drafts.base import Drafter


@dataclass(frozen=True)
class Event:
    token: int | None  # None only for the last event, which releases text held back to the end
    text: str  # what became printable with this token (may be "" or span earlier tokens)
    from_draft: bool  # True when a draft proposed it and the target accepted it


@dataclass
class Stats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens: those the target's cache held already (an earlier turn's prefix)
    generated: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0  # rounds whose drafts were not all accepted: each ended at a draft the verifier rejected
    target_passes: int = 0  # verify passes after the prefill
    tree_nodes: int = 0  # draft tokens verified in tree rounds (drafted counts their depth)
    lookup_drafted: int = 0  # of drafted and accepted: those from prompt lookup in front of the drafter
    lookup_accepted: int = 0
    accept_counts: Counter = field(default_factory=Counter)  # accepted drafts per speculative round
    draft_lengths: Counter = field(default_factory=Counter)  # drafts proposed per round
    prefill_s: float = 0.0  # the prompt through the target, and through a draft model if there is one
    draft_s: float = 0.0
    target_s: float = 0.0
    decode_s: float = 0.0  # wall time after the prefill
    finish_reason: str | None = None  # "stop" (EOS or stop string), "length", "context", "cancelled"
    end_token: int | None = None  # the end-of-generation token that ended the answer, which no Event carries

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def token_acceptance(self) -> float:
        """Accepted over the drafts the verifier judged (each round judges up to its first rejection and no
        further): the chance a judged draft is accepted, alpha in Leviathan et al.'s speedup formula. Unlike
        acceptance_rate it does not fall when chains grow longer, since drafts after a rejection are not judged."""
        judged = self.accepted + self.rejected
        return self.accepted / judged if judged else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Mean accepted drafts over rounds that drafted something."""
        n = sum(self.accept_counts.values())
        return sum(k * c for k, c in self.accept_counts.items()) / n if n else 0.0

    @property
    def produced(self) -> int:
        """Tokens the decode produced, one a pass position kept: the generated ones and the end-of-generation token
        that ended the answer, if one did (as llama-server's predicted_n counts them)."""
        return self.generated + (self.end_token is not None)

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.decode_s if self.decode_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "token_acceptance": round(self.token_acceptance, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "accepted_length_histogram": {str(k): v for k, v in sorted(self.accept_counts.items())},
            "draft_length_histogram": {str(k): v for k, v in sorted(self.draft_lengths.items())},
            "target_passes": self.target_passes,
            "tree_nodes": self.tree_nodes,
            "lookup_drafted": self.lookup_drafted,
            "lookup_accepted": self.lookup_accepted,
            "prefill_time_s": round(self.prefill_s, 4),
            "draft_time_s": round(self.draft_s, 4),
            "target_time_s": round(self.target_s, 4),
            "decode_time_s": round(self.decode_s, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "finish_reason": self.finish_reason,
        }


def speculate(
    target: Backend,
    drafter: Drafter | None,
    controller: DraftController | None,
    prompt: Sequence[int],
    params: SamplingParams,
    rng: np.random.Generator,
    *,
    max_tokens: int,
    stop: Sequence[str] = (),
    draft_max: int | None = None,
    stats: Stats | None = None,
    constraint: Constraint | None = None,
    tree_width: int = 1,
    gate: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[Event]:
    """Generate up to max_tokens after `prompt`, yielding one Event per emitted token.

    draft_max fixes the draft length (0 = target only); None lets the controller choose each round.
    constraint: a grammar over the answer (decode/constraint.py), fresh; the loop advances it.
    tree_width: above 1, a drafter that drafts trees (propose_tree: Medusa and EAGLE heads) proposes up to that
    many candidates a node, in the shape the controller plans from its costs (a chain where wider passes do not
    pay) or, with draft_max, draft_max depths of that many each; the target verifies the tree in one pass
    (forward_tree: llama.cpp); rounds under a constraint, or with another drafter or target, draft chains.
    gate: a drafter that knows how sure it is (`gated`: draft models, heads) drafts chains under the
    controller's DraftGate, which ends each chain where one more token would not pay (with draft_max None).
    clock: seconds for every time the loop takes (a simulated device's virtual clock: plan/sim.py).

    Output is distributed exactly as target-only sampling with `params` (under the constraint, if any),
    whatever the drafter.
    Fills `stats` (pass one in to read it afterwards), including the reason generation ended.
    """
    stats = stats if stats is not None else Stats()
    if not prompt:
        raise EdgespecError("the prompt is empty")
    if max_tokens < 1:
        raise EdgespecError(f"max tokens must be at least 1, got {max_tokens}")
    if len(prompt) >= target.n_ctx:
        raise EdgespecError(f"the prompt has {len(prompt)} tokens but the context holds {target.n_ctx}: "
                            "shorten the prompt or raise the context (--ctx, n_ctx)")
    if tree_width < 1:
        raise EdgespecError(f"tree width must be at least 1, got {tree_width}")
    return _rounds(target, drafter, controller, list(prompt), params, rng, max_tokens, stop, draft_max, stats,
                   constraint, tree_width, gate, clock)


def _rounds(target, drafter, controller, committed, params, rng, max_tokens, stop, draft_max, stats, constraint,
            tree_width, gate, clock):
    """The generator behind `speculate`, which validated its arguments eagerly."""
    stats.prompt_tokens = len(committed)
    eog, pieces = target.vocab.eog_ids, target.vocab.pieces
    text = TextStream(stop)
    trees = tree_width > 1 and constraint is None and drafter is not None and drafter.trees and target.trees
    gated = gate and draft_max is None and not trees and drafter is not None and drafter.gated
    # a round of length 0 knows its pass's token before it hands the token out: a backend that can start the pass
    # then (llama.cpp on a GPU) computes while the text, the stats and the consumer take their turn. So the next
    # round's length is chosen first, and a round the controller declines starts ahead as target-only's do
    started = False  # the next round's pass is under way
    k_next = None  # the next round's length, where it was chosen before this round's tokens were handed out

    def length(room: int, left: int) -> int:  # the next round's, with `room` cells free and `left` tokens to go
        return min(draft_length(drafter, controller, committed, draft_max, gated), room - 1, left - 1)

    t_start = clock()
    if drafter is not None:  # a drafter that follows the target's states starts without one
        drafter.reset()
    stats.cached_tokens = reuse(target, committed[:-1])  # an earlier turn's prefix, or a saved state's
    target.forward(committed[stats.cached_tokens:-1], 0)
    # a draft model reads the prompt too, as prefill work, where it will draft: one the controller declines reads
    # it only if a probe comes
    if drafter is not None and draft_max != 0 and (draft_max is not None or controller.begin(len(committed))):
        drafter.catch_up(committed)
    t_decode = clock()
    stats.prefill_s += t_decode - t_start
    decode_base = stats.decode_s

    try:
        while stats.finish_reason is None:
            room = target.n_ctx - len(committed)  # the pass appends 1 + k tokens to len - 1 cached
            if room <= 0:
                stats.finish_reason = "context"
                break
            k = k_next if k_next is not None else length(room, max_tokens - stats.generated)
            if k > 0:  # untimed for the controller: catching up is not a cost of drafting k more
                t = clock()
                drafter.catch_up(committed)
                stats.draft_s += clock() - t
            t0 = clock()
            steps = None  # the draft's steps this round, where a gate counted them (else one per draft)
            if k > 0 and trees:
                shape = _tree_shape(drafter, controller, k, draft_max, tree_width, room,
                                    max_tokens - stats.generated)
                drafts, n_acc, token, n_pass, k_round, t1, t2 = _tree_round(target, drafter, controller, committed,
                                                                            shape, params, rng, clock)
                stats.tree_nodes += n_pass - 1
            else:
                round_gate = controller.gate() if gated and k > 0 else None
                drafts, n_acc, token, target_laws, t1, t2 = _chain_round(target, drafter, committed, k, params,
                                                                         rng, constraint, round_gate, clock,
                                                                         started)
                n_pass, k_round = len(drafts) + 1, len(drafts)
                if round_gate is not None:
                    controller.observe_gate(round_gate, len(drafts), n_acc)
                    steps = round_gate.steps or None
            if drafter is not None:  # heads read the state that produced the committed token
                drafter.observe_target(target, n_acc, len(committed) - 1)  # the pass's first row sat there

            stats.target_passes += 1
            stats.draft_s += t1 - t0
            stats.target_s += t2 - t1
            stats.draft_lengths[k_round] += 1
            looked_up = k_round and drafter.last_free  # prompt lookup in front of the drafter
            if k_round:
                stats.drafted += k_round
                stats.accepted += n_acc
                stats.rejected += n_acc < k_round
                stats.accept_counts[n_acc] += 1
                if looked_up:
                    stats.lookup_drafted += k_round
                    stats.lookup_accepted += n_acc
            learn = None  # what a round the drafter sat out teaches, learnt once the next pass has started
            if drafter is not None:  # a round drafted by prompt lookup in front of the drafter teaches lookup's own
                learner = controller.lookup_rounds() if looked_up else controller
                if k_round:
                    learner.observe(k_round, n_acc, t1 - t0, t2 - t1, pass_tokens=n_pass, draft_steps=steps)
                else:
                    # a free drafter's guess, made before the context grows; the row's law is in hand (computed to
                    # draw the token), so a pass started next cannot replace it
                    guess = drafter.propose(committed, 1, params, rng) if k == 0 and drafter.free else ([], None)
                    learn = (learner, t1 - t0, t2 - t1, n_pass, target_laws[0] if guess[0] else None, guess)

            kept = [*drafts[:n_acc], token]
            committed.extend(kept)  # what the next round's length is chosen for; generation may end inside it
            left = max_tokens - stats.generated - len(kept)
            k_next, started = None, False
            if left > 0 and len(committed) < target.n_ctx and eog.isdisjoint(kept):  # another round follows
                k_next = length(target.n_ctx - len(committed), left)
                started = k_next == 0 and target.prefetch([token])
            # learnt while the next pass computes, where one started: the round after next is the first that this
            # round's score can move, so that a declined draft costs target-only decoding nothing
            if learn is not None:
                _learn_declined(*learn, steps)
            if k_next == 0 and drafter is not None:
                drafter.ahead(committed)
            for i, tok in enumerate(kept):
                if constraint is not None:
                    constraint.consume(tok)
                if tok in eog:
                    stats.finish_reason, stats.end_token = "stop", tok
                    break
                stats.generated += 1
                stats.decode_s = decode_base + clock() - t_decode  # live: tokens/s mid-stream too
                piece = text.feed(pieces[tok])
                yield Event(tok, piece, from_draft=i < n_acc)
                if text.stopped:
                    stats.finish_reason = "stop"
                    break
                if stats.generated >= max_tokens:
                    stats.finish_reason = "length"
                    break
        tail = text.flush()
        if tail:
            yield Event(None, tail, from_draft=False)
    finally:  # also reached when the consumer closes the stream early
        if stats.finish_reason is None:
            stats.finish_reason = "cancelled"
        stats.decode_s = decode_base + clock() - t_decode


def _learn_declined(learner, draft_s, target_s, n_pass, row_law, guess, steps) -> None:
    """What a round without drafts teaches its controller: the one-token pass's cost, and where a free drafter
    guessed, what the target would have kept of the guess (its shadow score against the row's law)."""
    learner.observe(0, 0, draft_s, target_s, pass_tokens=n_pass, draft_steps=steps)
    if row_law is not None:
        tokens, probs = guess
        learner.observe_shadow(rule.acceptance(row_law, rule.as_laws(probs, 1)[0], tokens[0]))


def draft_length(drafter, controller, committed, draft_max=None, gated=False) -> int:
    """The draft length of the round after `committed` (0: the target alone), the one place it is decided: the
    drafter offers what it has (prompt lookup: the length of its match), the controller decides. Asked once a
    round, at the end of the round before where one came (its tokens not handed out yet), so that a round of
    length 0 can start its pass first; the loop clips it to the context's room and the tokens left."""
    if drafter is None:
        return 0
    if draft_max is not None:  # the caller's fixed length (a lookup match shorter than it proposes what it has)
        return draft_max
    if drafter.free:  # prompt lookup alone, scored every round, never probed: the best length among what it found
        # (a length priced without asking what lookup has can be a shorter match verified at a loss:
        # docs/results/2026-11-26-declined-draft.md); where no length pays the search can wait (drafter.ahead)
        return controller.best_up_to(drafter.offer(committed, controller.k_max)) if controller.best_k() else 0
    k = controller.choose()
    if gated and k > 0:  # the gate decides how far, up to the longest the controller allows
        k = controller.k_max
    if drafter.offer(committed, 1):  # prompt lookup in front of the drafter has a match: its own controller decides
        lookup = controller.lookup_rounds()
        k = lookup.choose()
        found = drafter.offer(committed, k) if k else 0  # a shorter match may not pay
        k = k if found == k else lookup.best_up_to(found)
    return k


def _chain_round(target, drafter, committed, k, params, rng, constraint, gate=None, clock=time.perf_counter,
                 started=False):
    """Draft up to k tokens (0: none; a gate may end the chain sooner), verify them in one pass (started: the
    target is computing the pass over the last committed token already, k is 0); the target's cache keeps the
    accepted ones. Returns (drafts, accepted, next token, the target's laws (rule.Rows), draft end
    time, verify end time)."""
    drafts, draft_probs = [], None
    if k > 0:
        options = {"constraint": constraint} if constraint and drafter.grammar_aware else {}
        if gate is not None:
            options["gate"] = gate
        drafts, draft_probs = drafter.propose(committed, k, params, rng, **options)
        drafts, draft_probs = _until_end(drafts, draft_probs, target.vocab.eog_ids)
    allowed = None
    if constraint is not None:
        drafts, draft_probs, allowed = _constrain(constraint, drafts, draft_probs)
    t1 = clock()
    # the rows are read before the target's next pass: a view of its buffer where it has one
    if started:
        logits = target.collect()  # [1, V]
    else:
        logits = target.forward([committed[-1], *drafts], len(drafts) + 1, copy=False)  # [k+1, V]
    if allowed is not None:  # the grammar first, then temperature, top-k, ... on what it allows
        logits = np.where(allowed, logits, -np.inf)
    target_laws = rule.Rows(logits, params)  # each row processed when the rule first reads it
    # k = 0 is the same rule with nothing to accept: a plain target sample
    n_acc, token = rule.verify(target_laws, rule.as_laws(draft_probs, len(drafts)), drafts, target.vocab.n_vocab, rng)
    t2 = clock()
    if len(committed) + n_acc < len(target.tokens):  # nothing to drop after a round that kept every draft
        target.rollback(len(committed) + n_acc)
    return drafts, n_acc, token, target_laws, t1, t2


def _tree_shape(drafter, controller, k, draft_max, width, room, left):
    """The tree of a round the loop chose to draft (k > 0). A fixed draft length: k depths, each with width
    candidates (the first continuing the chain). Otherwise the shape with the most expected tokens per second
    (decode/shape.py) under the controller's costs and the acceptance it learnt per rank, up to `width`
    candidates a node, k_max deep, fitting the context and one pass; a chain of one where no tree pays but the
    controller drafts (a probe)."""
    if draft_max is not None:
        k = min(k, (room - 1) // width, (MAX_OUTPUTS - 1) // width)
        return TreeShape.chain(k, width)
    shape = controller.trees.shape(controller, max_nodes=min(room - 1, MAX_OUTPUTS - 1),
                                   max_depth=min(controller.k_max, left - 1), width=width,
                                   branching=drafter.branching)
    return shape if shape.size else TreeShape.chain(1)


def _tree_round(target, drafter, controller, committed, shape, params, rng, clock=time.perf_counter):
    """Draft the tree `shape` plans, verify it in one pass (the controller learns which ranks were kept); the
    target's cache keeps the accepted branch. Returns (accepted tokens, their number, next token, tokens in the
    pass, the tree's depth, draft end time, verify end time)."""
    tree = drafter.propose_tree(committed, shape, params, rng)
    t1 = clock()
    logits = target.forward_tree([committed[-1], *tree.tokens], [-1, *(p + 1 for p in tree.parents)])  # [n+1, V]
    path, token = verify_tree(to_probs(logits, params), tree.probs, np.asarray(tree.tokens, dtype=np.int64),
                              np.asarray(tree.parents, dtype=np.int64), rng)
    t2 = clock()
    target.keep_branch([0, *(i + 1 for i in path)])  # the root and the accepted nodes; last_hidden their rows
    if controller is not None:
        controller.trees.ranks.observe_tree(tree.parents, path)
    accepted = [tree.tokens[i] for i in path]
    return accepted, len(accepted), token, len(tree.tokens) + 1, tree.depth, t1, t2


def verified_length(drafts, eog) -> int:
    """How many of a draft's tokens a round verifies: those up to its first end-of-generation token. The answer ends
    there if the target accepts it, so rows after it would be verified, and counted as accepted, for nothing. A
    stopping rule on the drafted tokens, as a gate's: the rule stays exact."""
    return next((i + 1 for i, token in enumerate(drafts) if token in eog), len(drafts))


def _until_end(drafts, draft_probs, eog):
    """The draft cut to its verified_length."""
    n = verified_length(drafts, eog)
    if n == len(drafts):
        return drafts, draft_probs
    return drafts[:n], None if draft_probs is None else rule.as_laws(draft_probs, len(drafts))[:n]


def _constrain(constraint, drafts, draft_probs):
    """Cut the draft at its first token the grammar forbids; mask and renormalise the draft rows kept; the
    allowed sets for the k+1 target rows [k+1, V]. The constraint is left where it was."""
    allowed = [constraint.allowed()]
    kept = 0
    for token in drafts:
        if not allowed[-1][token] or not constraint.consume(token):
            break
        kept += 1
        allowed.append(constraint.allowed())
    constraint.rollback(kept)
    allowed = np.stack(allowed)  # [kept+1, V]
    draft_laws = rule.restrict(rule.as_laws(draft_probs, len(drafts))[:kept], allowed[:kept])
    return drafts[:kept], draft_laws, allowed
