"""ONNX decoder-with-past folders through onnxruntime.

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

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.backends.onnx.folder import (
    DEVICE_MEMORY,
    HIDDEN_OUTPUT,
    MODEL_FILE,
    PROVIDERS,
    check_onnx_folder,
    open_session,
    pick_provider,
    read_json,
    require,
    weight_files,
)
from edgespec.backends.onnx.vocab import read_vocab
from edgespec.backends.protocol import MAX_OUTPUTS, Backend, check_forward
from edgespec.errors import EdgespecError
from edgespec.machine import cores

PREFILL_CHUNK = 128  # tokens per session run, bounding the logits buffer onnxruntime returns to 128 x V floats:
# a 512-token prompt through SmolLM2-135M fp32 (2 CPU threads) takes 0.82-0.85 s in chunks of 128, 0.81 s of 256,
# 0.95-1.0 s of 64
FEED_INPUTS = {"input_ids", "attention_mask", "position_ids"}
NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32,
               "tensor(float)": np.float32, "tensor(float16)": np.float16}


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


class OnnxBackend(Backend):
    """An exported ONNX decoder and its KV cache. See edgespec.backends.protocol.Backend for the contract."""

    def __init__(self, folder: str | os.PathLike, *, n_ctx: int = 2048, n_threads: int | None = None,
                 provider: str = "cpu", hidden: bool = False, spin: bool | str = False):
        """hidden: forward also keeps the final hidden state of every row it returns logits for (last_hidden),
        for draft heads; the export must have the output (edgespec export writes it). spin: whether onnxruntime's
        threads spin between ops, within runs only (SPIN_WITHIN_RUNS) or also between them (see open_session)."""
        folder = check_onnx_folder(folder)
        ort = require("onnxruntime")
        self.name, self.path = folder.name, folder
        wanted = pick_provider(ort.get_available_providers(), provider)
        self.n_threads = n_threads or min(cores(), 8)
        self._session = open_session(ort, folder / MODEL_FILE, wanted, self.n_threads, strict=provider != "auto",
                                     spin=spin)
        self.spin = spin
        self.spins_between_runs = spin is True
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
