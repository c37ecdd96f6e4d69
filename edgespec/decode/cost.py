"""How far to draft, from costs measured on this device and acceptance measured on this text.

Per round with k draft tokens, each accepted independently with probability alpha, the expected number of tokens
emitted is (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023, eq. 1), and the round costs k draft steps plus
one target pass over k+1 tokens. The controller picks the k in [0, k_max] with the most expected tokens per
second; k = 0 is plain target decoding. Costs start from a calibration at load (decode/calibrate.py) and follow
what every round measures; alpha is a decayed running estimate. Guesses come right in runs where text repeats
itself (prompt lookup most of all), so the round's first draft is kept with the acceptance measured after guesses
like the last one judged (kept or not), and each further one with the acceptance measured after a kept guess;
with independent acceptance both are alpha and this is eq. 1. A draft model that sat rounds out reads the text it
skipped before it drafts again, at `read_cost` a token (measured at load): the controller weighs that reading
before it resumes drafting, probes, or has a prompt read at prefill.

A round's drafting costs a start and a step per draft, `draft_start + k * draft_cost`, fitted to every drafting
round's time and steps. The first step of a round costs more than the next ones: it reads what the last pass kept,
and it follows the target's pass, a pause that leaves the draft's weights cold (SmolLM2 Q4_0 beside its f32 target
on a 2-core CPU: about 5 ms more than a further step of 6-7 ms; experiments/draft_pause.py). One cost per step,
averaged over the short chains a hard text gets, would price every step like a first one, make long chains look
dear, and keep chains short.

A drafter that knows how sure it is (draft models and heads: `gated`) drafts each chain under a DraftGate
(decode/gate.py), which the controller makes and calibrates from every verified round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.decode.gate import DraftGate
from edgespec.decode.shape import TreePlanner
from edgespec.decode.step_fit import StepFit

EMA = 0.2  # weight of a new timing in the running cost per pass length
DECAY = 0.97  # per observed round: acceptance evidence older than ~30 rounds fades
PRIOR_WEIGHT = 8.0  # pseudo-rounds behind a prior acceptance measured at load
NEW_TEXT_KEEP = 0.5  # at a new text, earlier texts' acceptance evidence keeps this weight, the prior the rest
PROBE_EVERY = 32  # rounds at k = 0 before one k = 1 round re-tests acceptance
PROBE_MAX = 256  # ... doubling after every probe that does not bring drafting back, up to this
PROBE_READ_MAX = 0.01  # no probe where a draft reads a token it missed in more than this share of a target step
REPAY_ROUNDS = 64  # drafting resumes after idle rounds only if it repays the draft's reading of them within these
CONFIDENCE_BINS = 10  # the gate's calibration: acceptance per tenth of the draft's confidence
BIN_PRIOR = 2.0  # pseudo-tokens behind each bin's prior, acceptance = the bin's confidence
BIN_DECAY = 0.99  # per token observed in a bin
EXPLORE_EVIDENCE = 4.0  # tokens judged in a confidence bin before the gate may drop a round's first token there
STREAK_PRIOR = 4.0  # pseudo-tokens behind the acceptance after a kept or a rejected guess, at alpha


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens emitted by a round of k drafts with per-token acceptance alpha."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class DraftController:
    """Chooses the draft length of each round and learns from each round's outcome."""

    target_costs: dict[int, float]  # n tokens in a verify pass -> seconds
    draft_cost: float  # seconds per draft step (beyond a round's start, draft_start)
    k_max: int
    read_cost: float = 0.0  # seconds a draft takes per token it missed, reading them before it drafts again
    draft_start: float = 0.0  # seconds a drafting round spends besides its steps' draft_cost each
    accepted: float = 1.0  # Beta(1, 1) prior on the per-token acceptance
    rejected: float = 1.0
    prior: tuple[float, float] | None = None  # (accepted, rejected) pseudo-counts measured at load (set_prior)
    # observe moves target_costs towards the passes timed and fits the draft's step costs to the rounds timed
    # (False: the draft's costs stay as given and set_pass_costs sets the verify's)
    learn_costs: bool = True
    # the gate's calibration: per confidence bin, decayed counts of draft tokens accepted and rejected
    bin_accepted: list[float] = field(default_factory=lambda: [
        BIN_PRIOR * (i + 0.5) / CONFIDENCE_BINS for i in range(CONFIDENCE_BINS)])
    bin_rejected: list[float] = field(default_factory=lambda: [
        BIN_PRIOR * (1 - (i + 0.5) / CONFIDENCE_BINS) for i in range(CONFIDENCE_BINS)])
    _idle_rounds: int = field(default=0, repr=False)
    _probe_every: int = field(default=PROBE_EVERY, repr=False)
    _probing: bool = field(default=False, repr=False)  # the last choice was a probe
    _unread: int = field(default=0, repr=False)  # rounds since the draft last drafted: tokens it has not read
    # decayed [kept, judged] counts of guesses judged right after a kept guess and right after a rejected one (a
    # shadow score counts as a guess), and whether the last one judged was kept
    after_kept: list[float] = field(default_factory=lambda: [0.0, 0.0])
    after_rejected: list[float] = field(default_factory=lambda: [0.0, 0.0])
    _last_kept: bool = field(default=True, repr=False)
    _last_judged_now: bool = field(default=True, repr=False)  # the last round judged a guess (else _last_kept is old)
    _surveyed: tuple | None = field(default=None, repr=False, compare=False)  # ((accepted, rejected), _survey's answer)
    _spent: tuple | None = field(default=None, repr=False, compare=False)  # _spending's answer
    trees: TreePlanner = field(default_factory=TreePlanner, repr=False, compare=False)  # tree rounds' shapes
    _lookup: DraftController | None = field(default=None, repr=False, compare=False)  # lookup_rounds'

    def __post_init__(self):
        self._steps = StepFit((self.draft_start, self.draft_cost))  # the draft's step costs, drawn towards load's
        self._timed: set[int] = set()  # pass lengths (> 1) a round has timed since the costs were set (_follow)

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def _after(self, counts: list[float]) -> float:
        return (counts[0] + STREAK_PRIOR * self.alpha) / (counts[1] + STREAK_PRIOR)

    def expected(self, k: int) -> float:
        """Tokens a round of k drafts is expected to emit: its first draft kept with the acceptance that follows
        guesses like the last one judged, each further one with the acceptance that follows a kept guess."""
        if k == 0:
            return 1.0
        return 1.0 + self._first() * expected_tokens(self._after(self.after_kept), k - 1)

    def _first(self) -> float:
        """The acceptance of a round's first guess: as after guesses like the last one judged, where that was in the
        round just before; else (rounds sat out since, nothing judged in them) the acceptance of any guess. A rejection
        followed by rounds a draft model sits out would otherwise price its next first guess as one right after a
        rejection for the rest of the text, and keep it declined (an H200's 135M draft at 0.56 of a pass, acceptance
        0.9: 12 of 237 rounds drafting, benchmarks/controller_sim.py, h200-1.5b-f16)."""
        if not self._last_judged_now:
            return self.alpha
        return self._after(self.after_kept if self._last_kept else self.after_rejected)

    def _judged(self, kept: float) -> None:
        """One guess judged (kept: 1, rejected: 0, a shadow score: the target's chance of keeping it)."""
        counts = self.after_kept if self._last_kept else self.after_rejected
        counts[0] = DECAY * counts[0] + kept
        counts[1] = DECAY * counts[1] + 1.0
        self._last_kept = kept >= 0.5
        self._last_judged_now = True

    def verify_cost(self, n: int) -> float:
        """Seconds for a verify pass over n tokens (more than were measured: the widest known, scaled)."""
        if n not in self.target_costs:
            widest = max(self.target_costs)
            return self.target_costs[widest] * n / widest
        return self.target_costs[n]

    def pass_cost(self, k: int) -> float:
        """Seconds for the verify pass of a chain of k: k drafts and the last committed token (a tree's shape is
        priced by `trees`)."""
        return self.verify_cost(k + 1)

    def drafting_cost(self, k: int) -> float:
        """Seconds a round spends drafting k deep (k steps; none for k = 0)."""
        return self.draft_start + k * self.draft_cost if k > 0 else 0.0

    def chain_cost(self, k: int) -> float:
        """Seconds for a chain round of k drafts: k draft steps and a verify pass of k + 1 tokens."""
        return self.drafting_cost(k) + self.verify_cost(k + 1)

    def _fit_cost(self, steps: int, seconds: float) -> None:
        """Refit draft_start and draft_cost to the drafting rounds seen (StepFit)."""
        self.draft_start, self.draft_cost = self._steps.add(steps, seconds)

    def acceptance_at(self, confidence: float) -> float:
        """The calibrated chance that a draft token drafted with this confidence is accepted (given the
        tokens before it were)."""
        b = _bin(confidence)
        return self.bin_accepted[b] / (self.bin_accepted[b] + self.bin_rejected[b])

    def unexplored(self, confidence: float) -> bool:
        """Has the gate's calibration judged fewer than EXPLORE_EVIDENCE tokens in this confidence's bin?"""
        b = _bin(confidence)
        return self.bin_accepted[b] + self.bin_rejected[b] < BIN_PRIOR + EXPLORE_EVIDENCE

    def gate(self) -> DraftGate:
        """A fresh gate for one round's chain; a probe's keeps its first token whatever the calibration says
        (else a calibration that says no would never again see a token judged, and never learn otherwise)."""
        return DraftGate(self, keep_first=self._probing)

    def observe_gate(self, gate: DraftGate, n_drafted: int, n_accepted: int) -> None:
        """Calibrate from a verified gated chain: its first n_drafted tokens were verified (a grammar may
        have cut the rest), n_accepted of them kept. Tokens after the first rejection say nothing."""
        for i, confidence in enumerate(gate.confidences[:min(n_drafted, n_accepted + 1)]):
            b = _bin(confidence)
            self.bin_accepted[b] = BIN_DECAY * self.bin_accepted[b] + (i < n_accepted)
            self.bin_rejected[b] = BIN_DECAY * self.bin_rejected[b] + (i >= n_accepted)

    def predicted_rate(self, k: int) -> float:
        """Expected tokens per second with k drafts per round."""
        return self.expected(k) / (self.drafting_cost(k) + self.pass_cost(k))

    def could_pay(self) -> bool:
        """Would some draft length beat target-only decoding if every draft were accepted? If not, the
        draft is too slow for this target and probing its acceptance is pure cost."""
        return self.target_costs[1] > self._survey()[2]

    def saving(self, k: int) -> float:
        """Seconds a round of k drafts is expected to save over target-only decoding of the tokens it brings."""
        return self.expected(k) * self.target_costs[1] - (self.drafting_cost(k) + self.pass_cost(k))

    def best_k(self) -> int:
        """The draft length with the most expected tokens per second, as acceptance and costs stand."""
        return self.best_up_to(self.k_max)

    def best_up_to(self, n: int) -> int:
        """The draft length of at most n with the most expected tokens per second (0: target-only): for a drafter
        that has no more than n drafts to offer (prompt lookup)."""
        c1 = self.target_costs[1]
        if n < self.k_max and all(c1 * (k + 1) <= self.drafting_cost(k) + self.pass_cost(k) for k in range(1, n + 1)):
            return 0  # not even n drafts all kept would beat the target alone: acceptance need not be weighed
        best, holds, _ = self._survey()
        if n < best:
            best = min(range(1, n + 1), key=holds.__getitem__, default=0)  # the shortest of equally fast ones
        return best if best and c1 > holds[best] else 0

    def _survey(self) -> tuple[int, list[float], float]:
        """What choosing a length reads, but for the one-token pass cost c1 (target_costs[1]): the best length
        k >= 1; per length k (holds[k]; holds[0] is inf) the c1 up to which target-only decoding is at least as
        fast as k drafts a round (1 / k's predicted_rate); and the c1 over which some length would beat it if every
        draft were kept (could_pay).

        The loop chooses every round, the rounds a draft sits out included, where choosing must cost next to
        nothing; yet such a round teaches the controller c1 alone. So the survey is kept until a method moves
        something else it read (observe of a drafting round or of a pass longer than one token, observe_shadow,
        set_prior, begin) or acceptance is set from outside, and a round a draft model sits out compares c1 with
        two numbers. Made every round (predicted_rate for every length, could_pay's terms), choosing cost 10 us
        warm and 20-30 us in a decode, whose passes leave the caches cold: 2-3 % of a 1 ms target pass
        (experiments/declined_draft.py, docs/results/2026-11-26-declined-draft.md).
        Costs (draft_cost, draft_start, k_max) are set at construction and then only by observe."""
        key = (self.accepted, self.rejected)
        if self._surveyed is not None and self._surveyed[0] == key:
            return self._surveyed[1]
        spent, pay = self._spent or self._spending()
        first = self._first()
        kept = self._after(self.after_kept)
        best, holds = 0, [float("inf")]
        tokens, gain = 1.0, first  # expected(k) = 1 + first * (1 + kept + ... + kept^(k-1)), summed as k grows
        for k in range(1, self.k_max + 1):
            tokens += gain
            gain *= kept
            holds.append(spent[k] / tokens)
            if holds[k] < holds[best]:  # the fastest k (the shortest of equally fast ones, as max() picks)
                best = k
        survey = (best, holds, pay)
        if max(self.target_costs) > 1:  # else pass_cost scales c1 itself: made again every time
            self._surveyed = (key, survey)
        return survey

    def _spending(self) -> tuple[list[float], float]:
        """The survey's part that acceptance does not move: per length k the seconds a round of k spends
        (spent[k]; spent[0] unused), and could_pay's threshold. Kept until the costs it read move (observe of a
        drafting round or of a pass longer than one token), so that a shadow score, which moves acceptance only,
        makes the survey again from 8 divisions: prompt lookup's declined rounds each bring one
        (docs/results/2026-11-27-gpu-check.md)."""
        spent, pay = [0.0], float("inf")  # k_max 0: nothing drafts, nothing pays
        for k in range(1, self.k_max + 1):
            spent.append(self.draft_start + k * self.draft_cost + self.pass_cost(k))
            pay = min(pay, spent[k] / (k + 1))
        if max(self.target_costs) > 1:
            self._spent = (spent, pay)
        return spent, pay

    def drafting(self) -> bool:
        """Would the next round draft (no probe counted)?"""
        return self.best_k() > 0

    def set_prior(self, agreement: float) -> None:
        """Start from the acceptance measured at load (a draft model's agreement with the target), worth
        PRIOR_WEIGHT rounds; every new text returns the estimate part way to it (begin)."""
        self.prior = (PRIOR_WEIGHT * agreement, PRIOR_WEIGHT * (1 - agreement))
        self.accepted, self.rejected = self.prior
        self._surveyed = None

    def begin(self, prompt_tokens: int) -> bool:
        """A new text, whose prompt the draft has not read: should it read it now, at prefill? Only where the next
        round would draft and repay the reading within REPAY_ROUNDS; otherwise the prompt counts as unread, and is
        read (drafts.catch_up) before the first round that drafts, if one comes.

        Acceptance differs from text to text, so a new one first takes the estimate half way back to the prior
        measured at load (where there is one): a draft model declined after one hard answer is never probed on a
        CPU (see choose), and would otherwise sit out every later text however well it would do there. The draft's
        step cost, fitted only from rounds that draft, would stay where the last of them left it in the same way
        (after a server's first answer, of 10 tokens, the fit held a step at 1.5x its load timing and declined a
        draft model for all 24 later answers: docs/results/2026-11-27-parallel-auto.md): the fit's rounds keep the
        same weight, the load timing it is drawn towards the rest."""
        if self.prior is not None:
            self.accepted = NEW_TEXT_KEEP * self.accepted + (1 - NEW_TEXT_KEEP) * self.prior[0]
            self.rejected = NEW_TEXT_KEEP * self.rejected + (1 - NEW_TEXT_KEEP) * self.prior[1]
            self._idle_rounds, self._probe_every, self._last_kept = 0, PROBE_EVERY, True
            self._surveyed = None
        fitted = self._steps.fade(NEW_TEXT_KEEP) if self.learn_costs else None  # the step cost likewise
        if fitted is not None:
            self.draft_start, self.draft_cost = fitted
            self._surveyed = self._spent = None
        k = self.best_k()
        read = k > 0 and self.read_cost * prompt_tokens <= REPAY_ROUNDS * self.saving(k)
        self._unread = 0 if read else prompt_tokens
        return read

    def choose(self) -> int:
        """The next round's draft length. While no length pays, a round of 1 now and then re-tests acceptance,
        which may have changed with the text. A probe is not cheap for a draft model: before it drafts, it
        reads every token it missed in one batched pass, so probes that do not bring drafting back come ever
        more rarely, and most tokens a declined draft missed are never read (experiments/declined_draft.py).
        Drafting that pays again after idle rounds resumes only if it repays that reading within REPAY_ROUNDS.
        Where reading a missed token costs more than PROBE_READ_MAX of a target step (a draft model on a CPU, or
        beside a GPU's own small-batch costs), no probe comes at all: the reading alone would cost that share
        of the time declined, whatever the spacing. A free draft scored in the rounds it does not draft
        (observe_shadow) is never probed either: the scores are the evidence a probe would bring."""
        self._probing = False
        k, holds, pay = self._survey()
        c1 = self.target_costs[1]
        if k and c1 > holds[k] and self.read_cost * self._unread <= REPAY_ROUNDS * self.saving(k):
            self._idle_rounds, self._unread, self._probe_every = 0, 0, PROBE_EVERY
            return k
        self._unread += 1
        if c1 <= pay or self.read_cost > PROBE_READ_MAX * c1:
            self._idle_rounds = 0
            return 0
        self._idle_rounds += 1
        if self._idle_rounds < self._probe_every:
            return 0
        self._idle_rounds, self._unread, self._probe_every = 0, 0, min(2 * self._probe_every, PROBE_MAX)
        self._probing = True
        return 1

    def observe_shadow(self, p_accept: float) -> None:
        """Record a draft that was computed for free but not verified (k = 0 round): the target's
        probability of accepting it is known from the row already computed."""
        self.accepted = DECAY * self.accepted + p_accept
        self.rejected = DECAY * self.rejected + 1.0 - p_accept
        self._judged(p_accept)
        self._idle_rounds = 0
        self._surveyed = None
        self._survey()  # now, while the loop's next pass computes (decode/loop.py), not when the next length is chosen

    def take_draft_costs(self, other: DraftController) -> None:
        """Price draft steps from here on as `other` learnt them (its fit, rounds and all): a stream among others
        takes what the one that generated alone fitted (parallel.Parallel), the draft's steps being the device's,
        not the text's."""
        self._steps = StepFit(other._steps.prior, list(other._steps.sums))
        self.draft_start, self.draft_cost = other.draft_start, other.draft_cost
        self._surveyed = self._spent = None

    def _follow(self, n: int, old: float) -> None:
        """A pass of n > 1 tokens was timed, its cost moving from `old`: every longer-than-one length no round has
        timed yet moves by the same factor. Times taken at load go stale as the host's load moves (a 4-row pass of
        the widened 2B target: 1.72x a one-row pass after one block of a run, 1.45x after the next,
        docs/results/2026-11-28-big-pair), and a length never drafted would otherwise keep its load price for
        good: a dear one is never tried, a cheap one is chosen and found dear. Lengths timed since follow their own
        rounds; the one-token cost (timed in every declined round) moves none, so a declined round stays cheap."""
        self._timed.add(n)
        factor = self.target_costs[n] / old if old > 0 else 1.0
        if factor != 1.0:
            for m in self.target_costs:
                if m > 1 and m not in self._timed:
                    self.target_costs[m] *= factor

    def lookup_rounds(self) -> DraftController:
        """The controller of the rounds prompt lookup drafts in front of this one's drafter (ngram+ a draft model or
        heads): their own acceptance, no draft cost, this one's pass costs (shared, also once set_pass_costs
        replaced them); they teach this one nothing."""
        if self._lookup is None:
            self._lookup = DraftController({}, 0.0, self.k_max)
        if self._lookup.target_costs is not self.target_costs:
            self._lookup.share_pass_costs(self)
        return self._lookup

    def share_pass_costs(self, other: DraftController) -> None:
        """Price verify passes by `other`'s costs, the same dict, each one's rounds moving both (prompt lookup in front
        of a draft: one target, two controllers)."""
        self.target_costs, self._timed = other.target_costs, other._timed
        self._surveyed = self._spent = None

    def set_pass_costs(self, costs: dict[int, float]) -> None:
        """Price verify passes by `costs` (n tokens -> seconds) from here on: what a pass of a stream among others
        costs it (parallel.Parallel, with learn_costs off while others generate: a joined pass's time is not this
        stream's cost)."""
        self.target_costs = dict(costs)
        self._timed = set()
        self._surveyed = self._spent = None

    def observe(self, n_drafted: int, n_accepted: int, draft_s: float, target_s: float,
                pass_tokens: int | None = None, draft_steps: int | None = None) -> None:
        """Record one round: n_drafted tokens proposed (a tree: its depth), n_accepted kept, and what each side
        cost; pass_tokens: tokens in the verify pass (default n_drafted + 1, a chain's); draft_steps: the draft's
        steps (default n_drafted; under a gate, also the step whose token it did not keep). The cost is fitted
        per step, not per kept token: the gate counts its unkept step itself, and a cost per kept token would
        count it twice and read a hard text's short chains as a slower draft."""
        n = pass_tokens if pass_tokens is not None else n_drafted + 1
        if self.learn_costs:
            old = self.target_costs.get(n, target_s)
            self.target_costs[n] = (1 - EMA) * old + EMA * target_s
            if n > 1:
                self._follow(n, old)
        if n != 1 or n_drafted:  # more than the one-token cost, which the survey leaves out
            self._surveyed = self._spent = None
        if not n_drafted and self._last_judged_now:  # a round that judged no guess (a shadow score may follow)
            self._last_judged_now = False
            self._surveyed = None
        if n_drafted:
            if self.learn_costs:
                self._fit_cost(draft_steps or n_drafted, draft_s)
            self.accepted = DECAY * self.accepted + n_accepted
            self.rejected = DECAY * self.rejected + (n_accepted < n_drafted)
            for i in range(min(n_accepted + 1, n_drafted)):  # the kept ones and the first rejected
                self._judged(float(i < n_accepted))


def _bin(confidence: float) -> int:
    return min(int(confidence * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)
