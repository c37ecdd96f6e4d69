"""Copies of a GGUF whose vocabulary is another tokenizer's over the same weights: padded, or permuted.

Padded as larger models of a family are: the same model, more ids. Permuted as a tokenizer of another family is:
the same tokens and weights under other ids, optionally a few tokens fewer.

Contract: pad_vocab(src, dst, n_vocab) writes at dst the model of src, every tensor byte for byte, except that
its vocabulary has n_vocab ids: the source's, then placeholder tokens named and typed as llama.cpp's converter
names the ids a checkpoint's embedding has and its tokenizer lacks (`[PAD{id}]`, unused, score -1000). The
vocabulary tensors (token_embd.weight, and output.weight where the output is not tied to it) get one zero row
per new id; zero bytes are 0.0 in every ggml type (a quantized block whose scales are zero holds zeros), so a
padding id's logit is exactly 0 and the logits of the source's ids are unchanged.

permute_vocab(src, dst, seed=, drop=) writes at dst the model of src with its token ids shuffled: token i of src
is token perm[i] of dst, its text, type, score and vocabulary rows moved whole, every `*_token_id` key mapped,
control tokens included (another family's tokenizer numbers its specials otherwise too). Greedy text is the
source's; logits are the source's permuted (dst's row perm[i] is src's row i). drop removes that many tokens
that no BPE merge builds on, with the merges that make them: a BPE tokenizer whose every merge still makes a
token it has, so text tokenizes into the kept tokens (a dropped token's text into its parts, or other merges').

Why: Qwen2.5 0.5B-3B GGUFs have 151,936 tokens and 7B-72B 152,064, the larger models' embedding and output
rounded up with 128 padding rows. A draft and a target may differ by such padding (backends/protocol.py
check_compatible says "padded"); a padded copy of the default model is such a pair with real weights, offline.
A draft of another tokenizer is drafted through the tokens both vocabularies have; a permuted copy of the
default model is such a pair whose answer is known (all tokens shared, the same text), and with drop one
that lacks some of the source's tokens.

usage: python -m edgespec.models.vocab_edit pad SRC.gguf DST.gguf --vocab N
       python -m edgespec.models.vocab_edit permute SRC.gguf DST.gguf [--seed 0] [--drop 0]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgespec.backends import gguf_file
from edgespec.errors import EdgespecError

VOCAB_TENSORS = ("token_embd.weight", "output.weight")  # one row per token id: [V, row bytes]
PER_ID = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")  # one entry per id
MERGES = "tokenizer.ggml.merges"
PAD_SCORE = -1000.0  # llama.cpp's converter's score for a padding id


def pad_vocab(src: str | os.PathLike, dst: str | os.PathLike, n_vocab: int) -> Path:
    """Write at dst the GGUF src with its vocabulary padded to n_vocab ids (more than src has); returns dst.
    Written beside dst under a temporary name and renamed, so a failure leaves nothing at dst."""
    gguf = gguf_file.lib()
    reader = gguf_file.open_gguf(src)
    n_src = _n_vocab(reader, src)
    if n_vocab <= n_src:
        raise EdgespecError(f"{src} has {n_src} tokens: a padded vocabulary needs more, got {n_vocab}")
    pad = range(n_src, n_vocab)
    tails = {"tokenizer.ggml.tokens": [f"[PAD{i}]" for i in pad],
             "tokenizer.ggml.token_type": [int(gguf.TokenType.UNUSED)] * len(pad),
             "tokenizer.ggml.scores": [PAD_SCORE] * len(pad)}
    values = {f.name: f.contents() + tails[f.name] for f in reader.fields.values() if f.name in tails}

    def padded(rows: np.ndarray) -> np.ndarray:  # [n_src, row bytes] -> [n_vocab, row bytes], zero rows after
        return np.concatenate([rows, np.zeros((len(pad), rows.shape[1]), dtype=np.uint8)])

    return _write_copy(reader, Path(dst), n_vocab, values, padded)


def permute_vocab(src: str | os.PathLike, dst: str | os.PathLike, *, seed: int = 0, drop: int = 0) -> Path:
    """Write at dst the GGUF src with its token ids shuffled; returns dst. With rng = numpy's default_rng(seed),
    drop=0: perm = rng.permutation(n_src), and token i of src is token perm[i] of dst (dst's texts[perm[i]] is
    src's texts[i], its vocabulary rows likewise, a `*_token_id` key naming i names perm[i]). drop > 0: first
    rng.choice draws that many of the tokens no merge builds on (never a special or a `*_token_id` one), which go,
    with the merges that make them; the kept ids, in src's order, are then numbered 0..n_src-drop-1 and those
    numbers permuted as above. Merges and the chat template are text and stay. Written beside dst under a
    temporary name and renamed, so a failure leaves nothing at dst."""
    reader = gguf_file.open_gguf(src)
    n_src = _n_vocab(reader, src)
    named = {f.name: int(f.contents()) for f in reader.fields.values()
             if f.name.startswith("tokenizer.ggml.") and f.name.endswith("_token_id")}
    rng = np.random.default_rng(seed)
    kept = np.arange(n_src)
    values = {}
    if drop:
        dropped, values[MERGES] = _drop_leaves(reader, src, drop, set(named.values()), rng)
        kept = np.setdiff1d(kept, dropped)  # sorted: src's order
    order = np.empty(len(kept), dtype=np.int64)  # [n_dst] dst id -> src id
    order[rng.permutation(len(kept))] = kept
    new_id = np.full(n_src, -1, dtype=np.int64)  # [n_src] src id -> dst id, -1 where dropped
    new_id[order] = np.arange(len(order))
    for f in reader.fields.values():
        if f.name in PER_ID:
            contents = f.contents()
            values[f.name] = [contents[i] for i in order]
    for name, i in named.items():  # an id outside the vocabulary (some converters write -1 for none) stays
        values[name] = int(new_id[i]) if 0 <= i < n_src else i
    return _write_copy(reader, Path(dst), len(order), values, lambda rows: rows[order])


def _n_vocab(reader, src) -> int:
    """How many ids src's vocabulary has; refuses a file whose other arrays or tensors may also be per id, which
    a copy would leave in the source's order or size."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise EdgespecError(f"{src} has no tokenizer in its metadata: there is no vocabulary to copy")
    n = len(tokens.data)
    for f in reader.fields.values():
        if f.name not in PER_ID and f.name != MERGES and len(f.types) > 1 and len(f.data) == n:
            raise EdgespecError(f"{src}'s {f.name} has one entry per token: a copy does not know how to move it")
    for t in reader.tensors:
        if t.name not in VOCAB_TENSORS and n in (int(d) for d in t.shape):
            raise EdgespecError(f"{src}'s tensor {t.name} {list(t.shape)} may have a row per token: "
                                "a copy does not know how to move it")
    return n


def _drop_leaves(reader, src, drop: int, named: set[int], rng) -> tuple[np.ndarray, list[str]]:
    """(drop src ids drawn from the tokens no merge builds on, the merges left once those making them go)."""
    gguf = gguf_file.lib()
    if MERGES not in reader.fields:
        raise EdgespecError(f"{src} has no BPE merges: drop removes tokens only from a BPE vocabulary")
    texts = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    merges = reader.fields[MERGES].contents()
    pairs = [m.split(" ", 1) for m in merges]  # byte-level BPE texts have no space: "Ġ t" makes "Ġt"
    parts = {p for pair in pairs for p in pair}
    id_of = {t: i for i, t in enumerate(texts)}
    leaves = sorted({id_of[a + b] for a, b in pairs if a + b not in parts and a + b in id_of}
                    - named - {i for i, t in enumerate(types) if t != gguf.TokenType.NORMAL})
    if not 0 < drop <= len(leaves):
        raise EdgespecError(f"{src} has {len(leaves)} tokens that no merge builds on: drop must be 1..{len(leaves)}, "
                            f"got {drop}")
    dropped = np.sort(rng.choice(leaves, drop, replace=False))
    gone = {texts[i] for i in dropped}
    return dropped, [m for m, (a, b) in zip(merges, pairs, strict=True) if a + b not in gone]


def _write_copy(reader, dst: Path, n_vocab: int, values: dict, rows: Callable[[np.ndarray], np.ndarray]) -> Path:
    """Write at dst the model of reader, fields and tensors in its order, except: the fields named in values get
    those values, the `*.vocab_size` key n_vocab, and the vocabulary tensors rows(their rows as bytes
    [n_src, row bytes]) -> [n_vocab, row bytes]. Written at a temporary name beside dst and renamed."""
    n_src = len(reader.fields["tokenizer.ggml.tokens"].data)
    writer = gguf_file.new_writer(None, gguf_file.architecture(reader))
    for field in reader.fields.values():
        if field.name in values:
            writer.add_key_value(field.name, values[field.name], field.types[0],
                                 sub_type=field.types[-1] if len(field.types) > 1 else None)
        elif field.name.endswith(".vocab_size"):
            writer.add_key_value(field.name, n_vocab, field.types[0])
        else:
            gguf_file.copy_fields(writer, [field])
    for t in reader.tensors:
        data = rows(_vocab_rows(t, n_src)) if t.name in VOCAB_TENSORS else t.data
        writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.partial")
    try:
        gguf_file.write(writer, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def _vocab_rows(tensor, n_src: int) -> np.ndarray:
    """A vocabulary tensor's rows as raw bytes [n_src, row bytes], a view of the file."""
    per_block, block_bytes = gguf_file.lib().GGML_QUANT_SIZES[tensor.tensor_type]
    row_bytes = int(tensor.shape[0]) // per_block * block_bytes  # shape in ggml's order: [E, V]
    if int(tensor.shape[-1]) != n_src or tensor.data.nbytes != n_src * row_bytes:
        raise EdgespecError(f"{tensor.name} is {list(tensor.shape)} ({tensor.data.nbytes} bytes), not one row of "
                            f"{row_bytes} bytes per token of the {n_src} in the vocabulary: cannot copy it")
    return np.asarray(tensor.data).view(np.uint8).reshape(n_src, row_bytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    pad = sub.add_parser("pad", help="more ids: the source's, then placeholders with zero rows")
    pad.add_argument("--vocab", type=int, required=True, help="ids the copy has (e.g. the source's + 128)")
    permute = sub.add_parser("permute", help="the same tokens under shuffled ids, optionally a few fewer")
    permute.add_argument("--seed", type=int, default=0, help="of the permutation (and of the tokens dropped)")
    permute.add_argument("--drop", type=int, default=0, help="tokens no merge builds on to remove (default none)")
    for p in (pad, permute):
        p.add_argument("src", help="the GGUF to copy")
        p.add_argument("dst", help="where to write the copy")
    args = ap.parse_args()
    start = time.perf_counter()
    try:
        if args.command == "pad":
            path = pad_vocab(args.src, args.dst, args.vocab)
        else:
            path = permute_vocab(args.src, args.dst, seed=args.seed, drop=args.drop)
    except EdgespecError as e:
        raise SystemExit(f"error: {e}") from None
    n = len(gguf_file.open_gguf(path).fields["tokenizer.ggml.tokens"].data)
    print(f"{path}: {n} tokens ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
