"""Parity of an exported model with its source: logits side by side on a few prompts.

Metrics per prompt, over every position of prompt + greedy continuation: max |logit difference|,
mean KL(source || exported) of the temperature-1 distributions, top-1 agreement; and whether the greedy
continuations of N tokens are equal. Each quantization has its own pass thresholds; a failed check
is an error (the export is not written), and the report is saved as JSON either way.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from edgespec.backends.protocol import Backend, forward_rows
from edgespec.errors import EdgespecError

PARITY_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Q: Tom has 3 apples and buys 5 more. How many apples does he have?\nA:",
    '{"name": "Ada", "languages": [',
]
GREEDY_TOKENS = 16


@dataclass(frozen=True)
class Threshold:
    max_kl: float  # mean KL(source || exported) per position, nats
    min_top1: float  # fraction of positions whose argmax agrees
    greedy_equal: bool  # must the greedy continuations be identical?


# Float exports must reproduce the source; quantized ones may drift. Calibrated on SmolLM2-135M, a small
# model that quantization hurts more than the 1B+ models these types are usually used for (measured
# there, GGUF: q8_0 KL 0.005 / top-1 0.98, q4_k_m 0.06 / 0.90, q4_0 0.34 / 0.75).
THRESHOLDS = {
    "f32": Threshold(1e-4, 0.99, True), "fp32": Threshold(1e-4, 0.99, True),
    "f16": Threshold(1e-3, 0.97, False), "fp16": Threshold(1e-3, 0.97, False),
    "bf16": Threshold(5e-3, 0.95, False),
    "q8_0": Threshold(0.01, 0.95, False), "int8": Threshold(0.1, 0.8, False),
    "q6_k": Threshold(0.03, 0.92, False), "q5_k_m": Threshold(0.05, 0.9, False),
    "q4_k_m": Threshold(0.12, 0.85, False), "q4_0": Threshold(0.45, 0.7, False), "int4": Threshold(0.45, 0.7, False),
}


def log_softmax(logits: np.ndarray) -> np.ndarray:  # [T, V] -> [T, V]
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def logits_metrics(source: np.ndarray, exported: np.ndarray) -> dict:
    """Compare logits [T, V] of the same positions from the source and the exported model."""
    if source.shape != exported.shape:
        raise EdgespecError(f"parity: logits shapes differ, source {source.shape} vs exported {exported.shape}")
    log_p, log_q = log_softmax(source), log_softmax(exported)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)  # [T]
    return {
        "positions": int(source.shape[0]),
        "max_abs_diff": float(np.abs(source.astype(np.float64) - exported).max()),
        "kl": float(kl.mean()),
        "top1_agreement": float((source.argmax(-1) == exported.argmax(-1)).mean()),
    }


def judge(quant: str, prompts: list[dict]) -> dict:
    """The report: per-prompt metrics (each with `greedy_equal`), their aggregate, the threshold, pass/fail."""
    limit = THRESHOLDS[quant]
    positions = sum(p["positions"] for p in prompts)
    overall = {
        "max_abs_diff": max(p["max_abs_diff"] for p in prompts),
        "kl": sum(p["kl"] * p["positions"] for p in prompts) / positions,
        "top1_agreement": sum(p["top1_agreement"] * p["positions"] for p in prompts) / positions,
        "greedy_equal": sum(p["greedy_equal"] for p in prompts),
    }
    failures = []
    if overall["kl"] > limit.max_kl:
        failures.append(f"mean KL {overall['kl']:.3g} > {limit.max_kl}")
    if overall["top1_agreement"] < limit.min_top1:
        failures.append(f"top-1 agreement {overall['top1_agreement']:.3f} < {limit.min_top1}")
    if limit.greedy_equal and overall["greedy_equal"] < len(prompts):
        failures.append(f"greedy continuations differ on {len(prompts) - overall['greedy_equal']} prompt(s)")
    return {"quant": quant, "threshold": asdict(limit), "passed": not failures, "failures": failures,
            "overall": overall, "prompts": prompts}


class LogitsModel(Protocol):
    """What parity needs from either side: the source (transformers) or an export (GGUF, ONNX)."""

    def tokenize(self, text: str) -> list[int]: ...

    def logits(self, ids: list[int]) -> np.ndarray:
        """Next-token logits at every position of ids: [len(ids), V]."""
        ...

    def greedy(self, ids: list[int], n: int) -> list[int]:
        """The n greedy tokens after ids (fewer if the model ends the text)."""
        ...


class BackendModel:
    """A runtime backend (e.g. a GGUF through llama.cpp) seen as a LogitsModel."""

    def __init__(self, backend: Backend):
        self.backend = backend

    def tokenize(self, text):
        return self.backend.tokenize(text, special=True)

    def logits(self, ids):
        self.backend.rollback(0)
        rows = list(forward_rows(self.backend, ids))
        self.backend.rollback(0)
        return np.concatenate(rows)

    def greedy(self, ids, n):
        from edgespec.decode.loop import speculate
        from edgespec.decode.sampling import SamplingParams

        events = speculate(self.backend, None, None, ids, SamplingParams(), np.random.default_rng(0), max_tokens=n)
        return [e.token for e in events if e.token is not None]


def run_parity(quant: str, source: LogitsModel, exported: LogitsModel, prompts=PARITY_PROMPTS,
               n_greedy: int = GREEDY_TOKENS) -> dict:
    """Compare an export with its source on `prompts`; returns the judged report (see `judge`)."""
    rows = []
    for prompt in prompts:
        ids = source.tokenize(prompt)
        continuation = source.greedy(ids, n_greedy)
        full = ids + continuation
        row = {"prompt": prompt, "tokenizer_equal": exported.tokenize(prompt) == ids,
               **logits_metrics(source.logits(full), exported.logits(full))}
        row["greedy_equal"] = exported.greedy(ids, n_greedy) == continuation
        rows.append(row)
    report = judge(quant, rows)
    if not all(r["tokenizer_equal"] for r in rows):
        report["passed"] = False
        report["failures"].append("the exported tokenizer splits a prompt differently from the source's")
    return report


def write_report(report: dict, path: Path) -> Path:
    path.write_text(json.dumps(report, indent=2))
    return path


def check(report: dict, path: Path) -> None:
    """Raise the parity failure as a user error that points at the saved report."""
    if not report["passed"]:
        raise EdgespecError(f"parity check failed for {report['quant']}: {'; '.join(report['failures'])} "
                            f"(report: {path}); the export was not written")
