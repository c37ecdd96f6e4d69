"""llama.cpp's staging functions for drafts that read the target's states (EAGLE-3 heads, MTP layers), bound
through ctypes: llama-cpp-python binds none of them.

They live in src/llama-ext.h, a C++ header without extern "C", so libllama exports them under their C++ (Itanium)
names; those names encode the signature, so a pinned llama.cpp whose signatures moved fails here with an error
naming the missing function rather than calling it wrongly. docs/llama-drafts.md says how llama.cpp's own
speculative driver uses them.

Bound so far, for what edgespec uses: the inputs of chosen target layers for every token of a pass (the features
an EAGLE-3 head is trained on and drafts from) and the target layers an EAGLE-3 model reads. The rest (the nextn
rows, the draft's other context) is bound when a drafter uses it.
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
}


@cache
def ext(name: str):
    """The bound function `name` of FUNCTIONS, from the libllama llama_cpp loaded."""
    symbol, restype, argtypes = FUNCTIONS[name]
    cdll = getattr(getattr(lib(), "llama_cpp", None), "_lib", None)
    function = getattr(cdll, symbol, None) if cdll is not None else None
    if function is None:
        raise EdgespecError(f"this llama.cpp does not export llama_{name} ({symbol}): the drafts that read a target's "
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

    def read(self, n_tokens: int) -> np.ndarray:
        """The kept inputs for the n_tokens of the last decode, as a copy: [len(layers), n_tokens, n_embd]
        float32."""
        out = np.empty((len(self.layers), n_tokens, self.backend.n_embd), dtype=np.float32)
        for i, layer in enumerate(self.layers):
            rows = ext("get_embeddings_layer_inp")(self.backend._ctx, layer)
            out[i] = np.ctypeslib.as_array(rows, shape=(n_tokens, self.backend.n_embd))
        return out

    def close(self) -> None:
        """Later passes keep nothing."""
        for layer in self.layers:
            ext("set_embeddings_layer_inp")(self.backend._ctx, layer, False)
