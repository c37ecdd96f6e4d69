"""EAGLE-3 heads in llama.cpp's own format (GGUF architecture `eagle3`), drafting inside llama.cpp beside the
target's context, their whole distributions under edgespec's rejection rule.

An EAGLE-3 head (Li et al. 2025) reads three of the target's layers. After every target pass the inputs of those
layers for each row (llama-ext's layer-input extraction, backends/llama/ext.py) are joined, 3 x the target's width,
and the head's encoder (`fc`) turns each into one row g[P]; its decoder, one Llama layer, drafts from them as an
MTP layer does (drafts/llama_head.py: entries, chains, what differs from llama-server's `--spec-type
draft-eagle3`). With a `d2t` map the head speaks a subset of the target's ids and llama.cpp scatters its logits
into the target's vocabulary with -inf elsewhere; the drafter keeps the subset's logits (`ids`).

What a drafting round costs besides its steps, and the controller does not price yet: an encoder call over the
target's rows since the last round, and a decoder call for the entries committed since (LlamaHeadDrafter._entries).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgespec.backends.llama.ext import ENCODE, nextn_rows
from edgespec.backends.llama.lib import lib as _lib
from edgespec.drafts.llama_head import LayerReadingDrafter
from edgespec.errors import EdgespecError

PENDING = 64  # target rows kept for the encoder before it runs without a draft asking


def head_ids(path: str | os.PathLike, n_vocab: int) -> np.ndarray | None:
    """The target ids an EAGLE-3 GGUF drafts (its d2t map, converted to absolute ids), None where it drafts the
    whole vocabulary. Found from the streamed header: gguf-py's reader would parse the vocabulary the converter
    copies into the head first (seconds at 49k tokens)."""
    from edgespec.backends.model_info import read_gguf_header

    tensor = next((t for t in read_gguf_header(Path(path))[1] if t.name == "d2t"), None)
    if tensor is None:
        return None
    if tensor.type not in ("I64", "I32"):
        raise EdgespecError(f"{Path(path).name}: its d2t map is {tensor.type}, not integer ids")
    ids = np.fromfile(path, dtype=np.int64 if tensor.type == "I64" else np.int32, count=tensor.n_elements,
                      offset=tensor.offset).astype(np.int64)
    if ids.size == 0 or ids.min() < 0 or ids.max() >= n_vocab or np.unique(ids).size != ids.size:
        raise EdgespecError(f"{Path(path).name}: its d2t map is not a set of distinct ids under {n_vocab}")
    return ids


class Eagle3Drafter(LayerReadingDrafter):
    """Drafts chains from an EAGLE-3 GGUF against a LlamaBackend target (streams: for_streams)."""

    what = "an EAGLE-3 head"

    def __init__(self, path: str | os.PathLike, target, *, n_threads: int | None = None):
        path = Path(path)
        self.load(path, target)
        lib = _lib()
        cparams = self.decoder_params(target, n_threads)  # its graph takes the target's embeddings, output layer
        ctx = lib.llama_init_from_model(self._model, cparams) if len(self.layers) == 3 else None
        if not ctx:
            self._free_model()
            raise EdgespecError(f"{path.name} is not an EAGLE-3 head llama.cpp can run beside {target.name} "
                                f"(it reads target layers {self.layers}; an EAGLE-3 head reads three)")
        self.ids = head_ids(path, target.vocab.n_vocab)
        self.pending: dict[int, np.ndarray] = {}  # position -> the target's features there, not encoded yet
        self.name = f"eagle3:{path.name}"
        self.attach(ctx, target, lib.llama_model_n_embd(self._model))
        self.read_layers(target)

    def _read_target(self, positions: list[int], first: int = 0) -> None:
        """After a target pass: its rows' features, kept by position until the head's encoder reads them (in
        _encode, when the head drafts, or once PENDING have gathered): a pass the head drafts nothing after costs
        a copy of its rows, not an encoder call."""
        self.pending.update(zip(positions, self.features(len(positions), first), strict=True))
        if len(self.pending) >= PENDING:
            self._encode()

    def _encode(self) -> None:
        """The pending features through the head's encoder, into g at their positions."""
        if not self.pending:
            return
        positions = sorted(self.pending)
        features = np.stack([self.pending.pop(pos) for pos in positions]).astype(np.float32)  # [n, 3E]
        lib = _lib()
        for start in range(0, len(positions), self.n_batch):
            chunk = features[start:start + self.n_batch]
            after = lib.llama_memory_seq_pos_max(self._mem, self.seq) + 1  # the encoder reads no position; llama.cpp
            for j, row in enumerate(chunk):  # checks them against the head's cache all the same
                self.batch.add(None, row, after + j, True)
            self.batch.process(ENCODE)
            self.g[positions[start:start + len(chunk)]] = nextn_rows(self._ctx, len(chunk), self.width)

    _flush = _encode

    def _fresh(self) -> None:
        self.pending = {}
