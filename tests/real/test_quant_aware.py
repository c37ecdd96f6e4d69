"""Quantization-aware distillation: the rounding trained through is the one the GGUF export writes, the trained
checkpoint holds the rounded weights, and a full-depth Q4_0 draft trains, exports and pairs exactly."""

import json

import numpy as np
import pytest
from conftest import soft_llama

from edgespec.backends import gguf_file
from edgespec.errors import EdgespecError

HF_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def _gguf_layers(path, config) -> dict[str, np.ndarray]:
    """Every decoder linear weight of a GGUF, dequantized, by its Hugging Face name and in its row order."""
    from gguf.quants import dequantize

    from edgespec.train.eagle import rope_rows

    out = {}
    for t in gguf_file.open_gguf(path).tensors:
        parts = t.name.split(".")
        hf = next((k for k, v in HF_TO_GGUF.items() if parts[0] == "blk" and parts[2] == v), None)
        if hf is None:
            continue
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        out[f"model.layers.{parts[1]}.{hf}.weight"] = (t.tensor_type.name, w)
        if parts[2] in ("attn_q", "attn_k"):  # undo the converter's RoPE row order (rope_rows is a permutation)
            n_head = config.num_attention_heads if parts[2] == "attn_q" else config.num_key_value_heads
            order = rope_rows(np.arange(w.shape[0], dtype=np.float64)[:, None], n_head)[:, 0].astype(int)
            restored = np.empty_like(w)
            restored[order] = w
            out[f"model.layers.{parts[1]}.{hf}.weight"] = (t.tensor_type.name, restored)
    return out


@pytest.mark.parametrize("quant", ["q4_0", "q8_0"])
def test_the_rounding_trained_through_is_the_one_the_export_writes(tiny_checkpoint, tmp_path, quant):
    import torch
    from transformers import LlamaForCausalLM

    from edgespec.export import export
    from edgespec.train.quant_aware import fake_quant

    export(str(tiny_checkpoint), "gguf", quant, tmp_path / "m.gguf", progress=False, parity=False)
    model = LlamaForCausalLM.from_pretrained(tiny_checkpoint, torch_dtype=torch.float32)
    weights = dict(model.named_parameters())
    stored = _gguf_layers(tmp_path / "m.gguf", model.config)
    assert len(stored) == 7 * model.config.num_hidden_layers
    for name, (gtype, w) in stored.items():
        assert gtype == quant.upper()
        rounded = fake_quant(torch, weights[name].detach(), quant).numpy()
        assert np.array_equal(rounded, w), name  # bit for bit, every weight of every layer
        assert not np.array_equal(rounded, weights[name].detach().numpy())


def test_wrapped_layers_compute_with_rounded_weights_and_train_the_float_ones(tiny_checkpoint):
    import torch

    from edgespec.train.draft_model import init_draft
    from edgespec.train.quant_aware import fake_quant, keep_rounded, round_layers

    draft, picks = init_draft(tiny_checkpoint, 2, full_depth=True)  # all the target's layers
    assert picks == [0, 1]
    floats = {n: p.detach().clone() for n, p in draft.named_parameters()}
    ids = torch.tensor([[1, 400, 2000, 31, 7]])
    plain = draft(input_ids=ids).logits
    assert round_layers(torch, draft, "q4_0") == 14
    rounded_logits = draft(input_ids=ids).logits
    assert not torch.allclose(plain, rounded_logits)
    # by hand: the same model with every decoder linear weight replaced by its rounding
    reference, _ = init_draft(tiny_checkpoint, 2, full_depth=True)
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if ".layers." in name and name.endswith("proj.weight"):
                p.copy_(fake_quant(torch, p, "q4_0"))
    assert torch.allclose(reference(input_ids=ids).logits, rounded_logits, atol=1e-5)
    # the straight-through gradient reaches the float weights
    rounded_logits[0, -1].logsumexp(0).backward()
    original = draft.model.layers[0].self_attn.q_proj.parametrizations.weight.original
    assert original.grad is not None and original.grad.abs().sum() > 0
    keep_rounded(torch, draft)
    q = draft.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(q, fake_quant(torch, floats["model.layers.0.self_attn.q_proj.weight"], "q4_0"))
    assert torch.equal(fake_quant(torch, q, "q4_0"), q)  # rounding the kept weights again changes nothing
    assert torch.equal(draft.model.norm.weight, floats["model.norm.weight"])
    assert torch.equal(draft.model.embed_tokens.weight, floats["model.embed_tokens.weight"])


def test_a_full_depth_draft_without_rounding_or_an_unknown_type_is_refused_before_any_corpus(soft_checkpoint,
                                                                                             tmp_path):
    from edgespec.train.distill import distill

    target = tmp_path / "target.gguf"
    target.write_bytes(b"not read: refused first")
    prompts = [{"cat": "chat", "prompt": "Hello."}]
    with pytest.raises(EdgespecError, match="as many only with --quant-aware"):
        distill(target, tmp_path / "d.gguf", source=soft_checkpoint, prompts=prompts, n_layers=3, progress=False)
    with pytest.raises(EdgespecError, match="--quant-aware trains for q4_0 or q8_0"):
        distill(target, tmp_path / "d.gguf", source=soft_checkpoint, prompts=prompts, n_layers=3, quant="f16",
                quant_aware=True, progress=False)
    with pytest.raises(EdgespecError, match="1 to 3 layers"):
        distill(target, tmp_path / "d.gguf", source=soft_checkpoint, prompts=prompts, n_layers=4, quant="q4_0",
                quant_aware=True, progress=False)
    odd = soft_llama(tmp_path / "odd", hidden_size=48)  # 48 inputs: not blocks of 32
    with pytest.raises(EdgespecError, match="inputs of 48, which do not split"):
        distill(target, tmp_path / "d.gguf", source=odd, prompts=prompts, n_layers=3, quant="q4_0",
                quant_aware=True, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd", "target.gguf"]


def test_a_full_depth_draft_goes_on_training_only_quantization_aware(soft_checkpoint):
    from edgespec.train.draft_model import check_init

    check_init(soft_checkpoint, soft_checkpoint, full_depth=True)  # a Llama of the target's shapes and depth
    check_init(soft_checkpoint, soft_checkpoint, n_layers=3, full_depth=True)  # --layers as when it was made
    with pytest.raises(EdgespecError, match="give 3 \\(its own\\) to 3 \\(the target's\\)"):
        check_init(soft_checkpoint, soft_checkpoint, n_layers=4, full_depth=True)
    with pytest.raises(EdgespecError, match="a full-depth draft trains only with --quant-aware"):
        check_init(soft_checkpoint, soft_checkpoint)


@pytest.fixture(scope="module")
def soft_checkpoint(tmp_path_factory):
    """Larger layer weights than the init's, so Q4_0's rounding moves the output measurably."""
    return soft_llama(tmp_path_factory.mktemp("soft-llama"), layer_scale=8.0)


def test_a_quantization_aware_full_depth_draft_trains_exports_and_pairs_exactly(soft_checkpoint, tmp_path):
    import torch
    from transformers import LlamaForCausalLM

    from edgespec.api import load
    from edgespec.export import export
    from edgespec.train.distill import distill
    from edgespec.train.quant_aware import fake_quant

    target = tmp_path / "target.gguf"
    export(str(soft_checkpoint), "gguf", "f32", target, progress=False, parity=False)
    prompts = [{"cat": "chat", "prompt": f"Tell me something about the number {i}."} for i in range(16)]
    summary = distill(target, tmp_path / "draft.gguf", source=soft_checkpoint, prompts=prompts, n_layers=3,
                      epochs=3, max_tokens=24, progress=False, lr=3e-3, holdout=0.25, quant="q4_0",
                      quant_aware=True, vocab_size=0)
    training = summary["training"]
    assert training["quant_aware"] == "q4_0" and training["layers_from_target"] == [0, 1, 2]
    # before training the draft is the target's plain Q4_0 rounding; training brings it closer to the target
    assert training["epochs"][-1]["held_out_loss"] < training["initial_loss"]
    # the checkpoint holds the rounded weights, and the GGUF holds exactly those
    model = LlamaForCausalLM.from_pretrained(summary["checkpoint"], torch_dtype=torch.float32)
    weights = dict(model.named_parameters())
    for name, (gtype, w) in _gguf_layers(tmp_path / "draft.gguf", model.config).items():
        assert gtype == "Q4_0" and np.array_equal(weights[name].detach().numpy(), w), name
        assert torch.equal(fake_quant(torch, weights[name].detach(), "q4_0"), weights[name].detach())
    parity = summary["export"]["parity"]["overall"]
    # the GGUF is the checkpoint but for its q8_0 embeddings: as close as a q8_0 export (a plain q4_0 one may be
    # 0.45 away); top-1 is not asked, the tiny model's soft rows are full of near-ties
    assert summary["export"]["parity"]["passed"] and parity["kl"] < 0.01
    assert json.loads((tmp_path / "draft.gguf.distill.json").read_text())["training"]["quant_aware"] == "q4_0"
    engine = load(target, tmp_path / "draft.gguf", n_ctx=256)
    base = engine.generate("Tell me something about the number 99.", max_tokens=32, draft_max=0)
    spec = engine.generate("Tell me something about the number 99.", max_tokens=32, draft_max=3)
    assert spec.tokens == base.tokens and spec.stats.drafted > 0
