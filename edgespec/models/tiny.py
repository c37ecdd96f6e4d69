"""Tiny random-weight Hugging Face checkpoints of the architectures the common model families use.

Export and load are tested per architecture: each takes its own path through llama.cpp's converter and optimum
(Qwen2's attention biases, Llama 3's rope scaling, Phi3's fused projections, Gemma2's soft-capping and scaled
embeddings, Mistral's sliding window). The real models cannot be downloaded here and would be too slow to export
in a test, so `write_tiny` writes the family's config at a width of 64 and two layers, with random weights.

The tokenizer is the default model's (SmolLM2's byte-level BPE), as Qwen, Llama 3 and Mistral's newer models have
one of that kind, with the family's end-of-turn token added as a special token that becomes the checkpoint's end
of sequence. Gemma 2 and Phi-3 ship SentencePiece models, which llama.cpp's converter reads for them
(tokenizer.model): theirs is a small SentencePiece BPE trained here on edgespec's prompts, with the family's
settings and special ids. An embedding larger than the tokenizer (vocab_size) keeps rows the tokenizer does not
name, as Qwen 2.5 and Phi-3 ship theirs; llama.cpp's converter names them [PADn], and so does edgespec's ONNX
vocabulary reader.

usage: python -m edgespec.models.tiny FAMILY OUT [--vocab N] [--seed S]
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from edgespec.errors import EdgespecError

SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 4096}
# the output layer scaled up: sharp distributions as a trained model's, not the initialisation's nearly uniform
# ones, so parity's KL and top-1 agreement mean something and greedy choices are seldom near-ties
LOGIT_SCALE = 20.0
SPM_PIECES = 4000  # a trained SentencePiece vocabulary's size


@dataclass(frozen=True)
class SentencePiece:
    """How a family's SentencePiece tokenizer is made: the trainer's settings, the transformers class."""

    tokenizer_class: str
    trainer: dict
    special: tuple[str, ...]  # the family's special tokens: pieces, or added after them when not
    options: dict = field(default_factory=dict)  # for the transformers class


# Gemma: no space before the first word, ids pad 0, eos 1, bos 2, unk 3, the turn markers among the pieces, and
# a tab piece (without one, transformers' converter renames the <0x09> byte piece to a tab, as older Gemma
# tokenizers lacked it, and the GGUF's token texts would differ from the ONNX export's)
GEMMA_SPM = SentencePiece("GemmaTokenizerFast", {
    "add_dummy_prefix": False, "remove_extra_whitespaces": False, "normalization_rule_name": "identity",
    "allow_whitespace_only_pieces": True, "pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3,
    "pad_piece": "<pad>", "eos_piece": "<eos>", "bos_piece": "<bos>", "unk_piece": "<unk>",
    "user_defined_symbols": ["<start_of_turn>", "<end_of_turn>", "\t"]}, ("<start_of_turn>", "<end_of_turn>"))
# Llama 2's, which Phi-3 extends: a space before the first word, ids unk 0, bos 1, eos 2, chat markers added
# (options: transformers' converter then writes the space prefix into the normalizer, as Phi-3's tokenizer.json has it)
PHI3_SPM = SentencePiece("LlamaTokenizerFast", {"add_dummy_prefix": True, "unk_id": 0, "bos_id": 1, "eos_id": 2},
                         ("<|endoftext|>", "<|assistant|>", "<|end|>", "<|user|>"),
                         options={"legacy": True, "add_prefix_space": True})


@dataclass(frozen=True)
class Family:
    config: str  # the transformers config class
    end_of_turn: str  # the token that ends an assistant turn: the checkpoint's eos
    kwargs: dict = field(default_factory=dict)  # the family's own config fields, over SHAPE
    sentencepiece: SentencePiece | None = None  # None: the default model's byte-level BPE


FAMILIES = {
    # Qwen 2.5: attention biases on q, k and v; tied embeddings at the small sizes
    "qwen2": Family("Qwen2Config", "<|im_end|>", {"rope_theta": 1000000.0, "tie_word_embeddings": True}),
    # Llama 3.1 / 3.2: rope frequencies rescaled ("llama3"), <|eot_id|> ends a turn
    "llama3": Family("LlamaConfig", "<|eot_id|>", {
        "rope_theta": 500000.0, "tie_word_embeddings": True, "head_dim": 16, "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}}),
    # Phi-3 / 3.5 mini: q, k and v in one qkv_proj, gate and up in one gate_up_proj
    "phi3": Family("Phi3Config", "<|end|>", {"original_max_position_embeddings": 4096}, PHI3_SPM),
    # Gemma 2: embeddings scaled by sqrt(width), logits soft-capped in attention and at the output, every other
    # layer attends within a sliding window, norms after the sublayers too; llama.cpp scales attention by
    # 1/sqrt(head_dim), which is Gemma 2 2B's and 9B's query_pre_attn_scalar
    "gemma2": Family("Gemma2Config", "<end_of_turn>", {
        "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4096, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0}, GEMMA_SPM),
    # Mistral 7B v0.1: attention within a sliding window shorter than its context, an output layer of its own
    "mistral": Family("MistralConfig", "</s>", {"sliding_window": 4096, "max_position_embeddings": 32768,
                                                 "tie_word_embeddings": False}),
}


def write_tiny(family: str, out: str | Path, *, vocab_size: int | None = None, seed: int = 0,
               tokenizer: str | Path | None = None, **overrides) -> Path:
    """Write a tiny random checkpoint of `family` (a key of FAMILIES) to the new folder `out`; return it.

    vocab_size: rows of the embedding (default: the tokenizer's size). tokenizer: a folder holding the default
    model's tokenizer files (edgespec.models.smollm2.save_tokenizer, 8 s), made here when not given; a family
    with a SentencePiece tokenizer ignores it. overrides: config fields over the family's (sliding_window=64).
    """
    if family not in FAMILIES:
        raise EdgespecError(f"unknown model family {family!r}: choose one of {', '.join(FAMILIES)}")
    try:
        import torch
        import transformers
    except ImportError as e:
        raise EdgespecError("writing a checkpoint needs the export extra: pip install 'edgespec[export]'") from e
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise EdgespecError(f"{out} exists and is not empty: choose a new folder")
    spec = FAMILIES[family]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if spec.sentencepiece is None:
            tok = _default_tokenizer(tmp, tokenizer, transformers)
        else:
            tok = _sentencepiece_tokenizer(tmp, spec.sentencepiece, transformers)
        tok.add_special_tokens({"eos_token": spec.end_of_turn})
        tok.save_pretrained(tmp)
        vocab_size = vocab_size or len(tok)
        if vocab_size < len(tok):
            raise EdgespecError(f"a vocabulary of {vocab_size} tokens is smaller than the tokenizer's {len(tok)}")
        config = getattr(transformers, spec.config)(**{**SHAPE, **spec.kwargs, **overrides}, vocab_size=vocab_size,
                                                    bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                                    pad_token_id=tok.pad_token_id)
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(LOGIT_SCALE)
        model.save_pretrained(tmp)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _default_tokenizer(folder: Path, source: str | Path | None, transformers):
    """The default model's tokenizer, from `source` (a folder of its files) or made from the default model."""
    if source is None:
        from edgespec.models.smollm2 import save_tokenizer

        save_tokenizer(folder)
    else:
        for f in Path(source).iterdir():
            if f.is_file():
                shutil.copy2(f, folder / f.name)
    return transformers.AutoTokenizer.from_pretrained(folder)


def _sentencepiece_tokenizer(folder: Path, spec: SentencePiece, transformers):
    """A SentencePiece BPE trained on edgespec's prompts (deterministic: one thread, fixed data), saved as the
    tokenizer.model llama.cpp's converter reads, and transformers' fast tokenizer converted from it."""
    import sentencepiece

    data = resources.files("edgespec").joinpath("data", "train_prompts.jsonl").read_text(encoding="utf-8")
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([json.loads(line)["prompt"] for line in data.splitlines()]), model_writer=model,
        model_type="bpe", vocab_size=SPM_PIECES, byte_fallback=True, split_digits=True, num_threads=1,
        minloglevel=2, **spec.trainer)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    tok = getattr(transformers, spec.tokenizer_class)(vocab_file=str(folder / "tokenizer.model"), **spec.options)
    tok.add_special_tokens({"additional_special_tokens": list(spec.special)})
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", choices=list(FAMILIES))
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, help="embedding rows (default: the tokenizer's size)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        path = write_tiny(args.family, args.out, vocab_size=args.vocab, seed=args.seed)
    except EdgespecError as e:
        raise SystemExit(f"error: {e}") from None
    print(path)


if __name__ == "__main__":
    main()
