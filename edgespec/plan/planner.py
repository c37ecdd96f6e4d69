"""The memory planner: what a target, a draft and their KV caches need, what fits a device, how fast it may go.

Everything is computed from the model files' headers (model_info) and the settings; no weights load. Per
model: the weights (tensor bytes; llama.cpp's CPU backend repacks Q4_0 tensors into a second copy), the KV
cache (layers x 2 x kv_heads x head_dim x n_ctx x bytes per value of the KV type), compute buffers (a fit
to the sizes llama.cpp reports), logits buffers and the vocabulary tables; the process adds the Python
runtime and the libraries. The draft's context is what it reads (a window of recent tokens) plus what it
drafts, not the target's. When the preferred settings do not fit, the planner gives up, in this order, what
costs least: the draft's window, the prompt batch (slower prefill only), KV precision (f16, q8_0, q4_0),
context length (unless the user fixed it), and on a discrete GPU the layers that stay in VRAM. When nothing
fits it refuses, saying how much is missing and which changes would fit.

The constants below were measured on this project's reference machine (x86-64, llama.cpp CPU build,
onnxruntime CPU) with benchmarks/memory.py, which also prints planned against measured peaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from edgespec.backends.llama.lib import KV_BLOCKS  # module import only: llama_cpp loads on first use
from edgespec.backends.model_info import ModelInfo
from edgespec.backends.protocol import MAX_OUTPUTS
from edgespec.drafts.base import DRAFT_WINDOWS, MAX_DRAFT
from edgespec.errors import EdgespecError
from edgespec.plan.profiles import Profile
from edgespec.units import GiB, MiB, mib_text

KV_CHOICES = tuple(KV_BLOCKS)  # best quality first
UBATCHES = (512, 256, 128)  # prompt tokens per llama.cpp compute pass: the compute buffer scales with it
DEFAULT_CTX, MIN_CTX, CTX_STEP = 2048, 256, 256  # llama.cpp rounds contexts up to a multiple of 256

# measured here: interpreter + numpy + edgespec, the planner's own imports (gguf-py, psutil), then each
# runtime library once imported
PYTHON_BYTES = 30 * MiB
PLANNER_BYTES = 8 * MiB
LIBRARY_BYTES = {"llama.cpp": 11 * MiB, "onnxruntime": 23 * MiB}
GPU_CONTEXT_BYTES = {"cuda": 400 * MiB, "vulkan": 200 * MiB, "metal": 0}  # assumed, not measured: no GPU here
# per vocabulary entry: llama.cpp's token and merge tables, the GGUF metadata it keeps, edgespec's Vocab
# (25 MiB for SmolLM2's 49152 tokens, beyond weights and KV, right after loading)
VOCAB_BYTES_PER_TOKEN = 530
REPACKED_TYPES = {"Q4_0", "IQ4_NL"}  # ggml-cpu repacks these for its matmul kernels (x86 AVX2 / ARM NEON)
# onnxruntime on the CPU holds the initializers and pre-packed copies of the MatMul weights: peak RSS over the
# initializer bytes was 1.8x for an fp32 export and 2.0x (plus activations) for an int8 one of SmolLM2-135M
ONNX_WEIGHT_FACTOR = 1.9
QUANT_BITS = {"q8_0": 8.5, "q6_k": 6.5625, "q5_k_m": 5.69, "q4_k_m": 4.89, "q4_0": 4.5}  # bits per weight


@dataclass(frozen=True)
class ModelNeed:
    """One model's bytes under one set of settings."""

    role: str  # "target" | "draft"
    info: ModelInfo = field(repr=False)
    runtime: str  # "llama.cpp" | "onnxruntime"
    n_ctx: int
    kv_type: str
    n_ubatch: int
    n_gpu_layers: int  # llama.cpp layers on the GPU (n_layer + 1 = all, the output layer included)
    weights: int
    repacked: int
    kv_cache: int
    compute: int
    outputs: int
    vocab: int
    gpu_bytes: int  # the part of the total that lives in a discrete GPU's VRAM
    states: int = 0  # the part of kv_cache that is recurrent layers' states and their snapshots (state_bytes)

    @property
    def total(self) -> int:
        return self.weights + self.repacked + self.kv_cache + self.compute + self.outputs + self.vocab


@dataclass(frozen=True)
class Plan:
    profile: Profile = field(repr=False)
    capacity: int  # bytes the models and the runtime may use (VRAM on a discrete GPU)
    budget_note: str  # where capacity comes from
    models: tuple[ModelNeed, ...]
    runtime: int  # Python, libraries, GPU context, the loop's working arrays, the draft heads
    drafter: str  # the draft's family (drafts/spec.DraftSpec.family): "model" | "heads" | "lookup" | "none"
    draft_window: int | None
    changes: tuple[str, ...] = ()  # what the planner changed from the preferred settings, and why
    suggestions: tuple[str, ...] = ()  # when it does not fit: changes that would
    heads: int = 0  # of runtime: what draft heads hold (their weights, caches and buffers, or output rows)

    @property
    def target(self) -> ModelNeed:
        return self.models[0]

    @property
    def draft(self) -> ModelNeed | None:
        return self.models[1] if len(self.models) > 1 else None

    @property
    def discrete(self) -> bool:
        return not self.profile.unified and self.profile.gpu is not None

    @property
    def total(self) -> int:
        return sum(m.total for m in self.models) + self.runtime

    @property
    def used(self) -> int:
        """Bytes counted against capacity: everything, or what lives in VRAM on a discrete GPU."""
        if self.discrete:
            return sum(m.gpu_bytes for m in self.models) + GPU_CONTEXT_BYTES.get(self.profile.gpu, 0)
        return self.total

    @property
    def fits(self) -> bool:
        return self.used <= self.capacity

    @property
    def missing(self) -> int:
        return max(self.used - self.capacity, 0)


def kv_bytes(info: ModelInfo, n_ctx: int, kv_type: str, runtime: str) -> int:
    layers = info.n_layer if info.attention_layers is None else info.attention_layers
    values = layers * 2 * info.n_head_kv * info.head_dim * n_ctx
    if runtime == "onnxruntime":  # the past's dtype is fixed by the export
        return int(values * info.kv_dtype_bytes)
    block, size = KV_BLOCKS[kv_type]
    return values // block * size


def state_bytes(info: ModelInfo, sequences: int) -> int:
    """llama.cpp's recurrent states (ModelInfo.recurrent_layers): each recurrent layer keeps float32 rows of its
    state, 1 + n_rs_seq a sequence (n_rs_seq = MAX_OUTPUTS snapshots, that a verify pass can be rolled back:
    backends/llama/backend.py)."""
    return info.recurrent_layers * info.state_floats * 4 * sequences * (1 + MAX_OUTPUTS)


def llama_head_bytes(kind: str, path, target_info, n_ctx: int) -> int:
    """What a draft decoding inside llama.cpp beside the target adds to the process, from the files' headers (the
    memory planner's figure): its weights (an EAGLE-3 or DFlash file's tensors; an MTP layer's are in the target's
    file, counted with it); its decoder context's f16 KV cache over the target's context (its own layers; an MTP
    context caches the target's nextn layers); the logits buffer llama.cpp sizes for it (drafts/llama_head.py,
    decoder_params: n_batch rows of the vocabulary for a model with an encoder, EAGLE-3 and DFlash, MAX_OUTPUTS
    rows for MTP); and g, one float32 row of the decoder's width per position, in numpy. kind: "eagle3", "dflash"
    or "mtp" (DraftSpec.in_llama)."""
    from edgespec.backends.model_info import read_model_info
    from edgespec.drafts.llama_head import HEAD_BATCH
    from edgespec.drafts.llama_kinds import mtp_layers

    rows = n_ctx + MAX_OUTPUTS
    if kind == "mtp":
        info = replace(target_info, n_layer=mtp_layers(target_info.path)[1])
        weights, outputs = 0, MAX_OUTPUTS
    else:
        info = read_model_info(path)
        weights, outputs = info.weight_bytes, HEAD_BATCH
    return (weights + kv_bytes(info, rows, "f16", "llama.cpp") + 4 * outputs * target_info.n_vocab
            + 4 * rows * info.n_embd)


def compute_bytes(info: ModelInfo, n_ctx: int, n_ubatch: int) -> int:
    """llama.cpp's compute buffer: activations of a ubatch plus its f16 attention mask, or, for small
    ubatches, the graph of one decode step with MAX_OUTPUTS logits rows. Fitted to the sizes llama.cpp
    logs ("compute buffer size") for three models of different shapes (tests/real/test_planner.py holds the default
    model to 0.5 MiB of the log) with an f16 KV cache;
    a quantized one (flash attention) needs up to 1.1 MiB less, which this does not subtract."""
    per_token = max(4 * info.n_embd + 3 * info.n_ff, 5 * info.n_embd) * 4
    return max(n_ubatch * per_token + n_ctx * n_ubatch * 2, int(1.1 * MAX_OUTPUTS * info.n_vocab * 4))


def runtime_of(info: ModelInfo) -> str:
    return "onnxruntime" if info.format == "onnx" else "llama.cpp"


def llama_ctx(n_ctx: int, info: ModelInfo) -> int:
    """The context llama.cpp allocates: capped at the training context, rounded up to a multiple of 256."""
    if info.n_ctx_train:
        n_ctx = min(n_ctx, info.n_ctx_train)
    return math.ceil(n_ctx / CTX_STEP) * CTX_STEP


def model_need(role: str, info: ModelInfo, n_ctx: int, kv_type: str, n_ubatch: int, gpu: str | None,
               n_gpu_layers: int, discrete: bool, sequences: int = 1) -> ModelNeed:
    """What one model needs at these settings; sequences: those its llama.cpp context holds (recurrent states
    are kept a sequence each: state_bytes, counted with the KV cache)."""
    runtime = runtime_of(info)
    if runtime == "onnxruntime":
        weights = int(info.weight_bytes * ONNX_WEIGHT_FACTOR)
        kv = kv_bytes(info, n_ctx, kv_type, runtime)
        # a run returns a chunk's logits for every position and new present.* arrays beside the past
        compute = 128 * info.n_vocab * 4 + kv
        on_gpu = discrete and gpu is not None
        kv_name = {4: "f32", 2: "f16"}.get(info.kv_dtype_bytes, "model's")
        need = ModelNeed(role, info, runtime, n_ctx, kv_name, 0, 0, weights, 0, kv, compute,
                         MAX_OUTPUTS * info.n_vocab * 4, VOCAB_BYTES_PER_TOKEN * info.n_vocab, 0)
        return replace(need, gpu_bytes=need.weights + kv + compute if on_gpu else 0)
    n_ctx = llama_ctx(n_ctx, info)
    layers_on_gpu = min(n_gpu_layers, info.n_layer) if gpu else 0
    cpu_share = 1 - layers_on_gpu / info.n_layer
    repackable = sum(t.n_bytes for t in info.tensors if t.type in REPACKED_TYPES and t.name != "token_embd.weight")
    # mmap'd Q4_0 pages are read to repack them and stay resident beside the repacked copy
    repacked = int(repackable * cpu_share)
    states = state_bytes(info, sequences)
    kv = kv_bytes(info, n_ctx, kv_type, runtime) + states
    n_ubatch = min(n_ubatch, n_ctx)  # as llama.cpp caps it
    compute = compute_bytes(info, n_ctx, n_ubatch)
    outputs = MAX_OUTPUTS * info.n_vocab * 4
    gpu_bytes = 0
    if discrete and layers_on_gpu:
        gpu_bytes = info.layer_bytes() * layers_on_gpu + kv * layers_on_gpu // info.n_layer + compute
        if n_gpu_layers > info.n_layer:  # the output layer too
            gpu_bytes += info.weight_bytes - info.layer_bytes() * info.n_layer
    return ModelNeed(role, info, runtime, n_ctx, kv_type, n_ubatch, n_gpu_layers if gpu else 0,
                     info.weight_bytes, repacked, kv, compute, outputs, VOCAB_BYTES_PER_TOKEN * info.n_vocab,
                     gpu_bytes, states)


def runtime_bytes(models: list[ModelInfo], gpu_context: int, k_max: int, n_vocab: int) -> int:
    libraries = {runtime_of(m) for m in models}
    loop = (k_max + 1) * n_vocab * 8 * 4  # to_probs' float64 rows for a verify pass, and their temporaries
    return PYTHON_BYTES + PLANNER_BYTES + sum(LIBRARY_BYTES[r] for r in libraries) + loop + gpu_context


def make_plan(target: ModelInfo, draft: ModelInfo | None, profile: Profile, *, budget: int | None = None,
              n_ctx: int | None = None, kv_type: str | None = None, drafter: str = "model",
              k_max: int = 8, heads_bytes: int | None = None, sequences: int = 1) -> Plan:
    """The best settings that fit `profile` (and `budget`, if given), or the plan closest to fitting,
    with suggestions, when nothing does (plan.fits is then False).

    n_ctx: fixed context (None: DEFAULT_CTX, halved while it does not fit). kv_type: fixed KV cache type
    (None: f16, then q8_0, then q4_0). drafter: "model" (draft is its file), "heads" (heads_bytes: what the
    heads hold, drafts.heads.medusa_bytes or drafts.eagle.eagle_bytes; None: a float32 copy of the target's
    output layer, what Medusa heads without a token subset keep), "lookup", "none" (DraftSpec.family).
    sequences: the sequences each model's context holds (streams, or a branch each for draft trees), which a model
    with recurrent layers keeps a state for each (state_bytes).
    """
    if kv_type is not None and kv_type not in KV_BLOCKS:
        raise EdgespecError(f"unknown KV cache type '{kv_type}': choose one of {', '.join(KV_BLOCKS)}")
    capacity = profile.capacity if budget is None else min(profile.capacity, budget)
    note = f"{profile.name}: {profile.memory_bytes / GiB:.1f} GiB, {profile.reserve_bytes / GiB:.1f} GiB reserved"
    if budget is not None and budget < profile.capacity:
        note = f"budget {mib_text(budget)}"
    wanted_ctx = n_ctx or DEFAULT_CTX
    contexts = [wanted_ctx] if n_ctx else [c for c in _halvings(wanted_ctx)]
    kvs = [kv_type] if kv_type else list(KV_CHOICES)
    windows = list(DRAFT_WINDOWS) if draft is not None else [None]
    first = best = None
    for ctx in contexts:
        for kv in kvs:
            for ub in UBATCHES:
                for window in windows:
                    plan = _place(target, draft, profile, capacity, note, ctx, kv, ub, window, drafter, k_max,
                                  heads_bytes, sequences)
                    first = first or plan
                    if plan.fits and _all_on_gpu(plan):
                        return replace(plan, changes=_changes(first, plan))
                    # partial offload only at the context asked for: layers are not worth a shorter context
                    if plan.fits and ctx == contexts[0] and (best is None or _gpu_layers(plan) > _gpu_layers(best)):
                        best = plan
    if best is not None:  # a discrete GPU that holds only part of the layers
        return replace(best, changes=_changes(first, best))
    smallest = _place(target, draft, profile, capacity, note, contexts[-1], kvs[-1], UBATCHES[-1], windows[-1],
                      drafter, k_max, heads_bytes, sequences)
    suggestions = _suggest(target, draft, profile, capacity, contexts[-1], kvs[-1], drafter, k_max, heads_bytes,
                           sequences)
    return replace(smallest, suggestions=tuple(suggestions))


def _halvings(ctx: int) -> list[int]:
    out = [ctx]
    while out[-1] // 2 >= MIN_CTX:
        out.append(out[-1] // 2)
    return out


def _place(target, draft, profile, capacity, note, ctx, kv, ub, window, drafter, k_max, heads_bytes,
           sequences) -> Plan:
    """Needs at these settings; on a discrete GPU, the draft first, then as many target layers as fit VRAM."""
    gpu, discrete = profile.gpu, not profile.unified and profile.gpu is not None
    gpu_context = GPU_CONTEXT_BYTES.get(gpu, 0) if gpu and not discrete else 0  # discrete: counted in VRAM
    runtime = runtime_bytes([m for m in (target, draft) if m], gpu_context, k_max, target.n_vocab)
    heads = 0
    if drafter == "heads":  # heads read (rows of) the target's output layer from a float32 copy, in numpy
        heads = target.n_vocab * target.n_embd * 4 if heads_bytes is None else heads_bytes
    draft_ctx = min(ctx, window) + MAX_DRAFT if window else 0

    def needs(n_target_gpu: int, n_draft_gpu: int) -> list[ModelNeed]:
        out = [model_need("target", target, ctx, kv, ub, gpu, n_target_gpu, discrete, sequences)]
        if draft is not None:
            out.append(model_need("draft", draft, draft_ctx, kv, ub, gpu, n_draft_gpu, discrete, sequences))
        return out

    def plan(models):
        return Plan(profile, capacity, note, tuple(models), runtime + heads, drafter if draft is None else "model",
                    window, heads=heads)

    all_t, all_d = target.n_layer + 1, (draft.n_layer + 1 if draft else 0)
    full = plan(needs(all_t, all_d))
    if not discrete or full.fits:
        return full
    n_draft = all_d if plan(needs(0, all_d)).fits else 0
    n_target = max((n for n in range(all_t, -1, -1) if plan(needs(n, n_draft)).fits), default=0)
    return plan(needs(n_target, n_draft))


def _gpu_layers(plan: Plan) -> int:
    return sum(m.n_gpu_layers for m in plan.models)


def _all_on_gpu(plan: Plan) -> bool:
    return not plan.discrete or all(m.n_gpu_layers == m.info.n_layer + 1 or m.runtime == "onnxruntime"
                                    for m in plan.models)


def _changes(first: Plan, plan: Plan) -> tuple[str, ...]:
    out = []
    t, t0 = plan.target, first.target
    if t.n_ctx < t0.n_ctx:
        out.append(f"context {t.n_ctx} tokens (not {t0.n_ctx})")
    if t.kv_type != t0.kv_type:
        out.append(f"KV cache {t.kv_type} (not {t0.kv_type})")
    if t.n_ubatch != t0.n_ubatch:
        out.append(f"prompt batch {t.n_ubatch} (not {t0.n_ubatch}): slower prefill")
    if plan.draft_window != first.draft_window:
        out.append(f"draft reads the last {plan.draft_window} tokens (not {first.draft_window})")
    for m in plan.models:
        if plan.discrete and m.runtime == "llama.cpp" and m.n_gpu_layers <= m.info.n_layer:
            out.append(f"{m.role}: {m.n_gpu_layers} of {m.info.n_layer + 1} layers on the GPU, the rest on the CPU")
    return tuple(out)


def _suggest(target, draft, profile, capacity, ctx, kv, drafter, k_max, heads_bytes, sequences) -> list[str]:
    """Changes that would fit, cheapest first: a smaller context, a smaller quantization, no draft model.
    The last two are tried at `ctx`, the smallest context the user's options allow."""
    out = []

    def fits(t, d, ctx, window, kind):
        return _place(t, d, profile, capacity, "", ctx, kv, UBATCHES[-1], window, kind, k_max, heads_bytes,
                      sequences).fits

    window = DRAFT_WINDOWS[-1] if draft is not None else None
    smaller_ctx = next((c for c in range(ctx - CTX_STEP, 0, -CTX_STEP) if fits(target, draft, c, window, drafter)),
                       None)
    if smaller_ctx:
        out.append(f"a context of {smaller_ctx} tokens (--ctx {smaller_ctx})")
    for quant in ("q4_k_m", "q4_0"):
        smaller = requantized(target, quant)
        if smaller.weight_bytes < target.weight_bytes and fits(smaller, draft, ctx, window, drafter):
            out.append(f"the target as {quant} (about {smaller.weight_bytes / MiB:.0f} MiB of weights: "
                       f"edgespec export {target.name} --to gguf --quant {quant} --out ...)")
            break
    if draft is not None and fits(target, None, ctx, None, "lookup"):
        out.append("no draft model (--draft ngram: prompt lookup needs no memory)")
    if not out:
        out.append("a device with more memory, or a smaller target model")
    return out


def requantized(info: ModelInfo, quant: str) -> ModelInfo:
    """The same model's facts with its 2-D weights at `quant`'s bits per weight (an estimate for suggestions)."""
    from edgespec.backends.model_info import Tensor

    bits = QUANT_BITS[quant]
    tensors = tuple(t if t.n_elements < 4096 or t.n_bytes * 8 <= t.n_elements * bits
                    else Tensor(t.name, quant.upper(), t.n_elements, int(t.n_elements * bits / 8))
                    for t in info.tensors)
    return replace(info, tensors=tensors, format="gguf")
