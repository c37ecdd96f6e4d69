"""Constrained decoding on the real model: the robot's prompts under a JSON schema."""

import json
from importlib import resources

import pytest

ROBOT_SCHEMA = json.loads(resources.files("edgespec").joinpath("data/robot.schema.json").read_text())


@pytest.mark.parametrize("draft", ["ngram", "model"])
def test_robot_prompts_give_valid_json_and_greedy_output_is_the_constrained_targets(default_gguf, q4_0_gguf,
                                                                                   draft):
    from edgespec.api import load
    from edgespec.bench import read_prompts

    engine = load(default_gguf, q4_0_gguf if draft == "model" else "ngram", n_ctx=512)
    prompts = [p["prompt"] for p in read_prompts(None) if p["cat"] == "robot"]
    for prompt in prompts:
        base = engine.generate(prompt, max_tokens=64, draft_max=0, json_schema=ROBOT_SCHEMA)
        spec = engine.generate(prompt, max_tokens=64, draft_max=3, json_schema=ROBOT_SCHEMA)
        assert spec.tokens == base.tokens
        command = json.loads(spec.text)
        assert command["action"] in ROBOT_SCHEMA["properties"]["action"]["enum"]
        assert set(command) <= set(ROBOT_SCHEMA["properties"])
        assert spec.stats.finish_reason == "stop"
    assert spec.stats.drafted > 0
