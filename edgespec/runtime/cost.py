"""How far to draft, from costs measured on this device and acceptance measured on this text.

Per round with k draft tokens, each accepted independently with probability alpha, the expected
number of tokens emitted is (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023, eq. 1), and the
round costs k draft steps plus one target pass over k+1 tokens. The controller picks the k in
[0, k_max] with the most expected tokens per second; k = 0 is plain target decoding. Costs start from
a calibration at load and follow what every round measures; alpha is a decayed running estimate.

A drafter that knows how sure it is (draft models and heads: `gated`) drafts under a DraftGate instead of
to a fixed k: each draft token is kept only while the round's expected tokens per second still rise with
it, the token's acceptance read off the draft's confidence at its position (the top probability of the
draft's law there, never the drawn token's own: that would bias the draft law) through a calibration
learned from every verified round. Where the draft is unsure, the round ends early and the verify pass
stays short; where it is sure, the round drafts up to k_max. The length of a draft is the draft's own
business, decided before the target is consulted, so the output law is untouched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from edgespec.runtime.backend import Backend

EMA = 0.2  # weight of a new timing in the running cost per pass length
DECAY = 0.97  # per observed round: acceptance evidence older than ~30 rounds fades
PRIOR_WEIGHT = 8.0  # pseudo-rounds behind a prior acceptance measured at load
PROBE_EVERY = 32  # rounds at k = 0 before one k = 1 round re-tests acceptance
PROBE_MAX = 256  # ... doubling after every probe that does not bring drafting back, up to this
CONFIDENCE_BINS = 10  # the gate's calibration: acceptance per tenth of the draft's confidence
BIN_PRIOR = 2.0  # pseudo-tokens behind each bin's prior, acceptance = the bin's confidence
BIN_DECAY = 0.99  # per token observed in a bin


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens emitted by a round of k drafts with per-token acceptance alpha."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def agreement(target: Backend, draft: Backend, tokens: list[int]) -> float:
    """Fraction of positions of `tokens` where both models' greedy choices agree (teacher-forced).

    A prior for the acceptance rate before any round has run; both caches are left empty.
    """
    agree = 0
    tokens = tokens[:min(target.n_ctx, draft.n_ctx)]
    for backend in (target, draft):
        backend.rollback(0)
    for start in range(0, len(tokens), 16):  # 16 rows a pass: within every backend's output cap
        chunk = tokens[start:start + 16]
        target_picks, draft_picks = (b.forward(chunk, len(chunk)).argmax(axis=1) for b in (target, draft))
        agree += int((target_picks == draft_picks).sum())
    for backend in (target, draft):
        backend.rollback(0)
    n = len(tokens)
    return agree / n if n else 0.5


def measure_pass_costs(backend: Backend, n_max: int, reps: int = 3, context: int = 32) -> dict[int, float]:
    """Seconds for one forward of n tokens with n logits rows, n = 1..n_max, after `context` tokens.

    The cache is left empty. Takes the median of `reps` timings per n, after one warm-up pass.
    """
    n_vocab = backend.vocab.n_vocab
    filler = [(i * 7919 + 13) % n_vocab for i in range(context + n_max)]
    backend.rollback(0)
    backend.forward(filler[:context], 1)
    costs = {}
    for n in range(1, n_max + 1):
        times = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            backend.forward(filler[context:context + n], n)
            times.append(time.perf_counter() - t0)
            backend.rollback(context)
        costs[n] = sorted(times[1:])[len(times[1:]) // 2]
    backend.rollback(0)
    return costs


@dataclass
class DraftController:
    """Chooses the draft length of each round and learns from each round's outcome."""

    target_costs: dict[int, float]  # n tokens in a verify pass -> seconds
    draft_cost: float  # seconds per drafted token
    k_max: int
    width: int = 1  # candidates per depth of a draft tree: a round of depth k verifies k * width + 1 tokens
    accepted: float = 1.0  # Beta(1, 1) prior on the per-token acceptance
    rejected: float = 1.0
    # the gate's calibration: per confidence bin, decayed counts of draft tokens accepted and rejected
    bin_accepted: list[float] = field(default_factory=lambda: [
        BIN_PRIOR * (i + 0.5) / CONFIDENCE_BINS for i in range(CONFIDENCE_BINS)])
    bin_rejected: list[float] = field(default_factory=lambda: [
        BIN_PRIOR * (1 - (i + 0.5) / CONFIDENCE_BINS) for i in range(CONFIDENCE_BINS)])
    _idle_rounds: int = field(default=0, repr=False)
    _probe_every: int = field(default=PROBE_EVERY, repr=False)

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def verify_cost(self, n: int) -> float:
        """Seconds for a verify pass over n tokens (more than were measured: the widest known, scaled)."""
        if n not in self.target_costs:
            widest = max(self.target_costs)
            return self.target_costs[widest] * n / widest
        return self.target_costs[n]

    def pass_cost(self, k: int) -> float:
        """Seconds for the verify pass of a round k deep: k * width drafts and the last committed token."""
        return self.verify_cost(k * self.width + 1)

    def chain_cost(self, k: int) -> float:
        """Seconds for a chain round of k drafts: k draft steps and a verify pass of k + 1 tokens."""
        return k * self.draft_cost + self.verify_cost(k + 1)

    def acceptance_at(self, confidence: float) -> float:
        """The calibrated chance that a draft token drafted with this confidence is accepted (given the
        tokens before it were)."""
        b = _bin(confidence)
        return self.bin_accepted[b] / (self.bin_accepted[b] + self.bin_rejected[b])

    def gate(self) -> DraftGate:
        """A fresh gate for one round's chain."""
        return DraftGate(self)

    def observe_gate(self, gate: DraftGate, n_drafted: int, n_accepted: int) -> None:
        """Calibrate from a verified gated chain: its first n_drafted tokens were verified (a grammar may
        have cut the rest), n_accepted of them kept. Tokens after the first rejection say nothing."""
        for i, confidence in enumerate(gate.confidences[:min(n_drafted, n_accepted + 1)]):
            b = _bin(confidence)
            self.bin_accepted[b] = BIN_DECAY * self.bin_accepted[b] + (i < n_accepted)
            self.bin_rejected[b] = BIN_DECAY * self.bin_rejected[b] + (i >= n_accepted)

    def predicted_rate(self, k: int) -> float:
        """Expected tokens per second with k drafts per round (alpha: acceptance per depth of a tree)."""
        return expected_tokens(self.alpha, k) / (k * self.draft_cost + self.pass_cost(k))

    def could_pay(self) -> bool:
        """Would some draft length beat target-only decoding if every draft were accepted? If not, the
        draft is too slow for this target and probing its acceptance is pure cost."""
        base = 1.0 / self.target_costs[1]
        return any((k + 1) / (k * self.draft_cost + self.pass_cost(k)) > base for k in range(1, self.k_max + 1))

    def best_k(self) -> int:
        """The draft length with the most expected tokens per second, as acceptance and costs stand."""
        return max(range(self.k_max + 1), key=self.predicted_rate)

    def drafting(self) -> bool:
        """Would the next round draft (no probe counted)?"""
        return self.best_k() > 0

    def choose(self) -> int:
        """The next round's draft length. While no length pays, a round of 1 now and then re-tests acceptance,
        which may have changed with the text. A probe is not cheap for a draft model: before it drafts, it
        reads every token it missed in one batched pass, so probes that do not bring drafting back come ever
        more rarely, and most tokens a declined draft missed are never read (benchmarks/declined_draft.py)."""
        k = self.best_k()
        if k > 0:
            self._idle_rounds, self._probe_every = 0, PROBE_EVERY
            return k
        if not self.could_pay():
            self._idle_rounds = 0
            return 0
        self._idle_rounds += 1
        if self._idle_rounds < self._probe_every:
            return 0
        self._idle_rounds, self._probe_every = 0, min(2 * self._probe_every, PROBE_MAX)
        return 1

    def observe_shadow(self, p_accept: float) -> None:
        """Record a draft that was computed for free but not verified (k = 0 round): the target's
        probability of accepting it is known from the row already computed."""
        self.accepted = DECAY * self.accepted + p_accept
        self.rejected = DECAY * self.rejected + 1.0 - p_accept

    def observe(self, n_drafted: int, n_accepted: int, draft_s: float, target_s: float,
                pass_tokens: int | None = None) -> None:
        """Record one round: n_drafted tokens proposed (a tree: its depth), n_accepted kept, and what each side
        cost; pass_tokens: tokens in the verify pass (default n_drafted + 1, a chain's)."""
        n = pass_tokens if pass_tokens is not None else n_drafted + 1
        old = self.target_costs.get(n, target_s)
        self.target_costs[n] = (1 - EMA) * old + EMA * target_s
        if n_drafted:
            self.draft_cost = (1 - EMA) * self.draft_cost + EMA * draft_s / n_drafted
            self.accepted = DECAY * self.accepted + n_accepted
            self.rejected = DECAY * self.rejected + (n_accepted < n_drafted)


def _bin(confidence: float) -> int:
    return min(int(confidence * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)


class DraftGate:
    """Decides, while a gated drafter drafts one chain, how far it goes. The drafter asks `keep(confidence)`
    of each token it has drawn (False ends the chain before it) and `go_on()` before it pays for the next
    draft step (False ends the chain after the tokens kept).

    Both keep the round's expected tokens per second rising: with s the chance that every kept token is
    accepted and a a token's calibrated acceptance, a token adds s * a expected tokens. Keeping a drawn one
    costs a verify row (its draft step is spent either way); another step costs a draft step and a row, and
    its acceptance is guessed from the last token's (confidence runs in stretches)."""

    def __init__(self, controller: DraftController):
        self.controller = controller
        self.confidences: list[float] = []  # of the kept tokens
        self.survival = 1.0
        self.expected = 1.0  # tokens the round is expected to emit with the kept drafts (the target's one included)

    def keep(self, confidence: float) -> bool:
        c, n = self.controller, len(self.confidences)
        gain = self.survival * c.acceptance_at(confidence)
        spent = (n + 1) * c.draft_cost  # the steps so far, this token's included
        if (self.expected + gain) / (spent + c.verify_cost(n + 2)) <= self.expected / (spent + c.verify_cost(n + 1)):
            return False
        self.confidences.append(confidence)
        self.survival = gain
        self.expected += gain
        return True

    def go_on(self) -> bool:
        c, n = self.controller, len(self.confidences)
        if not n:
            return False
        gain = self.survival * c.acceptance_at(self.confidences[-1])
        return (self.expected + gain) / c.chain_cost(n + 1) > self.expected / c.chain_cost(n)
