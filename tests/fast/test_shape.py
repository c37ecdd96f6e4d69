"""Draft tree shapes (decode/shape.py): the best tree from costs and per-rank acceptance, what rounds teach it, and
the trees drafters draw from a shape (drafts/base.grow_tree)."""

import numpy as np
import pytest

from edgespec.decode.sampling import SamplingParams
from edgespec.decode.shape import RANK_DECAY, RANK_SHARES, RankAcceptance, TreeShape, best_shape
from edgespec.drafts.base import grow_tree
from edgespec.plan.bound import chain_bound, tree_bound

FLAT = {n: 1.0 + 0.01 * n for n in range(1, 40)}  # a GPU-like pass: a row costs 1 % of a one-row pass


def reach_sum(shape: TreeShape, kept) -> float:
    """1 + the sum over nodes of the product of kept[rank] along the path: the tokens a round emits, by hand."""
    reach = []
    for parent, rank in zip(shape.parents, shape.ranks, strict=True):
        reach.append((1.0 if parent < 0 else reach[parent]) * kept[rank])
    return 1.0 + sum(reach)


def all_trees(n_nodes: int, width: int):
    """Every tree of up to n_nodes nodes whose siblings are ranks 0..m-1, as TreeShapes (breadth first)."""
    seen = set()

    def grow(parents, ranks):
        key = (tuple(parents), tuple(ranks))
        if key in seen:
            return
        seen.add(key)
        yield TreeShape(tuple(parents), tuple(ranks))
        if len(parents) == n_nodes:
            return
        for row in range(-1, len(parents)):
            m = sum(1 for p in parents if p == row)
            if m < width:
                yield from grow([*parents, row], [*ranks, m])

    yield from grow([], [])


@pytest.mark.parametrize("kept, step", [((0.8, 0.13, 0.04), 0.05), ((0.6, 0.3), 0.02), ((0.95, 0.03), 0.2)])
def test_the_best_shape_is_the_best_of_every_small_tree(kept, step):
    """Against brute force over every tree of up to 6 nodes and 3 guesses a node: no tree has more expected tokens
    per second than best_shape's, and best_shape's expected tokens are the reach sum of its own tree."""
    def seconds(nodes, depth):
        return depth * step + FLAT[nodes + 1]

    def rate(shape):
        return reach_sum(shape, kept) / seconds(shape.size, shape.depth)

    best = best_shape(list(kept), seconds, max_nodes=6, max_depth=6, width=3)
    assert best.expected == pytest.approx(reach_sum(best, kept))
    brute = max(all_trees(6, min(3, len(kept))), key=rate)
    assert rate(best) == pytest.approx(rate(brute))


def test_dear_rows_keep_a_chain_and_cheap_rows_grow_a_tree():
    """The same acceptance: where each row costs as much as a one-row pass nothing pays (the empty shape); where
    a row adds 30 % a chain; where rows are nearly free, siblings too."""
    kept = RankAcceptance().kept(0.8)
    assert best_shape(kept, lambda n, d: float(n + 1), max_nodes=15, max_depth=8, width=3).size == 0
    dear = best_shape(kept, lambda n, d: 1.0 + 0.3 * n, max_nodes=15, max_depth=8, width=3)
    assert dear.size > 0 and set(dear.ranks) == {0}
    cheap = best_shape(kept, lambda n, d: FLAT[n + 1] + 0.05 * d, max_nodes=15, max_depth=8, width=3)
    assert max(cheap.ranks) > 0 and cheap.size == 15


def test_without_branching_only_first_guesses_have_children():
    kept = RankAcceptance().kept(0.7)
    shape = best_shape(kept, lambda n, d: FLAT[n + 1] + 0.05 * d, max_nodes=15, max_depth=8, width=3,
                       branching=False)
    for parent in shape.parents:
        assert parent < 0 or shape.ranks[parent] == 0
    free = best_shape(kept, lambda n, d: FLAT[n + 1] + 0.05 * d, max_nodes=15, max_depth=8, width=3)
    assert free.expected > shape.expected  # branching finds more at the same node budget


def test_shapes_list_parents_first_and_siblings_in_rank_order():
    shape = best_shape(RankAcceptance().kept(0.6), lambda n, d: FLAT[n + 1] + 0.01 * d, max_nodes=15,
                       max_depth=8, width=4)
    for node, (parent, rank) in enumerate(zip(shape.parents, shape.ranks, strict=True)):
        assert parent < node
        siblings = [shape.ranks[i] for i in range(node) if shape.parents[i] == parent]
        assert siblings == list(range(rank))
    assert TreeShape.chain(3, 2) == TreeShape((-1, -1, 0, 0, 2, 2), (0, 1, 0, 1, 0, 1))
    assert TreeShape.chain(3, 2).fanout() == [2, 2, 0, 2, 0, 0, 0] and TreeShape.chain(3, 2).depth == 3


def test_the_tree_bound_is_the_chain_bound_for_one_guess_and_passes_it_where_rows_are_cheap():
    """Formula values from a cost table (FLAT), no clock read: with one guess a node the tree bound is the chain
    bound; with three, on rows costing 1 % of a pass, the best tree's formula value is over 5 % above the chain's."""
    kept = RankAcceptance().kept(0.8)
    costs = {n: FLAT[n] for n in range(1, 17)}
    chain = chain_bound(costs, 0.0, 0.05, 0.8, k_max=8)
    one = tree_bound(costs, 0.0, 0.05, kept[:1], width=1, max_nodes=15, max_depth=8)
    assert (one.k, one.nodes) == (chain.k, chain.k) and one.speedup == pytest.approx(chain.speedup)
    wide = tree_bound(costs, 0.0, 0.05, kept, width=3, max_nodes=15, max_depth=8)
    assert wide.speedup > 1.05 * chain.speedup and wide.nodes > wide.k


def test_rank_acceptance_starts_from_the_shares_and_learns_from_verified_trees():
    ranks = RankAcceptance()
    kept = ranks.kept(0.8)
    assert kept[0] == pytest.approx(0.8)
    assert [q / 0.2 for q in kept[1:]] == pytest.approx(list(RANK_SHARES))  # of the first guess's misses
    # a tree: two guesses at the root, the first with two children; the path kept the root's second guess
    parents = [-1, -1, 0, 0]
    for _ in range(400):
        ranks.observe_tree(parents, [1])
    conditional = ranks.conditional(0.8)
    assert conditional[0] < 0.05 and conditional[1] > 0.95  # rank 0 always rejected, rank 1 always kept
    fresh = RankAcceptance()
    fresh.observe_tree(parents, [0])  # the first guess kept, then its two children both rejected
    d = RANK_DECAY
    assert fresh.kept_counts[:2] == pytest.approx([d, 0.0]) and fresh.tried_counts[:2] == pytest.approx([d + 1, 1])


def test_grow_tree_draws_the_planned_shape_breadth_first():
    """Greedy: each node's children are its law's best tokens in order; expand is asked per node with the path
    from the root, depth by depth; a node whose expand returns None gets no children."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 12))
    asked = []

    def expand(path):
        asked.append(list(path))
        return None if len(path) == 2 else logits[len(path)]

    shape = TreeShape((-1, -1, 0, 0, 1, 2), (0, 1, 0, 1, 0, 0))
    tree = grow_tree(shape, expand, SamplingParams(temperature=0), rng, 12)
    order = np.argsort(-logits, axis=1)
    assert tree.tokens[:2] == order[0, :2].tolist() and tree.parents == [-1, -1, 0, 0, 1]
    assert tree.tokens[2:4] == order[1, :2].tolist() and tree.tokens[4] == order[1, 0]
    assert [len(p) for p in asked] == [0, 1, 1, 2]  # root, its two children, then node 2 (None: no child)
    assert tree.probs.shape == (6, 12) and np.all(tree.probs[3:] == 0)


@pytest.mark.parametrize("seed", range(3))
def test_sampled_candidates_are_distinct_and_ranked_as_drawn(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=8)
    shape = TreeShape((-1, -1, -1), (0, 1, 2))
    tree = grow_tree(shape, lambda path: logits, SamplingParams(temperature=1.0), rng, 8)
    assert len(set(tree.tokens)) == 3 and tree.parents == [-1, -1, -1]
    assert tree.probs[0].sum() == pytest.approx(1.0)
