"""ONNX decoder-with-past folders through onnxruntime (the only runtime module importing onnxruntime and tokenizers).

A folder is what `edgespec export --to onnx` writes: model.onnx (inputs input_ids, attention_mask, position_ids,
past_key_values.{layer}.{key|value}; outputs logits, last_hidden_state (the final normed hidden state the output
layer reads, which draft heads read too) and present.{layer}.{key|value}), its external data if any,
tokenizer.json, config.json and generation_config.json. The graph returns logits for every new position, so a
prompt runs in chunks of PREFILL_CHUNK tokens and each chunk's logits are cut to the rows asked for at once. The
KV cache is the present.* outputs fed back as the next past; rollback slices them along the sequence axis. On a
GPU the cache stays on the device through IO binding; on the CPU it is plain numpy arrays.

The vocabulary is read with the `tokenizers` library and follows llama.cpp's conventions (token texts, printed
pieces, BOS/EOS as its converter picks them, end-of-generation ids by its text rule), so an ONNX export and a
GGUF of the same model have equal Vocabs and can form a mixed target/draft pair.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError
from edgespec.runtime.backend import MAX_OUTPUTS, Vocab, check_forward

MODEL_FILE = "model.onnx"
HIDDEN_OUTPUT = "last_hidden_state"  # [batch, T, E]: added by edgespec's export (export/onnx.add_hidden_output)
PREFILL_CHUNK = 128  # tokens per session run, bounding the logits buffer onnxruntime returns to 128 x V floats:
# a 512-token prompt through SmolLM2-135M fp32 (2 CPU threads) takes 0.82-0.85 s in chunks of 128, 0.81 s of 256,
# 0.95-1.0 s of 64
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
             "tensorrt": "TensorrtExecutionProvider", "coreml": "CoreMLExecutionProvider"}
# best first; TensorRT builds its engines at load and per new shape range, so auto leaves it to those who ask.
# A GPU build of onnxruntime lists its providers whether or not the GPU libraries load: auto then runs on the CPU.
AUTO_ORDER = ("cuda", "coreml", "cpu")
DEVICE_MEMORY = {"CUDAExecutionProvider", "TensorrtExecutionProvider"}  # providers whose tensors live on a GPU
FEED_INPUTS = {"input_ids", "attention_mask", "position_ids"}
NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32,
               "tensor(float)": np.float32, "tensor(float16)": np.float16}

# llama.cpp decides end of generation by token text (llama-vocab.cpp, ggml-org/llama.cpp#9606). check_compatible
# requires equal eog_ids, so an ONNX export must apply the same rule as a GGUF of the same model.
EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
             "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
             "<｜end▁of▁sentence｜>")  # the last: DeepSeek's, an end-of-turn text for llama.cpp
# fill-in-the-middle pad / repo / file-separator tokens end generation too: llama.cpp takes the first it meets
# of each kind (hash order); we take the lowest id. SmolLM2's <reponame> (id 4) is one of these.
FIM_EOG_TEXTS = (("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
                 ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
                 ("<|file_sep|>",))


def _require(module: str):
    """Import a runtime dependency of ONNX models, or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EdgespecError(f"ONNX models need {module}: pip install 'edgespec[onnx]'") from e


def check_onnx_folder(folder: str | os.PathLike) -> Path:
    """The export folder (a path to its model.onnx is accepted too), or a clear error."""
    folder = Path(folder)
    if folder.is_file() and folder.name == MODEL_FILE:
        folder = folder.parent
    if not folder.exists():
        raise EdgespecError(f"model folder not found: {folder}")
    if not folder.is_dir():
        raise EdgespecError(f"{folder} is not an ONNX model folder (export one with: edgespec export --to onnx)")
    if not (folder / MODEL_FILE).is_file():
        raise EdgespecError(f"{folder} has no {MODEL_FILE}: export one with: edgespec export --to onnx")
    return folder


def pick_provider(available: Sequence[str], provider: str) -> str:
    """The execution provider for `provider` (cpu, cuda, tensorrt, coreml or auto) among those available."""
    if provider == "auto":
        return next(PROVIDERS[d] for d in AUTO_ORDER if PROVIDERS[d] in available)
    if provider not in PROVIDERS:
        raise EdgespecError(f"unknown provider '{provider}': choose one of {', '.join([*PROVIDERS, 'auto'])}")
    if PROVIDERS[provider] not in available:
        hint = "install onnxruntime-gpu" if provider in ("cuda", "tensorrt") else "use --provider cpu"
        raise EdgespecError(f"provider '{provider}' needs onnxruntime's {PROVIDERS[provider]}, but this onnxruntime "
                            f"has only {', '.join(available)}: {hint}")
    return PROVIDERS[provider]


def available_providers() -> tuple[str, ...]:
    """Short names of the providers this onnxruntime offers (none without onnxruntime)."""
    try:
        ort = importlib.import_module("onnxruntime")
    except ImportError:
        return ()
    names = {v: k for k, v in PROVIDERS.items()}
    return tuple(names[p] for p in ort.get_available_providers() if p in names)


SPIN_WITHIN_RUNS = "runs"  # spin between the ops of a run, stop at its end (see open_session)
SPIN_SETTINGS = (False, SPIN_WITHIN_RUNS, True)


def open_session(ort, path: Path, provider: str, n_threads: int, *, strict: bool, spin: bool | str = False):
    """An InferenceSession on `provider` (CPU for the ops it lacks), quiet, its threads spinning as `spin` says.
    onnxruntime falls back to the CPU when the provider's libraries do not load: with `strict` that is an error.

    spin: False, the threads block as soon as they run out of work; SPIN_WITHIN_RUNS, they spin between the ops
    of a run and stop at its end (session.force_spinning_stop); True, they also spin on after a run. A spinning
    pool wakes faster between ops (the f32 SmolLM2 export decoded 12 % faster alone here), but one that spins on
    after a run takes the cores that a draft model, an EAGLE head's llama.cpp threads or the other model of a
    pair need before the next run (benchmarks/onnx_spinning.py)."""
    if spin not in SPIN_SETTINGS:
        raise EdgespecError(f"spin must be one of {', '.join(map(repr, SPIN_SETTINGS))}, got {spin!r}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = n_threads
    for pool in ("intra_op", "inter_op"):
        options.add_session_config_entry(f"session.{pool}.allow_spinning", "1" if spin else "0")
    if spin == SPIN_WITHIN_RUNS:
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.log_severity_level = 2 if os.environ.get("EDGESPEC_ORT_LOG") else 3  # warnings, else errors only
    providers = [provider, "CPUExecutionProvider"] if provider != "CPUExecutionProvider" else [provider]
    if provider == "TensorrtExecutionProvider":
        providers.insert(1, "CUDAExecutionProvider")  # for the subgraphs TensorRT rejects
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
    except Exception as e:  # onnxruntime raises its own types (InvalidProtobuf, Fail, ...) for unreadable files
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EdgespecError(f"onnxruntime could not load {path}: {reason}") from None
    if strict and session.get_providers()[0] != provider:
        raise EdgespecError(f"onnxruntime could not start {provider} for {path}: its libraries did not load "
                            "(the reason is in onnxruntime's log above)")
    return session


@dataclass(frozen=True)
class Graph:
    """What the session's inputs and outputs say about the model."""

    inputs: dict[str, type]  # feed name -> numpy dtype, among FEED_INPUTS
    past: tuple[str, ...]  # past_key_values.{layer}.{key|value}
    present: tuple[str, ...]  # present.{layer}.{key|value}, in the same order
    kv_heads: int
    head_dim: int
    kv_dtype: type
    n_vocab: int  # the width of the logits
    has_hidden: bool  # the graph returns HIDDEN_OUTPUT


def read_graph(session, path: Path, config: dict) -> Graph:
    """Check that the graph is a decoder with past key/values that edgespec can feed; describe it."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    past = tuple(name for name in inputs if name.startswith("past_key_values."))
    if not past:
        raise EdgespecError(f"{path} takes no past key/values: export it with past key/values: "
                            "edgespec export --to onnx")
    unknown = sorted(set(inputs) - FEED_INPUTS - set(past))
    if unknown or "input_ids" not in inputs:
        raise EdgespecError(f"{path} is not a decoder edgespec can run: it takes {', '.join(sorted(inputs))}")
    present = tuple(name.replace("past_key_values.", "present.") for name in past)
    missing = [name for name in ("logits", *present) if name not in outputs]
    if missing:
        raise EdgespecError(f"{path} has no output {missing[0]}: export it with: edgespec export --to onnx")
    shape = inputs[past[0]].shape  # [batch, kv_heads, past, head_dim], some dims may be names
    heads = config.get("num_key_value_heads", config.get("num_attention_heads"))
    kv_heads = shape[1] if isinstance(shape[1], int) else heads
    head_dim = shape[3] if isinstance(shape[3], int) else config.get("head_dim") or config["hidden_size"] // heads
    width = outputs["logits"].shape[-1]
    return Graph(inputs={name: NUMPY_TYPES.get(inputs[name].type, np.int64) for name in FEED_INPUTS & set(inputs)},
                 past=past, present=present, kv_heads=kv_heads, head_dim=head_dim,
                 kv_dtype=NUMPY_TYPES.get(inputs[past[0]].type, np.float32),
                 n_vocab=width if isinstance(width, int) else config["vocab_size"],
                 has_hidden=HIDDEN_OUTPUT in outputs)


class HostCache:
    """The past as numpy arrays: the present.* outputs of one run are the past_key_values.* of the next."""

    def __init__(self, session, graph: Graph, outputs: tuple[str, ...]):
        """outputs: what run returns, logits first (and HIDDEN_OUTPUT where hidden states are asked for)."""
        self._session, self._graph, self._outputs = session, graph, outputs
        empty = np.zeros((1, graph.kv_heads, 0, graph.head_dim), graph.kv_dtype)  # [1, kv_heads, 0, head_dim]
        self.past = dict.fromkeys(graph.past, empty)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run the session on feeds plus the past; keep the presents; return the outputs, logits [1, T, V] first."""
        results = self._session.run([*self._outputs, *self._graph.present], {**feeds, **self.past})
        presents = results[len(self._outputs):]
        self.past = dict(zip(self._graph.past, presents, strict=True))  # [1, kv_heads, past + T, head_dim]
        return results[:len(self._outputs)]

    def truncate(self, n_past: int) -> None:
        # views; onnxruntime copies a strided input to a contiguous one on the next run
        self.past = {name: value[:, :, :n_past] for name, value in self.past.items()}


class DeviceCache:
    """The past as OrtValues in device memory ("cuda"), bound with IO binding, so the cache does not cross the
    bus each step; only the logits come back to the host. The tests run it with device "cpu" (no GPU there)."""

    def __init__(self, ort, session, graph: Graph, outputs: tuple[str, ...], device: str = "cuda"):
        self._ort, self._session, self._graph, self._device = ort, session, graph, device
        self._outputs = outputs
        empty = np.zeros((1, graph.kv_heads, 0, graph.head_dim), graph.kv_dtype)  # [1, kv_heads, 0, head_dim]
        self.past = dict.fromkeys(graph.past, empty)  # host arrays until the first run

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        binding = self._session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for name, value in self.past.items():
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, value)
            else:
                binding.bind_ortvalue_input(name, value)
        for name in self._outputs:
            binding.bind_output(name)  # in host memory: the caller keeps only a few rows of them
        for name in self._graph.present:
            binding.bind_output(name, self._device, 0)
        self._session.run_with_iobinding(binding)
        results = binding.get_outputs()
        self.past = dict(zip(self._graph.past, results[len(self._outputs):], strict=True))
        return [value.numpy() for value in results[:len(self._outputs)]]  # logits [1, T, V] first

    def truncate(self, n_past: int) -> None:
        # an OrtValue cannot be sliced in place, and [:, :, :n] of [1, H, S, D] is not one contiguous block:
        # copy through the host (one round trip of the cache per rollback that drops tokens)
        for name, value in self.past.items():
            host = value if isinstance(value, np.ndarray) else value.numpy()
            prefix = np.ascontiguousarray(host[:, :, :n_past])  # [1, kv_heads, n_past, head_dim]
            # an empty cache stays on the host: no zero-byte device buffers
            self.past[name] = self._ort.OrtValue.ortvalue_from_numpy(prefix, self._device, 0) if n_past else prefix


class OnnxBackend:
    """An exported ONNX decoder and its KV cache. See edgespec.runtime.backend.Backend for the contract."""

    def __init__(self, folder: str | os.PathLike, *, n_ctx: int = 2048, n_threads: int | None = None,
                 provider: str = "cpu", hidden: bool = False, spin: bool | str = False):
        """hidden: forward also keeps the final hidden state of every row it returns logits for (last_hidden),
        for draft heads; the export must have the output (edgespec export writes it). spin: whether onnxruntime's
        threads spin between ops, within runs only (SPIN_WITHIN_RUNS) or also between them (see open_session)."""
        folder = check_onnx_folder(folder)
        ort = _require("onnxruntime")
        self.name, self.path = folder.name, folder
        wanted = pick_provider(ort.get_available_providers(), provider)
        self.n_threads = n_threads or min(os.cpu_count() or 1, 8)
        self._session = open_session(ort, folder / MODEL_FILE, wanted, self.n_threads, strict=provider != "auto",
                                     spin=spin)
        self.spin = spin
        self.provider = self._session.get_providers()[0]  # what runs, after any fallback: the CLI prints it
        config = read_json(folder / "config.json")
        self._graph = read_graph(self._session, folder / MODEL_FILE, config)
        if hidden and not self._graph.has_hidden:
            raise EdgespecError(f"{folder / MODEL_FILE} does not return hidden states, which draft heads read: export "
                                "it again with this version of edgespec (edgespec export --to onnx)")
        self.hidden = hidden
        self.n_embd = int(config.get("hidden_size", 0))
        self.last_hidden: np.ndarray | None = None  # [n_logits, n_embd] of the last forward, if hidden
        self._tokenizer, self.vocab = read_vocab(folder, config, self._graph.n_vocab)
        max_positions = config.get("max_position_embeddings")
        self.n_ctx = min(n_ctx, max_positions) if max_positions else n_ctx
        self.tokens: list[int] = []
        on_gpu = self.provider in DEVICE_MEMORY
        outputs = ("logits", HIDDEN_OUTPUT) if hidden else ("logits",)
        self._cache = (DeviceCache(ort, self._session, self._graph, outputs) if on_gpu
                       else HostCache(self._session, self._graph, outputs))

    def placement(self) -> dict:
        """Where the model runs: onnxruntime's provider (after any fallback)."""
        short = {v: k for k, v in PROVIDERS.items()}
        return {"runtime": "onnxruntime", "device": short.get(self.provider, self.provider)}

    def forward(self, tokens: Sequence[int], n_logits: int, *, copy: bool = True) -> np.ndarray:
        n = len(tokens)
        check_forward(self, n, n_logits, MAX_OUTPUTS)
        out = np.empty((n_logits, self.vocab.n_vocab), dtype=np.float32)  # [n_logits, V]
        hidden = np.empty((n_logits, self.n_embd), dtype=np.float32) if self.hidden and n_logits else None
        first_out = n - n_logits  # index in `tokens` of the first position whose logits are returned
        for start in range(0, n, PREFILL_CHUNK):
            chunk = list(tokens[start:start + PREFILL_CHUNK])
            results = self._run(chunk)  # logits [1, T, V] (and hidden states [1, T, E])
            skip = min(max(first_out - start, 0), len(chunk))  # rows of this chunk before the ones asked for
            rows = slice(start + skip - first_out, start + len(chunk) - first_out)
            if skip < len(chunk):
                out[rows] = results[0][0, skip:]
                if hidden is not None:
                    hidden[rows] = results[1][0, skip:]
            del results  # the all-positions buffer goes now, not at the next chunk
            self.tokens.extend(chunk)
        self.last_hidden = hidden
        return out

    def _run(self, chunk: list[int]) -> list[np.ndarray]:
        """Append one chunk to the cache; logits [1, T, V] for its positions (and hidden states [1, T, E])."""
        n_past, n = len(self.tokens), len(self.tokens) + len(chunk)
        arrays = {"input_ids": np.array([chunk]),  # [1, T]
                  "attention_mask": np.ones((1, n)),  # [1, n_past + T]
                  "position_ids": np.arange(n_past, n)[None]}  # [1, T]
        feeds = {name: arrays[name].astype(dtype) for name, dtype in self._graph.inputs.items()}
        try:
            return self._cache.run(feeds)
        except Exception as e:  # onnxruntime's own error types; the cache is unchanged when a run fails
            raise EdgespecError(f"onnxruntime failed on {self.name}: {str(e).strip().splitlines()[0]}") from None

    def rollback(self, n_past: int) -> None:
        if n_past < 0 or n_past > len(self.tokens):
            raise ValueError(f"cannot roll back to {n_past} with {len(self.tokens)} tokens cached")
        if n_past < len(self.tokens):
            self._cache.truncate(n_past)
            del self.tokens[n_past:]

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        # without special, texts such as <|im_end|> stay text; with it, the post-processor may add a BOS
        self._tokenizer.encode_special_tokens = not special
        return self._tokenizer.encode(text, add_special_tokens=special).ids

    def chat_template(self) -> str | None:
        """tokenizer_config.json's template, else chat_template.jinja's (the order of llama.cpp's converter)."""
        template = read_json(self.path / "tokenizer_config.json").get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja = self.path / "chat_template.jinja"
        if template is None and jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        return template

    def memory(self) -> dict[str, int]:
        g = self._graph
        # past holds a key and a value per layer: [1, kv_heads, n_ctx, head_dim] each at full context
        kv = len(g.past) * g.kv_heads * g.head_dim * np.dtype(g.kv_dtype).itemsize * self.n_ctx
        return {
            "weights": sum(f.stat().st_size for f in weight_files(self.path)),
            "kv_cache": kv,
            # onnxruntime returns logits for every position of a chunk; we keep at most MAX_OUTPUTS rows
            "logits": min(PREFILL_CHUNK, self.n_ctx) * self.vocab.n_vocab * 4,
        }

    def close(self) -> None:
        """Release the session and the cache; the backend is unusable afterwards."""
        self._session = self._cache = None


def load_graph(model: Path):
    """The graph of a model file, its external weights left on disk; a clear error for a file that is no model."""
    onnx = _require("onnx")
    try:
        return onnx.load(str(model), load_external_data=False).graph
    except Exception as e:  # onnx raises DecodeError and others for files that are no model
        raise EdgespecError(f"{model} is not an ONNX model onnx can read: {e}") from None


def logits_matmul(graph):
    """The node that computes the logits when it is the output layer's MatMul (its input 0 is the final normed
    hidden state, input 1 the output weight), else None."""
    head = next((node for node in graph.node if "logits" in node.output), None)
    return head if head is not None and head.op_type == "MatMul" else None


def export_facts(folder: str | os.PathLike) -> dict:
    """What the graph and tokenizer of an export say, without a session: hidden (it returns HIDDEN_OUTPUT),
    n_embd, vocab_digest (as OnnxBackend's Vocab would have it)."""
    folder = check_onnx_folder(folder)
    graph = load_graph(folder / MODEL_FILE)
    config = read_json(folder / "config.json")
    logits = next((o for o in graph.output if o.name == "logits"), None)
    width = logits.type.tensor_type.shape.dim[-1].dim_value if logits is not None else 0
    _, vocab = read_vocab(folder, config, width or config.get("vocab_size", 0))
    return {"hidden": any(o.name == HIDDEN_OUTPUT for o in graph.output), "n_embd": int(config.get("hidden_size", 0)),
            "vocab_digest": vocab.digest}


def float_initializers(graph, ndim: int | None = None) -> dict:
    """The graph's float32 and float16 initializers by name (only those of `ndim` dimensions, if given)."""
    onnx = _require("onnx")
    return {t.name: t for t in graph.initializer
            if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16) and ndim in (None, len(t.dims))}


def output_matrix(folder: Path) -> np.ndarray:
    """An export's output layer [V, E] (float32 or float16), for draft heads: the weight the logits MatMul reads,
    an initializer [E, V] or the Transpose of one [V, E] (tied embeddings, as optimum exports them); where the
    output layer is quantized (int4), the token embeddings of a model that ties the two (they stay float)."""
    _require("onnx")
    from onnx import numpy_helper

    folder = check_onnx_folder(folder)
    graph = load_graph(folder / MODEL_FILE)
    weights = float_initializers(graph, ndim=2)
    producer = {name: node for node in graph.node for name in node.output}

    def read(name: str) -> np.ndarray:
        return numpy_helper.to_array(weights[name], base_dir=str(folder))

    head = logits_matmul(graph)
    if head is not None:
        weight = head.input[1]
        if weight in weights:
            return np.ascontiguousarray(read(weight).T)
        source = producer.get(weight)
        if source is not None and source.op_type == "Transpose" and source.input[0] in weights:
            return read(source.input[0])
    if read_json(folder / "config.json").get("tie_word_embeddings"):
        table = next((node.input[0] for node in graph.node if node.op_type == "Gather" and node.input[0] in weights),
                     None)
        if table is not None:
            return read(table)
    raise EdgespecError(f"{folder / MODEL_FILE}: draft heads read the output layer, which this export keeps "
                        "quantized; use an fp32 or fp16 export (or an int4 one of a model with tied embeddings)")


LAYER_PROJECTIONS = ("self_attn/q_proj", "self_attn/k_proj", "self_attn/v_proj", "self_attn/o_proj", "mlp/gate_proj",
                     "mlp/up_proj", "mlp/down_proj")  # a Llama block's MatMuls, as the exporter names their nodes


def decoder_layer(folder: Path, layer: int) -> dict[str, np.ndarray]:
    """One decoder layer of a Llama export in Hugging Face's names and layout, float32: the projections
    (q_proj ... down_proj, [out, in]) from the initializers of the MatMul nodes the exporter names after them
    (/model/layers.N/self_attn/q_proj/MatMul, weight stored [in, out]), the two norms, and the final norm
    ("norm"), each the weight its node reads. An EAGLE head starts from it. Quantized projections (int4, int8)
    are refused."""
    _require("onnx")
    from onnx import numpy_helper

    folder = check_onnx_folder(folder)
    graph = load_graph(folder / MODEL_FILE)
    weights = float_initializers(graph)
    identity = {node.output[0]: node.input[0] for node in graph.node if node.op_type == "Identity"}

    def initializer(name: str) -> str | None:
        """The float initializer a node input is, through Identity nodes (the exporter keeps one copy of equal
        weights, e.g. norms still at their initial ones, and names the others Identity outputs of it)."""
        while name not in weights and name in identity:
            name = identity[name]
        return name if name in weights else None

    def read(name: str) -> np.ndarray:
        return numpy_helper.to_array(weights[name], base_dir=str(folder)).astype(np.float32)

    found = {}
    names = {f"/model/layers.{layer}/{part}/MatMul": part.split("/")[1] for part in LAYER_PROJECTIONS}
    # a norm's weight: the 1-D initializer its Mul reads
    norms = {f"/model/layers.{layer}/input_layernorm/": "input_layernorm",
             f"/model/layers.{layer}/post_attention_layernorm/": "post_attention_layernorm", "/model/norm/": "norm"}
    for node in graph.node:
        if node.op_type == "MatMul" and node.name in names and initializer(node.input[1]):
            found[names[node.name]] = np.ascontiguousarray(read(initializer(node.input[1])).T)
        norm = next((norms[prefix] for prefix in norms if node.name.startswith(prefix)), None)
        if norm is not None and node.op_type == "Mul":
            vectors = [initializer(name) for name in node.input]
            vector = next((name for name in vectors if name and len(weights[name].dims) == 1), None)
            if vector is not None:
                found[norm] = read(vector)
    missing = sorted({*(part.split("/")[1] for part in LAYER_PROJECTIONS), "input_layernorm",
                      "post_attention_layernorm", "norm"} - set(found))
    if missing:
        raise EdgespecError(f"{folder / MODEL_FILE} has no float weights for {', '.join(missing)} of layer {layer} "
                            "(quantized, or not a Llama export): an EAGLE head starts from the target's layer; train "
                            "it on an fp32 or fp16 export")
    return found


def weight_files(folder: Path) -> list[Path]:
    """model.onnx and its external data: the files beside it named model.onnx* (the export's convention,
    e.g. model.onnx_data), found without parsing a graph that may be gigabytes."""
    return sorted(f for f in folder.iterdir() if f.is_file() and f.name.startswith(MODEL_FILE))


def read_json(path: Path) -> dict:
    """A JSON file of the folder, {} when absent, a clear error when unreadable."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EdgespecError(f"{path} is not valid JSON: {e}") from None


def read_vocab(folder: Path, config: dict, n_vocab: int):
    """(the tokenizers Tokenizer, the Vocab) of an export folder, in llama.cpp's conventions."""
    tokenizers = _require("tokenizers")
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise EdgespecError(f"{folder} has no tokenizer.json: export the model with: edgespec export --to onnx")
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for files it cannot parse
        raise EdgespecError(f"{path} is not a tokenizer the tokenizers library can read: {e}") from None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > n_vocab:
        raise EdgespecError(f"{path} has {size} tokens but {folder / MODEL_FILE} scores only {n_vocab}")
    # ids the embedding has but the tokenizer lacks are named as llama.cpp's converter names them
    texts = [tokenizer.id_to_token(i) or f"[PAD{i}]" for i in range(n_vocab)]
    added = tokenizer.get_added_tokens_decoder()  # id -> AddedToken
    byte_level = tokenizer.decoder is not None and b"ByteLevel" in tokenizer.decoder.__getstate__()  # its JSON
    pieces = [b"" if i in added and added[i].special  # control tokens print nothing
              else text.encode("utf-8") if i in added
              else piece(text, byte_level) for i, text in enumerate(texts)]
    ids = tokenizer.get_vocab(with_added_tokens=True)  # text -> id
    tokenizer_config = read_json(folder / "tokenizer_config.json")
    generation = read_json(folder / "generation_config.json")
    eos = generation.get("eos_token_id", config.get("eos_token_id"))
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    eos_id = special_id("eos", tokenizer_config, config, generation, ids)
    vocab = Vocab(texts=tuple(t.encode("utf-8") for t in texts), pieces=tuple(pieces),
                  bos_id=special_id("bos", tokenizer_config, config, generation, ids), eos_id=eos_id,
                  eog_ids=eog_ids(ids, eos_ids | ({eos_id} if eos_id >= 0 else set())))
    return tokenizer, vocab


def special_id(kind: str, tokenizer_config: dict, config: dict, generation: dict, ids: dict[str, int]) -> int:
    """The bos or eos id as llama.cpp's converter picks it: tokenizer_config.json's token text, else config.json's
    id, else generation_config.json's (the first of a list); -1, llama.cpp's 'no token', when none says."""
    entry = tokenizer_config.get(f"{kind}_token")
    text = entry.get("content") if isinstance(entry, dict) else entry
    if isinstance(text, str) and text in ids:
        return ids[text]
    for source in (config, generation):
        value = source.get(f"{kind}_token_id")
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int):
            return value
    return -1


def eog_ids(ids: dict[str, int], eos_ids: set[int]) -> frozenset[int]:
    """End-of-generation ids: the EOS ids and the tokens llama.cpp's text rule marks (see EOG_TEXTS)."""
    found = {ids[text] for text in EOG_TEXTS if text in ids}
    for kind in FIM_EOG_TEXTS:
        candidates = [ids[text] for text in kind if text in ids]
        if candidates:
            found.add(min(candidates))
    if "<|return|>" in ids and "<|call|>" in ids and "<|end|>" in ids:
        found.discard(ids["<|end|>"])  # gpt-oss: <|end|> ends a message, not the answer (llama.cpp's exception)
    return frozenset(found | eos_ids)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode table inverted: the printable character byte-level BPE uses -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}  # these bytes stand for themselves
    others = [b for b in range(256) if b not in table.values()]
    table.update({chr(256 + n): b for n, b in enumerate(others)})  # the rest map to U+0100, U+0101, ...
    return table


BYTE_DECODER = _byte_decoder()


def piece(text: str, byte_level: bool) -> bytes:
    """The bytes a vocabulary token prints: byte-level BPE maps each character back to its byte; SentencePiece
    vocabularies write a space as U+2581 and raw bytes as <0xNN>."""
    if byte_level:
        return b"".join(bytes([BYTE_DECODER[c]]) if c in BYTE_DECODER else c.encode("utf-8") for c in text)
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        return bytes([int(text[3:5], 16)])
    return text.replace("\u2581", " ").encode("utf-8")
