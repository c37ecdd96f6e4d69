"""A GGUF decoder stack fed vectors instead of tokens, through llama-cpp-python's low-level API."""

from __future__ import annotations

import ctypes
import os

import numpy as np

from edgespec.backends.llama.lib import KV_TYPES, check_gguf_file
from edgespec.backends.llama.lib import lib as _lib
from edgespec.backends.llama.model import LlamaHandles
from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.errors import EdgespecError
from edgespec.machine import cores


class LlamaVectorModel(LlamaHandles):
    """A GGUF decoder stack fed vectors instead of tokens (llama_batch.embd), one sequence from position 0:
    what an EAGLE head runs in (drafts/eagle.py), and a draft model drafting from a subset of the vocabulary
    (backends/llama/subset.py). `forward` appends rows and returns, for its last n_out rows, the output layer's
    logits and (with hidden) the final normed hidden state. The weights are read into memory (no mmap), so the
    file may be deleted once the model is open. kv_type: f32 (no rounding, flash
    attention off: a head's one-layer cache) or one of KV_TYPES, as LlamaBackend."""

    def __init__(self, path: str | os.PathLike, *, n_ctx: int, n_threads: int | None = None, n_ubatch: int = 32,
                 hidden: bool = True, kv_type: str = "f32"):
        path = check_gguf_file(path)
        lib = _lib()
        mparams = lib.llama_model_default_params()
        mparams.load_mode = lib.LLAMA_LOAD_MODE_NONE  # read, not mapped
        self._model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise EdgespecError(f"llama.cpp could not load the head model {path}")
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = n_ctx
        # without flash attention a pass holds [n_ctx, n_ubatch, n_head] scores: small batches keep that small
        cparams.n_batch = cparams.n_ubatch = min(n_ubatch, n_ctx)
        # the context as LlamaBackend's (up to MAX_OUTPUTS sequences, one unified cache); only sequence 0 is used
        cparams.n_seq_max = MAX_OUTPUTS
        cparams.kv_unified = True
        cparams.n_outputs_max = MAX_OUTPUTS
        cparams.n_threads = cparams.n_threads_batch = n_threads or min(cores(), 8)
        cparams.no_perf = True
        cparams.embeddings = self.hidden = hidden
        self.kv_type = kv_type
        if kv_type == "f32":  # a head's one-layer cache: small, and no f16 rounding
            cparams.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED  # its CPU kernel rounds through f16
            cparams.type_k = cparams.type_v = lib.GGML_TYPE_F32
        else:  # as LlamaBackend: a draft model's cache
            cparams.type_k = cparams.type_v = getattr(lib, KV_TYPES[kv_type])
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            lib.llama_model_free(self._model)
            raise EdgespecError(f"llama.cpp could not create a context of {n_ctx} rows for the head model {path}")
        self._mem = lib.llama_get_memory(self._ctx)
        self.n_ctx, self.n_batch = lib.llama_n_ctx(self._ctx), lib.llama_n_batch(self._ctx)
        self.n_embd = lib.llama_model_n_embd(self._model)
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model))
        self.n = 0  # rows in the cache, at positions 0 .. n-1
        self._batch = lib.llama_batch_init(self.n_batch, self.n_embd, 1)

    def forward(self, vectors: np.ndarray, n_out: int = 1) -> tuple[np.ndarray, np.ndarray | None]:
        """Append rows vectors [T, E]; logits [n_out, V] and hidden states [n_out, E] (None without hidden) of
        the last n_out."""
        lib, n = _lib(), len(vectors)
        if not 0 <= n_out <= min(n, MAX_OUTPUTS) or self.n + n > self.n_ctx:
            raise EdgespecError(f"vector model: {n} rows with {n_out} outputs do not fit ({self.n} of {self.n_ctx} "
                                f"rows used, at most {MAX_OUTPUTS} outputs)")
        if n_out < n:  # with embeddings on llama.cpp outputs every row: run the others with them off
            if self.hidden:
                lib.llama_set_embeddings(self._ctx, False)
            try:
                self._decode(vectors[:n - n_out], outputs=False)
            finally:
                if self.hidden:
                    lib.llama_set_embeddings(self._ctx, True)
        if n_out:
            self._decode(vectors[n - n_out:], outputs=True)
        logits = np.empty((n_out, self.n_vocab), dtype=np.float32)  # [n_out, V]
        for j in range(n_out):
            logits[j] = np.ctypeslib.as_array(lib.llama_get_logits_ith(self._ctx, j), shape=(self.n_vocab,))
        if not self.hidden:
            return logits, None
        hidden = np.stack([np.ctypeslib.as_array(lib.llama_get_embeddings_ith(self._ctx, j), shape=(self.n_embd,))
                           for j in range(n_out)]) if n_out else np.empty((0, self.n_embd), dtype=np.float32)
        return logits, hidden

    def _decode(self, vectors: np.ndarray, *, outputs: bool) -> None:
        b, vectors = self._batch, np.ascontiguousarray(vectors, dtype=np.float32)
        for start in range(0, len(vectors), self.n_batch):
            chunk = vectors[start:start + self.n_batch]
            ctypes.memmove(b.embd, chunk.ctypes.data, chunk.nbytes)
            for j in range(len(chunk)):
                b.pos[j] = self.n + j
                b.n_seq_id[j] = 1
                b.seq_id[j][0] = 0
                b.logits[j] = int(outputs)
            b.n_tokens = len(chunk)
            rc = _lib().llama_decode(self._ctx, b)
            if rc != 0:
                self.truncate(self.n)  # drop whatever part of the chunk got in
                raise EdgespecError(f"llama_decode failed with code {rc} on the head model")
            self.n += len(chunk)

    def truncate(self, n: int) -> None:
        """Keep the first n rows (and nothing a failed pass left after them)."""
        _lib().llama_memory_seq_rm(self._mem, 0, n, -1)
        self.n = min(n, self.n)

    def memory(self) -> dict[str, int]:
        """Bytes of the weights and the KV cache."""
        return self._held()
