"""apps/jetson: the robot service on the default model, over stdin/stdout and HTTP."""

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "apps" / "jetson"
SCHEMA = json.loads(resources.files("edgespec").joinpath("data/robot.schema.json").read_text())
TOOLS = {t["function"]["name"]: t["function"]["parameters"]
         for t in json.loads(resources.files("edgespec").joinpath("data/robot.tools.json").read_text())}
COMMANDS = ["move forward two meters", "turn left by 90 degrees", "pick up the red cup from the table",
            "place the box on the shelf", "stop"]


def valid(action: dict) -> bool:
    props = SCHEMA["properties"]
    return (action.get("action") in props["action"]["enum"] and set(action) <= set(props)
            and all(isinstance(action[k], (int, float)) for k in ("distance_m", "angle_deg") if k in action)
            and all(isinstance(action[k], str) and len(action[k]) <= 40 for k in ("object", "location")
                    if k in action))


def run(args, stdin):
    return subprocess.run([sys.executable, "-m", "edgespec_robot", "--threads", "1", *args], input=stdin,
                          capture_output=True, text=True, cwd=APP, timeout=600)


def called(action: dict) -> bool:
    """An action from the robot's tools: one of them, its arguments valid against its parameters."""
    jsonschema = pytest.importorskip("jsonschema")
    arguments = {k: v for k, v in action.items() if k != "action"}
    jsonschema.validate(arguments, TOOLS[action["action"]])
    return True


def test_every_robot_command_becomes_a_valid_call_of_its_tools():
    from edgespec.bench import read_prompts

    prompts = [p["prompt"] for p in read_prompts(None) if p["cat"] == "robot"]
    lines = [*COMMANDS, *(json.dumps({"command": p}) for p in prompts), '{"no command": 1}']
    result = run([], "\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(answers) == len(lines)
    assert all(called(a["action"]) and valid(a["action"]) for a in answers[:-1]), answers
    assert "error" in answers[-1]
    assert answers[0]["action"] == {"action": "move", "distance_m": 2}
    assert answers[COMMANDS.index("stop")]["action"] == {"action": "stop"}


def test_one_schema_of_an_action_instead_of_tools():
    schema = str(resources.files("edgespec").joinpath("data/robot.schema.json"))
    result = run(["--schema", schema], "\n".join(COMMANDS[:2]) + "\n")
    assert result.returncode == 0, result.stderr
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(answers) == 2 and all(valid(a["action"]) for a in answers), answers
    both = run(["--schema", schema, "--tools", schema], "stop\n")
    assert both.returncode != 0 and "not both" in both.stderr and not both.stdout


def test_a_budget_that_cannot_fit_is_refused_before_loading():
    result = run(["--budget", "20MB"], "move forward\n")
    assert result.returncode != 0 and "edgespec_robot:" in result.stderr and not result.stdout


def test_http_interface():
    from fastapi.testclient import TestClient

    sys.path.insert(0, str(APP))
    from edgespec_robot.service import Robot, http_app

    import edgespec

    tools = json.loads(resources.files("edgespec").joinpath("data/robot.tools.json").read_text())
    client = TestClient(http_app(Robot(edgespec.load(None, "ngram", n_ctx=512, threads=1), tools=tools)))
    assert client.get("/health").json()["status"] == "ok"
    answer = client.post("/command", json={"command": "turn right by 45 degrees"}).json()
    assert called(answer["action"]) and valid(answer["action"])
    assert client.post("/command", json={"nope": 1}).status_code == 422
