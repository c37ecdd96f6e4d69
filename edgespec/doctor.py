"""`edgespec doctor`: what this device has, whether a pair loads, where its models run and what their steps cost,
and an exactness self-test of the rule.

The self-test checks the rule generation runs, where it runs: for the loaded pair, at a few positions of a
real text, it hands the target's rows of logits (float32, the loaded target's vocabulary) and the draft's row at
the same position to the loop's own code: decode/laws.py makes their laws through the row passes of this build
(the C module's AVX2, SSE2 or portable passes, or numpy), the draft's law draws the proposals and decode/rule.py
judges them, many times. The emitted tokens are tested against the reference: the target's processed
distribution p computed in float64 by sampling.to_probs (chi-square; outcomes expected fewer than 5 times are
pooled). It runs at the temperature and top-p asked for and at FILTERS (top-p, top-k with min-p, a high
temperature). The guarantee is about that processed target distribution: quantization, a grammar or the
sampling parameters change p itself, and the rule returns whatever p is. Drafts without a distribution
of their own (prompt lookup, heads) are stood in for by the target's row one position earlier: a real,
mismatched distribution, which is what the rule must correct.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections import Counter

import numpy as np

from edgespec import __version__
from edgespec.decode import rows
from edgespec.decode.calibrate import measure_pass_costs
from edgespec.decode.laws import law
from edgespec.decode.rule import Rows, verify
from edgespec.decode.sampling import SamplingParams, to_probs
from edgespec.machine import cores

ALPHA = 1e-3  # a correct rule fails the self-test at this rate
POSITIONS = (6, 14, 30)  # where in the text the rule is tested
# filters tested besides the ones asked for, at the first position: each takes other paths of laws.py
FILTERS = (SamplingParams(0.7, top_p=0.95), SamplingParams(0.7, top_k=40, min_p=0.05), SamplingParams(1.5))
TEXT = ("The robot moved forward two meters, turned left, and picked up the red cup from the kitchen table. "
        "Then it placed the cup on the shelf next to the books and returned to its charging station.")


def chi2_sf(x: float, df: int) -> float:
    """P(chi-square with df degrees of freedom > x): exact for df 1 and 2, Wilson-Hilferty beyond (within
    a few percent of the p-value near 1e-3 for df >= 3, which is all a pass/fail at ALPHA needs)."""
    if df == 1:
        return math.erfc(math.sqrt(x / 2))
    if df == 2:
        return math.exp(-x / 2)
    z = ((x / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


def goodness_of_fit(draws: list[int], law: np.ndarray) -> tuple[float, int]:
    """p-value and degrees of freedom of a chi-square test of draws against law [V]."""
    n, counts = len(draws), Counter(draws)
    if any(law[t] == 0 for t in counts):  # a token the target cannot emit: as wrong as a rule can be
        return 0.0, 0
    big = np.nonzero(law * n >= 5)[0]
    obs = [counts[t] for t in big]
    exp = [law[t] * n for t in big]
    if n - sum(exp) > 1e-9:
        obs.append(n - sum(obs))
        exp.append(n - sum(exp))
    if len(obs) < 2:
        return 1.0, 0
    x = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    return chi2_sf(x, len(obs) - 1), len(obs) - 1


def rule_selftest(target_logits: np.ndarray, draft_logits: np.ndarray, params: SamplingParams,
                  rng: np.random.Generator, draws: int) -> dict:
    """Run the loop's rule on one drafted token `draws` times: target_logits [2, V] (this position and the next,
    as the target hands them over), draft_logits [V]; the proposals drawn from the draft's law as a draft model
    draws them. The emitted first tokens are tested against the float64 reference of target_logits[0]."""
    target, draft = Rows(target_logits, params), law(draft_logits, params)
    n_vocab = target_logits.shape[1]
    emitted = []
    for _ in range(draws):
        token = draft.sample(rng)
        n_acc, sampled = verify(target, [draft], [token], n_vocab, rng)
        emitted.append(token if n_acc == 1 else sampled)
    p_ref = to_probs(target_logits[0], params)  # [V], float64
    p, df = goodness_of_fit(emitted, p_ref)
    accept = float(np.minimum(p_ref, to_probs(draft_logits, params)).sum())  # exact acceptance probability here
    return {"p_value": p, "df": df, "acceptance": round(accept, 4), "draws": draws, "ok": p >= ALPHA}


def describe(params: SamplingParams) -> str:
    """params as the CLI's options say them."""
    parts = [f"t={params.temperature:g}"]
    parts += [f"top-k={params.top_k}"] if params.top_k else []
    parts += [f"top-p={params.top_p:g}"] if params.top_p < 1 else []
    parts += [f"min-p={params.min_p:g}"] if params.min_p else []
    return " ".join(parts)


def exactness(engine, params: SamplingParams, draws: int = 10000, seed: int = 0) -> dict:
    """The self-test on a loaded engine: params at POSITIONS of TEXT, each of FILTERS at the first; see the
    module docstring."""
    from edgespec.backends.protocol import sync

    tokens = engine.target.tokenize(TEXT, special=False)
    rng = np.random.default_rng(seed)
    draft = engine.draft_backend
    cases = [(params, pos) for pos in POSITIONS] + [(f, POSITIONS[0]) for f in FILTERS if f != params]
    results, dtype = [], None
    for case, pos in cases:
        logits = np.array(sync(engine.target, tokens[:pos + 2], 3))  # [3, V]: pos-1, pos, pos+1, as handed over
        dtype = logits.dtype
        q = np.array(sync(draft, tokens[:pos + 1], 1))[0] if draft is not None else logits[0]
        results.append({"position": pos, "sampling": describe(case),
                        **rule_selftest(logits[1:], q, case, rng, draws)})
    engine.target.rollback(0)
    if draft is not None:
        draft.rollback(0)
    path = (f"decode/rule.py on decode/laws.py, row passes {rows.kind()}, {dtype} rows of "
            f"{engine.target.vocab.n_vocab:,} ids")
    return {"draft": "draft model" if draft is not None else "stand-in (the target one position back)",
            "path": path, "temperature": params.temperature, "positions": results,
            "ok": all(r["ok"] for r in results)}


def environment() -> dict:
    """Versions, build flags, devices, providers and memory: what decides how edgespec runs here."""
    import psutil

    out = {"edgespec": __version__, "python": platform.python_version(), "platform": platform.platform(),
           "numpy": np.__version__, "cpus": os.cpu_count(), "cores": cores(),  # the machine's; this process's
           "memory": {"total": psutil.virtual_memory().total, "available": psutil.virtual_memory().available}}
    from edgespec.backends.llama.lib import build_info
    from edgespec.backends.onnx.folder import runtime_info
    from edgespec.decode.rows import kind

    out["llama_cpp"], out["onnxruntime"] = build_info(), runtime_info()
    out["row_passes"] = kind()  # sampling's passes over a row: the C module (which kind) or numpy
    for name in ("llguidance", "torch"):
        try:
            out[name] = __import__(name).__version__ if name == "torch" else _version(name)
        except ImportError:
            out[name] = None
    return out


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


COST_TOKENS = (1, 2, 4)  # verify pass lengths doctor reports


def step_costs(engine) -> dict:
    """What a step costs on this device, in ms: the target's pass over 1, 2 and 4 tokens (the controller's
    measurement at load, or measured now where nothing drafts), and the draft's step and its reading of a
    token it skipped (none for prompt lookup, which costs no model call)."""
    controller = engine.controller
    passes = controller.target_costs if controller is not None else measure_pass_costs(engine.target,
                                                                                          max(COST_TOKENS))
    costs = {"target_pass_ms": {n: round(passes[n] * 1e3, 3) for n in COST_TOKENS if n in passes}}
    if controller is not None and controller.draft_cost > 0:  # prompt lookup costs no model call
        costs["draft_step_ms"] = round(controller.draft_cost * 1e3, 3)
        costs["draft_read_ms"] = round(controller.read_cost * 1e3, 3)
    return costs


def run_doctor(load_engine, params: SamplingParams, draws: int = 10000) -> dict:
    """Environment, a load of the pair (timed), where its models run and what their steps cost, and the
    self-test; "ok" is False if a check failed."""
    report = {"environment": environment(), "checks": []}
    t = time.perf_counter()
    try:
        engine = load_engine()
    except Exception as e:  # what the user should see is the failure itself, as a failed check
        report["checks"].append({"name": "load", "ok": False, "detail": str(e)})
        report["ok"] = False
        return report
    try:
        draft = engine.draft_backend.name if engine.draft_backend else (engine.drafter.name if engine.drafter
                                                                        else "none")
        report["checks"].append({"name": "load", "ok": True, "detail": f"target {engine.target.name}, draft "
                                 f"{draft}, {time.perf_counter() - t:.1f} s"})
        report["placement"], report["costs"] = engine.placement(), step_costs(engine)
        result = exactness(engine, params, draws)
        worst = min(r["p_value"] for r in result["positions"])
        report["checks"].append({"name": "exactness", "ok": result["ok"], "detail": result,
                                 "summary": f"the loop's rule ({result['path']}) vs the float64 processed "
                                            f"target distribution, {len(result['positions'])} cases "
                                            f"({describe(params)} at {len(POSITIONS)} positions, then "
                                            f"{', '.join(describe(f) for f in FILTERS if f != params)}), {draws} "
                                            f"draws each: smallest p-value {worst:.3g} (fails below {ALPHA})"})
    finally:
        engine.close()
    report["ok"] = all(c["ok"] for c in report["checks"])
    return report
