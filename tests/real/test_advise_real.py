"""advise on the real model: its predictions against what the loop then measures."""

import json

import pytest

from edgespec.plan import advise


def test_advise_on_the_real_model_predicts_what_the_loop_then_measures(q4_0_gguf, tmp_path):
    """Calibration and check on the same prompts (each twice in the file: one copy each side): at temperature 0
    predicted and measured acceptance agree at every draft length, for a draft model and prompt lookup."""
    from click.testing import CliRunner

    from edgespec.cli import main

    rows = [{"cat": "code", "prompt": "Write a Python function that reverses a list."},
            {"cat": "chat", "prompt": "Name three colors."}, {"cat": "chat", "prompt": "Say hello politely."}]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows for _ in range(2)))
    result = CliRunner().invoke(main, ["advise", "--draft", str(q4_0_gguf), "--also", "ngram", "--prompts",
                                       str(prompts), "-n", "24", "--draft-max", "3", "--check", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report["recommendations"]) == {"chat", "code", "overall"}
    for name, cats in report["check"]["drafts"].items():
        predicted = report["drafts"][name]["categories"]
        for cat, check in cats.items():
            assert check["prompts"] == {"chat": 2, "code": 1, "overall": 3}[cat]
            for k, measured in check["measured"].items():
                assert predicted[cat]["draft_lengths"][k]["acceptance"] == pytest.approx(measured["acceptance"],
                                                                                         abs=0.02), (name, cat, k)
    model = report["drafts"][f"model:{q4_0_gguf.name}"]
    assert model["categories"]["overall"]["statistics"]["kl_target_draft"] > 0
    assert model["costs"]["target_pass_ms"]["1"] > 0 and model["costs"]["draft_per_token_ms"] > 0


def test_roofline_costs_read_the_profile(default_gguf, q4_0_gguf):
    from edgespec.plan.profiles import get_profile

    profile = get_profile("orin-nano-8gb")
    measured = advise.Costs({1: 0.01, 2: 0.02}, 0.0, 0.001, 0.0002, "here")
    costs = advise.roofline_costs(measured, default_gguf, q4_0_gguf, "orin-nano-8gb")
    assert costs.target[1] == costs.target[2] == pytest.approx(default_gguf.stat().st_size / profile.bandwidth,
                                                               rel=0.05)
    assert costs.draft_per_token < costs.target[1] and costs.row == measured.row and "orin-nano-8gb" in costs.source
