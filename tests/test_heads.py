"""Medusa heads: exact output on a fake target with hidden states, training on a real corpus, a real pair."""

import numpy as np
import pytest
from fake import EOS, FakeBackend, random_table
from test_loop import check_target_law, random_gates

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


@pytest.mark.laws
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
    assert drafted > 6000 * (2 if width > 1 else 1 / 2 if gated else 1)


SUBSET = np.array([1, 2, 4])  # EOS (0) and token 3 are never drafted


@pytest.mark.laws
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
    assert drafted > 6000 * (2 if width > 1 else 1)


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


@pytest.mark.real
def test_trained_heads_on_the_real_model_learn_and_keep_greedy_output(default_gguf, default_corpus, tmp_path):
    from edgespec.api import load
    from edgespec.backends.llama.backend import LlamaBackend
    from edgespec.drafts.heads import output_matrix
    from edgespec.train.corpus import read_corpus
    from edgespec.train.eagle import answer_subset
    from edgespec.train.heads import train_medusa

    _, seqs = read_corpus(default_corpus)
    output = output_matrix(default_gguf)
    subset = answer_subset(seqs, output.shape[0])
    weight, bias, report = train_medusa(seqs, output, subset=subset, n_heads=2, epochs=3, lr=3e-3,
                                        holdout=0.34, progress=False)
    assert report["epochs"][-1]["loss"] < report["epochs"][0]["loss"] and report["subset"] == 8192
    backend = LlamaBackend(default_gguf, n_ctx=16)
    path = save_heads(tmp_path / "d.medusa.npz", weight, bias,
                      {"vocab_digest": backend.vocab.digest, "n_embd": backend.n_embd}, subset=subset)
    engine = load(default_gguf, path, n_ctx=512)
    assert engine.drafter.name == "medusa:d.medusa.npz" and engine.drafter.output.shape == (8192, 576)
    for prompt in ("Say hello.", "Name three colors."):
        base = engine.generate(prompt, max_tokens=24, draft_max=0)
        spec = engine.generate(prompt, max_tokens=24, draft_max=2)
        assert spec.tokens == base.tokens and spec.stats.drafted > 0
    trees = load(default_gguf, path, n_ctx=512, tree_width=2)
    for prompt in ("Say hello.", "Name three colors."):
        spec = trees.generate(prompt, max_tokens=24, draft_max=2)
        assert spec.tokens == engine.generate(prompt, max_tokens=24, draft_max=0).tokens
        assert spec.stats.tree_nodes > spec.stats.drafted > 0
    trees.close()  # heads on ONNX targets: tests/test_onnx_backend.py


def test_heads_are_planned_with_their_rows_of_the_output_layer(default_gguf, tmp_path):
    from edgespec.api import plan_for

    backend = HiddenFake(random_table(np.random.default_rng(0), V))
    heads = heads_file(tmp_path, backend)
    ngram = plan_for(default_gguf, "ngram", device="rpi5-8gb")
    planned = plan_for(default_gguf, heads, device="rpi5-8gb")
    weights = 4 * (3 * V * V + 3 * V)  # the heads' own float32 weights
    assert planned.drafter == "heads" and planned.runtime - ngram.runtime == 49152 * 576 * 4 + weights
    subset = plan_for(default_gguf, heads_file(tmp_path, backend, subset=np.arange(8192)), device="rpi5-8gb")
    assert subset.runtime - ngram.runtime == 8192 * 576 * 4 + weights  # only the subset's rows


def test_the_output_layer_is_read_from_the_header_in_blocks_or_as_a_view(default_gguf, tmp_path):
    """output_matrix finds the tensor from the streamed header: the default model's Q8_0 rows dequantize to
    what gguf's own reader gives (f16 on request, within its rounding), and F32 rows come back as a view of
    the file itself, not a copy."""
    import gguf
    from gguf.quants import dequantize

    from edgespec.drafts.heads import output_matrix

    tensor = next(t for t in gguf.GGUFReader(default_gguf).tensors if t.name == "token_embd.weight")
    expected = dequantize(tensor.data, tensor.tensor_type).reshape(49152, 576)
    np.testing.assert_array_equal(output_matrix(default_gguf), expected)
    half = output_matrix(default_gguf, np.float16)
    assert half.dtype == np.float16 and np.abs(half - expected).max() <= 1e-3 * np.abs(expected).max()

    rows = np.arange(12 * 64, dtype=np.float32).reshape(12, 64)
    writer = gguf.GGUFWriter(str(tmp_path / "f32.gguf"), "llama")
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    writer.add_tensor("token_embd.weight", rows)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    view = output_matrix(tmp_path / "f32.gguf")
    np.testing.assert_array_equal(view, rows)
    assert isinstance(view.base, np.memmap) or isinstance(view, np.memmap)
