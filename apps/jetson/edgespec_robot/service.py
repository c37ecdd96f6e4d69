"""The robot service: turns natural-language commands into calls of the robot's tools (or JSON actions valid
against a schema).

Two interfaces over one loaded model pair, both one command at a time:
- stdin/stdout (default): one command per input line (plain text, or {"command": "..."}), one JSON
  object per output line: {"command", "action"} on success, {"command", "error"} otherwise. Robot
  software that spawns the service as a child process talks to it this way.
- HTTP (--http HOST:PORT, bound to loopback by default): POST /command {"command": "..."} answers the
  same object; GET /health. What the systemd unit runs.

The robot's commands are OpenAI function tools (edgespec/data/robot.tools.json, or --tools FILE): the model
answers each command with one call, {"action": <the tool's name>, **its arguments}, as an OpenAI-client agent
would get it from `edgespec serve`. The call is decoded under its tool's parameters (constrained decoding: the
grammar masks the target's distribution and the draft drafts under the same mask), so it always parses and
validates; the decoding is exact for the constrained target. --schema FILE instead constrains each answer to
one JSON schema of an action. The pair is loaded under a device profile and memory
budget from edgespec's planner, which refuses, before loading anything, a pair that would not fit.
"""

import argparse
import functools
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

import edgespec
from edgespec.errors import EdgespecError
from edgespec.tool_calls import check_tools

SYSTEM = ("You control a robot. Answer every command with one JSON object: the action and its arguments "
          "(distance in meters, angles in degrees).")
SYSTEM_TOOLS = "You control a robot. Answer every command with one call of its tools (meters, degrees)."


class Robot:
    """A loaded pair and the robot's tools (OpenAI function tools) or one schema of an action; `act` turns one
    command into an action (thread-safe, one at a time). executor: the one thread the engine was loaded on, where
    every generation then runs (llama.cpp's CPU passes take 1.5x as long once a second thread has decoded:
    edgespec.server.loading_thread); None: the caller's."""

    def __init__(self, engine: edgespec.Engine, schema: dict | None = None, max_tokens: int = 96, executor=None,
                 tools: list[dict] | None = None):
        if (schema is None) == (tools is None):
            raise EdgespecError("give the robot its tools or a schema of an action, one of the two")
        self.engine, self.schema, self.max_tokens, self.executor = engine, schema, max_tokens, executor
        self.tools = tools
        self._lock = threading.Lock()

    def act(self, command: str) -> dict:
        if self.executor is not None:
            return self.executor.submit(self._act, command).result()
        return self._act(command)

    def _act(self, command: str) -> dict:
        command = command.strip()
        if not command:
            return {"command": command, "error": "empty command"}
        system = SYSTEM if self.tools is None else SYSTEM_TOOLS
        messages = [{"role": "system", "content": system}, {"role": "user", "content": command}]
        constrained = {"json_schema": self.schema} if self.tools is None else {"tools": self.tools,
                                                                                "tool_choice": "required"}
        try:
            with self._lock:
                result = self.engine.generate(messages, max_tokens=self.max_tokens, temperature=0.0, **constrained)
        except EdgespecError as e:
            return {"command": command, "error": str(e)}
        if result.stats.finish_reason != "stop":  # cut by max_tokens or the context: not a whole action
            return {"command": command, "error": f"no complete action within {self.max_tokens} tokens"}
        if self.tools is None:
            action = json.loads(result.text)
        else:
            (call,) = result.tool_calls  # a required call: one, and it parses
            action = {"action": call["function"]["name"], **json.loads(call["function"]["arguments"])}
        stats = result.stats
        return {"command": command, "action": action,
                "stats": {"tokens": stats.generated, "acceptance_rate": round(stats.acceptance_rate, 3),
                          "tokens_per_second": round(stats.tokens_per_second, 1)}}


def serve_stdio(robot: Robot, lines, out) -> None:
    for line in lines:
        if not line.strip():
            continue
        try:
            command = json.loads(line)["command"] if line.lstrip().startswith("{") else line
        except (ValueError, KeyError, TypeError):
            answer = {"command": line.strip(), "error": 'a JSON line needs a "command" string'}
        else:
            answer = robot.act(str(command))
        out.write(json.dumps(answer) + "\n")
        out.flush()


def http_app(robot: Robot):
    from fastapi import FastAPI
    from pydantic import BaseModel

    class Command(BaseModel):  # annotations evaluated here (no postponed annotations in this module): FastAPI
        command: str           # must see the class, not the string 'Command', to read it as the body

    app = FastAPI(title="edgespec robot")

    @app.post("/command")
    def command(body: Command):  # a plain def: FastAPI runs it on a worker thread; Robot serialises
        return robot.act(body.command)

    @app.get("/health")
    def health():
        return {"status": "ok", "target": robot.engine.target.name}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="edgespec_robot", description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="target GGUF/ONNX [default: edgespec's default model]")
    parser.add_argument("--draft", default="ngram", help="draft model file, 'ngram' or 'none' [default: ngram]")
    parser.add_argument("--tools", help="the robot's commands as OpenAI function tools, a JSON list [default: "
                        "edgespec's robot.tools.json]")
    parser.add_argument("--schema", help="one JSON schema of an action instead of tools (e.g. edgespec's "
                        "robot.schema.json)")
    parser.add_argument("--device", default=None, help="device profile, e.g. orin-nano-8gb (edgespec profiles)")
    parser.add_argument("--budget", default=None, help="memory the models may use, e.g. 3GiB")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--http", metavar="HOST:PORT", help="serve HTTP instead of stdin/stdout")
    args = parser.parse_args(argv)
    try:
        if args.tools and args.schema:
            raise EdgespecError("give --tools or --schema, not both")
        schema = json.loads(open(args.schema).read()) if args.schema else None
        tools = None if schema else json.loads(open(args.tools).read() if args.tools else resources.files(
            "edgespec").joinpath("data/robot.tools.json").read_text())
        if tools is not None:
            check_tools(tools)  # a bad file is refused before the models load
        # over HTTP, requests arrive on many threads: the engine loads on one and answers every command there
        executor = ThreadPoolExecutor(1, thread_name_prefix="edgespec-robot") if args.http else None
        load = functools.partial(edgespec.load, args.target, args.draft, device=args.device, budget=args.budget,
                                 threads=args.threads)
        engine = executor.submit(load).result() if executor else load()
    except (OSError, ValueError, EdgespecError) as e:
        sys.exit(f"edgespec_robot: {e}")
    robot = Robot(engine, schema, args.max_tokens, executor, tools)
    print(f"edgespec_robot: ready ({engine.target.name}, draft {args.draft})", file=sys.stderr, flush=True)
    if args.http:
        import uvicorn

        host, _, port = args.http.rpartition(":")
        uvicorn.run(http_app(robot), host=host or "127.0.0.1", port=int(port), log_level="warning")
    else:
        serve_stdio(robot, sys.stdin, sys.stdout)
