"""A draft model in torch: the target's architecture with fewer layers (evenly spaced copies of the target's),
started fresh or from a draft trained before, grown, saved as a Hugging Face checkpoint with the target's tokenizer.

torch is imported here and in export/hf.py (parity) only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError
from edgespec.machine import cores

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "chat_template.jinja", "generation_config.json")


def pick_layers(n_source: int, n_draft: int) -> list[int]:
    """Evenly spaced source layers, the first and the last included."""
    if n_draft == 1:
        return [0]
    return [round(i * (n_source - 1) / (n_draft - 1)) for i in range(n_draft)]


def torch_modules():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise EdgespecError("training needs the export extra (torch, transformers): pip install 'edgespec[export]'") \
            from e
    return torch, transformers


def init_draft(source: Path, n_layers: int, full_depth: bool = False):
    """A draft model: the source's config with n_layers, its weights copied where shapes allow. full_depth: it
    may have all the source's layers (a quantization-aware draft: the target's own weights, to be rounded)."""
    torch, transformers = torch_modules()
    config = check_new_draft(source, n_layers, full_depth)
    teacher = transformers.AutoModelForCausalLM.from_pretrained(source, torch_dtype=torch.float32)
    config.num_hidden_layers = n_layers
    draft = transformers.LlamaForCausalLM(config)
    picks = pick_layers(len(teacher.model.layers), n_layers)
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(teacher.model.embed_tokens.weight)
        draft.model.norm.weight.copy_(teacher.model.norm.weight)
        if not config.tie_word_embeddings:
            draft.lm_head.weight.copy_(teacher.lm_head.weight)
        for i, j in enumerate(picks):
            draft.model.layers[i].load_state_dict(teacher.model.layers[j].state_dict())
    del teacher
    return draft, picks


def check_new_draft(source: Path, n_layers: int, full_depth: bool = False):
    """The source's config, if a new draft of n_layers can be made from it (said before any corpus is built)."""
    _, transformers = torch_modules()
    config = transformers.AutoConfig.from_pretrained(source)
    if getattr(config, "model_type", None) != "llama":
        raise EdgespecError(f"distill builds Llama-architecture drafts; {source} is a {config.model_type} model")
    most = config.num_hidden_layers if full_depth else config.num_hidden_layers - 1
    if not 1 <= n_layers <= most:
        raise EdgespecError(f"the draft needs 1 to {most} layers (the target has {config.num_hidden_layers}"
                            f"{'' if full_depth else '; as many only with --quant-aware'}), got {n_layers}")
    return config


SHAPE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")


def check_init(init: Path, source: Path, n_layers: int | None = None, full_depth: bool = False) -> None:
    """A draft distilled before (its Hugging Face checkpoint) may go on training only if it is a Llama of the
    source's shapes with fewer layers (as many where full_depth: quantization-aware), and be deepened
    (n_layers) only to fewer layers than the source's (as many where full_depth); said before any corpus is
    built."""
    _, transformers = torch_modules()
    if not (init / "config.json").is_file():
        raise EdgespecError(f"--init needs a distilled draft's checkpoint folder (the .hf beside its GGUF); "
                            f"{init} has no config.json")
    config = transformers.AutoConfig.from_pretrained(init)
    target = transformers.AutoConfig.from_pretrained(source)
    if getattr(config, "model_type", None) != "llama":
        raise EdgespecError(f"--init {init} is a {config.model_type} model; distill trains Llama drafts")
    differ = [k for k in SHAPE_KEYS if getattr(config, k, None) != getattr(target, k, None)]
    if differ:
        raise EdgespecError(f"--init {init} was not distilled from this target: "
                            + ", ".join(f"{k} {getattr(config, k, None)} vs {getattr(target, k, None)}"
                                        for k in differ))
    if config.num_hidden_layers > target.num_hidden_layers or (
            config.num_hidden_layers == target.num_hidden_layers and not full_depth):
        raise EdgespecError(f"--init {init} has {config.num_hidden_layers} layers, the target "
                            f"{target.num_hidden_layers}: not a draft"
                            + ("" if full_depth else " (a full-depth draft trains only with --quant-aware)"))
    most = target.num_hidden_layers if full_depth else target.num_hidden_layers - 1
    if n_layers is not None and not config.num_hidden_layers <= n_layers <= most:
        raise EdgespecError(f"--layers {n_layers} with --init deepens the draft: give {config.num_hidden_layers} "
                            f"(its own) to {most} ({'the target' if full_depth else 'one fewer than the target'}'s)")


def resume_draft(init: Path, source: Path, n_layers: int | None = None, full_depth: bool = False):
    """The draft at init, checked against the source, to train on; deepened to n_layers where that is more
    than its own (see grow). Returns (draft, the layers it kept and where new ones went, or None)."""
    torch, transformers = torch_modules()
    check_init(init, source, n_layers, full_depth)
    draft = transformers.LlamaForCausalLM.from_pretrained(init, torch_dtype=torch.float32)
    if n_layers is None or n_layers == draft.config.num_hidden_layers:
        return draft, None
    return grow(draft, n_layers)


def grow(draft, n_layers: int):
    """The draft deepened to n_layers computing exactly what it computed: each new layer, spread evenly
    between the old ones, is a copy of the layer before it with its output projections (attention's o_proj,
    the MLP's down_proj) zeroed, so it adds nothing to the residual stream until training moves it; its
    other weights start from its neighbour's rather than from noise. Returns (model, layout): layout names
    each layer's origin, an old index or "new"."""
    torch, transformers = torch_modules()
    old = draft.config.num_hidden_layers
    added = n_layers - old
    after = [max(0, round((i + 1) * old / (added + 1)) - 1) for i in range(added)]  # the old layer before each
    layout, copy_of = [], []
    for j in range(old):
        layout += [j] + ["new"] * after.count(j)
        copy_of += [j] * (1 + after.count(j))
    config = draft.config.__class__.from_dict(draft.config.to_dict())
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[0]] * n_layers
    grown = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        grown.model.embed_tokens.weight.copy_(draft.model.embed_tokens.weight)
        grown.model.norm.weight.copy_(draft.model.norm.weight)
        if not config.tie_word_embeddings:
            grown.lm_head.weight.copy_(draft.lm_head.weight)
        for layer, origin, j in zip(grown.model.layers, layout, copy_of, strict=True):
            layer.load_state_dict(draft.model.layers[j].state_dict())
            if origin == "new":
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    return grown, layout


# GGUF types a draft can be trained for, each as `edgespec export` writes it: q4_0 through an f16 intermediate and
# llama.cpp's quantizer, q8_0 by the converter from the weights as they are (both ggml's reference rounding)


def untie_output(torch, draft) -> None:
    """Give the draft an output layer of its own, started as a copy of the embeddings it was tied to."""
    if draft.config.tie_word_embeddings:
        draft.config.tie_word_embeddings = False
        draft.lm_head.weight = torch.nn.Parameter(draft.model.embed_tokens.weight.detach().clone())


def save_checkpoint(model, source: Path, out: Path) -> Path:
    """The draft as a Hugging Face folder with the source's tokenizer files."""
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def n_vocab_of(source: Path) -> int:
    _, transformers = torch_modules()
    return transformers.AutoConfig.from_pretrained(source).vocab_size


def default_source(target: Path):
    """The default model's checkpoint, rebuilt offline once into the user cache."""
    from edgespec.models.default import default_target
    from edgespec.models.smollm2 import build_checkpoint
    from edgespec.models.source import Source

    if target.resolve() != default_target().resolve():
        raise EdgespecError("give --source: the target's Hugging Face checkpoint (folder or hub id), whose tokenizer "
                            "and weights start the draft")
    cache = Path(os.environ.get("EDGESPEC_CACHE", Path.home() / ".cache" / "edgespec")) / "checkpoints"
    return Source("hf", build_checkpoint(cache / "smollm2-135m-instruct"), "SmolLM2-135M-Instruct")


def start_head_training(seqs: list, seed: int, holdout: float):
    """How training heads (Medusa, EAGLE) on a corpus begins: (torch seeded and on every core, a generator from the
    same seed, the held-out sequences, the training ones). The corpus must hold hidden states."""
    from edgespec.train.corpus import holdout_split

    torch, _ = torch_modules()
    if any(s.hidden is None for s in seqs):
        raise EdgespecError("the corpus has no hidden states: build it with edgespec train-heads (hidden states on)")
    torch.manual_seed(seed)
    torch.set_num_threads(cores())
    rng = np.random.default_rng(seed)
    held, train_seqs = holdout_split(seqs, holdout, rng)
    return torch, rng, held, train_seqs
