"""Quantization-aware training: the draft's layers train through the rounding its GGUF export will apply (q4_0,
q8_0: blocks of 32 weights along a row, each with its own f16 scale), so it learns the weights the file will hold."""

from __future__ import annotations

from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.train.draft_model import torch_modules

QUANT_AWARE = ("q4_0", "q8_0")
BLOCK = 32  # weights per block along a row, each block with its own f16 scale


def fake_quant(torch, w, quant: str):
    """w [out, in] as its GGUF of type `quant` holds it, dequantized: blocks of 32 along each row, rounded as
    ggml's quantize_row_q4_0_ref / q8_0_ref round them, times each block's scale stored as f16."""
    rows, cols = w.shape
    if quant == "q4_0":
        x = w.half().float().reshape(rows, cols // BLOCK, BLOCK)
        signed_max = x.gather(-1, x.abs().argmax(dim=-1, keepdim=True))  # the first of largest magnitude
        d = signed_max / -8
        inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        q = torch.clamp(torch.floor(x * inverse + 8.5), 0, 15) - 8
    elif quant == "q8_0":
        x = w.float().reshape(rows, cols // BLOCK, BLOCK)
        d = x.abs().amax(dim=-1, keepdim=True) / 127
        inverse = torch.where(d != 0, 1 / d, torch.zeros_like(d))
        y = x * inverse
        q = torch.sign(y) * torch.floor(y.abs() + 0.5)  # C's roundf: halves away from zero
    else:
        raise EdgespecError(f"quantization-aware training knows {', '.join(QUANT_AWARE)}, not {quant}")
    return (q * d.half().float()).reshape(rows, cols)


def round_layers(torch, draft, quant: str) -> int:
    """Make every linear weight of the draft's decoder layers compute through its GGUF rounding (a straight-
    through estimate: the forward pass sees the rounded weight, the gradient reaches the float one); the
    embeddings, norms and output layer are left as they are. Returns how many weights were wrapped."""
    from torch.nn.utils import parametrize

    class Rounded(torch.nn.Module):
        def forward(self, w):
            return w + (fake_quant(torch, w, quant) - w).detach()

    linears = [m for m in draft.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    for m in linears:
        if m.in_features % BLOCK:
            raise EdgespecError(f"{quant} rounds blocks of {BLOCK} weights; a layer with {m.in_features} inputs does "
                                "not split into them")
        parametrize.register_parametrization(m, "weight", Rounded())
    return len(linears)


def check_blocks(source: Path, quant: str) -> None:
    """Every decoder layer input (the hidden width, the MLP's) must split into rounding blocks; said before any
    corpus is built (round_layers checks each layer again)."""
    _, transformers = torch_modules()
    config = transformers.AutoConfig.from_pretrained(source)
    odd = {w for w in (config.hidden_size, config.intermediate_size) if w % BLOCK}
    if odd:
        raise EdgespecError(f"{quant} rounds blocks of {BLOCK} weights; this model's layers take inputs of "
                            f"{', '.join(map(str, sorted(odd)))}, which do not split into them")


def keep_rounded(torch, draft) -> None:
    """Replace each wrapped weight by its rounded value: the checkpoint then holds what the GGUF will hold
    (rounding it again changes nothing), so the export's parity check compares like with like."""
    from torch.nn.utils import parametrize

    for m in draft.modules():
        if parametrize.is_parametrized(m, "weight"):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
