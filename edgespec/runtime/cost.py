"""How far to draft, from costs measured on this device and acceptance measured on this text.

Per round with k draft tokens, each accepted independently with probability alpha, the expected
number of tokens emitted is (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023, eq. 1), and the
round costs k draft steps plus one target pass over k+1 tokens. The controller picks the k in
[0, k_max] with the most expected tokens per second; k = 0 is plain target decoding. Costs start from
a calibration at load and follow what every round measures; alpha is a decayed running estimate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from edgespec.runtime.backend import Backend

EMA = 0.2  # weight of a new timing in the running cost per pass length
DECAY = 0.97  # per observed round: acceptance evidence older than ~30 rounds fades
PRIOR_WEIGHT = 8.0  # pseudo-rounds behind a prior acceptance measured at load
PROBE_EVERY = 32  # rounds at k = 0 before one k = 1 round re-tests acceptance


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
    _idle_rounds: int = field(default=0, repr=False)

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def pass_cost(self, k: int) -> float:
        """Seconds for the verify pass of a round k deep: k * width drafts and the last committed token."""
        n = k * self.width + 1
        if n not in self.target_costs:  # a tree wider than what was measured: the widest known, scaled
            widest = max(self.target_costs)
            return self.target_costs[widest] * n / widest
        return self.target_costs[n]

    def predicted_rate(self, k: int) -> float:
        """Expected tokens per second with k drafts per round (alpha: acceptance per depth of a tree)."""
        return expected_tokens(self.alpha, k) / (k * self.draft_cost + self.pass_cost(k))

    def could_pay(self) -> bool:
        """Would some draft length beat target-only decoding if every draft were accepted? If not, the
        draft is too slow for this target and probing its acceptance is pure cost."""
        base = 1.0 / self.target_costs[1]
        return any((k + 1) / (k * self.draft_cost + self.pass_cost(k)) > base for k in range(1, self.k_max + 1))

    def choose(self) -> int:
        k = max(range(self.k_max + 1), key=self.predicted_rate)
        if k == 0 and self.could_pay():
            self._idle_rounds += 1
            if self._idle_rounds >= PROBE_EVERY:  # acceptance may have changed with the text
                self._idle_rounds = 0
                return 1
        else:
            self._idle_rounds = 0
        return k

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
