"""`--draft mtp`: the MTP ("nextn") layers a target carries in its own GGUF (Qwen3.5/3.6, GLM-4.5, DeepSeek-V3,
...), drafting inside llama.cpp beside the target's context, their whole distributions under edgespec's rejection
rule.

An MTP layer was trained with the target to predict the token after next: at position P it joins the target's
last state there (h[P], which the target's own output layer turns into the law of token P + 1) with the embedding
of token P + 1, and its logits, through the target's output layer, are the law of token P + 2. llama.cpp builds
its graph in a second context of the target's model (LLAMA_CONTEXT_TYPE_MTP; the model loaded with its MTP tensors,
LlamaBackend(load_mtp=True)); the target context hands over h for every row of every pass (llama-ext's "nextn"
rows). The decoder entries, chains and what differs from llama-server's `--spec-type draft-mtp` are
drafts/llama_head.py's. One MTP layer drafts every step from its own state, as llama-server does for Qwen3.5;
a model with several (step35's chained heads) or MTP layers sharing the target's cache (Gemma 4's assistant) is
not driven here.
"""

from __future__ import annotations

from edgespec.backends.llama.ext import ext, nextn_rows
from edgespec.backends.llama.lib import lib as _lib
from edgespec.drafts.llama_head import LlamaHeadDrafter
from edgespec.errors import EdgespecError

CONTEXT_TYPE_MTP = 1  # llama.h's enum llama_context_type


class MtpDrafter(LlamaHeadDrafter):
    """Drafts chains from the MTP layer of a LlamaBackend target opened with load_mtp (streams: for_streams)."""

    all_outputs = False  # its graph selects the output rows: the committed entries need no logits but the last's

    def __init__(self, target, *, n_threads: int | None = None):
        self.check_target(target, "an MTP layer")
        lib = _lib()
        n_layers = lib.llama_model_n_layer_nextn(target._model)
        if not getattr(target, "load_mtp", False) or n_layers < 1:
            raise EdgespecError(f"{target.name} was opened without MTP layers (--draft mtp opens it with them)")
        if n_layers > 1:
            raise EdgespecError(f"{target.name} carries {n_layers} MTP layers; edgespec drives a single one")
        cparams = self.decoder_params(target, n_threads)
        cparams.ctx_type = CONTEXT_TYPE_MTP
        ctx = lib.llama_init_from_model(target._model, cparams)
        if not ctx:
            raise EdgespecError(f"llama.cpp could not make an MTP context for {target.name}")
        self.name = f"mtp:{target.name}"
        self.attach(ctx, target, target.n_embd)
        ext("set_embeddings_nextn")(target._ctx, True, False)  # h of every row of every pass

    def _read_target(self, positions: list[int], first: int = 0) -> None:
        """After a target pass: its last state at each row's position, g[P] = h[P]."""
        self.g[positions] = nextn_rows(self.target._ctx, len(positions), self.width, first or None)

    def close(self) -> None:
        if getattr(self, "target", None) is not None and self._feeding():
            ext("set_embeddings_nextn")(self.target._ctx, False, False)
        self.release()
