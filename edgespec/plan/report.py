"""What a memory plan says: a roofline speed prediction, JSON for scripts, the text table, the refusal."""

from __future__ import annotations

from edgespec.decode.cost import expected_tokens
from edgespec.plan.planner import ModelNeed, Plan
from edgespec.units import mib_text


def predict(plan: Plan, acceptance: float, k_max: int = 8) -> dict:
    """Decode speed from the roofline (bandwidth / bytes read per token): an upper bound, labelled so.

    A verify pass of k+1 tokens is taken to read the weights once, as one step does (bandwidth-bound);
    on CPUs with quantized weights it costs more (edgespec bench measures it). Speculation is Leviathan's
    expected tokens per round, (1 - a^(k+1)) / (1 - a), over the round's cost k * t_draft + t_target.
    """
    t_target = _step_seconds(plan, plan.target)
    # heads: a step reads at most what they hold (their weights, cache and buffers; Medusa's output rows)
    t_draft = _step_seconds(plan, plan.draft) if plan.draft else plan.heads / plan.profile.bandwidth
    out = {"kind": "prediction (roofline upper bound)", "acceptance": acceptance,
           "target_tokens_per_second": round(1 / t_target, 1), "draft_step_cost": round(t_draft / t_target, 3)}
    if plan.drafter == "none":
        return out
    rows = []
    for k in range(1, k_max + 1):
        speed = expected_tokens(acceptance, k) / (k * t_draft + t_target)
        rows.append({"draft_length": k, "tokens_per_second": round(speed, 1), "speedup": round(speed * t_target, 3)})
    best = max(rows, key=lambda r: r["speedup"])
    out.update(speculative=rows, best_draft_length=best["draft_length"], best_speedup=best["speedup"])
    return out


def _step_seconds(plan: Plan, m: ModelNeed) -> float:
    """Bytes one decode step reads (weights, half the KV cache on average, one sequence's recurrent states) over the
    bandwidth of where they live."""
    state = m.info.recurrent_layers * m.info.state_floats * 4 if m.states else 0
    read = m.info.bytes_read_per_token() + (m.kv_cache - m.states) // 2 + state
    if not plan.discrete or m.runtime == "onnxruntime":
        return read / plan.profile.bandwidth
    on_gpu = min(m.n_gpu_layers, m.info.n_layer) / m.info.n_layer
    host = plan.profile.host_bandwidth or plan.profile.bandwidth / 10
    return read * on_gpu / plan.profile.bandwidth + read * (1 - on_gpu) / host


PARTS = ("weights", "repacked", "kv_cache", "compute", "outputs", "vocab")


def to_dict(plan: Plan, prediction: dict | None = None) -> dict:
    models = [{"role": m.role, "path": str(m.info.path), "runtime": m.runtime, "context": m.n_ctx,
               "kv_type": m.kv_type, "prompt_batch": m.n_ubatch, "gpu_layers": m.n_gpu_layers,
               "bytes": {**{p: getattr(m, p) for p in PARTS}, "total": m.total},
               "recurrent_state_bytes": m.states,  # part of bytes.kv_cache
               **({"gpu_bytes": m.gpu_bytes} if plan.discrete else {})} for m in plan.models]
    out = {"device": plan.profile.name, "title": plan.profile.title, "capacity": plan.capacity,
           "capacity_from": plan.budget_note, "fits": plan.fits, "total": plan.total, "used": plan.used,
           "missing": plan.missing, "runtime_bytes": plan.runtime, "heads_bytes": plan.heads, "drafter": plan.drafter,
           "draft_window": plan.draft_window, "models": models, "changes": list(plan.changes),
           "suggestions": list(plan.suggestions)}
    if prediction:
        out["prediction"] = prediction
    return out


def refusal(plan: Plan) -> str:
    """The one-paragraph error for a plan that does not fit."""
    where = "VRAM" if plan.discrete else "memory"
    return (f"the models do not fit {plan.profile.title} ({plan.budget_note}): they need {mib_text(plan.used)} of "
            f"{where} at the smallest settings (context {plan.target.n_ctx}, KV {plan.target.kv_type}), "
            f"{mib_text(plan.capacity)} is available, {mib_text(plan.missing)} is missing. Would fit: "
            + "; or ".join(plan.suggestions))


def format_plan(plan: Plan, prediction: dict | None = None) -> str:
    lines = [f"device: {plan.profile.title} [{plan.profile.name}], capacity {mib_text(plan.capacity)} "
             f"({plan.budget_note})", ""]
    header = f"{'':10}" + "".join(f"{p:>10}" for p in (*PARTS, "total"))
    lines += [header + "   settings"]
    for m in plan.models:
        settings = f"ctx {m.n_ctx}, KV {m.kv_type}"
        if m.runtime == "llama.cpp":
            settings += f", batch {m.n_ubatch}" + (f", GPU layers {m.n_gpu_layers}" if plan.profile.gpu else "")
        if m.states:
            settings += f", recurrent states {mib_text(m.states)} of the KV column"
        lines.append(f"{m.role:10}" + "".join(f"{mib_text(getattr(m, p)):>10}" for p in (*PARTS, "total"))
                     + f"   {m.info.name} ({m.runtime}): {settings}")
    if plan.heads:
        lines.append(f"{'heads':10}{'':60}{mib_text(plan.heads):>10}   the draft heads: weights, cache, buffers")
    lines.append(f"{'runtime':10}{'':60}{mib_text(plan.runtime - plan.heads):>10}   "
                 "Python, libraries, the loop's arrays")
    lines.append(f"{'total':10}{'':60}{mib_text(plan.total):>10}")
    if plan.discrete:
        lines.append(f"in VRAM: {mib_text(plan.used)} of {mib_text(plan.capacity)}")
    lines.append("")
    if plan.fits:
        lines.append(f"fits, {mib_text(plan.capacity - plan.used)} to spare"
                     + (": " + "; ".join(plan.changes) if plan.changes else ""))
    else:
        lines.append(refusal(plan))
    if prediction:
        lines += ["", f"{prediction['kind']}: target alone {prediction['target_tokens_per_second']} tok/s"]
        if "speculative" in prediction:
            lines.append(f"  with acceptance {prediction['acceptance']} and a draft step costing "
                         f"{prediction['draft_step_cost']}x a target step: best draft length "
                         f"{prediction['best_draft_length']}, {prediction['best_speedup']}x target-only")
    return "\n".join(lines)

