"""The robot service: turns natural-language commands into JSON actions valid against a schema.

Two interfaces over one loaded model pair, both one command at a time:
- stdin/stdout (default): one command per input line (plain text, or {"command": "..."}), one JSON
  object per output line: {"command", "action"} on success, {"command", "error"} otherwise. Robot
  software that spawns the service as a child process talks to it this way.
- HTTP (--http HOST:PORT, bound to loopback by default): POST /command {"command": "..."} answers the
  same object; GET /health. What the systemd unit runs.

Every answer is decoded under the schema (constrained decoding: the grammar masks the target's
distribution and the draft drafts under the same mask), so the action always parses and validates; the
decoding is exact for the constrained target. The pair is loaded under a device profile and memory
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

SYSTEM = ("You control a robot. Answer every command with one JSON object: the action and its arguments "
          "(distance in meters, angles in degrees).")


class Robot:
    """A loaded pair and the schema; `act` turns one command into an action (thread-safe, one at a time).
    executor: the one thread the engine was loaded on, where every generation then runs (llama.cpp's CPU passes
    take 1.5x as long once a second thread has decoded: edgespec.server.loading_thread); None: the caller's."""

    def __init__(self, engine: edgespec.Engine, schema: dict, max_tokens: int = 96, executor=None):
        self.engine, self.schema, self.max_tokens, self.executor = engine, schema, max_tokens, executor
        self._lock = threading.Lock()

    def act(self, command: str) -> dict:
        if self.executor is not None:
            return self.executor.submit(self._act, command).result()
        return self._act(command)

    def _act(self, command: str) -> dict:
        command = command.strip()
        if not command:
            return {"command": command, "error": "empty command"}
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": command}]
        try:
            with self._lock:
                result = self.engine.generate(messages, max_tokens=self.max_tokens, temperature=0.0,
                                              json_schema=self.schema)
        except EdgespecError as e:
            return {"command": command, "error": str(e)}
        if result.stats.finish_reason != "stop":  # cut by max_tokens or the context: not a whole action
            return {"command": command, "error": f"no complete action within {self.max_tokens} tokens"}
        stats = result.stats
        return {"command": command, "action": json.loads(result.text),
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
    parser.add_argument("--schema", help="JSON schema of an action [default: edgespec's robot.schema.json]")
    parser.add_argument("--device", default=None, help="device profile, e.g. orin-nano-8gb (edgespec profiles)")
    parser.add_argument("--budget", default=None, help="memory the models may use, e.g. 3GiB")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--http", metavar="HOST:PORT", help="serve HTTP instead of stdin/stdout")
    args = parser.parse_args(argv)
    try:
        text = (open(args.schema).read() if args.schema
                else resources.files("edgespec").joinpath("data/robot.schema.json").read_text())
        schema = json.loads(text)
        # over HTTP, requests arrive on many threads: the engine loads on one and answers every command there
        executor = ThreadPoolExecutor(1, thread_name_prefix="edgespec-robot") if args.http else None
        load = functools.partial(edgespec.load, args.target, args.draft, device=args.device, budget=args.budget,
                                 threads=args.threads)
        engine = executor.submit(load).result() if executor else load()
    except (OSError, ValueError, EdgespecError) as e:
        sys.exit(f"edgespec_robot: {e}")
    robot = Robot(engine, schema, args.max_tokens, executor)
    print(f"edgespec_robot: ready ({engine.target.name}, draft {args.draft})", file=sys.stderr, flush=True)
    if args.http:
        import uvicorn

        host, _, port = args.http.rpartition(":")
        uvicorn.run(http_app(robot), host=host or "127.0.0.1", port=int(port), log_level="warning")
    else:
        serve_stdio(robot, sys.stdin, sys.stdout)
