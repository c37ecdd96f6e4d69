"""A draft's cost per round, `start + steps * step`, fitted to the drafting rounds seen (decode/cost.py's
DraftController keeps one: why a round's first step costs more than the next ones is said there)."""

from __future__ import annotations

from dataclasses import dataclass, field

COST_DECAY = 0.95  # per drafting round: the draft's timings older than ~20 rounds fade from its cost fit
COST_PRIOR = 0.25  # pseudo-rounds behind the cost's start (0) and step (as measured at load) in that fit


@dataclass
class StepFit:
    """A drafting round's cost as `start + steps * step`, fitted to the rounds seen: least squares over sums decayed
    by COST_DECAY a round, drawn towards `prior` (start, step as timed at load) by COST_PRIOR pseudo-rounds, so rounds
    that all take the same steps still give both. Neither part is negative."""

    prior: tuple[float, float]
    sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # decayed (1, s, s^2, d, s * d): s steps, d seconds

    def add(self, steps: int, seconds: float) -> tuple[float, float]:
        """One drafting round of `steps` steps taking `seconds`: the (start, step) fitted now."""
        for i, x in enumerate((1.0, steps, steps * steps, seconds, steps * seconds)):
            self.sums[i] = COST_DECAY * self.sums[i] + x
        return self.solve()

    def fade(self, keep: float) -> tuple[float, float] | None:
        """The rounds seen keep `keep` of their weight, the prior the rest: the (start, step) fitted now (None
        where no round was seen: the prior stands)."""
        if not self.sums[0]:
            return None
        self.sums = [keep * x for x in self.sums]
        return self.solve()

    def solve(self) -> tuple[float, float]:
        n, s, ss, d, sd = self.sums
        start0, step0 = self.prior
        a11, a12, a22 = n + COST_PRIOR, s, ss + COST_PRIOR
        r1, r2 = d + COST_PRIOR * start0, sd + COST_PRIOR * step0
        det = a11 * a22 - a12 * a12  # > 0: n * ss >= s * s, and the prior adds to both
        start, step = (a22 * r1 - a12 * r2) / det, (a11 * r2 - a12 * r1) / det
        if start < 0:  # neither part can be negative: fit the other alone
            return 0.0, r2 / a22
        if step < 0:
            return r1 / a11, 0.0
        return start, step
