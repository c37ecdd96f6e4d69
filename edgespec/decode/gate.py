"""The gate a drafter that knows how sure it is drafts each chain under: how far one round's chain goes.

A drafter that knows how sure it is (draft models and heads: `gated`) drafts under a DraftGate instead
of to a fixed k: each draft token is kept only while some chain it leads to raises the round's expected tokens
per second, the token's acceptance read off the draft's confidence at its position (the top probability of the
draft's law there, never the drawn token's own: that would bias the draft law) through a calibration
learned from every verified round. Where the draft is unsure, the round ends early and the verify pass
stays short; where it is sure, the round drafts up to k_max. The length of a draft is the draft's own
business, decided before the target is consulted, so the output law is untouched.

The gate reads the controller (decode/cost.py's DraftController): its costs (drafting_cost, verify_cost,
chain_cost), k_max, and the calibration of acceptance per confidence (acceptance_at, unexplored), which the
controller learns from every verified chain (observe_gate).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgespec.decode.cost import DraftController


class DraftGate:
    """Decides, while a gated drafter drafts one chain, how far it goes. The drafter asks `keep(confidence)`
    of each token it has drawn (False ends the chain before it) and `go_on()` before it pays for the next
    draft step (False ends the chain after the tokens kept).

    Both compare the round's expected tokens per second if the chain ended now with the best it could reach by
    going on: with s the chance that every kept token is accepted and a a token's calibrated acceptance, a token
    adds s * a expected tokens; keeping a drawn one costs a verify row (its draft step is spent either way),
    another step a draft step and a row, and the acceptance of tokens not drawn yet is guessed from the last
    one's (confidence runs in stretches). Looking ahead to the whole chain, not one token, matters where the first
    extra verify row is dear and later ones cheap (a CPU's 7B-class pass: 2 rows 1.62x one row, 8 rows 3.24x): one
    more token never pays there, five more do. A round's first token is kept whatever the calibration says on a
    probe, and where its confidence falls in a bin that has judged fewer than EXPLORE_EVIDENCE tokens: a
    calibration that says no would otherwise never see a token judged, and never learn otherwise."""

    def __init__(self, controller: DraftController, keep_first: bool = False):
        self.controller, self.keep_first = controller, keep_first
        self.steps = 0  # draft steps the chain took: one per token judged, kept or not
        self.confidences: list[float] = []  # of the kept tokens
        self.survival = 1.0
        self.expected = 1.0  # tokens the round is expected to emit with the kept drafts (the target's one included)

    def keep(self, confidence: float) -> bool:
        self.steps += 1
        c, n = self.controller, len(self.confidences)
        acceptance = c.acceptance_at(confidence)
        gain = self.survival * acceptance
        stop = self.expected / (c.drafting_cost(n + 1) + c.verify_cost(n + 1))  # its step spent, its row saved
        first = n == 0 and (self.keep_first or c.unexplored(confidence))
        if not (first or self._best_going_on(gain, acceptance) > stop):
            return False
        self.confidences.append(confidence)
        self.survival = gain
        self.expected += gain
        return True

    def go_on(self) -> bool:
        c, n = self.controller, len(self.confidences)
        if not n:
            return False
        acceptance = c.acceptance_at(self.confidences[-1])
        return self._best_going_on(self.survival * acceptance, acceptance) > self.expected / c.chain_cost(n)

    def _best_going_on(self, gain: float, acceptance: float) -> float:
        """The best expected tokens per second of the chains that keep one token more than now (adding gain) and
        then any number more up to k_max, each accepted with `acceptance` once those before it were."""
        c = self.controller
        best, tokens = 0.0, self.expected
        for m in range(len(self.confidences) + 1, c.k_max + 1):  # m kept tokens in all
            tokens += gain
            best = max(best, tokens / c.chain_cost(m))
            gain *= acceptance
        return best
