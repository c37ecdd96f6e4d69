"""A soak of `edgespec serve --parallel N`: clients for minutes on loopback, no error, memory flat, clean shutdown.

N client threads send chat requests in turn for --minutes: whole answers and streams, greedy and sampled, and every
fifth stream dropped after a few events (a client that goes away). The server's resident memory (RSS, from
/proc) is read every 10 s (it grows by the prompt cache's states up to --prompt-cache bytes, then stays); at the
end the server gets SIGTERM and must exit 0 within 30 s. Printed: requests,
errors (any status but 200, or a stream that ended in an error event), tokens, RSS at the first minute and at the
end, and the shutdown; --json writes the RSS series.

usage: python benchmarks/serve_soak.py --target T.gguf [--draft ngram|D.gguf] [--parallel 8|auto] [--clients 8]
       [--minutes 10] [--max-tokens 64] [--threads 2] [--ctx 1024] [--prompt-cache auto] [--prompts FILE]
       [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from vs_llama_cpp import free_port


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", default="ngram")
    ap.add_argument("--parallel", default="8", help="the server's --parallel: a number, or auto")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--prompt-cache", default="auto", help="the server's --prompt-cache (its bytes bound the RSS)")
    ap.add_argument("--prompts", help="JSONL with a 'prompt' field [default: edgespec's built-in set]")
    ap.add_argument("--json")
    args = ap.parse_args()

    from edgespec.bench import read_prompts

    prompts = [row["prompt"] for row in read_prompts(args.prompts)]
    port = free_port()
    command = [str(Path(sys.executable).with_name("edgespec")), "serve", "-m", args.target, "--draft", args.draft,
               "--parallel", str(args.parallel), "--port", str(port), "--threads", str(args.threads), "--ctx",
               str(args.ctx), "--max-queue", str(4 * args.clients), "--prompt-cache", args.prompt_cache, "--cpu"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                break
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                sys.exit(f"the server did not start: {server.stderr.read()}")
            time.sleep(0.3)

    counts = {"requests": 0, "errors": 0, "tokens": 0, "dropped": 0}
    errors: list[str] = []
    lock = threading.Lock()
    end = time.time() + 60 * args.minutes
    numbers = itertools.count()

    def client() -> None:
        while time.time() < end:
            n = next(numbers)
            body = {"messages": [{"role": "user", "content": prompts[n % len(prompts)]}],
                    "max_tokens": args.max_tokens, "temperature": 0.0 if n % 2 else 0.8, "seed": n,
                    "stream": n % 3 == 0}
            request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            tokens, problem, dropped = 0, None, False
            try:
                with urllib.request.urlopen(request, timeout=300) as r:
                    if body["stream"]:
                        for i, line in enumerate(r):
                            if line.startswith(b"data: {"):
                                event = json.loads(line[6:])
                                if "error" in event:
                                    problem = str(event["error"])
                                tokens += bool(event.get("choices") and event["choices"][0]["delta"].get("content"))
                            if n % 5 == 0 and i >= 6:  # a client that goes away mid-answer
                                dropped = True
                                break
                    else:
                        tokens = json.load(r)["usage"]["completion_tokens"]
            except (urllib.error.URLError, OSError, ValueError) as e:
                problem = repr(e)
            with lock:
                counts["requests"] += 1
                counts["tokens"] += tokens
                counts["dropped"] += dropped
                if problem:
                    counts["errors"] += 1
                    errors.append(problem)

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    series = []
    started = time.time()
    while any(t.is_alive() for t in threads):
        series.append((round(time.time() - started), rss_mib(server.pid)))
        time.sleep(10)
    for t in threads:
        t.join()
    health = json.load(urllib.request.urlopen(f"{url}/health"))
    series.append((round(time.time() - started), rss_mib(server.pid)))
    server.send_signal(signal.SIGTERM)
    t0 = time.time()
    try:
        code = server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        code = "killed after 30 s"
    first_minute = next((mib for s, mib in series if s >= 60), series[0][1])
    print(f"command: {' '.join(command)}")
    print(f"{args.clients} clients for {args.minutes} min: {counts['requests']} requests, {counts['errors']} errors, "
          f"{counts['dropped']} dropped mid-stream on purpose, {counts['tokens']} tokens")
    print(f"server RSS: {series[0][1]:.0f} MiB at start, {first_minute:.0f} MiB at 1 min, "
          f"{max(m for _, m in series):.0f} MiB peak, {series[-1][1]:.0f} MiB at the end")
    print(f"health at the end: {health}")
    print(f"SIGTERM: exit {code} in {time.time() - t0:.1f} s")
    for problem in errors[:5]:
        print(f"error: {problem}")
    if args.json:
        Path(args.json).write_text(json.dumps({"counts": counts, "rss_mib": series, "exit": code,
                                               "errors": errors}, indent=1))


if __name__ == "__main__":
    main()
