"""Weights read out of an ONNX export's graph for training and draft heads: the output layer, a decoder layer in
Hugging Face's names, and what the graph says without a session."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgespec.backends.onnx.folder import HIDDEN_OUTPUT, MODEL_FILE, check_onnx_folder, read_json, require
from edgespec.backends.onnx.vocab import read_vocab
from edgespec.errors import EdgespecError


def load_graph(model: Path):
    """The graph of a model file, its external weights left on disk; a clear error for a file that is no model."""
    onnx = require("onnx")
    try:
        return onnx.load(str(model), load_external_data=False).graph
    except Exception as e:  # onnx raises DecodeError and others for files that are no model
        raise EdgespecError(f"{model} is not an ONNX model onnx can read: {e}") from None


# what may come between the output layer's MatMul and the logits: Gemma 2's final soft-capping,
# tanh(x / cap) * cap, which optimum exports as Div, Tanh, Mul by constants
SOFTCAP_OPS = {"Div", "Tanh", "Mul"}


def logits_matmul(graph):
    """The output layer's MatMul (its input 0 is the final normed hidden state, input 1 the output weight) when
    the logits come from it, directly or through soft-capping (SOFTCAP_OPS), else None."""
    producer = {name: node for node in graph.node for name in node.output}
    head = producer.get("logits")
    while head is not None and head.op_type in SOFTCAP_OPS:
        head = producer.get(head.input[0])
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
    onnx = require("onnx")
    return {t.name: t for t in graph.initializer
            if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16) and ndim in (None, len(t.dims))}


def output_matrix(folder: Path) -> np.ndarray:
    """An export's output layer [V, E] (float32 or float16), for draft heads: the weight the logits MatMul reads,
    an initializer [E, V] or the Transpose of one [V, E] (tied embeddings, as optimum exports them); where the
    output layer is quantized (int4), the token embeddings of a model that ties the two (they stay float)."""
    require("onnx")
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
    require("onnx")
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
