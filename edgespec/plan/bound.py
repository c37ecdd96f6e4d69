"""The chain bound: the best speedup over target-only decoding that drafting a chain of a fixed length k each round
allows, from the device's costs and the text's acceptance (Leviathan et al. 2023, eq. 1 and section 3.4).

A round drafts k tokens (a start and k steps of the draft: draft_start + k * draft_step seconds), then one target
pass over k + 1 tokens (C(k + 1) seconds) emits (1 - alpha^(k+1)) / (1 - alpha) tokens where each draft is
accepted independently with probability alpha. Target-only decoding emits one token per C(1). The bound is the best
k's ratio of the two rates. It is what a controller that knows alpha and the costs would reach with chains; a gate
that drafts further where the draft is sure and stops where it is not can pass it, and so can trees, whose bound
(tree_bound) is the best tree's from the chance each of a draft's guesses is the one kept (decode/shape.py).

alpha is the per-token acceptance among drafts the verifier judged (Stats.token_acceptance: kept ones and the
first rejected of a round): measured under a gate it is the acceptance of the tokens the gate chose to draft,
higher than a fixed chain's, so the bound it gives is higher than a fixed chain reaches.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgespec.decode.cost import expected_tokens
from edgespec.decode.shape import best_shape


@dataclass(frozen=True)
class Bound:
    k: int  # the best chain length, or the best tree's depth (0: drafting does not pay)
    speedup: float  # its rate over target-only decoding
    tokens: float  # tokens a round of k is expected to emit
    nodes: int | None = None  # a tree's draft tokens (None: a chain's, k)

    def to_dict(self) -> dict:
        out = {"k": self.k, "speedup": round(self.speedup, 3), "tokens_per_round": round(self.tokens, 3)}
        return out if self.nodes is None else {**out, "nodes": self.nodes}


def chain_speedup(pass_costs: dict[int, float], draft_start: float, draft_step: float, alpha: float, k: int,
                  streams: int = 1) -> float:
    """The rate of chains of k over target-only decoding. pass_costs: seconds of a target pass over n rows, for
    n = streams and streams * (k + 1) at least. With several streams generating at once, every stream drafts k (the
    draft's steps joined across streams: draft_start and draft_step are a joined round's) and one pass verifies all
    streams' k + 1 tokens, streams * (k + 1) rows, against one pass of `streams` rows a token target-only. Where a
    pass of several rows is compute-bound (a CPU), the rows the streams' tokens already fill leave drafting little:
    batching took the compute one stream's drafts would have used."""
    if k == 0:
        return 1.0
    return (expected_tokens(alpha, k) * pass_costs[streams]
            / (draft_start + k * draft_step + pass_costs[streams * (k + 1)]))


def chain_bound(pass_costs: dict[int, float], draft_start: float, draft_step: float, alpha: float,
                k_max: int | None = None, streams: int = 1) -> Bound:
    """The best chain length up to k_max (default: the longest whose pass cost is given) and its speedup, for one
    stream or `streams` verified together (chain_speedup)."""
    if pass_costs.get(streams, 0) <= 0:
        raise ValueError(f"the bound needs the cost of a pass of {streams} row{'s' * (streams > 1)}")
    longest = max(pass_costs) // streams - 1
    k_max = longest if k_max is None else min(k_max, longest)
    best = Bound(0, 1.0, 1.0)
    for k in range(1, k_max + 1):
        if streams * (k + 1) not in pass_costs:
            continue
        speedup = chain_speedup(pass_costs, draft_start, draft_step, alpha, k, streams)
        if speedup > best.speedup:
            best = Bound(k, speedup, expected_tokens(alpha, k))
    return best


def tree_bound(pass_costs: dict[int, float], draft_start: float, draft_step: float, kept: list[float], *,
               width: int, max_nodes: int, max_depth: int, branching: bool = True) -> Bound:
    """The best tree's speedup (decode/shape.best_shape) where each node's rank-r guess is the token kept with
    probability kept[r], a round costing a start, a draft step per depth and a pass over its nodes and the root
    (pass_costs given for every length up to max_nodes + 1). Bound.k is the tree's depth, Bound.nodes its size."""
    def seconds(nodes: int, depth: int) -> float:
        return (draft_start + depth * draft_step if depth else 0.0) + pass_costs[nodes + 1]

    shape = best_shape(kept, seconds, max_nodes=max_nodes, max_depth=max_depth, width=width, branching=branching)
    return Bound(shape.depth, shape.expected * pass_costs[1] / seconds(shape.size, shape.depth), shape.expected,
                 shape.size)

