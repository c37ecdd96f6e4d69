"""A draft model that drafts from a subset of the vocabulary: the same layers, a narrower output layer.

A small draft spends much of a step in its output layer: SmolLM2's is 49152 x 576, 28M of a twelve-layer
draft's 71M multiply-adds a token. A draft trained on the target's answers only ever proposes the tokens the
target emits, so its output layer can keep just those rows (the frequency-ranked subset FR-Spec and EAGLE-3
use, here the one edgespec's heads draft from). Every other token gets draft probability 0, which the
rejection rule handles like any other draft distribution: the output stays the target's, exactly.

The subset lives in the draft's GGUF as the metadata key SUBSET_KEY (`edgespec draft-vocab` adds it). At load,
SubsetDraft writes the draft's layers and the subset's output rows (bytes copied, never requantized) as a GGUF
with a placeholder vocabulary of one token per row, which llama.cpp runs fed vectors (LlamaVectorModel): the
input embedding of every token, subset or not, is read here from the draft's own token_embd, so the draft reads
any text exactly as the full draft does. Logits come back over the whole vocabulary (-inf off the subset), so to
the loop it is one more Backend.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgespec.backends import gguf_file
from edgespec.backends.gguf_file import SUBSET_KEY
from edgespec.backends.protocol import MAX_OUTPUTS, Backend, Vocab, check_forward
from edgespec.errors import EdgespecError

SUBSET_UBATCH = 256  # rows per llama.cpp pass: attention scores [n_ctx, n_ubatch, n_head] without flash attention


def read_subset(path: str | os.PathLike) -> np.ndarray | None:
    """The subset a draft GGUF carries (token ids [S], ascending), or None for a full-vocabulary draft."""
    return _subset_of(gguf_file.open_gguf(path))


def _subset_of(reader) -> np.ndarray | None:
    field = reader.fields.get(SUBSET_KEY)
    return None if field is None else np.asarray(field.contents(), dtype=np.int64)


def check_subset(subset: np.ndarray, n_vocab: int, eog_ids: frozenset[int] = frozenset()) -> np.ndarray:
    """subset as sorted unique ids with every end-of-generation id in (a draft that cannot propose the end
    drafts past it), or an error for ids outside the vocabulary."""
    subset = np.asarray(subset, dtype=np.int64)
    if subset.ndim != 1 or len(subset) == 0 or subset.min() < 0 or subset.max() >= n_vocab:
        raise EdgespecError(f"a draft subset needs token ids in 0..{n_vocab - 1}, got {subset.size} ids "
                            f"from {subset.min(initial=0)} to {subset.max(initial=0)}")
    return np.union1d(subset, np.fromiter(eog_ids, dtype=np.int64))


def write_subset(src: str | os.PathLike, dst: str | os.PathLike, subset: np.ndarray) -> Path:
    """A copy of the draft GGUF src at dst that carries `subset` (SUBSET_KEY); weights unchanged. Written beside
    dst under a temporary name and renamed, so a failure leaves nothing at dst."""
    from edgespec.backends.llama.backend import LlamaTokenizer

    reader, dst = gguf_file.open_gguf(src), Path(dst)
    tokenizer = LlamaTokenizer(src)
    try:
        vocab = tokenizer.vocab
    finally:
        tokenizer.close()
    subset = check_subset(subset, vocab.n_vocab, vocab.eog_ids)
    arch = gguf_file.architecture(reader)
    tmp = dst.with_name(f".{dst.name}.partial")
    try:
        writer = gguf_file.new_writer(None, arch)
        gguf_file.copy_fields(writer, reader.fields.values(), lambda name: name == SUBSET_KEY)
        writer.add_array(SUBSET_KEY, [int(i) for i in subset])
        for t in reader.tensors:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        gguf_file.write(writer, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def _narrow_gguf(reader, subset: np.ndarray, path: Path, n_ctx: int) -> None:
    """The draft's layers with output rows `subset` (tied to token_embd, which vector inputs never read) and a
    placeholder vocabulary of one token per row, at path."""
    tensors = {t.name: t for t in reader.tensors}
    rows = tensors.get("output.weight") or tensors["token_embd.weight"]
    writer = gguf_file.new_writer(None, gguf_file.architecture(reader))
    gguf_file.copy_fields(writer, reader.fields.values(), lambda name: (
        name.startswith("tokenizer.") or name.endswith(".vocab_size") or name.endswith(".context_length")
        or name == SUBSET_KEY))
    writer.add_context_length(n_ctx)
    gguf_file.add_placeholder_vocab(writer, len(subset))
    writer.add_tensor("token_embd.weight", np.ascontiguousarray(rows.data[subset]), raw_dtype=rows.tensor_type)
    for t in reader.tensors:
        if t.name not in ("token_embd.weight", "output.weight"):
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    gguf_file.write(writer, path)


class SubsetDraft(Backend):
    """A draft GGUF with a subset, as a Backend (see backends/protocol.py): logits [n, V] with -inf off the
    subset. Settings as LlamaBackend's for a draft (f16 cache by default)."""

    def __init__(self, path: str | os.PathLike, *, n_ctx: int = 2048, n_threads: int | None = None,
                 kv_type: str = "f16", subset: np.ndarray | None = None):
        """subset: token ids to keep (default: the file's SUBSET_KEY, which it must then have)."""
        from edgespec.backends.llama.backend import LlamaTokenizer
        from edgespec.backends.llama.lib import KV_TYPES
        from edgespec.backends.llama.vectors import LlamaVectorModel

        if kv_type not in KV_TYPES:
            raise EdgespecError(f"unknown KV cache type '{kv_type}': choose one of {', '.join(KV_TYPES)}")
        reader = gguf_file.open_gguf(path)
        self.path, self.name = Path(path), Path(path).name
        self._tokenizer = LlamaTokenizer(path)
        self.vocab: Vocab = self._tokenizer.vocab
        if subset is None:
            subset = _subset_of(reader)
            if subset is None:
                raise EdgespecError(f"{path} carries no draft subset: add one with edgespec draft-vocab")
        self.subset = check_subset(subset, self.vocab.n_vocab, self.vocab.eog_ids)  # [S]
        embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
        # the input rows, as stored: dequantized a few at a time, as llama.cpp's get_rows does
        self._embd_rows, self._embd_type = np.asarray(embd.data), embd.tensor_type.name  # [V, row bytes or E]
        with tempfile.TemporaryDirectory(prefix="edgespec-subset-") as tmp:
            narrow = Path(tmp) / "draft.gguf"
            _narrow_gguf(reader, self.subset, narrow, n_ctx)
            del reader, embd
            self.model = LlamaVectorModel(narrow, n_ctx=n_ctx, n_threads=n_threads, n_ubatch=SUBSET_UBATCH,
                                          hidden=False, kv_type=kv_type)  # read in: the file may go
        self._embd_rows = np.array(self._embd_rows)  # a copy, not a view of the reader's mapping
        self.n_ctx, self.kv_type, self.n_threads = self.model.n_ctx, kv_type, n_threads
        self.tokens: list[int] = []

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """The draft's input embeddings of tokens: [T, E] float32."""
        return gguf_file.dequantize(self._embd_rows[np.asarray(tokens, dtype=np.int64)], self._embd_type)

    def placement(self) -> dict:
        return {"runtime": "llama.cpp", "device": "cpu"}  # vector input runs on the CPU

    def forward(self, tokens: Sequence[int], n_logits: int, *, copy: bool = True) -> np.ndarray:
        check_forward(self, len(tokens), n_logits, MAX_OUTPUTS)
        out = np.full((n_logits, self.vocab.n_vocab), -np.inf, dtype=np.float32)  # [n_logits, V]
        if tokens:
            logits, _ = self.model.forward(self.embed(tokens), n_logits)  # [n_logits, S]
            self.tokens.extend(tokens)
            out[:, self.subset] = logits
        return out

    def rollback(self, n_past: int) -> None:
        if n_past < 0 or n_past > len(self.tokens):
            raise ValueError(f"cannot roll back to {n_past} with {len(self.tokens)} tokens cached")
        self.model.truncate(n_past)
        del self.tokens[n_past:]

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        return self._tokenizer.tokenize(text, special=special)

    def chat_template(self) -> str | None:
        return self._tokenizer.chat_template()

    def memory(self) -> dict[str, int]:
        held = self.model.memory()  # the narrowed model and its cache; beside it, the input rows
        return {**held, "weights": held["weights"] + self._embd_rows.nbytes,
                "logits": MAX_OUTPUTS * self.vocab.n_vocab * 4}

    def close(self) -> None:
        self.model.close()
        self._tokenizer.close()
