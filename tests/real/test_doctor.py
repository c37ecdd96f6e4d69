"""edgespec doctor on the real model, and its statistics (the self-test against a broken rule:
laws/test_doctor_laws.py)."""

import json
import os

import pytest
from click.testing import CliRunner
from scipy import stats
from stats_util import target_instead_of_residual

from edgespec import doctor
from edgespec.cli import main
from edgespec.decode import rows, rule
from edgespec.plan.placement import gpu_name


@pytest.mark.parametrize("x, df", [(3.0, 1), (10.8, 1), (5.0, 2), (13.8, 2), (20.0, 5), (30.0, 10), (80.0, 40),
                                   (150.0, 100)])
def test_chi2_tail_matches_scipy_where_it_decides(x, df):
    exact = stats.chi2.sf(x, df)
    assert doctor.chi2_sf(x, df) == pytest.approx(exact, rel=0.1 if df > 2 else 1e-9)


def test_step_costs_are_the_ones_the_controller_measured_at_load():
    from edgespec.decode.cost import DraftController

    class Engine:
        controller = DraftController({1: 0.010, 2: 0.012, 3: 0.015, 4: 0.020}, 0.004, 3, read_cost=0.001)

    assert doctor.step_costs(Engine()) == {"target_pass_ms": {1: 10.0, 2: 12.0, 4: 20.0}, "draft_step_ms": 4.0,
                                           "draft_read_ms": 1.0}


def test_doctor_on_the_default_model_and_with_a_broken_rule(monkeypatch):
    runner = CliRunner()
    result = runner.invoke(main, ["doctor", "--json", "--draws", "4000"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ok"] and [c["name"] for c in report["checks"]] == ["load", "exactness"]
    assert report["environment"]["llama_cpp"]["devices"]
    assert report["environment"]["row_passes"] == rows.kind()  # what the rule runs on (tests/fast/test_rows.py)
    if hasattr(os, "sched_getaffinity"):  # the cores the default threads use: this process's (a worker's share)
        assert report["environment"]["cores"] == len(os.sched_getaffinity(0)) <= report["environment"]["cpus"]
    target = report["placement"]["target"]  # the default model, its 30 layers + output, where this build puts it
    assert report["placement"]["draft"] is None and target["runtime"] == "llama.cpp" and target["layers"] == 31
    gpu = gpu_name()  # a CPU build runs it on the CPU; a GPU build on its GPU
    assert (target["device"], target["gpu_layers"] > 0) == ((gpu, True) if gpu else ("cpu", False))
    passes = report["costs"]["target_pass_ms"]
    assert list(passes) == ["1", "2", "4"] and min(passes.values()) > 0
    assert "draft_step_ms" not in report["costs"]  # prompt lookup costs no model call
    exactness = report["checks"][1]["detail"]  # the path generation runs, at several filters
    assert exactness["path"] == (f"decode/rule.py on decode/laws.py, row passes {report['environment']['row_passes']}"
                                 ", float32 rows of 49,152 ids")
    assert [case["sampling"] for case in exactness["positions"]] == ["t=1"] * 3 + [
        "t=0.7 top-p=0.95", "t=0.7 top-k=40 min-p=0.05", "t=1.5"]
    monkeypatch.setattr(rule, "residual", target_instead_of_residual)
    result = runner.invoke(main, ["doctor", "--draws", "4000"])
    assert result.exit_code == 1 and "FAIL exactness" in result.output
    where = f"llama.cpp on {target['device']}, {target['gpu_layers']}/31 layers on the GPU"
    assert f"target: {where}, a pass over 1/2/4 tokens" in result.output
