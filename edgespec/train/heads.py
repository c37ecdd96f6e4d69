"""Train Medusa heads on a corpus of the target's answers with its hidden states (train.corpus).

Head i learns, from the target's state at position t, the target's distribution at position t + i (which
predicts token t + i + 1): the cross-entropy to the target's exact top-K probabilities there, through the
target's own output layer, kept frozen. The residual blocks start at zero, so before training every head
repeats the target's next-token prediction. Like an EAGLE head, the heads draw from a subset of the
vocabulary (the corpus's most probable tokens, train.eagle.answer_subset): they are trained over those
rows of the output layer, the target's mass outside them counting as loss nobody can win. See
drafts/heads.py for how they draft.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError
from edgespec.progress import say
from edgespec.train.corpus import Sequence


def head_pairs(seqs: list[Sequence], n_heads: int) -> list[tuple[int, int, int]]:
    """(sequence, state index j, head i) for every state whose head-i target position j + i exists."""
    return [(s, j, i) for s, seq in enumerate(seqs) for j in range(len(seq.lse)) for i in range(1, n_heads + 1)
            if j + i < len(seq.lse)]


def train_medusa(seqs: list[Sequence], output: np.ndarray, *, subset: np.ndarray | None = None, n_heads: int = 4,
                 epochs: int = 2, lr: float = 1e-3, batch: int = 256, holdout: float = 0.1, seed: int = 0,
                 progress: bool = True):
    """Heads (weight [H, E, E], bias [H, E]) and a report with per-head held-out top-1 agreement.

    output: the target's output layer [V, E]; subset: the token ids the heads draft from (None: all)."""
    from edgespec.train.draft_model import start_head_training
    from edgespec.train.eagle import subset_positions

    torch, rng, held, train_seqs = start_head_training(seqs, seed, holdout)
    n_embd = seqs[0].hidden.shape[1]
    n_vocab = output.shape[0]
    subset = np.arange(n_vocab) if subset is None else subset
    index = subset_positions(subset, n_vocab)  # token id -> output row, -1 outside the subset
    out = torch.from_numpy(np.ascontiguousarray(output[subset], dtype=np.float32))  # [S, E], frozen
    weight = torch.zeros((n_heads, n_embd, n_embd), requires_grad=True)
    bias = torch.zeros((n_heads, n_embd), requires_grad=True)
    optimizer = torch.optim.AdamW([weight, bias], lr=lr, weight_decay=0.0)

    def step(pairs, group):
        s_idx, j_idx, i_idx = (np.array(x) for x in zip(*pairs, strict=True))
        states = [group[s].hidden[j] for s, j in zip(s_idx, j_idx, strict=True)]
        h = torch.from_numpy(np.stack(states).astype(np.float32))  # [N, E]
        heads = torch.from_numpy(i_idx - 1)
        pre = torch.zeros_like(h)  # [N, E]: W_i h + b_i, one product per head
        for i in range(n_heads):
            rows = heads == i
            pre[rows] = h[rows] @ weight[i].T + bias[i]
        logq = torch.log_softmax((h + torch.nn.functional.silu(pre)) @ out.T, dim=-1)  # [N, S]
        ids = torch.from_numpy(index[np.stack([group[s].topk_ids[j + i] for s, j, i in pairs])])  # rows, -1 outside
        p = torch.from_numpy(np.exp(np.stack([group[s].topk_logits[j + i] - group[s].lse[j + i]
                                              for s, j, i in pairs])))
        inside = ids >= 0
        loss = -(p * torch.where(inside, logq.gather(1, ids.clamp(min=0)), 0)).sum(dim=1).mean()
        agree = (logq.argmax(dim=1) == ids[:, 0]).numpy()  # never where the target's top-1 is outside
        return loss, agree, i_idx

    def evaluate():
        hits, counts = np.zeros(n_heads), np.zeros(n_heads)
        pairs = head_pairs(held, n_heads)
        with torch.no_grad():
            for start in range(0, len(pairs), batch):
                _, agree, heads = step(pairs[start:start + batch], held)
                np.add.at(hits, heads - 1, agree)
                np.add.at(counts, heads - 1, 1)
        return [round(float(h / c), 4) if c else None for h, c in zip(hits, counts, strict=True)]

    report = {"heads": n_heads, "subset": len(subset), "train_sequences": len(train_seqs),
              "held_out_sequences": len(held),
              "initial_agreement": evaluate(), "epochs": []}
    say(progress, f"{n_heads} Medusa heads; held-out top-1 agreement per head before training: "
                   f"{report['initial_agreement']}")
    pairs = head_pairs(train_seqs, n_heads)
    for epoch in range(epochs):
        t0, losses = time.perf_counter(), []
        perm = rng.permutation(len(pairs))
        for n, start in enumerate(range(0, len(pairs), batch)):
            loss, _, _ = step([pairs[k] for k in perm[start:start + batch]], train_seqs)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if progress and n % 50 == 0:
                say(progress, f"  epoch {epoch + 1} batch {n}/{len(pairs) // batch + 1} "
                               f"loss {np.mean(losses[-50:]):.3f}")
        entry = {"epoch": epoch + 1, "loss": round(float(np.mean(losses)), 4), "held_out_agreement": evaluate(),
                 "seconds": round(time.perf_counter() - t0, 1)}
        report["epochs"].append(entry)
        say(progress, f"epoch {epoch + 1}/{epochs}: loss {entry['loss']:.3f}, held-out agreement per head "
                       f"{entry['held_out_agreement']} ({entry['seconds']:.0f} s)")
    return weight.detach().numpy(), bias.detach().numpy(), report


def train_heads(target: str | os.PathLike | None, out: str | os.PathLike, *, kind: str = "medusa",
                corpus: str | os.PathLike | None = None, prompts: list[dict] | None = None, n_heads: int = 4,
                epochs: int = 2, max_tokens: int = 160, temperature: float = 0.0, seed: int = 0,
                progress: bool = True, answerer: str | os.PathLike | None = None,
                answer_draft: str | os.PathLike | None = None, also_corpora: list[str | os.PathLike] = (),
                corpus_only: bool = False, hf_target: str | os.PathLike | None = None, **train_kwargs) -> dict:
    """Corpus (with hidden states) from a GGUF target or an ONNX export, then Medusa heads or an EAGLE head:
    `edgespec train-heads`.

    kind "medusa" writes *.medusa.npz (n_heads heads); "eagle" writes *.eagle.npz (train_kwargs go to train_eagle);
    "eagle3" writes an EAGLE-3 GGUF (and its SpecForge checkpoint beside), converted against hf_target, the
    target's Hugging Face folder (train/eagle3.py).
    answerer: a faster model of the target's family writes the corpus's answers; answer_draft: the draft the
    answering model speculates with (see build_corpus). temperature: the corpus's answers are sampled (prompt i
    seeded with seed + i) rather than greedy; seed also seeds training. also_corpora: finished corpora of the
    same target trained on beside `corpus` (for instance its sampled answers beside its greedy ones).
    corpus_only: build the corpus and stop (the summary has no heads).
    """
    from edgespec.backends.open import open_model
    from edgespec.drafts.eagle import EAGLE_SUFFIX
    from edgespec.drafts.heads import HEADS_SUFFIX, output_matrix, save_heads
    from edgespec.train.corpus import build_corpus, check_also, read_corpora
    from edgespec.train.prompts import read_train_prompts

    if target is None:
        from edgespec.models.default import default_target

        target = default_target()
    target, out = Path(target), Path(out)
    suffix = {"medusa": HEADS_SUFFIX, "eagle": EAGLE_SUFFIX, "eagle3": ".gguf"}.get(kind)
    if suffix is None:
        raise EdgespecError(f"unknown kind of heads '{kind}': medusa, eagle or eagle3")
    if kind == "eagle3" and (target.suffix.lower() != ".gguf" or hf_target is None
                             or not (Path(hf_target) / "config.json").is_file()):
        raise EdgespecError("an EAGLE-3 head is trained on a GGUF target and converted by llama.cpp's converter, "
                            "which reads the target's Hugging Face folder: give --hf-target DIR (config.json, "
                            "tokenizer; edgespec default-checkpoint rebuilds the default model's)")
    if target.suffix.lower() != ".gguf" and not target.is_dir():
        raise EdgespecError(f"{target}: heads are trained on the hidden states of a GGUF target (llama.cpp) or of an "
                            "ONNX export folder (edgespec export --to onnx adds them as an output)")
    if not out.name.endswith(suffix):
        raise EdgespecError(f"name the {kind} heads file *{suffix}, e.g. {out.name.split('.')[0]}{suffix}")
    corpus = Path(corpus) if corpus else out.with_name(out.name.removesuffix(suffix) + ".corpus")
    if corpus_only and also_corpora:
        raise EdgespecError("--also-corpus trains beside the corpus, and --corpus-only trains nothing: give one")
    check_also(corpus, also_corpora)
    # the vocabulary digest and width the heads are checked against at load; an export that does not return
    # hidden states is refused here, before the corpus is started
    backend = open_model(target, n_ctx=16, threads=None, hidden=True)
    meta = {"kind": kind, "target": target.name, "vocab_digest": backend.vocab.digest, "n_embd": backend.n_embd}
    backend.close()
    t0 = time.perf_counter()
    manifest = build_corpus(target, prompts if prompts is not None else read_train_prompts(), corpus,
                            max_tokens=max_tokens, temperature=temperature, hidden=True, seed=seed, progress=progress,
                            answerer=answerer, answer_draft=answer_draft)
    corpus_s = time.perf_counter() - t0
    summary = {"corpus": str(corpus), "answered_by": manifest["settings"].get("answerer") or "target",
               "corpus_positions": manifest["positions"], "corpus_seconds": round(corpus_s, 1)}
    if corpus_only:
        return summary
    seqs = read_corpora(corpus, also_corpora)
    t0 = time.perf_counter()
    if kind == "eagle":
        from edgespec.train.eagle import fit_eagle

        report = fit_eagle(target, seqs, out, meta, epochs=epochs, seed=seed, progress=progress, **train_kwargs)
    elif kind == "eagle3":
        from edgespec.train.eagle3 import fit_eagle3

        report = fit_eagle3(target, hf_target, seqs, out, epochs=epochs, seed=seed, progress=progress,
                            **train_kwargs)
    else:
        from edgespec.train.eagle import answer_subset

        output = output_matrix(target)
        subset = answer_subset(seqs, output.shape[0])
        weight, bias, report = train_medusa(seqs, output, subset=subset, n_heads=n_heads, epochs=epochs, seed=seed,
                                            progress=progress, **train_kwargs)
        save_heads(out, weight, bias, {**meta, "training": report}, subset=subset)
    return {"heads": str(out), "kind": kind, "bytes": out.stat().st_size, **summary,
            "also_corpora": [str(c) for c in also_corpora], "train_positions": sum(len(s.lse) for s in seqs),
            "train_seconds": round(time.perf_counter() - t0, 1), "training": report}
