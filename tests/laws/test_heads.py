"""Medusa heads: exact output on a fake target with hidden states (on the real model: real/test_heads_real.py)."""

import numpy as np
import pytest
from fake import EOS, FakeBackend, random_table
from stats_util import check_target_law, random_gates

from edgespec.decode.sampling import SamplingParams
from edgespec.decode.shape import TreeShape
from edgespec.drafts.heads import MedusaDrafter, load_heads, medusa_states, save_heads
from edgespec.errors import EdgespecError

V = 5


class HiddenFake(FakeBackend):
    """A fake target whose 'hidden state' at a position is its logits row there (E = V), so an identity
    output layer maps it back to the logits, as a real target's output layer does. Logits below -30 (a token
    the test rules out) read as -30 there: a real state stays finite, and the heads' W h must not overflow."""

    hidden, path = True, None

    def __init__(self, table, **kwargs):
        super().__init__(table, **kwargs)
        self.n_embd = table.shape[0]
        self.last_hidden = None

    def forward(self, tokens, n_logits, *, copy=True):  # always a new array
        rows = super().forward(tokens, n_logits)
        self.last_hidden = np.maximum(rows, -30.0) if n_logits else None
        return rows

    def forward_tree(self, tokens, parents):
        rows = super().forward_tree(tokens, parents)
        self.last_hidden = np.maximum(rows, -30.0)
        return rows

    def keep_branch(self, path):
        super().keep_branch(path)
        self.last_hidden = self.last_hidden[list(path)]


def heads_file(tmp_path, target, n_heads=3, seed=0, subset=None):
    rng = np.random.default_rng(seed)
    return save_heads(tmp_path / "t.medusa.npz", rng.normal(scale=0.5, size=(n_heads, V, V)),
                      rng.normal(size=(n_heads, V)), {"vocab_digest": target.vocab.digest, "n_embd": V}, subset=subset)


T1, T08 = SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_p=0.9)


@pytest.mark.parametrize("params, width, broken, gated", [(T1, 1, False, False), (T08, 1, False, False),
                                                          (T1, 1, True, False), (T1, 2, False, False),
                                                          (T08, 3, False, False), (T1, 3, True, False),
                                                          (T1, 1, False, True), (T08, 1, False, True)])
def test_medusa_drafts_follow_the_target_chain(tmp_path, monkeypatch, params, width, broken, gated):
    """Four tokens from the loop with heads that draft from the target's state, as chains (to a fixed length or
    as far as the gate lets them) or as trees 3 deep (head i's candidates at depth i): their joint law is the
    target chain's; a wrong rule is caught."""
    rng = np.random.default_rng(7)
    table = random_table(rng, V, 1.5)
    table[:, EOS] = -1e9
    target = HiddenFake(table)
    drafter = MedusaDrafter(heads_file(tmp_path, target), target, output=np.eye(V))
    drafted = check_target_law(monkeypatch, target, drafter, table, params, width=width, broken=broken, n_tokens=4,
                               gate=random_gates() if gated else None)
    # the heads drafted in most runs (all but each first round)
    assert drafted > (2 if width > 1 else 1 / 2 if gated else 1)


SUBSET = np.array([1, 2, 4])  # EOS (0) and token 3 are never drafted


@pytest.mark.parametrize("params, width, broken", [(T1, 1, False), (T08, 2, False), (T1, 1, True), (T1, 2, True)])
def test_heads_over_a_token_subset_keep_the_target_law(tmp_path, monkeypatch, params, width, broken):
    """Heads that draft from a subset of the vocabulary (the output layer's rows for those tokens): every
    drafted token is in the subset, its law puts no mass elsewhere, and the loop's output law is still the
    target chain's, where token 3, which the target often samples, can only come from the target."""
    rng = np.random.default_rng(11)
    table = random_table(rng, V, 1.5)
    table[:, EOS] = -1e9
    target = HiddenFake(table)
    drafter = MedusaDrafter(heads_file(tmp_path, target, subset=SUBSET), target, output=np.eye(V))
    assert drafter.output.shape == (len(SUBSET), V) and drafter.n_vocab == V
    drafter.feature = rng.normal(size=V).astype(np.float32)
    tree = drafter.propose_tree([], TreeShape.chain(3, width), params, rng)
    assert set(tree.tokens) <= set(SUBSET.tolist()) and len(tree.tokens) == 3 * width
    assert tree.probs.shape[1] == V and np.all(tree.probs[:, [0, 3]] == 0)
    sums = tree.probs.sum(axis=1)  # one law per depth, over the subset
    assert np.isclose(sums, 1.0).sum() == 3 and np.all(np.isclose(sums, 1.0) | (sums == 0))
    drafted = check_target_law(monkeypatch, target, drafter, table, params, width=width, broken=broken, n_tokens=4)
    assert drafted > (2 if width > 1 else 1)  # per answer


def test_heads_state_is_a_residual_block():
    rng = np.random.default_rng(0)
    h, w, b = rng.normal(size=4), rng.normal(size=(2, 4, 4)), rng.normal(size=(2, 4))
    pre = w[1] @ h + b[1]
    np.testing.assert_allclose(medusa_states(h, w, b)[1], h + pre / (1 + np.exp(-pre)))
    np.testing.assert_allclose(medusa_states(h, np.zeros_like(w), np.zeros_like(b)), [h, h])  # zero init: h


def test_heads_files_are_checked(tmp_path):
    target = HiddenFake(random_table(np.random.default_rng(0), V))
    path = heads_file(tmp_path, target)
    weight, bias, meta, subset = load_heads(path)
    assert weight.shape == (3, V, V) and bias.shape == (3, V) and meta["n_embd"] == V and subset is None
    np.testing.assert_array_equal(load_heads(heads_file(tmp_path, target, subset=SUBSET))[3], SUBSET)
    for bad in ([2, 1, 4], [1, 1, 4], [-1, 2]):  # unsorted, repeated, negative
        with pytest.raises(EdgespecError, match="malformed token subset"):
            load_heads(save_heads(tmp_path / "s.medusa.npz", weight, bias, meta, subset=np.array(bad)))
    with pytest.raises(EdgespecError, match="token ids up to 7"):
        MedusaDrafter(save_heads(tmp_path / "s.medusa.npz", weight, bias, meta, subset=np.array([1, 7])), target,
                      output=np.eye(V))
    other = save_heads(tmp_path / "o.medusa.npz", weight, bias, {"vocab_digest": "0" * 16, "n_embd": V})
    with pytest.raises(EdgespecError, match="trained for another target"):
        MedusaDrafter(other, target, output=np.eye(V))
    (tmp_path / "bad.medusa.npz").write_bytes(b"not a zip")
    with pytest.raises(EdgespecError, match="not a heads file"):
        load_heads(tmp_path / "bad.medusa.npz")
    with pytest.raises(EdgespecError, match="not found"):
        load_heads(tmp_path / "missing.medusa.npz")
    plain = FakeBackend(random_table(np.random.default_rng(0), V))
    with pytest.raises(EdgespecError, match="hidden"):
        MedusaDrafter(path, plain, output=np.eye(V))
