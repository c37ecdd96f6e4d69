"""What the controller starts from, measured once at load on this device: the verify pass's cost per length, what a
draft model pays per token of text it skipped, and how often the draft's greedy choices agree with the target's
(the prior acceptance). decode/cost.py's DraftController takes these and then learns from every round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from edgespec.backends.protocol import MAX_OUTPUTS, Backend, forward_rows
from edgespec.decode.cost import DraftController

CALIBRATION_TEXT = (  # ordinary assistant prose and code, for the draft-agreement prior at load
    "Sure! Here is a short answer. The sky looks blue because air molecules scatter short (blue) "
    "wavelengths of sunlight more than long (red) ones; this is called Rayleigh scattering.\n\n"
    "```python\ndef add(a, b):\n    return a + b\n```\n"
    "Let me know if you have any other questions."
)


def controller_for(target: Backend, drafter, draft_backend: Backend | None, pass_costs: dict[int, float],
                   draft_cost: float, k_max: int, *, learn_costs: bool = True) -> DraftController | None:
    """The controller of a loaded pair, the one place one is built (api.load; parallel.Parallel, once for its
    streams): None without a drafter. pass_costs: a verify pass's seconds per length; draft_cost: a draft step's
    (and a drafter's start_cost, where it measured one, a round's start besides its steps).
    For a draft model, a prior on acceptance so that a good one is used from the start (how often its greedy
    choices agree with the target's on CALIBRATION_TEXT; none for another tokenizer, whose tokens are not the
    target's) and what reading the text it skipped costs it."""
    if drafter is None:
        return None
    # heads inside llama.cpp measure a round's start apart from its steps (drafts/llama_head.LlamaHeadDrafter)
    start = getattr(getattr(drafter, "inner", drafter), "start_cost", 0.0)
    controller = DraftController(dict(pass_costs), draft_cost, k_max, learn_costs=learn_costs, draft_start=start)
    if draft_backend is not None:
        model = getattr(drafter, "inner", drafter)  # behind prompt lookup (ngram+)
        if model.pairing != "cross-tokenizer":
            controller.set_prior(agreement(target, model.backend, target.tokenize(CALIBRATION_TEXT, special=True)))
        controller.read_cost = measure_read_cost(draft_backend)
    return controller


def agreement(target: Backend, draft: Backend, tokens: list[int]) -> float:
    """Fraction of positions of `tokens` where both models' greedy choices agree (teacher-forced).

    A prior for the acceptance rate before any round has run; both caches are left empty.
    """
    agree = 0
    tokens = tokens[:min(target.n_ctx, draft.n_ctx)]
    for backend in (target, draft):
        backend.rollback(0)
    for target_rows, draft_rows in zip(forward_rows(target, tokens), forward_rows(draft, tokens), strict=True):
        agree += int((target_rows.argmax(axis=1) == draft_rows.argmax(axis=1)).sum())
    for backend in (target, draft):
        backend.rollback(0)
    n = len(tokens)
    return agree / n if n else 0.5


def measure_pass_costs(backend: Backend, n_max: int, reps: int = 3, context: int = 32,
                       clock: Callable[[], float] = time.perf_counter,
                       lengths: Sequence[int] | None = None) -> dict[int, float]:
    """Seconds for one forward of n tokens with n logits rows, n = 1..n_max (or each n of `lengths`), after
    `context` tokens, by `clock`.

    The cache is left empty. Takes the median of `reps` timings per n, after one warm-up pass.
    """
    n_vocab = backend.vocab.n_vocab
    filler = [(i * 7919 + 13) % n_vocab for i in range(context + n_max)]
    backend.rollback(0)
    backend.forward(filler[:context], 1)
    costs = {}
    for n in lengths or range(1, n_max + 1):
        times = []
        for _ in range(reps + 1):
            t0 = clock()
            backend.forward(filler[context:context + n], n, copy=False)  # as the loop reads its rows
            times.append(clock() - t0)
            backend.rollback(context)
        costs[n] = sorted(times[1:])[len(times[1:]) // 2]
    backend.rollback(0)
    return costs


def measure_read_cost(draft: Backend, n: int = MAX_OUTPUTS, reps: int = 3,
                      clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds a draft model takes per token of text it skipped, read in one pass before it drafts again: what a
    pass of n tokens costs over a pass of 1, per token (DraftController.read_cost)."""
    costs = measure_pass_costs(draft, n, reps, clock=clock, lengths=(1, n))
    return max(costs[n] - costs[1], 0.0) / (n - 1)
