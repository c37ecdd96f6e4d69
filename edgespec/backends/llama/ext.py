"""llama.cpp's staging functions for drafts that read the target's states (EAGLE-3 heads, MTP layers), bound
through ctypes: llama-cpp-python binds none of them.

They live in src/llama-ext.h, a C++ header without extern "C", so libllama exports them under their C++ (Itanium)
names; those names encode the signature, so a pinned llama.cpp whose signatures moved fails here with an error
naming the missing function rather than calling it wrongly. docs/llama-drafts.md says how llama.cpp's own
speculative driver uses them.

Bound, for what edgespec uses: the inputs of chosen target layers for every token of a pass (the features an
EAGLE-3 head is trained on and drafts from), the target layers an EAGLE-3 model reads, and a context's pre-norm
("nextn") rows, where an EAGLE-3 head leaves its encoder's output and each draft step's state. llama.h's extended
batch (rows carrying a token, an embedding, or both) and llama_process, plain C functions llama-cpp-python 0.3.36
does not bind either, are bound here too (ExtBatch).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from functools import cache

import numpy as np

from edgespec.backends.llama.lib import lib
from edgespec.errors import EdgespecError

_ctx, _model = ctypes.c_void_p, ctypes.c_void_p
_FLOATS = ctypes.POINTER(ctypes.c_float)
_INTS = ctypes.POINTER(ctypes.c_int32)

# name: (its C++ symbol in libllama, restype, argtypes)
FUNCTIONS = {
    "set_embeddings_layer_inp": ("_Z30llama_set_embeddings_layer_inpP13llama_contextjb", None,
                                 [_ctx, ctypes.c_uint32, ctypes.c_bool]),
    "get_embeddings_layer_inp": ("_Z30llama_get_embeddings_layer_inpP13llama_contextj", _FLOATS,
                                 [_ctx, ctypes.c_uint32]),
    "model_target_layer_ids": ("_Z28llama_model_target_layer_idsPK11llama_model", _INTS, [_model]),
    "model_target_layer_ids_n": ("_Z30llama_model_target_layer_ids_nPK11llama_model", ctypes.c_uint32, [_model]),
    "set_embeddings_nextn": ("_Z26llama_set_embeddings_nextnP13llama_contextbb", None,
                             [_ctx, ctypes.c_bool, ctypes.c_bool]),
    "get_embeddings_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context", _FLOATS, [_ctx]),
    "get_embeddings_nextn_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti", _FLOATS,
                                 [_ctx, ctypes.c_int32]),
}


class Embd(ctypes.Structure):
    """llama.h's struct llama_embd: n_rows rows of n_embd floats (not owned: the caller keeps them alive)."""
    _fields_ = [("data", _FLOATS), ("n_rows", ctypes.c_size_t), ("n_embd", ctypes.c_size_t)]


_batch = ctypes.c_void_p
# llama.h's extended batch and llama_process: C symbols, bound by name (restype, argtypes)
C_FUNCTIONS = {
    "llama_batch_ext_init": (_batch, [_ctx]),
    "llama_batch_ext_free": (None, [_batch]),
    "llama_batch_ext_clear": (None, [_batch]),
    "llama_batch_ext_add_token": (ctypes.c_int32, [_batch, ctypes.c_int32, ctypes.c_int32]),
    "llama_batch_ext_add_embd": (ctypes.c_int32, [_batch, ctypes.c_int32, Embd]),
    "llama_batch_ext_set_embd_token": (ctypes.c_bool, [_batch, ctypes.c_int32, Embd]),
    "llama_batch_ext_set_output_logits": (ctypes.c_bool, [_batch, ctypes.c_int32, ctypes.c_bool]),
    "llama_batch_ext_set_pos": (ctypes.c_bool, [_batch, ctypes.c_int32, _INTS]),
    "llama_process": (ctypes.c_int32, [_ctx, ctypes.c_int, _batch]),
}
ENCODE, DECODE = 0, 1  # enum llama_process_type


@cache
def ext(name: str):
    """The bound function `name` of FUNCTIONS, from the libllama llama_cpp loaded."""
    symbol, restype, argtypes = FUNCTIONS[name] if name in FUNCTIONS else (name, *C_FUNCTIONS[name])
    cdll = getattr(getattr(lib(), "llama_cpp", None), "_lib", None)
    function = getattr(cdll, symbol, None) if cdll is not None else None
    if function is None:
        raise EdgespecError(f"this llama.cpp does not export {name} ({symbol}): the drafts that read a target's "
                            "states (EAGLE-3, MTP) need the llama-cpp-python edgespec pins (make install)")
    function.restype, function.argtypes = restype, argtypes
    return function


def target_layer_ids(model) -> list[int]:
    """The target layers an EAGLE-3 or DFlash model reads (empty for any other model)."""
    n = ext("model_target_layer_ids_n")(model)
    ids = ext("model_target_layer_ids")(model) if n else None
    return [ids[i] for i in range(n)] if ids else []


class LayerInputs:
    """The inputs of chosen layers of a LlamaBackend's model for every token of each of its passes: opened, every
    later pass keeps them; read() gives those of the last llama.cpp decode. Layers are 0 .. n_layer - 1 (the input
    of layer 0 is the token's embedding; the state after the last layer is no layer's input). Reading a layer
    llama.cpp was not told to keep would abort the process (an assert in llama.cpp), so only these are read."""

    def __init__(self, backend, layers: Sequence[int]):
        for layer in layers:
            if not 0 <= layer < backend.n_layer:
                raise EdgespecError(f"layer {layer}: the model has layers 0 to {backend.n_layer - 1}")
        self.backend, self.layers = backend, tuple(layers)
        for layer in self.layers:
            ext("set_embeddings_layer_inp")(backend._ctx, layer, True)

    def read(self, n_tokens: int, first: int = 0) -> np.ndarray:
        """The kept inputs of n_tokens rows of the last decode from batch index `first` on (llama.cpp keeps them in
        batch order, however it split the batch), as a copy: [len(layers), n_tokens, n_embd] float32."""
        out = np.empty((len(self.layers), n_tokens, self.backend.n_embd), dtype=np.float32)
        for i, layer in enumerate(self.layers):
            rows = ext("get_embeddings_layer_inp")(self.backend._ctx, layer)
            out[i] = np.ctypeslib.as_array(rows, shape=(first + n_tokens, self.backend.n_embd))[first:]
        return out

    def close(self) -> None:
        """Later passes keep nothing."""
        for layer in self.layers:
            ext("set_embeddings_layer_inp")(self.backend._ctx, layer, False)


def nextn_rows(ctx, n_rows: int, width: int, first: int | None = None) -> np.ndarray:
    """A copy of a context's pre-norm rows [n_rows, width] after its last process or decode: all of them, or
    n_rows from the row of batch index `first` on (-1: the last row)."""
    rows = ext("get_embeddings_nextn")(ctx) if first is None else ext("get_embeddings_nextn_ith")(ctx, first)
    if not rows:
        raise EdgespecError("llama.cpp returned no pre-norm rows: the context was not told to keep them")
    return np.ctypeslib.as_array(rows, shape=(n_rows, width)).copy()


class ExtBatch:
    """llama.h's extended batch for one context: rows of a token and an embedding (an EAGLE-3 head's decoder input),
    of an embedding alone (its encoder input, a DFlash draft's target features) or of a token alone (a DFlash
    block), each at its own position in one sequence of the context (`seq`). The embeddings stay referenced, not
    copied, until process() has run."""

    def __init__(self, ctx, seq: int = 0):
        self.ctx, self.seq = ctx, seq
        self.batch = ext("llama_batch_ext_init")(ctx)
        if not self.batch:
            raise EdgespecError("llama.cpp could not make an extended batch")
        self.rows: list[np.ndarray] = []  # the embeddings the batch points into
        self.n = 0  # rows in the batch

    def add(self, token: int | None, embedding: np.ndarray | None, position: int, output: bool) -> None:
        """A row of a token, an embedding, or both (an EAGLE-3 or MTP decoder's entry) at `position`."""
        if embedding is not None:
            row = np.ascontiguousarray(embedding, dtype=np.float32).reshape(1, -1)
            self.rows.append(row)
            embd = Embd(row.ctypes.data_as(_FLOATS), 1, row.shape[1])
        if token is None:
            index = ext("llama_batch_ext_add_embd")(self.batch, self.seq, embd)
        else:
            index = ext("llama_batch_ext_add_token")(self.batch, self.seq, token)
            if index >= 0 and embedding is not None and not ext("llama_batch_ext_set_embd_token")(self.batch, index,
                                                                                                    embd):
                index = -2
        if index < 0:
            raise EdgespecError(f"llama.cpp refused a row of an extended batch (code {index})")
        ext("llama_batch_ext_set_pos")(self.batch, index, (ctypes.c_int32 * 4)(position, 0, 0, 0))
        if output:
            ext("llama_batch_ext_set_output_logits")(self.batch, index, True)
        self.n += 1

    def process(self, kind: int) -> None:
        """Run the rows (ENCODE or DECODE) and empty the batch."""
        n, self.n = self.n, 0
        rc = ext("llama_process")(self.ctx, kind, self.batch)
        ext("llama_batch_ext_clear")(self.batch)
        self.rows = []
        if rc != 0:
            raise EdgespecError(f"llama_process failed with code {rc} ({n} rows)")

    def close(self) -> None:
        if self.batch:
            ext("llama_batch_ext_free")(self.batch)
            self.batch = None
