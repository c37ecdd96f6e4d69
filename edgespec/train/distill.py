"""Distil a small Llama draft from a target: trained on the target's own answers, against its distributions.

The draft is the target's architecture with fewer layers: its embeddings, final norm and output layer are
the target's (frozen by default: the draft then shares the target's view of tokens), and its layers start
as copies of evenly spaced target layers. Training minimises the cross-entropy to the target's
distribution at every answer position, -sum_k p_k log q(k) over the target's top-K tokens with their exact
probabilities (a KL to the target up to the target's entropy), not only to the tokens it chose. A draft that
will draft from a vocabulary subset (drafts/subset.py) is trained with its softmax over that subset, what
it drafts from; train_output gives it an output layer of its own (untied, trained with the layers).
A quantization-aware draft (quant_aware) trains through the rounding its GGUF export will apply, so it learns
the weights the file will hold; with as many layers as the target it is the target's quantization, trained
to agree with the target (a draft at a quantized model's cost, close to the target's own answers).
On CPU with torch (CUDA or MPS when present). The result is saved as a Hugging Face checkpoint with the
target's tokenizer and goes out through edgespec.export, parity-checked like any export.

torch is imported here (training) and in export/hf.py (parity) only.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError
from edgespec.export.files import say
from edgespec.train.corpus import Sequence, holdout_split
from edgespec.train.eagle import SUBSET_SIZE, answer_subset, subset_positions

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "chat_template.jinja", "generation_config.json")


def pick_layers(n_source: int, n_draft: int) -> list[int]:
    """Evenly spaced source layers, the first and the last included."""
    if n_draft == 1:
        return [0]
    return [round(i * (n_source - 1) / (n_draft - 1)) for i in range(n_draft)]


def _torch():
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
    torch, transformers = _torch()
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
    _, transformers = _torch()
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
    _, transformers = _torch()
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
    torch, transformers = _torch()
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
    torch, transformers = _torch()
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
    _, transformers = _torch()
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


def _batches(seqs: list[Sequence], max_tokens: int, rng: np.random.Generator):
    """Lists of sequences of at most max_tokens padded tokens, shuffled."""
    order = rng.permutation(len(seqs))
    batch, longest = [], 0
    for i in order:
        n = len(seqs[i].tokens)
        if batch and max(longest, n) * (len(batch) + 1) > max_tokens:
            yield batch
            batch, longest = [], 0
        batch.append(seqs[i])
        longest = max(longest, n)
    if batch:
        yield batch


def _loss(torch, draft, batch: list[Sequence], device, subset=None):
    """Mean over answer positions of -sum_k p_k log q(k); also, per answer position in batch order, whether
    the draft's top-1 equals the target's (teacher-forced greedy agreement).

    subset: (ids [S] on device, each token's index in them [V], -1 outside): q is then the draft's softmax over
    those tokens only, what a subset draft drafts from; the target's tokens outside it drop out of the sum, and
    a position whose target top-1 lies outside counts as a disagreement."""
    longest = max(len(s.tokens) for s in batch)
    ids = torch.zeros((len(batch), longest), dtype=torch.long)
    mask = torch.zeros((len(batch), longest), dtype=torch.long)
    for b, s in enumerate(batch):
        ids[b, :len(s.tokens)] = torch.from_numpy(s.tokens.astype(np.int64))
        mask[b, :len(s.tokens)] = 1
    hidden = draft.model(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state  # [B, L, E]
    rows = torch.cat([hidden[b, s.n_prompt - 1:len(s.tokens) - 1] for b, s in enumerate(batch)])  # [N, E]
    top_ids = np.concatenate([s.topk_ids for s in batch]).astype(np.int64)  # [N, K]
    p = torch.from_numpy(np.exp(np.concatenate([s.topk_logits - s.lse[:, None] for s in batch]))).to(device)
    if subset is None:
        logq = torch.log_softmax(draft.lm_head(rows).float(), dim=-1)  # [N, V]
    else:
        kept, index = subset
        logq = torch.log_softmax(torch.nn.functional.linear(rows, draft.lm_head.weight[kept]).float(), dim=-1)
        top_ids = index[top_ids]  # [N, K] as subset indices, -1 outside
        p = p * torch.from_numpy(top_ids >= 0).to(device)
        top_ids = np.maximum(top_ids, 0)
    top_ids = torch.from_numpy(top_ids).to(device)
    loss = -(p * logq.gather(1, top_ids)).sum(dim=1).mean()
    agree = logq.argmax(dim=1) == top_ids[:, 0]
    if subset is not None:
        agree &= p[:, 0] > 0
    return loss, agree


def untie_output(torch, draft) -> None:
    """Give the draft an output layer of its own, started as a copy of the embeddings it was tied to."""
    if draft.config.tie_word_embeddings:
        draft.config.tie_word_embeddings = False
        draft.lm_head.weight = torch.nn.Parameter(draft.model.embed_tokens.weight.detach().clone())


def train(seqs: list[Sequence], source: Path, *, n_layers: int | None = None, epochs: int = 3, lr: float = 3e-4,
          batch_tokens: int = 2048, train_embeddings: bool = False, holdout: float = 0.1, seed: int = 0,
          progress: bool = True, init: Path | None = None, subset: np.ndarray | None = None,
          train_output: bool = False, quant_aware: str | None = None):
    """Train a draft on corpus sequences; returns (model, report) with per-epoch loss and held-out agreement.

    n_layers: the new draft's layers (4 when None); init: a draft distilled before goes on training instead of
    a new one, deepened to n_layers where that is given and more than its own (see grow); subset: the token ids
    the draft will draft from (see draft_vocab): loss and agreement over them only; train_output: the draft gets
    an output layer of its own (untied from the embeddings, which stay frozen) and trains it with its layers;
    quant_aware: a GGUF type (QUANT_AWARE): the layers train through its rounding (round_layers), the draft may
    have all the source's layers, and the model returned holds the rounded weights."""
    torch, _ = _torch()
    torch.manual_seed(seed)
    torch.set_num_threads(os.cpu_count() or 1)
    device = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    rng = np.random.default_rng(seed)
    held, train_seqs = holdout_split(seqs, holdout, rng)
    if init is not None:
        draft, grown = resume_draft(Path(init), source, n_layers, full_depth=quant_aware is not None)
        picks, n_layers = None, draft.config.num_hidden_layers
    else:
        grown = None
        draft, picks = init_draft(source, n_layers or 4, full_depth=quant_aware is not None)
        n_layers = n_layers or 4
    if train_output:
        untie_output(torch, draft)
    draft.to(device)
    if quant_aware is not None:
        round_layers(torch, draft, quant_aware)
    if not train_embeddings:
        draft.model.embed_tokens.weight.requires_grad_(False)
        draft.lm_head.weight.requires_grad_(train_output)
    if subset is not None:
        subset = (torch.from_numpy(subset.astype(np.int64)).to(device),
                  subset_positions(subset, draft.config.vocab_size))
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    steps = epochs * sum(1 for _ in _batches(train_seqs, batch_tokens, np.random.default_rng(0)))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(step / steps, 1.0))))
    report = {"layers_from_target": picks, "init": str(init) if init is not None else None, "grown": grown,
              "train_sequences": len(train_seqs), "held_out_sequences": len(held), "epochs": [], "device": device,
              "subset": None if subset is None else len(subset[0]), "own_output": not draft.config.tie_word_embeddings,
              "quant_aware": quant_aware}

    def evaluate() -> tuple[float, float, dict[str, float]]:
        """Held-out (cross-entropy to the target, top-1 agreement with it, that agreement per category)."""
        draft.eval()
        hits: dict[str, list[int]] = {}  # category: [agreeing positions, positions]
        loss = 0.0
        with torch.no_grad():
            for batch in _batches(held, batch_tokens, np.random.default_rng(0)):
                batch_loss, agree = _loss(torch, draft, batch, device, subset)
                loss += float(batch_loss) * len(agree)
                start = 0
                for s in batch:
                    n = len(s.tokens) - s.n_prompt
                    count = hits.setdefault(s.cat or "-", [0, 0])
                    count[0] += int(agree[start:start + n].sum())
                    count[1] += n
                    start += n
        draft.train()
        total = sum(n for _, n in hits.values())
        if not total:
            return float("nan"), float("nan"), {}
        return (loss / total, sum(a for a, _ in hits.values()) / total,
                {cat: round(a / n, 4) for cat, (a, n) in sorted(hits.items())})

    loss0, agree0, by_category0 = evaluate()
    report["initial_loss"], report["initial_agreement"] = round(loss0, 4), round(agree0, 4)
    report["initial_by_category"] = by_category0
    start = f"target layers {picks}" if init is None else f"from {init}" if grown is None else \
        f"from {init}, new layers where 'new' stands in {grown}"
    rounded = f", computing with its layers rounded as {quant_aware}" if quant_aware else ""
    say(progress, f"draft of {n_layers} layers ({start}{rounded}); held-out top-1 agreement {agree0:.3f} before "
                  "training")
    step = 0
    for epoch in range(epochs):
        t0, losses = time.perf_counter(), []
        for batch in _batches(train_seqs, batch_tokens, rng):
            loss, _ = _loss(torch, draft, batch, device, subset)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            step += 1
            if progress and step % 20 == 0:
                say(progress, f"  epoch {epoch + 1} step {step}/{steps} loss {np.mean(losses[-20:]):.3f}")
        held_loss, held_agree, by_category = evaluate()
        entry = {"epoch": epoch + 1, "loss": round(float(np.mean(losses)), 4), "held_out_loss": round(held_loss, 4),
                 "held_out_agreement": round(held_agree, 4), "held_out_by_category": by_category,
                 "seconds": round(time.perf_counter() - t0, 1)}
        report["epochs"].append(entry)
        say(progress, f"epoch {epoch + 1}/{epochs}: loss {entry['loss']:.3f}, held-out top-1 agreement "
                       f"{entry['held_out_agreement']:.3f} ({entry['seconds']:.0f} s)")
    if quant_aware is not None:
        keep_rounded(torch, draft)
    return draft.to("cpu"), report


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


def distill(target: str | os.PathLike | None, out: str | os.PathLike, *, source: str | os.PathLike | None = None,
            prompts: list[dict] | None = None, corpus: str | os.PathLike | None = None, n_layers: int | None = None,
            epochs: int = 3, max_tokens: int = 160, quant: str = "q8_0", onnx_out: str | os.PathLike | None = None,
            temperature: float = 0.0, seed: int = 0, progress: bool = True,
            answerer: str | os.PathLike | None = None, answer_draft: str | os.PathLike | None = None,
            also_corpora: list[str | os.PathLike] = (), init: str | os.PathLike | None = None,
            vocab_size: int = SUBSET_SIZE, quant_aware: bool = False, **train_kwargs) -> dict:
    """Corpus from the target, training, export: the whole `edgespec distill`. Returns a JSON-ready summary.

    answerer: a faster model of the target's family writes the corpus's answers; answer_draft: the draft the
    answering model speculates with (see build_corpus); also_corpora: finished corpora of the same target
    trained on beside `corpus`; init: a draft's checkpoint (.hf) that goes on training instead of a new draft
    (deepened to n_layers where given); n_layers: 4 for a new draft when None; vocab_size: the GGUF drafts from
    that many of the answers' most probable tokens (draft_vocab), and training's loss is over them; 0: from
    the whole vocabulary; quant_aware: train through `quant`'s rounding (see train), so the draft may have all the
    target's layers."""
    from edgespec.export import export_source
    from edgespec.models.source import Source, resolve
    from edgespec.train.corpus import build_corpus, check_also, read_corpora

    out = Path(out)
    if out.suffix.lower() != ".gguf":
        raise EdgespecError(f"the draft is written as GGUF: give --out a .gguf file name, not {out}")
    if quant_aware and quant not in QUANT_AWARE:
        raise EdgespecError(f"--quant-aware trains for {' or '.join(QUANT_AWARE)}; --quant is {quant}")
    if target is None:
        from edgespec.models.default import default_target

        target = default_target()
    src = resolve(str(source), progress=progress) if source else _default_source(Path(target))
    if src.kind != "hf":
        raise EdgespecError("--source must be the target's Hugging Face checkpoint (its tokenizer and weights start "
                            "the draft), not a GGUF")
    prompts = prompts if prompts is not None else read_train_prompts()
    corpus = Path(corpus) if corpus else out.with_name(out.stem + ".corpus")
    check_also(corpus, also_corpora)
    if init is not None:
        init = Path(init)
        check_init(init, src.path, n_layers, full_depth=quant_aware)
    else:
        check_new_draft(src.path, n_layers or 4, full_depth=quant_aware)
    if quant_aware:
        check_blocks(src.path, quant)
    t0 = time.perf_counter()
    # hidden states too where the target gives them (GGUF): the same corpus then trains draft heads
    manifest = build_corpus(target, prompts, corpus, max_tokens=max_tokens, temperature=temperature, seed=seed,
                            hidden=Path(target).suffix.lower() == ".gguf", progress=progress, answerer=answerer,
                            answer_draft=answer_draft)
    corpus_s = time.perf_counter() - t0
    seqs = read_corpora(corpus, also_corpora)
    # a draft that will draft from a subset learns over that subset (the one draft_vocab writes below)
    subset = answer_subset(seqs, _n_vocab(src.path), vocab_size) if vocab_size else None
    t0 = time.perf_counter()
    model, report = train(seqs, src.path, n_layers=n_layers, epochs=epochs, seed=seed, progress=progress,
                          init=init, subset=subset, quant_aware=quant if quant_aware else None, **train_kwargs)
    train_s = time.perf_counter() - t0
    checkpoint = save_checkpoint(model, src.path, out.with_name(out.stem + ".hf"))
    summary = {"draft": str(out), "checkpoint": str(checkpoint), "corpus": str(corpus),
               "answered_by": manifest["settings"].get("answerer") or "target",
               "corpus_positions": manifest["positions"], "corpus_seconds": round(corpus_s, 1),
               "also_corpora": [str(c) for c in also_corpora], "train_positions": sum(len(s.lse) for s in seqs),
               "train_seconds": round(train_s, 1), "training": report, "export": None}
    # the training's record stays with the checkpoint, so an export refused after hours of training loses nothing
    (checkpoint / "distill.json").write_text(json.dumps(summary, indent=2, default=str))
    try:
        summary["export"] = export_source(Source("hf", checkpoint, str(checkpoint)), "gguf", quant, out,
                                          progress=progress)
    except EdgespecError as e:
        raise EdgespecError(f"{e}\nthe trained draft is kept: {checkpoint} (training report: distill.json in it); "
                            f"export it with: edgespec export {checkpoint} --to gguf --quant {quant}") from e
    if vocab_size:
        summary["draft_vocab"] = draft_vocab(out, out, seqs, vocab_size, subset)
    if onnx_out:
        summary["onnx"] = export_source(Source("hf", checkpoint, str(checkpoint)), "onnx", "fp32", onnx_out,
                                        progress=progress)
    (out.with_name(out.name + ".distill.json")).write_text(json.dumps(summary, indent=2, default=str))
    return summary


def draft_vocab(draft: str | os.PathLike, out: str | os.PathLike, seqs: list[Sequence], size: int,
                subset: np.ndarray | None = None) -> dict:
    """A copy of the draft GGUF at out that drafts from the `size` tokens the target's answers in seqs make most
    probable (drafts/subset.py), or from `subset` where the caller chose them (distill, which trained
    over them); returns what it kept: the subset's size and the share of the answers' tokens in it (the most a
    draft can match)."""
    from edgespec.backends.model_info import read_model_info
    from edgespec.drafts.subset import read_subset, write_subset

    if size < 1:
        raise EdgespecError(f"a draft vocabulary needs at least one token, got {size}")
    if not seqs:
        raise EdgespecError("the corpus has no answers to choose the draft's tokens from")
    n_vocab = read_model_info(draft).n_vocab  # from the header: write_subset reads the vocabulary itself
    if any(int(s.tokens.max()) >= n_vocab for s in seqs):
        raise EdgespecError(f"the corpus has token ids past the draft's {n_vocab}: it comes from another target")
    write_subset(draft, out, answer_subset(seqs, n_vocab, size) if subset is None else subset)
    subset = read_subset(out)
    answers = np.concatenate([s.tokens[s.n_prompt:] for s in seqs])
    return {"draft": str(out), "from": str(draft), "tokens": len(subset),
            "answer_tokens_covered": round(float(np.isin(answers, subset).mean()), 4)}


def _n_vocab(source: Path) -> int:
    _, transformers = _torch()
    return transformers.AutoConfig.from_pretrained(source).vocab_size


def _default_source(target: Path):
    """The default model's checkpoint, rebuilt offline once into the user cache."""
    from edgespec.models.default import default_target
    from edgespec.models.smollm2 import build_checkpoint
    from edgespec.models.source import Source

    if target.resolve() != default_target().resolve():
        raise EdgespecError("give --source: the target's Hugging Face checkpoint (folder or hub id), whose tokenizer "
                            "and weights start the draft")
    cache = Path(os.environ.get("EDGESPEC_CACHE", Path.home() / ".cache" / "edgespec")) / "checkpoints"
    return Source("hf", build_checkpoint(cache / "smollm2-135m-instruct"), "SmolLM2-135M-Instruct")


def read_train_prompts() -> list[dict]:
    """The built-in training prompts (kept apart from the benchmark prompts)."""
    from importlib import resources

    text = resources.files("edgespec").joinpath("data/train_prompts.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]

