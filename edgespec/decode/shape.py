"""The shape of a draft tree, planned from the device's costs and how often each of a draft's guesses is the one kept.

A tree round drafts candidates under the last committed token and verifies them all in one target pass
(decode/verify.verify_tree). Where several tokens are drafted for one position, they are the draft's first,
second, ... guesses there: candidate r of a node is its rank-r guess. If the rank-r guess is the one kept with
probability q_r, whatever came before (Sequoia's positional acceptance, Chen et al. 2024), a node is reached with
the product of the q along its path, and a round emits 1 + the sum of its nodes' reach probabilities in
expectation, whatever the tree (each reached node is one more token kept). It costs one target pass over its
nodes and the root, and the draft's work: a step per depth (heads run the whole depth's nodes at once).

`best_shape` picks the tree with the most expected tokens per second: for each depth limit, nodes are added in
the order of their reach probability (a node's first child and next sibling become candidates once it is in,
so every prefix is a tree whose siblings are ranks 0..m-1), and every prefix is priced. Where verifying one more
row costs little (a GPU's flat pass costs), it grows wide; where rows are dear (a CPU), it stays a chain.

The q_r are learnt per rank from the rounds verified (`RankAcceptance`), starting from the shares measured on this
project's reference pair: of the tokens the SmolLM2-135M Q4_0 draft's first guess missed against its f32 target
(greedy, 640 tokens of 16 dev prompts), its second guess held 0.68, its third 0.16, its fourth 0.06.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

RANK_SHARES = (0.68, 0.16, 0.06)  # of the first guess's misses, the share the 2nd, 3rd, 4th guess held (above)
RANK_PRIOR = 4.0  # pseudo-candidates behind each rank's prior acceptance
RANK_DECAY = 0.99  # per candidate judged at that rank


@dataclass(frozen=True)
class TreeShape:
    """A draft tree's shape: node i follows node parents[i] (-1: the root, the last committed token) as its
    parent's rank-ranks[i] guess; parents come before their children and siblings in rank order. `expected`: the
    tokens a round of this shape is expected to emit (1 for the empty shape: target-only)."""

    parents: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()
    expected: float = 1.0

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depth(self) -> int:
        return tree_depth(self.parents)

    def fanout(self) -> list[int]:
        """Children per row: row 0 the root's, row i + 1 node i's."""
        counts = [0] * (self.size + 1)
        for parent in self.parents:
            counts[parent + 1] += 1
        return counts

    @staticmethod
    def chain(k: int, width: int = 1) -> TreeShape:
        """k depths of a chain, each chain node with width - 1 siblings that are leaves."""
        parents, ranks, chain = [], [], -1
        for _ in range(k):
            first = len(parents)
            for rank in range(width):
                parents.append(chain)
                ranks.append(rank)
            chain = first
        return TreeShape(tuple(parents), tuple(ranks))


def tree_depth(parents: Sequence[int]) -> int:
    """Nodes on a tree's longest path from the root (parents: -1 for the root's children, else an earlier node)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return max(depths, default=0)


def best_shape(kept: Sequence[float], seconds: Callable[[int, int], float], *, max_nodes: int, max_depth: int,
               width: int, branching: bool = True) -> TreeShape:
    """The tree with the most expected tokens per second. kept[r]: the chance that a node's rank-r guess is the
    token kept there, given the node was reached (their sum at most 1); seconds(nodes, depth): a round's time with
    that many draft nodes that deep (seconds(0, 0): a target-only step). At most max_nodes nodes, max_depth deep,
    `width` children a node; branching False: only a node's first guess has children (a drafter that follows one
    chain, its other guesses leaves). The empty shape where no tree beats target-only decoding."""
    width = min(width, len(kept))
    best, best_rate = TreeShape(), 1.0 / seconds(0, 0)
    if width < 1 or max_nodes < 1 or max_depth < 1 or kept[0] <= 0:
        return best
    for limit in range(1, max_depth + 1):
        parents: list[int] = []
        ranks: list[int] = []
        expected, deepest = 1.0, 0
        # candidates: (-reach, order, parent, rank, depth, the parent's reach); order: ties first come, first added
        heap = [(-kept[0], 0, -1, 0, 1, 1.0)]
        order = 1
        while heap and len(parents) < max_nodes:
            reach, _, parent, rank, depth, parent_reach = heapq.heappop(heap)
            reach = -reach
            node = len(parents)
            parents.append(parent)
            ranks.append(rank)
            expected += reach
            deepest = max(deepest, depth)
            rate = expected / seconds(len(parents), deepest)
            if rate > best_rate:
                best, best_rate = TreeShape(tuple(parents), tuple(ranks), expected), rate
            if rank + 1 < width and kept[rank + 1] > 0:  # the next guess of the same parent
                heapq.heappush(heap, (-parent_reach * kept[rank + 1], order, parent, rank + 1, depth, parent_reach))
                order += 1
            if depth < limit and (branching or rank == 0):  # this node's own first guess
                heapq.heappush(heap, (-reach * kept[0], order, node, 0, depth + 1, reach))
                order += 1
        if len(parents) < max_nodes and deepest < limit:
            break  # a deeper limit adds nothing: every candidate was taken
    return _in_rank_order(best)


def _in_rank_order(shape: TreeShape) -> TreeShape:
    """The same tree with each node's children consecutive in rank order, parents first (breadth first): the order
    a drafter draws them in."""
    children: list[list[int]] = [[] for _ in range(shape.size + 1)]
    for node, parent in enumerate(shape.parents):
        children[parent + 1].append(node)
    parents, ranks, new = [], [], {-1: -1}
    queue = [-1]
    for old in queue:
        for child in sorted(children[old + 1], key=lambda c: shape.ranks[c]):
            new[child] = len(parents)
            parents.append(new[old])
            ranks.append(shape.ranks[child])
            queue.append(child)
    return TreeShape(tuple(parents), tuple(ranks), shape.expected)


@dataclass
class RankAcceptance:
    """How often a node's rank-r guess is kept once ranks below it were rejected there: decayed counts per rank,
    drawn towards the chain's acceptance (rank 0) and RANK_SHARES (the others) by RANK_PRIOR pseudo-candidates."""

    ranks: int = len(RANK_SHARES) + 1
    kept_counts: list[float] = field(default_factory=list)
    tried_counts: list[float] = field(default_factory=list)

    def __post_init__(self):
        self.kept_counts = self.kept_counts or [0.0] * self.ranks
        self.tried_counts = self.tried_counts or [0.0] * self.ranks

    def conditional(self, alpha: float) -> list[float]:
        """Per rank, the chance its guess is kept given the ranks before it were not; alpha: rank 0's prior."""
        priors = [alpha] + [share / (1.0 - sum(RANK_SHARES[:r])) for r, share in enumerate(RANK_SHARES)]
        return [(self.kept_counts[r] + RANK_PRIOR * priors[r]) / (self.tried_counts[r] + RANK_PRIOR)
                for r in range(self.ranks)]

    def kept(self, alpha: float) -> list[float]:
        """Per rank, the chance its guess is the one kept at a reached node (best_shape's `kept`)."""
        out, missed = [], 1.0
        for a in self.conditional(alpha):
            out.append(missed * a)
            missed *= 1.0 - a
        return out

    def observe(self, rank: int, kept: bool) -> None:
        """A rank-r guess judged: kept or rejected."""
        if rank < self.ranks:
            self.kept_counts[rank] = RANK_DECAY * self.kept_counts[rank] + kept
            self.tried_counts[rank] = RANK_DECAY * self.tried_counts[rank] + 1.0

    def observe_tree(self, parents: Sequence[int], path: Sequence[int]) -> None:
        """A verified tree (its nodes' parents, children in rank order) and its accepted path (node indices, root
        to leaf): at each node the path reached, its children before the one kept were rejected, that one kept;
        where the path ends at a node with children, all of them were rejected."""
        children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
        for node, parent in enumerate(parents):
            children[parent + 1].append(node)
        row = 0
        for step in range(len(path) + 1):
            kids = children[row]
            chosen = path[step] if step < len(path) else None
            for rank, kid in enumerate(kids):
                self.observe(rank, kid == chosen)
                if kid == chosen:
                    break
            if chosen is None:
                return
            row = chosen + 1


@dataclass
class TreePlanner:
    """A controller's tree planning (decode/cost.DraftController.trees): the ranks' acceptance learnt from every tree
    verified, and the best shape for the costs the controller has learnt, made again only when either moved by more
    than rounding (0.001 of a rank's chance, 1 % of a one-row pass)."""

    ranks: RankAcceptance = field(default_factory=RankAcceptance)
    _planned: tuple | None = field(default=None, repr=False)  # (key, shape)

    def shape(self, controller, *, max_nodes: int, max_depth: int, width: int, branching: bool) -> TreeShape:
        """The best tree for the next round (best_shape) under `controller`'s costs (verify_cost, drafting_cost: a
        draft step per depth) and acceptance (rank 0's prior)."""
        kept = self.ranks.kept(controller.alpha)
        one = controller.verify_cost(1)
        # the best tree depends on costs relative to a one-row pass only: to 1 %, so that the timings every round
        # moves a little do not make it plan again every round
        key = (tuple(round(q, 3) for q in kept), max_nodes, max_depth, width, branching,
               round(controller.draft_start / one, 2), round(controller.draft_cost / one, 2),
               tuple(round(controller.verify_cost(n) / one, 2) for n in range(2, max_nodes + 2)))
        if self._planned is None or self._planned[0] != key:
            shape = best_shape(kept, lambda nodes, depth: controller.drafting_cost(depth) +
                               controller.verify_cost(nodes + 1), max_nodes=max_nodes, max_depth=max_depth,
                               width=width, branching=branching)
            self._planned = (key, shape)
        return self._planned[1]
