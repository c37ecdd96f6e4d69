"""A Run (edgespec/run.py): what a target, a draft and the options resolve to, once, before any weights load; and
what load and Parallel open from it, as it is."""

import pytest

import edgespec.api
import edgespec.parallel
import edgespec.run
from edgespec.errors import EdgespecError
from edgespec.run import ModelSettings, auto_streams, resolve_run


class Opened(Exception):
    """Raised by a stand-in for a backend's constructor, with what it was asked to open."""


@pytest.fixture
def opening(monkeypatch):
    """Loading a model raises Opened with its arguments instead (no weights load)."""
    def open_model(*args, **kwargs):
        raise Opened(args, kwargs)

    monkeypatch.setattr(edgespec.api, "open_model", open_model)
    monkeypatch.setattr(edgespec.parallel, "LlamaBackend", open_model)


def test_a_plan_sets_every_models_settings_and_asked_gpu_layers_go_over_it(default_gguf, opening):
    run = resolve_run(default_gguf, default_gguf, device="rpi5-8gb", budget="1GiB")
    plan = run.plan
    assert plan.fits and (run.streams, run.streams_why) == (1, "asked for")
    assert (run.n_ctx, run.draft_window) == (plan.target.n_ctx, plan.draft_window)
    assert run.target_settings == ModelSettings(plan.target.kv_type, plan.target.n_ubatch, plan.target.n_gpu_layers)
    assert run.draft_settings == ModelSettings(plan.draft.kv_type, plan.draft.n_ubatch, plan.draft.n_gpu_layers)
    asked = resolve_run(default_gguf, default_gguf, device="rpi5-8gb", gpu_layers=3)
    assert asked.target_settings.n_gpu_layers == asked.draft_settings.n_gpu_layers == 3
    assert asked.target_settings.kv_type == asked.plan.target.kv_type
    plain = resolve_run(default_gguf, "none", gpu_layers=0)  # no plan asked for: f16, on the CPU
    assert plain.plan is None and plain.target_settings == ModelSettings("f16", 512, 0) and plain.provider == "cpu"


def test_streams_plan_the_cells_of_all_of_them(default_gguf, opening):
    """Each stream's context is planned as one of their sum: a pool each (rounded up to 256 cells, as llama.cpp
    does) for prompt lookup on a CPU, one pool for a draft model's streams."""
    lookup = resolve_run(default_gguf, "ngram", streams=3, n_ctx=900, device="rpi5-8gb", gpu_layers=0)
    assert (lookup.streams, lookup.n_ctx, lookup.one_pool) == (3, 900, False)
    assert lookup.plan.target.n_ctx >= 3 * 1024
    model = resolve_run(default_gguf, default_gguf, streams=3, n_ctx=900, device="rpi5-8gb", gpu_layers=0)
    assert model.one_pool and 2700 <= model.plan.target.n_ctx < 3 * 1024


def test_parallel_auto_is_decided_with_the_run(default_gguf, opening):
    run = resolve_run(default_gguf, "none", streams=None)
    assert (run.streams, run.streams_why) == auto_streams(default_gguf, "none") and run.streams > 1
    heads = resolve_run(default_gguf, "eagle", streams=None)
    assert heads.streams == 1 and "run one stream at a time" in heads.streams_why
    trees = resolve_run(default_gguf, default_gguf, streams=None, tree_width=2)
    assert (trees.streams, trees.streams_why, trees.tree_width) == (1, "draft trees run one stream at a time", 2)


@pytest.mark.parametrize("options, words", [
    ({"draft": "ngram", "tree_width": 2}, "draft trees come from a draft model or heads"),
    ({"draft": "eagle", "tree_width": 5}, "tree width must be between 1 and 4"),
    ({"draft": "ngram+eagle", "tree_width": 2}, "prompt lookup drafts chains"),
    ({"draft": "default", "tree_width": 2, "streams": 2}, "draft trees run one stream at a time"),
    ({"draft": "eagle", "streams": 2}, "heads and prompt lookup in front of a draft run one stream at a time"),
    ({"draft": "none", "streams": 17}, "streams must be 1 to 16"),
    ({"draft": "none", "streams": 0}, "streams must be 1 to 16"),
    ({"draft": "none", "streams": 4, "n_ctx": 4096}, "need 16384 cells, more than .* was trained for"),
    ({"draft": "none", "n_ctx": 8}, "context must be at least 16 tokens"),
    ({"draft": "none", "budget": "100MiB"}, "do not fit .* MiB is missing"),
    ({"draft": "none", "streams": 2, "budget": "100MiB"}, "2 streams of 2048 tokens: .*do not fit"),
    ({"draft": "none", "gpu_layers": "some"}, "GPU layers must be a number or 'all'"),
])
def test_what_cannot_run_is_refused_before_any_weights_load(default_gguf, opening, options, words):
    options = {**options, "draft": default_gguf if options["draft"] == "default" else options["draft"]}
    opens = edgespec.api.load if "streams" not in options else None if "tree_width" in options else \
        edgespec.parallel.Parallel
    for open_it in filter(None, (resolve_run, opens)):
        with pytest.raises(EdgespecError, match=words):
            open_it(default_gguf, **options)


def test_load_and_parallel_open_the_run_they_are_given_as_it_is(default_gguf, opening, monkeypatch):
    """A Run handed to load or Parallel is opened with its settings, and nothing is resolved again."""
    one = resolve_run(default_gguf, "none", n_ctx=300, threads=1, kv_type="q8_0", gpu_layers=0)
    four = resolve_run(default_gguf, "ngram", streams=4, n_ctx=300, threads=1, gpu_layers=0)

    def again(*args, **kwargs):
        raise AssertionError("resolved again")

    monkeypatch.setattr(edgespec.run, "resolve_pair", again)
    monkeypatch.setattr(edgespec.run, "plan_for", again)
    with pytest.raises(Opened) as opened:
        edgespec.api.load(one)
    (target,), settings = opened.value.args
    assert target == one.pair.target
    assert settings == {"n_ctx": 300, "threads": 1, "provider": "cpu", "hidden": False, "spin": True, "load_mtp": False,
                        "sequences": None, "kv_type": "q8_0", "n_ubatch": 512, "n_gpu_layers": 0}
    with pytest.raises(Opened) as opened:
        edgespec.parallel.open_run(four)
    (target,), settings = opened.value.args
    assert target == four.pair.target and settings["n_ctx"] == 4 * 300 and settings["sequences"] == 4
    assert (settings["unified"], settings["n_threads"], settings["kv_type"]) == (four.one_pool, 1, "f16")


@pytest.mark.parametrize("draft, family", [("none", "none"), ("ngram", "lookup"), ("d.gguf", "model"),
                                           ("h.medusa.npz", "heads"), ("eagle", "heads"), ("ngram+eagle", "heads"),
                                           ("ngram+d.gguf", "model")])
def test_a_draft_has_one_family_for_the_planner_and_the_simulator(draft, family):
    from edgespec.drafts.spec import parse_draft
    from edgespec.plan.sim import DRAFTS

    assert parse_draft(draft).family == family and family in (*DRAFTS, "none")
