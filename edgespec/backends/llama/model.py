"""A loaded GGUF's handles through llama-cpp-python's low-level API: freeing them, the memory they hold, its
vocabulary, tokenizer and chat template. The models that run on them are in llama_backend.py (tokens in) and
llama_vectors.py (vectors in).
"""

from __future__ import annotations

import ctypes
import os

from edgespec.backends.llama.lib import KV_BLOCKS, check_gguf_file
from edgespec.backends.llama.lib import lib as _lib
from edgespec.backends.protocol import Vocab
from edgespec.errors import EdgespecError


class LlamaHandles:
    """A llama.cpp model, context and batch (`_model`, `_ctx`, `_batch`), freed once."""

    def _held(self) -> dict[str, int]:
        """Bytes of the weights and of a KV cache of n_ctx cells in kv_type."""
        lib, m = _lib(), self._model
        block, size = KV_BLOCKS.get(self.kv_type, (1, 4))  # or f32, a LlamaVectorModel's default
        kv_values = lib.llama_model_n_layer(m) * 2 * lib.llama_model_n_head_kv(m) * self._head_dim() * self.n_ctx
        return {"weights": int(lib.llama_model_size(m)), "kv_cache": kv_values // block * size}

    def _head_dim(self) -> int:
        lib, arch = _lib(), ctypes.create_string_buffer(64)
        lib.llama_model_meta_val_str(self._model, b"general.architecture", arch, 64)
        key_length = ctypes.create_string_buffer(32)
        if lib.llama_model_meta_val_str(self._model, arch.value + b".attention.key_length", key_length, 32) > 0:
            return int(key_length.value)
        return lib.llama_model_n_embd(self._model) // max(lib.llama_model_n_head(self._model), 1)

    def close(self) -> None:
        """Free the context and the model; the object is unusable afterwards."""
        if getattr(self, "_ctx", None):
            lib = _lib()
            lib.llama_batch_free(self._batch)
            lib.llama_free(self._ctx)
            lib.llama_model_free(self._model)
            self._ctx = self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def read_vocab(v) -> Vocab:
    """The Vocab of a llama.cpp vocabulary handle."""
    lib = _lib()
    n = lib.llama_vocab_n_tokens(v)
    buf = ctypes.create_string_buffer(256)
    pieces = []
    for i in range(n):
        size = lib.llama_token_to_piece(v, i, buf, len(buf), 0, False)
        if size < 0:  # longer than the buffer: ask again with the size it reported
            big = ctypes.create_string_buffer(-size)
            size = lib.llama_token_to_piece(v, i, big, len(big), 0, False)
            pieces.append(big.raw[:size])
        else:
            pieces.append(buf.raw[:size])
    return Vocab(
        texts=tuple(lib.llama_vocab_get_text(v, i) or b"" for i in range(n)),
        pieces=tuple(pieces),
        bos_id=lib.llama_vocab_bos(v),
        eos_id=lib.llama_vocab_eos(v),
        eog_ids=frozenset(i for i in range(n) if lib.llama_vocab_is_eog(v, i)),
    )


def tokenize_text(v, text: str, special: bool) -> list[int]:
    lib, raw = _lib(), text.encode("utf-8")
    cap = len(raw) + 8
    buf = (lib.llama_token * cap)()
    n = lib.llama_tokenize(v, raw, len(raw), buf, cap, special, special)
    if n < 0:
        cap = -n
        buf = (lib.llama_token * cap)()
        n = lib.llama_tokenize(v, raw, len(raw), buf, cap, special, special)
    return list(buf[:n])


def chat_template_of(model) -> str | None:
    tmpl = _lib().llama_model_chat_template(model, None)
    return tmpl.decode("utf-8") if tmpl else None


class LlamaTokenizer:
    """The vocabulary and chat template of a GGUF, loaded without its weights (llama.cpp's vocab_only)."""

    def __init__(self, path: str | os.PathLike):
        path = check_gguf_file(path)
        lib = _lib()
        mparams = lib.llama_model_default_params()
        mparams.vocab_only = True
        self._model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise EdgespecError(f"llama.cpp could not read the vocabulary of {path}: the GGUF is corrupt or truncated")
        self._vocab_p = lib.llama_model_get_vocab(self._model)
        self.vocab = read_vocab(self._vocab_p)

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        return tokenize_text(self._vocab_p, text, special)

    def chat_template(self) -> str | None:
        return chat_template_of(self._model)

    def close(self) -> None:
        if getattr(self, "_model", None):
            _lib().llama_model_free(self._model)
            self._model = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
