"""EAGLE head: training matches drafting, on a fake target with hidden states (its output law:
laws/test_eagle_laws.py; real training and the shipped head: real/test_eagle_real.py)."""

import numpy as np
import pytest
from fake import FakeBackend, random_table

from edgespec.decode.sampling import SamplingParams
from edgespec.drafts.eagle import WEIGHTS, EagleDrafter, EagleHead, load_eagle, save_eagle
from edgespec.errors import EdgespecError

V, E = 5, 6  # E even: RoPE rotates pairs


def random_head(rng, n_embd, n_head=1, n_head_kv=1, n_ff=8):
    d = n_embd // n_head
    shapes = {"fc_weight": (n_embd, 2 * n_embd), "fc_bias": (n_embd,), "no_feature": (n_embd,),
              "attn_norm": (n_embd,), "attn_q": (n_embd, n_embd), "attn_k": (n_head_kv * d, n_embd),
              "attn_v": (n_head_kv * d, n_embd), "attn_output": (n_embd, n_embd), "ffn_norm": (n_embd,),
              "ffn_gate": (n_ff, n_embd), "ffn_up": (n_ff, n_embd), "ffn_down": (n_embd, n_ff), "out_norm": (n_embd,)}
    weights = {k: rng.normal(scale=0.5, size=s).astype(np.float32) for k, s in shapes.items()}
    meta = {"n_head": n_head, "n_head_kv": n_head_kv, "rope_base": 100.0, "eps": 1e-5}
    return weights, meta


class HiddenFake(FakeBackend):
    """A fake target whose hidden state at a position is its logits row there, padded to E."""

    hidden, path, n_embd = True, None, E

    def forward(self, tokens, n_logits, *, copy=True):  # always a new array
        rows = super().forward(tokens, n_logits)
        self.last_hidden = np.pad(rows, ((0, 0), (0, E - V))).astype(np.float32) if n_logits else None
        return rows

    def forward_tree(self, tokens, parents):
        rows = super().forward_tree(tokens, parents)
        self.last_hidden = np.pad(rows, ((0, 0), (0, E - V))).astype(np.float32)
        return rows

    def keep_branch(self, path):
        super().keep_branch(path)
        self.last_hidden = self.last_hidden[list(path)]


def head_file(tmp_path, target, subset, seed=0, name="t.eagle.npz", digest=None):
    weights, meta = random_head(np.random.default_rng(seed), E)
    return save_eagle(tmp_path / name, weights, np.asarray(subset),
                      {**meta, "vocab_digest": digest or target.vocab.digest, "n_embd": E})


def test_training_replays_drafting_exactly():
    """The torch head's step s at position t equals drafting s tokens with the runtime head from the real
    entries before t-s+2: training-time test trains what runs."""
    torch = pytest.importorskip("torch")
    from edgespec.train.eagle import _torch_head

    rng = np.random.default_rng(1)
    weights, meta = random_head(rng, 16, n_head=4, n_head_kv=2, n_ff=24)
    t, first_real = 12, 3
    feats, embs = rng.normal(size=(t, 16)).astype(np.float32), rng.normal(size=(t, 16)).astype(np.float32)
    real = torch.zeros(1, t, dtype=torch.bool)
    real[0, first_real:] = True
    with torch.no_grad():
        outs = _torch_head(torch, weights, meta)(torch.from_numpy(feats)[None], torch.from_numpy(embs)[None], real,
                                                 torch.ones(1, t, dtype=torch.bool), 3)
    head = EagleHead(weights, meta)
    g = head.step(feats, embs, np.arange(t))
    assert g.dtype == np.float32  # a float64 slip (e.g. a numpy scalar) makes every draft step ~8x slower
    np.testing.assert_allclose(g, outs[0][0].numpy(), atol=2e-4)
    for s in (2, 3):
        for pos in (first_real + s - 1, 8, t - 1):
            head.truncate(0)
            last = pos - s + 1  # the last real entry of this chain
            g = head.step(feats[:last + 1], embs[:last + 1], np.arange(last + 1))[-1]
            for p in range(last + 1, pos + 1):
                g = head.step(g[None], embs[[p]], np.array([p]))[0]
            np.testing.assert_allclose(g, outs[s - 1][0, pos].numpy(), atol=2e-4)


@pytest.mark.parametrize("runner, atol", [("numpy", 1e-5), ("ggml", 1e-4)])
def test_the_drafter_pairs_each_state_with_the_token_it_produced(tmp_path, runner, atol):
    """Through the loop's hooks the head's cache holds, for every position, the target's state (or the
    no-feature vector in the prompt) with the next token: the same as one pass over the whole text."""
    target = HiddenFake(random_table(np.random.default_rng(0), V))
    path = head_file(tmp_path, target, range(V))
    drafter = EagleDrafter(path, target, embeddings=np.random.default_rng(2).normal(size=(V, E)).astype(np.float32),
                           runner=runner, weight_type="f32")
    prompt, rounds = [1, 2, 3], [([4], 1, 2), ([1, 1], 0, 3), ([], 0, 4)]  # (drafts proposed, accepted, new token)
    context, states = list(prompt), {}
    for drafts, n_acc, token in rounds:
        drafter.propose(context, max(len(drafts), 1), SamplingParams(), np.random.default_rng(0))
        target.last_hidden = np.random.default_rng(len(context)).normal(size=(1 + len(drafts), E))  # the pass's rows
        drafter.observe_target(target, n_acc, len(context) - 1)
        for i in range(n_acc + 1):
            states[len(context) - 1 + i] = target.last_hidden[i]
        context += drafts[:n_acc] + [token]
    drafter.propose(context, 1, SamplingParams(), np.random.default_rng(0))
    features = np.stack([states.get(p, drafter.no_feature) for p in range(len(context) - 1)]).astype(np.float32)
    weights, _, meta = load_eagle(path)
    expected = EagleHead(weights, meta).step(features, drafter.embeddings[context[1:]], np.arange(len(context) - 1))
    assert len(states) == 4 and min(states) == len(prompt) - 1  # real states from the prompt's last token on
    np.testing.assert_allclose(drafter.last[0], expected[-1], atol=atol)


T1, T08 = SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_p=0.9)


@pytest.mark.parametrize("weight_type, rtol", [("f32", 1e-4), ("f16", 0.02), ("q8_0", 0.1)])
def test_the_head_in_llama_cpp_computes_what_the_numpy_head_does(weight_type, rtol):
    """Entries, a drafted chain, a truncation and more entries through GgmlHead (grouped-query attention,
    RoPE at later positions) give NumpyHead's states and logits: float32 weights to rounding, f16 and q8_0
    weights within their precision (relative to the largest value)."""
    from edgespec.drafts.eagle import GgmlHead, NumpyHead

    rng = np.random.default_rng(3)
    e, s = 64, 96
    weights, meta = random_head(rng, e, n_head=4, n_head_kv=2, n_ff=128)
    weights = {k: v * (0.3 if v.ndim == 2 else 1.0) for k, v in weights.items()}  # keep activations moderate
    output = rng.normal(size=(s, e)).astype(np.float32)
    heads = [NumpyHead(weights, meta, output),
             GgmlHead(weights, meta, output, n_ctx=64, n_threads=1, weight_type=weight_type)]
    feats, embs = rng.normal(size=(40, e)).astype(np.float32), rng.normal(size=(40, e)).astype(np.float32)

    def run(head):
        out = [head.append(feats[:30], embs[:30], np.arange(30))]
        g = out[-1][0]
        for p in range(30, 33):  # a chain from the head's own states
            out.append(head.append(g[None], embs[[p]], np.array([p])))
            g = out[-1][0]
        head.truncate(30)
        out.append(head.append(feats[30:40], embs[30:40], np.arange(30, 40)))
        return out

    for (g_ref, l_ref), (g, logits) in zip(*map(run, heads), strict=True):
        assert np.abs(g - g_ref).max() <= rtol * np.abs(g_ref).max()
        assert np.abs(logits - l_ref).max() <= rtol * np.abs(l_ref).max()
    room = heads[1].model.n_ctx - heads[1].n  # llama.cpp rounds the context up
    with pytest.raises(EdgespecError, match="do not fit"):
        heads[1].append(np.zeros((room + 1, e), np.float32), np.zeros((room + 1, e), np.float32),
                        np.arange(40, 41 + room))
    with pytest.raises(EdgespecError, match="follow each other"):
        heads[1].append(feats[:1], embs[:1], np.array([7]))


def test_eagle_files_are_checked(tmp_path):
    target = HiddenFake(random_table(np.random.default_rng(0), V))
    embeddings = np.zeros((V, E), np.float32)
    path = head_file(tmp_path, target, range(V))
    weights, subset, meta = load_eagle(path)
    assert set(weights) == set(WEIGHTS) and list(subset) == list(range(V)) and meta["n_embd"] == E
    other = head_file(tmp_path, target, range(V), name="o.eagle.npz", digest="0" * 16)
    with pytest.raises(EdgespecError, match="trained for another target"):
        EagleDrafter(other, target, embeddings=embeddings)
    (tmp_path / "bad.eagle.npz").write_bytes(b"not a zip")
    with pytest.raises(EdgespecError, match="not an EAGLE head"):
        load_eagle(tmp_path / "bad.eagle.npz")
    with pytest.raises(EdgespecError, match="not found"):
        load_eagle(tmp_path / "missing.eagle.npz")
    with pytest.raises(EdgespecError, match="hidden"):
        EagleDrafter(path, FakeBackend(random_table(np.random.default_rng(0), V)), embeddings=embeddings)


def test_shipped_drafts_are_named_and_unknown_names_refused():
    from edgespec.drafts.spec import parse_draft
    from edgespec.models.default import SHIPPED_DRAFTS, shipped_draft

    assert parse_draft("eagle").heads == parse_draft("ngram+eagle").heads == "eagle"
    assert str(parse_draft("ngram+eagle").resolved()) == f"ngram+{shipped_draft('eagle')}"
    assert str(parse_draft("ngram").resolved()) == "ngram"
    for name in SHIPPED_DRAFTS:
        _, _, meta = load_eagle(shipped_draft(name))
        assert meta["n_embd"] == 576  # SmolLM2-135M's width; the vocabulary is checked at load
    with pytest.raises(EdgespecError, match="no shipped draft is called 'medusa'; there are: eagle"):
        shipped_draft("medusa")
