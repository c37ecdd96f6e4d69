"""Commands that train drafts: distill, draft-vocab, train-heads."""

from __future__ import annotations

import json

import click

from edgespec.cli.export import export_line
from edgespec.cli.options import Finite, Seed, Temperature
from edgespec.train.eagle import SUBSET_SIZE


def answering_options(f):
    """--answers-from and --answer-draft: who writes a corpus's answers, and how (distill, train-heads)."""
    f = click.option("--answer-draft", type=click.Path(exists=True), default=None,
                     help="Answer one prompt at a time, speculating with this draft model (the answers stay the "
                          "answering model's) [default: a GGUF model answers 16 prompts at once, faster on a "
                          "CPU; ONNX ones one at a time with prompt lookup]")(f)
    return click.option("--answers-from", "answerer", type=click.Path(exists=True), default=None,
                        help="A faster model of the target's family (e.g. its Q4 quantization) writes the answers; "
                             "the target only scores them [default: the target answers]")(f)


def training_prompt_options(f):
    """--prompts and --only-prompts: what the target answers for a corpus (distill, train-heads)."""
    f = click.option("--only-prompts", is_flag=True, help="Use only --prompts, not the built-in training prompts")(f)
    return click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False),
                        help="Your prompts (JSONL, {'cat': ..., 'prompt': ...}), added to the built-in training "
                             "prompts")(f)


def training_prompts(prompts_file: str | None, only: bool) -> list[dict]:
    from edgespec.bench import read_prompts
    from edgespec.train.prompts import read_train_prompts

    if only and not prompts_file:
        raise click.UsageError("--only-prompts needs --prompts FILE")
    return ([] if only else read_train_prompts()) + (read_prompts(prompts_file) if prompts_file else [])


def corpus_options(f):
    """--temperature and --also-corpus: what a corpus's answers are, and which finished corpora train beside it."""
    f = click.option("--also-corpus", "also_corpora", multiple=True, type=click.Path(exists=True, file_okay=False),
                     help="A finished corpus of the same target to train on too (repeatable; e.g. its sampled "
                          "answers beside its greedy ones)")(f)
    return click.option("-t", "--temperature", type=Temperature(), default=0.0, show_default=True,
                        help="Sample the corpus's answers at this temperature (prompt i seeded with --seed + i); "
                             "0 = the target's greedy answers")(f)


@click.command()
@click.option("-m", "--target", envvar="EDGESPEC_TARGET", type=click.Path(),
              help="The target that answers the prompts (GGUF or ONNX) [default: the default model]")
@click.option("--source", default=None,
              help="The target's Hugging Face checkpoint (folder or hub id): its tokenizer and weights start the "
                   "draft [default: rebuilt offline for the default model]")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="The draft GGUF to write")
@training_prompt_options
@click.option("--corpus", type=click.Path(file_okay=False), default=None,
              help="Where the target's answers are kept (resumable) [default: beside --out]")
@answering_options
@corpus_options
@click.option("--layers", type=click.IntRange(1), default=None,
              help="Draft layers [default: 4, or --init's]; with --init, more than its own deepens it (new layers "
                   "start as no-ops)")
@click.option("--init", "init", type=click.Path(exists=True, file_okay=False), default=None,
              help="Go on training a draft distilled before (its .hf checkpoint folder, written beside its GGUF) "
                   "instead of starting a new one")
@click.option("--epochs", type=click.IntRange(1), default=3, show_default=True)
@click.option("--lr", type=Finite(0, min_open=True), default=3e-4, show_default=True,
              help="Peak learning rate (warm-up, then cosine decay to 0 over the epochs)")
@click.option("--max-tokens", type=click.IntRange(1), default=160, show_default=True,
              help="Longest answer generated per prompt")
@click.option("--quant", default="q8_0", show_default=True, help="GGUF type of the draft (see edgespec export)")
@click.option("--onnx", "onnx_out", type=click.Path(file_okay=False), default=None,
              help="Also export the draft to ONNX (fp32) in this folder")
@click.option("--draft-vocab", "vocab_size", type=click.IntRange(0), default=SUBSET_SIZE, show_default=True,
              help="The GGUF drafts from this many of the answers' most probable tokens (a narrower output layer, a "
                   "cheaper step; see edgespec draft-vocab); 0: from the whole vocabulary")
@click.option("--train-output", is_flag=True,
              help="Give the draft an output layer of its own (untied from its embeddings) and train it with the "
                   "layers; with --draft-vocab only the subset's rows learn and are read")
@click.option("--quant-aware", is_flag=True,
              help="Train through --quant's rounding (q4_0, q8_0): the layers learn the weights the GGUF will hold. "
                   "With as many --layers as the target: the target's quantization, trained to agree with it")
@click.option("--seed", type=Seed(), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON")
def distill(target, source, out, prompts_file, only_prompts, corpus, answerer, answer_draft, temperature,
            also_corpora, layers, init, epochs, lr, max_tokens, quant, onnx_out, vocab_size, train_output, quant_aware,
            seed, as_json):
    """Train a small draft on the target's own answers (KL to its distributions) and export it to GGUF.

    The target answers the training prompts through edgespec (exactly its own distribution), a
    teacher-forced pass records its top-32 logits per position, and a draft of --layers layers, started
    from the target's embeddings and evenly spaced layers, is trained against them on this machine
    (CPU, or CUDA/MPS when torch has them). --init goes on training a draft distilled before; with more
    --layers than it has, it is deepened first (new layers start as no-ops). The summary, held-out agreement
    per category included, is also written beside --out (.distill.json). --quant-aware trains through the
    GGUF's rounding; `--layers <the target's> --quant q4_0 --quant-aware` trains the target's own Q4_0
    quantization to agree with it.
    """
    from edgespec.train.distill import distill as run

    prompts = training_prompts(prompts_file, only_prompts)
    summary = run(target, out, source=source, prompts=prompts, corpus=corpus, n_layers=layers, epochs=epochs,
                  max_tokens=max_tokens, quant=quant, onnx_out=onnx_out, temperature=temperature, seed=seed,
                  progress=not as_json, answerer=answerer, answer_draft=answer_draft, also_corpora=list(also_corpora),
                  init=init, lr=lr, vocab_size=vocab_size, train_output=train_output, quant_aware=quant_aware)
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    last = summary["training"]["epochs"][-1]
    click.echo(f"draft: {summary['draft']} ({export_line(summary['export'])})")
    click.echo(f"held-out top-1 agreement with the target: {summary['training']['initial_agreement']:.3f} before, "
               f"{last['held_out_agreement']:.3f} after training; corpus {summary['corpus_positions']} positions "
               f"({summary['corpus_seconds']:.0f} s), training {summary['train_seconds']:.0f} s")
    click.echo("held-out agreement by category: "
               + ", ".join(f"{cat} {a:.3f}" for cat, a in last["held_out_by_category"].items()))
    if summary.get("draft_vocab"):
        click.echo(_vocab_line(summary["draft_vocab"]))
    click.echo(f"use: edgespec chat --draft {summary['draft']}")


def _vocab_line(summary: dict) -> str:
    return (f"drafts from {summary['tokens']} tokens, {100 * summary['answer_tokens_covered']:.1f} % of the "
            "target's answer tokens in the corpus")


@click.command("draft-vocab")
@click.argument("draft", type=click.Path(dir_okay=False))
@click.option("--corpus", required=True, type=click.Path(file_okay=False),
              help="The target's answers (a corpus from edgespec distill or train-heads)")
@click.option("--also-corpus", "also_corpora", multiple=True, type=click.Path(file_okay=False),
              help="Another finished corpus of the same target (repeatable)")
@click.option("--tokens", "size", type=click.IntRange(1), default=SUBSET_SIZE, show_default=True,
              help="How many of the answers' most probable tokens the draft keeps")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The draft GGUF to write")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON")
def draft_vocab_cmd(draft, corpus, also_corpora, size, out, as_json):
    """Make a draft model (GGUF) draft from the tokens the target emits: a copy whose output layer keeps the --tokens
    tokens most probable in the target's answers, a cheaper step for a small draft. The output stays the
    target's exactly (tokens off the subset get draft probability 0, which the rule allows for); the draft reads
    every token as before. Use the copy as any draft: edgespec chat --draft OUT."""
    from edgespec.train.corpus import read_corpora
    from edgespec.train.distill import draft_vocab

    summary = draft_vocab(draft, out, read_corpora(corpus, list(also_corpora)), size)
    click.echo(json.dumps(summary, indent=2) if as_json else f"{summary['draft']}: {_vocab_line(summary)}")


@click.command("train-heads")
@click.option("-m", "--target", envvar="EDGESPEC_TARGET", type=click.Path(),
              help="The target whose hidden states the heads read: a GGUF file or an ONNX export folder (fp32 or "
                   "fp16 for EAGLE, whose layer starts from the target's) [default: the default model]")
@click.option("--kind", type=click.Choice(["medusa", "eagle", "eagle3"]), default="medusa", show_default=True,
              help="medusa: one residual block per future position over the target's last hidden state; eagle: "
                   "one decoder layer over the target's hidden state and the next token, drafting a chain; "
                   "eagle3: an EAGLE-3 head over three of the target's layers, written as llama.cpp's GGUF")
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="The heads file (*.medusa.npz, *.eagle.npz, or for eagle3 a *.gguf)")
@click.option("--hf-target", type=click.Path(file_okay=False, exists=True), default=None,
              help="eagle3: the target's Hugging Face folder, read by llama.cpp's converter (tokenizer, config)")
@click.option("--heads", "n_heads", type=click.IntRange(1, 8), default=4, show_default=True,
              help="Medusa heads (future positions)")
@click.option("--steps", type=click.IntRange(1, 8), default=3, show_default=True,
              help="EAGLE: draft steps trained as they run (each from the head's own guesses)")
@training_prompt_options
@click.option("--corpus", type=click.Path(file_okay=False), default=None,
              help="Where the target's answers and states are kept (resumable; shared with distill)")
@answering_options
@corpus_options
@click.option("--corpus-only", is_flag=True, help="Build (or finish) the corpus and stop, training nothing")
@click.option("--epochs", type=click.IntRange(1), default=4, show_default=True)
@click.option("--lr", type=Finite(0, min_open=True), default=None,
              help="Learning rate [default: 3e-3 medusa, 1e-3 eagle]")
@click.option("--max-tokens", type=click.IntRange(1), default=160, show_default=True)
@click.option("--seed", type=Seed(), default=0, show_default=True, help="Seeds sampled answers and training")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON")
def train_heads_cmd(target, kind, out, hf_target, n_heads, steps, prompts_file, only_prompts, corpus, answerer,
                    answer_draft, temperature, also_corpora, corpus_only, epochs, lr, max_tokens, seed, as_json):
    """Train draft heads on the target's own answers and hidden states (no second model to run).

    Use them as the draft: edgespec chat --target T.gguf --draft HEADS.medusa.npz
    """
    from edgespec.train.heads import train_heads

    prompts = training_prompts(prompts_file, only_prompts)
    extra = {"steps": steps} if kind in ("eagle", "eagle3") else {}
    if kind == "eagle3":
        extra["hf_target"] = hf_target
    summary = train_heads(target, out, kind=kind, corpus=corpus, prompts=prompts, n_heads=n_heads, epochs=epochs,
                          lr=lr or (3e-3 if kind == "medusa" else 1e-3), max_tokens=max_tokens,
                          temperature=temperature, seed=seed, progress=not as_json, answerer=answerer,
                          answer_draft=answer_draft, also_corpora=list(also_corpora), corpus_only=corpus_only,
                          **extra)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    if corpus_only:
        click.echo(f"corpus: {summary['corpus']} ({summary['corpus_positions']} positions, answered by "
                   f"{summary['answered_by']}; {summary['corpus_seconds']:.0f} s)")
        return
    last = summary["training"]["epochs"][-1]
    per = "head" if kind == "medusa" else "draft step"
    click.echo(f"heads: {summary['heads']} ({summary['bytes'] / 1e6:.1f} MB); held-out top-1 agreement per {per} "
               f"{last['held_out_agreement']}; training {summary['train_seconds']:.0f} s")
