"""The memory planner: sizes against llama.cpp's own, device profiles, the order of what it gives up, refusals
before any weights load, the speed prediction; and (slow) planned against measured peak memory."""

import json
import os
import re
import subprocess
import sys
from dataclasses import replace

import pytest
from click.testing import CliRunner
from test_planner_units import USER_PROFILES

import edgespec.api
from edgespec.backends.model_info import Tensor, read_model_info
from edgespec.cli import main
from edgespec.errors import EdgespecError
from edgespec.plan.planner import (
    DEFAULT_CTX,
    DRAFT_WINDOWS,
    KV_CHOICES,
    UBATCHES,
    compute_bytes,
    kv_bytes,
    llama_ctx,
    make_plan,
    model_need,
    requantized,
    state_bytes,
)
from edgespec.plan.profiles import Profile, get_profile
from edgespec.plan.report import format_plan, predict, refusal, to_dict
from edgespec.units import GiB, MiB

ENV = ("EDGESPEC_PROFILES", "EDGESPEC_DEVICE", "EDGESPEC_BUDGET", "EDGESPEC_TARGET", "EDGESPEC_DRAFT",
       "EDGESPEC_LLAMA_LOG")


@pytest.fixture(autouse=True)
def no_user_settings(monkeypatch):
    """The caller's environment picks no profile file, device, budget or model."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def profile(name="big", memory_gib=64.0, *, unified=True, reserve_gib=0.0, bandwidth=100e9, llama_cpp=("cpu",),
            host_bandwidth=None) -> Profile:
    return Profile(name=name, title=name.title(), memory_bytes=int(memory_gib * GiB), unified=unified,
                   reserve_bytes=int(reserve_gib * GiB), bandwidth=bandwidth, llama_cpp=llama_cpp,
                   onnxruntime=("cpu",), source="https://example.com/spec", host_bandwidth=host_bandwidth)


BIG = profile()


@pytest.fixture(scope="module")
def default_info(default_gguf):
    return read_model_info(default_gguf)


@pytest.fixture(scope="module")
def f32_info(default_info):
    """SmolLM2-135M as f32: the reference pair's target (the same tensors, 4 bytes per weight)."""
    return replace(default_info, path=default_info.path.with_name("smollm2-f32.gguf"),
                   tensors=tuple(Tensor(t.name, "F32", t.n_elements, 4 * t.n_elements) for t in default_info.tensors))


@pytest.fixture(scope="module")
def q4_0_info(q4_0_gguf):
    return read_model_info(q4_0_gguf)


# --- sizes -----------------------------------------------------------------------------------------


def test_kv_bytes_arithmetic(default_info):
    values = 30 * 2 * 3 * 64 * 2048  # layers x (K and V) x kv heads x head_dim x context
    assert kv_bytes(default_info, 2048, "f16", "llama.cpp") == values * 2 == 45 * MiB
    assert kv_bytes(default_info, 2048, "q8_0", "llama.cpp") == values // 32 * 34
    assert kv_bytes(default_info, 2048, "q4_0", "llama.cpp") == values // 32 * 18
    assert kv_bytes(default_info, 1024, "q4_0", "llama.cpp") * 2 == kv_bytes(default_info, 2048, "q4_0", "llama.cpp")


@pytest.mark.parametrize("kv_type", KV_CHOICES)
def test_kv_bytes_and_context_equal_llama_cpp(default_gguf, default_info, kv_type):
    from edgespec.backends.llama.backend import LlamaBackend

    backend = LlamaBackend(default_gguf, n_ctx=1000, kv_type=kv_type)
    try:
        assert backend.n_ctx == llama_ctx(1000, default_info) == 1024  # llama.cpp pads to a multiple of 256
        assert backend.memory()["kv_cache"] == kv_bytes(default_info, backend.n_ctx, kv_type, "llama.cpp")
        assert backend.memory()["weights"] == default_info.weight_bytes
    finally:
        backend.close()
    assert llama_ctx(20_000, default_info) == default_info.n_ctx_train == 8192


# llama.cpp's own log, in a fresh process (its logging is silenced in this one): one load per setting
_LOG_CHILD = r"""
import json, os, sys
from edgespec.backends.llama.backend import LlamaBackend
for n_ctx, n_ubatch, kv_type in json.loads(sys.argv[2]):
    os.write(2, f"@@setting {n_ctx} {n_ubatch} {kv_type}\n".encode())
    LlamaBackend(sys.argv[1], n_ctx=n_ctx, n_ubatch=n_ubatch, kv_type=kv_type, n_threads=1).close()
"""
F16_SETTINGS = [(2048, 512), (1024, 256), (512, 128), (4096, 512)]
QUANT_SETTINGS = [(2048, 512, "q8_0"), (1024, 256, "q4_0")]
SMALL_CTX = (256, 512, "f16")  # a prompt batch larger than the context: llama.cpp takes n_ubatch = n_ctx


@pytest.fixture(scope="module")
def llama_log_sizes(default_gguf):
    """{(n_ctx, n_ubatch, kv_type): (compute buffer MiB, KV buffer MiB)} as llama.cpp logs them."""
    settings = [(n, u, "f16") for n, u in F16_SETTINGS] + QUANT_SETTINGS + [SMALL_CTX]
    proc = subprocess.run([sys.executable, "-c", _LOG_CHILD, str(default_gguf), json.dumps(settings)],
                          capture_output=True, text=True, env={**os.environ, "EDGESPEC_LLAMA_LOG": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sizes = {}
    for part in proc.stderr.split("@@setting ")[1:]:
        n, u, kv = part.split("\n", 1)[0].split()
        compute = re.search(r"CPU compute buffer size\s*=\s*([\d.]+) MiB", part)
        kv_size = re.search(r"CPU KV buffer size\s*=\s*([\d.]+) MiB", part)
        assert compute and kv_size, part[-2000:]
        sizes[int(n), int(u), kv] = float(compute.group(1)), float(kv_size.group(1))
    assert len(sizes) == len(settings)
    return sizes


@pytest.mark.parametrize("n_ctx, n_ubatch", F16_SETTINGS)
def test_compute_bytes_equal_llama_cpp_log(llama_log_sizes, default_info, n_ctx, n_ubatch):
    logged_compute, logged_kv = llama_log_sizes[n_ctx, n_ubatch, "f16"]
    assert abs(compute_bytes(default_info, n_ctx, n_ubatch) / MiB - logged_compute) <= 0.5
    assert abs(kv_bytes(default_info, n_ctx, "f16", "llama.cpp") / MiB - logged_kv) <= 0.006  # the log rounds


@pytest.mark.parametrize("n_ctx, n_ubatch, kv_type", QUANT_SETTINGS)
def test_compute_bytes_with_a_quantized_kv_cache_never_underestimate(llama_log_sizes, default_info, n_ctx, n_ubatch,
                                                                     kv_type):
    """compute_bytes knows no KV type; with a quantized cache (flash attention) llama.cpp needs up to ~1 MiB less."""
    logged_compute, logged_kv = llama_log_sizes[n_ctx, n_ubatch, kv_type]
    planned = compute_bytes(default_info, n_ctx, n_ubatch) / MiB
    assert logged_compute - 0.5 <= planned <= logged_compute + 1.5
    assert abs(kv_bytes(default_info, n_ctx, kv_type, "llama.cpp") / MiB - logged_kv) <= 0.006


def test_planned_compute_at_a_context_smaller_than_the_batch(llama_log_sizes, default_info):
    n_ctx, n_ubatch, kv_type = SMALL_CTX
    need = model_need("target", default_info, n_ctx, kv_type, n_ubatch, None, 0, False)
    assert need.n_ubatch == 256
    assert abs(need.compute / MiB - llama_log_sizes[SMALL_CTX][0]) <= 0.5


# --- profiles --------------------------------------------------------------------------------------


# --- decisions -------------------------------------------------------------------------------------

def settings(plan):
    """Where a plan stands in the documented order of what is given up, most important first:
    context, then KV type, then prompt batch, then the draft's window (each an index, 0 = preferred)."""
    contexts = [DEFAULT_CTX // 2**i for i in range(4)]
    return (contexts.index(plan.target.n_ctx), KV_CHOICES.index(plan.target.kv_type),
            UBATCHES.index(plan.target.n_ubatch), DRAFT_WINDOWS.index(plan.draft_window) if plan.draft_window else 0)


def test_plenty_of_memory_changes_nothing(default_info, f32_info, q4_0_info):
    alone = make_plan(default_info, None, BIG, drafter="lookup")
    assert alone.fits and alone.changes == () and alone.suggestions == () and alone.draft is None
    t = alone.target
    assert (t.n_ctx, t.kv_type, t.n_ubatch, t.n_gpu_layers, alone.drafter) == (2048, "f16", 512, 0, "lookup")
    assert t.weights == default_info.weight_bytes and t.repacked == 0  # Q4_1 is not repacked
    assert t.kv_cache == 45 * MiB and t.compute == compute_bytes(default_info, 2048, 512)
    assert alone.total == t.total + alone.runtime and alone.used == alone.total

    pair = make_plan(f32_info, q4_0_info, BIG)
    assert pair.fits and pair.changes == () and pair.drafter == "model" and pair.draft_window == 1024
    assert pair.draft.n_ctx == 1280  # the window and what it drafts, padded to 256
    # ggml-cpu repacks Q4_0 matrices into a second copy (not the embedding table, which is only looked up)
    assert pair.draft.repacked == sum(t.n_bytes for t in q4_0_info.tensors
                                      if t.type == "Q4_0" and t.name != "token_embd.weight") > 0.6 * 2**26
    assert pair.target.repacked == 0
    assert pair.total == pair.target.total + pair.draft.total + pair.runtime


def test_shrinking_budget_gives_up_in_the_documented_order(f32_info, q4_0_info):
    full = make_plan(f32_info, q4_0_info, BIG)
    assert make_plan(f32_info, q4_0_info, BIG, budget=full.total).changes == ()  # used <= capacity: inclusive
    previous, first_seen = (0, 0, 0, 0), {}
    for budget in range(full.total - 1, 780 * MiB, -MiB // 2):
        plan = make_plan(f32_info, q4_0_info, BIG, budget=budget)
        if not plan.fits:
            assert budget < 790 * MiB and plan.missing == plan.used - budget > 0
            break
        assert plan.used <= plan.capacity == budget
        key = settings(plan)
        assert key >= previous, (budget / MiB, key, previous)  # a smaller budget never gets better settings
        previous = key
        for kind, index in zip(("context", "KV cache", "prompt batch", "draft reads"), key, strict=True):
            if index:
                first_seen.setdefault(kind, budget)
                assert any(c.startswith(kind) for c in plan.changes), plan.changes
    else:
        pytest.fail("no budget was too small")
    # the first thing given up is the draft's window, then the prompt batch, then KV precision, then context
    assert first_seen["draft reads"] > first_seen["prompt batch"] > first_seen["KV cache"] > first_seen["context"]
    assert first_seen["draft reads"] > full.total - MiB


def test_a_fixed_context_is_never_shrunk(f32_info, q4_0_info):
    for budget in range(880 * MiB, 760 * MiB, -4 * MiB):
        plan = make_plan(f32_info, q4_0_info, BIG, budget=budget, n_ctx=2048)
        assert plan.target.n_ctx == 2048
        assert plan.fits == (plan.used <= budget)
        assert plan.fits or plan.suggestions
    padded = make_plan(f32_info, q4_0_info, BIG, n_ctx=1000)
    assert padded.target.n_ctx == 1024 and padded.changes == ()
    fixed_kv = make_plan(f32_info, q4_0_info, BIG, budget=820 * MiB, kv_type="f16")
    assert fixed_kv.target.kv_type == fixed_kv.draft.kv_type == "f16" and fixed_kv.target.n_ctx < 2048
    with pytest.raises(EdgespecError, match="unknown KV cache type 'q2'"):
        make_plan(f32_info, q4_0_info, BIG, kv_type="q2")


def test_too_small_is_refused_with_what_is_missing_and_what_would_fit(f32_info, q4_0_info):
    budget = 780 * MiB
    plan = make_plan(f32_info, q4_0_info, BIG, budget=budget)
    assert not plan.fits and plan.missing == plan.used - budget > 0 and plan.suggestions
    assert (plan.target.n_ctx, plan.target.kv_type, plan.target.n_ubatch) == (256, "q4_0", 128)  # the smallest
    text = refusal(plan)
    assert f"{plan.missing / MiB:.1f} MiB is missing" in text and "--draft ngram" in text
    assert f"{budget / MiB:.1f} MiB is available" in text
    # every suggestion, taken, fits
    assert make_plan(f32_info, None, BIG, budget=budget, drafter="lookup").fits
    assert any("q4_k_m" in s for s in plan.suggestions)
    assert make_plan(requantized(f32_info, "q4_k_m"), q4_0_info, BIG, budget=budget).fits

    fixed = make_plan(f32_info, q4_0_info, BIG, budget=795 * MiB, n_ctx=2048)
    assert not fixed.fits
    ctx = next(int(m.group(1)) for s in fixed.suggestions if (m := re.search(r"--ctx (\d+)", s)))
    assert ctx < 2048 and make_plan(f32_info, q4_0_info, BIG, budget=795 * MiB, n_ctx=ctx).fits


def test_suggestions_under_a_fixed_context_fit_that_context(f32_info, q4_0_info):
    budget = 615 * MiB  # the f32 target alone needs ~620 MiB at 2048 tokens, ~608 MiB at 256
    plan = make_plan(f32_info, q4_0_info, BIG, budget=budget, n_ctx=2048)
    assert not plan.fits
    if any("--draft ngram" in s for s in plan.suggestions):
        assert make_plan(f32_info, None, BIG, budget=budget, n_ctx=2048, drafter="lookup").fits


def test_refusal_without_a_draft_model_does_not_suggest_dropping_it(default_info):
    plan = make_plan(default_info, None, BIG, budget=100 * MiB, drafter="lookup")
    assert not plan.fits and plan.missing == plan.used - 100 * MiB
    assert "--draft ngram" not in refusal(plan) and "a device with more memory" in refusal(plan)
    assert refusal(plan) in format_plan(plan)


def test_discrete_gpu_smaller_than_the_model_offloads_part_of_the_layers(f32_info, q4_0_info):
    def gpu(memory_gib):
        return profile("small-gpu", memory_gib, unified=False, bandwidth=300e9, llama_cpp=("cuda", "cpu"),
                       host_bandwidth=50e9)

    plan = make_plan(f32_info, None, gpu(0.7), drafter="lookup")  # 513 MiB of f32 weights; 317 MiB after CUDA
    t = plan.target
    assert plan.discrete and plan.fits and plan.used <= plan.capacity
    assert 0 < t.n_gpu_layers < f32_info.n_layer + 1 and t.n_ctx == 2048
    assert any(f"{t.n_gpu_layers} of 31 layers on the GPU" in c for c in plan.changes)
    assert plan.used == t.gpu_bytes + 400 * MiB  # the layers there, and the CUDA context
    assert t.gpu_bytes < f32_info.weight_bytes  # the rest stays in host RAM, outside the VRAM budget
    more = make_plan(f32_info, None, gpu(0.8), drafter="lookup")
    assert more.target.n_gpu_layers > t.n_gpu_layers and more.target.n_ctx == 2048

    pair = make_plan(f32_info, q4_0_info, gpu(0.7))
    assert pair.fits and pair.draft.n_gpu_layers == q4_0_info.n_layer + 1  # the small draft goes first
    assert 0 < pair.target.n_gpu_layers < t.n_gpu_layers and pair.target.n_ctx == 2048

    whole = make_plan(f32_info, q4_0_info, get_profile("rtx-4090-24gb"))
    assert whole.fits and whole.changes == () and whole.target.n_gpu_layers == 31
    assert to_dict(whole)["models"][0]["gpu_bytes"] > f32_info.weight_bytes
    unified = make_plan(f32_info, q4_0_info, get_profile("orin-nano-8gb"))
    assert unified.target.n_gpu_layers == 31 and unified.target.repacked == unified.draft.repacked == 0


def test_to_dict_is_json_and_adds_up(f32_info, q4_0_info):
    plan = make_plan(f32_info, q4_0_info, BIG, budget=820 * MiB)
    data = json.loads(json.dumps(to_dict(plan, predict(plan, 0.7))))
    assert data["fits"] and data["used"] == data["total"] == plan.total <= data["capacity"] == 820 * MiB
    assert data["total"] == sum(m["bytes"]["total"] for m in data["models"]) + data["runtime_bytes"]
    for m in data["models"]:
        assert m["bytes"]["total"] == sum(v for k, v in m["bytes"].items() if k != "total")
    assert data["changes"] == list(plan.changes) and data["prediction"]["acceptance"] == 0.7
    assert "fits" in format_plan(plan) and "KV cache q8_0 (not f16)" in format_plan(plan)


# --- prediction ------------------------------------------------------------------------------------

def test_predict_roofline_and_speculation(default_info, f32_info, q4_0_info):
    ngram = make_plan(default_info, None, BIG, drafter="lookup")
    read = default_info.bytes_read_per_token() + ngram.target.kv_cache // 2
    first = predict(ngram, 0.5)
    assert first["target_tokens_per_second"] == round(BIG.bandwidth / read, 1)
    assert first["draft_step_cost"] == 0
    speedups = [predict(ngram, a)["best_speedup"] for a in (0.0, 0.3, 0.6, 0.9)]
    assert speedups[0] == 1.0 and speedups == sorted(set(speedups))  # free drafts: never slower, better with a

    pair = make_plan(f32_info, q4_0_info, BIG)
    zero = predict(pair, 0.0)
    assert zero["best_speedup"] < 1 and 0 < zero["draft_step_cost"] < 1
    assert [predict(pair, a)["best_speedup"] for a in (0.5, 0.7, 0.9)] == sorted(
        {predict(pair, a)["best_speedup"] for a in (0.5, 0.7, 0.9)})
    assert predict(pair, 0.9)["best_draft_length"] > predict(pair, 0.5)["best_draft_length"]
    none = predict(make_plan(default_info, None, BIG, drafter="none"), 0.7)
    assert "speculative" not in none and none["target_tokens_per_second"] == first["target_tokens_per_second"]


# --- refusing before loading -----------------------------------------------------------------------

@pytest.fixture
def no_loading(monkeypatch):
    def open_model(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(edgespec.api, "open_model", open_model)


def test_load_under_too_small_a_budget_is_refused_before_any_weights_load(default_gguf, no_loading):
    with pytest.raises(EdgespecError, match=r"do not fit .* MiB is missing"):
        edgespec.api.load(default_gguf, "ngram", budget="100MiB")
    with pytest.raises(EdgespecError, match="cannot read the budget"):
        edgespec.api.load(default_gguf, "ngram", budget="a lot")
    with pytest.raises(EdgespecError, match="unknown device profile"):
        edgespec.api.load(default_gguf, "ngram", device="orin-nano-9gb")


def test_plan_for_reads_headers_only(default_gguf, q4_0_gguf, no_loading):
    plan = edgespec.api.plan_for(default_gguf, q4_0_gguf, device="rpi5-8gb", budget="1GiB")
    assert plan.fits and plan.capacity == GiB and plan.draft.info.path == q4_0_gguf
    assert edgespec.api.plan_for(default_gguf, "none", device="rpi5-8gb").drafter == "none"


def test_cli_generate_under_too_small_a_budget(default_gguf, no_loading):
    result = CliRunner().invoke(main, ["generate", "hi", "--budget", "100MiB", "-m", str(default_gguf)])
    assert result.exit_code == 1, result.output
    assert "do not fit" in result.output and "MiB is missing" in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, AssertionError)


def test_cli_plan_json(default_gguf, q4_0_gguf, tmp_path):
    runner = CliRunner()
    fits = runner.invoke(main, ["plan", "-m", str(default_gguf), "--json"])
    assert fits.exit_code == 0, fits.output
    data = json.loads(fits.output)
    assert data["fits"] is True and data["device"] == "auto" and data["prediction"]["best_speedup"] >= 1
    assert data["serve_streams"] == {"streams": 4, "why": "4 contexts of 2048 tokens"}

    refused = runner.invoke(main, ["plan", "-m", str(default_gguf), "--budget", "100MiB", "--json"])
    assert refused.exit_code == 1
    data = json.loads(refused.output)
    assert data["fits"] is False and data["missing"] > 0 and data["suggestions"]

    path = tmp_path / "profiles.toml"
    path.write_text(USER_PROFILES)
    custom = runner.invoke(main, ["plan", "-m", str(default_gguf), "--draft", str(q4_0_gguf), "--device", "my-board",
                                  "--profiles", str(path), "--json"])
    assert custom.exit_code == 0, custom.output
    data = json.loads(custom.output)
    assert data["device"] == "my-board" and data["capacity"] == int(3.5 * GiB) and len(data["models"]) == 2
    text = runner.invoke(main, ["plan", "-m", str(default_gguf), "--device", "rpi5-8gb", "--ctx", "1024"])
    assert text.exit_code == 0 and "Raspberry Pi 5" in text.output and "ctx 1024" in text.output
    assert "serve: 4 requests at once unless told (--parallel auto: 4 contexts of 1024 tokens)" in text.output


# --- planned against measured (slow) --------------------------------------------------------------


def check_peak(result, ctx=None):
    plan = result["plan"]
    assert plan["fits"] and 0.85 <= result["ratio"] <= 1.15, (result["ratio"], result["peak"], plan["total"])
    target = plan["models"][0]
    if ctx:
        assert target["context"] == ctx
    # the context was really filled, so the KV cache, compute buffer and logits reached their planned size
    assert target["context"] - 128 < result["prompt_tokens"] and result["generated"] == 64


def test_peak_memory_of_the_default_model_with_ngram(default_gguf):
    from edgespec.bench import measure_peak

    check_peak(measure_peak(str(default_gguf), "ngram", ctx=1024, device="auto"), ctx=1024)


def test_peak_memory_of_the_reference_pair(reference_pair, f32_info, q4_0_info):
    from edgespec.bench import measure_peak

    target, draft = reference_pair
    assert read_model_info(target).weight_bytes == f32_info.weight_bytes  # the stand-in of the fast tests is exact
    assert read_model_info(draft).weight_bytes == q4_0_info.weight_bytes
    result = measure_peak(target, draft, ctx=1024, device="auto")  # filled: 1024 tokens read by both models
    check_peak(result, ctx=1024)
    assert result["plan"]["changes"] == [] and result["plan"]["models"][1]["kv_type"] == "f16"


def test_peak_memory_of_the_reference_pair_under_a_budget(reference_pair):
    from edgespec.bench import measure_peak

    result = measure_peak(*reference_pair, ctx=1024, device="auto", budget="800MiB")
    check_peak(result, ctx=1024)
    plan = result["plan"]
    assert plan["changes"] and plan["total"] <= plan["capacity"] == 800 * MiB
    assert plan["models"][0]["kv_type"] != "f16"  # the budget forced a smaller KV cache


def test_a_gpu_in_the_llama_cpp_build_puts_models_on_it_by_default(monkeypatch):
    """Without --device, a llama.cpp build with a GPU loads under the plan for this machine (what fits on the GPU),
    and the placement says where each model runs; --gpu-layers and --cpu override it. The GPU is said to be there
    (a CPU build has none), so the plan's choice is checked on either build, not a GPU's speed; where each model
    then runs is what this build's own devices allow."""
    from edgespec import api
    from edgespec.backends.llama.lib import gpu_name as build_gpu
    from edgespec.plan import placement

    monkeypatch.setattr(placement, "gpu_name", lambda: "CUDA0")
    engine = api.load(draft="none")
    try:
        assert engine.plan is not None and engine.plan.profile.name == "auto"
    finally:
        engine.close()
    for layers in (0, "0", 12, "all"):
        engine = api.load(draft="none", gpu_layers=layers)
        try:  # asked for: no plan, the layers as given; a CPU build places none, a GPU build those, and says so
            n = placement.parse_gpu_layers(layers)
            assert engine.plan is None and engine.target.n_gpu_layers == n
            where = engine.placement()["target"]
            assert where["layers"] == 31 and where["gpu_layers"] == (min(n, 31) if build_gpu() else 0)
            assert where["device"] == (build_gpu() if where["gpu_layers"] else "cpu")
        finally:
            engine.close()
    monkeypatch.setattr(placement, "gpu_name", lambda: None)
    engine = api.load(draft="none")
    try:  # no GPU: as before, no plan and nothing offloaded
        assert engine.plan is None and engine.target.n_gpu_layers == 0
    finally:
        engine.close()


def test_drafts_inside_llama_cpp_are_counted_and_shown(default_gguf, smollm2_checkpoint, tmp_path):
    """An EAGLE-3 head holds its file, an f16 KV cache and a float32 g row per position of the context, and the
    logits buffer llama.cpp gives a model with an encoder (64 rows of the 49,152-token vocabulary); an MTP layer the
    same but its weights (the target file's). `edgespec plan` shows them on a line of their own."""
    from edgespec.export.eagle3 import convert_eagle3, random_eagle3
    from edgespec.models.random_mtp import write_random_qwen35_mtp
    from edgespec.run import plan_for

    random_eagle3(tmp_path / "head", smollm2_checkpoint, layers=[2, 15, 27], draft_vocab=2000)
    head = convert_eagle3(tmp_path / "head", smollm2_checkpoint, tmp_path / "head.gguf")
    small, large = (plan_for(default_gguf, str(head), n_ctx=n, budget="8GiB", measure_bandwidth=False)
                    for n in (512, 2048))
    none = plan_for(default_gguf, "none", n_ctx=2048, budget="8GiB", measure_bandwidth=False)
    assert small.heads > read_model_info(head).weight_bytes + 64 * 49152 * 4 and none.heads == 0
    assert large.heads - small.heads == 1536 * (2 * 2 * 3 * 64 + 4 * 576)  # K and V of 3 heads of 64, g of 576
    assert large.total - none.total >= large.heads
    assert re.search(r"^heads +.* the draft heads", format_plan(large), re.M)
    assert to_dict(large)["heads_bytes"] == large.heads
    step = predict(replace(large, profile=BIG), 0.7)["draft_step_cost"]  # the head's bytes over the target's read
    target_read = large.target.info.bytes_read_per_token() + large.target.kv_cache // 2
    assert step > 0 and step == pytest.approx(large.heads / target_read, abs=5e-4)
    qwen = write_random_qwen35_mtp(tmp_path / "qwen35-mtp.gguf", tokenizer=default_gguf)  # 64 wide, 2 kv heads of 16
    mtp = plan_for(str(qwen), "mtp", n_ctx=512, budget="8GiB", measure_bandwidth=False)
    assert mtp.heads == 528 * (2 * 2 * 2 * 16 + 4 * 64) + 16 * 49152 * 4


_RECURRENT_CHILD = r"""
import os, sys
from edgespec.backends.llama.backend import LlamaBackend
for sequences in (1, 16):
    os.write(2, f"@@sequences {sequences}\n".encode())
    LlamaBackend(sys.argv[1], n_ctx=512, n_threads=1, sequences=sequences).close()
"""


def test_a_recurrent_targets_states_and_attention_cache_equal_llama_cpp_log(default_gguf, tmp_path):
    """Qwen3.5's gated delta nets keep a state a sequence (and 16 snapshots of it), its attention layers alone a KV
    cache (one of the four trunk layers here): the planner's figures for one sequence (a chain) and for sixteen (a
    tree's branches) are what llama.cpp allocates, as its log says."""
    from edgespec.models.random_mtp import write_random_qwen35_mtp
    from edgespec.run import plan_for

    qwen = write_random_qwen35_mtp(tmp_path / "qwen35-mtp.gguf", tokenizer=default_gguf)
    proc = subprocess.run([sys.executable, "-c", _RECURRENT_CHILD, str(qwen)], capture_output=True, text=True,
                          env={**os.environ, "EDGESPEC_LLAMA_LOG": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = read_model_info(qwen)
    assert (info.recurrent_layers, info.attention_layers) == (3, 1)
    for part in proc.stderr.split("@@sequences ")[1:]:
        sequences = int(part.split("\n", 1)[0])
        logged_kv = float(re.search(r"CPU KV buffer size\s*=\s*([\d.]+) MiB", part).group(1))
        logged_states = float(re.search(r"CPU RS buffer size\s*=\s*([\d.]+) MiB", part).group(1))
        assert abs(kv_bytes(info, 512, "f16", "llama.cpp") / MiB - logged_kv) <= 0.006  # the log rounds
        assert abs(state_bytes(info, sequences) / MiB - logged_states) <= 0.006
        plan = plan_for(str(qwen), "none", n_ctx=512, budget="8GiB", measure_bandwidth=False, sequences=sequences)
        assert plan.target.kv_cache == kv_bytes(info, 512, "f16", "llama.cpp") + state_bytes(info, sequences)
        assert to_dict(plan)["models"][0]["recurrent_state_bytes"] == state_bytes(info, sequences)
        assert "recurrent states" in format_plan(plan)
