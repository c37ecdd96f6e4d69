"""Distil a small Llama draft from a target: trained on the target's own answers, against its distributions.

The draft is the target's architecture with fewer layers: its embeddings, final norm and output layer are
the target's (frozen by default: the draft then shares the target's view of tokens), and its layers start
as copies of evenly spaced target layers. Training minimises the cross-entropy to the target's
distribution at every answer position, -sum_k p_k log q(k) over the target's top-K tokens with their exact
probabilities (a KL to the target up to the target's entropy), not only to the tokens it chose. A draft that
will draft from a vocabulary subset (backends/llama/subset.py) is trained with its softmax over that subset, what
it drafts from; train_output gives it an output layer of its own (untied, trained with the layers).
A quantization-aware draft (quant_aware) trains through the rounding its GGUF export will apply, so it learns
the weights the file will hold; with as many layers as the target it is the target's quantization, trained
to agree with the target (a draft at a quantized model's cost, close to the target's own answers).
On CPU with torch (CUDA or MPS when present). The result is saved as a Hugging Face checkpoint with the
target's tokenizer and goes out through edgespec.export, parity-checked like any export.

The draft model itself: train/draft_model.py; training through the export's rounding: train/quant_aware.py.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError
from edgespec.machine import cores
from edgespec.progress import say
from edgespec.train.corpus import Sequence, holdout_split
from edgespec.train.draft_model import (
    check_init,
    check_new_draft,
    default_source,
    init_draft,
    n_vocab_of,
    resume_draft,
    save_checkpoint,
    torch_modules,
    untie_output,
)
from edgespec.train.eagle import SUBSET_SIZE, answer_subset, subset_positions
from edgespec.train.prompts import read_train_prompts
from edgespec.train.quant_aware import QUANT_AWARE, check_blocks, keep_rounded, round_layers


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
    torch, _ = torch_modules()
    torch.manual_seed(seed)
    torch.set_num_threads(cores())
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
    src = resolve(str(source), progress=progress) if source else default_source(Path(target))
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
    subset = answer_subset(seqs, n_vocab_of(src.path), vocab_size) if vocab_size else None
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
    probable (backends/llama/subset.py), or from `subset` where the caller chose them (distill, which trained
    over them); returns what it kept: the subset's size and the share of the answers' tokens in it (the most a
    draft can match)."""
    from edgespec.backends.llama.subset import read_subset, write_subset
    from edgespec.backends.model_info import read_model_info

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
