"""What `edgespec serve` lets in and what it counts: the admission queue and the /metrics counters.

The engine serves one generation at a time, so requests take it in turn (first come, first served). At most
`max_queue` are admitted at once, the one generating included; the app refuses more with a 429 whose
Retry-After is one mean generation (`Metrics.retry_after`). A request's wait for the engine ends at its
deadline (the app's `request_timeout` from its arrival); the app answers past it with a 504.

Metrics are updated on the event loop only and rendered in Prometheus' text format for GET /metrics.
Nothing here imports FastAPI: the middleware is a plain ASGI one.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field

from edgespec.decode.loop import Stats


class Admission:
    """At most `size` requests admitted at once, the one generating included; they take the engine in turn,
    first come, first served. Every admitted request leaves exactly once: through `leave`."""

    def __init__(self, size: int):
        self.size, self.admitted, self.lock = size, 0, asyncio.Lock()

    @property
    def in_flight(self) -> int:
        return 1 if self.lock.locked() else 0

    @property
    def waiting(self) -> int:
        return self.admitted - self.in_flight

    def admit(self) -> bool:
        if self.admitted >= self.size:
            return False
        self.admitted += 1
        return True

    async def turn(self, deadline: float | None) -> None:
        """Wait for the engine until `deadline` (loop time; None: no limit). TimeoutError past it, which, like
        a cancelled wait, leaves the queue."""
        try:
            async with asyncio.timeout_at(deadline):
                await self.lock.acquire()  # a cancelled acquire never holds the lock (Python >= 3.11)
        except BaseException:
            self.admitted -= 1
            raise

    def leave(self) -> None:
        """The engine is free again: the request that held it leaves."""
        self.lock.release()
        self.admitted -= 1


@dataclass
class Metrics:
    """What /metrics reports; updated on the event loop only."""

    responses: Counter = field(default_factory=Counter)  # HTTP status -> responses to /v1 requests
    generations: int = 0
    generation_s: float = 0.0  # wall time generations held the engine
    generated: int = 0
    drafted: int = 0
    accepted: int = 0

    def add(self, stats: Stats | None, seconds: float) -> None:
        self.generations += 1
        self.generation_s += seconds
        if stats is not None:  # None: refused before generating (a prompt longer than the context, ...)
            self.generated += stats.generated
            self.drafted += stats.drafted
            self.accepted += stats.accepted

    def retry_after(self) -> int:
        """Seconds until a full queue likely has room: one mean generation, at least 1."""
        return max(1, math.ceil(self.generation_s / self.generations)) if self.generations else 1

    def text(self, waiting: int, in_flight: int, max_queue: int) -> str:
        """Prometheus' text exposition format, version 0.0.4."""
        rows = [("edgespec_requests_total", "counter", "Responses to /v1 requests, by HTTP status.",
                 [(f'{{status="{status}"}}', n) for status, n in sorted(self.responses.items())]),
                ("edgespec_generated_tokens_total", "counter", "Tokens generated.", [("", self.generated)]),
                ("edgespec_draft_tokens_total", "counter", "Draft tokens proposed to the target.",
                 [("", self.drafted)]),
                ("edgespec_draft_tokens_accepted_total", "counter", "Draft tokens the target accepted.",
                 [("", self.accepted)]),
                ("edgespec_generation_seconds_total", "counter", "Wall time generations held the engine.",
                 [("", round(self.generation_s, 6))]),
                ("edgespec_queue_depth", "gauge", "Requests waiting for the engine.", [("", waiting)]),
                ("edgespec_requests_in_flight", "gauge", "Requests generating (the engine serves one at a time).",
                 [("", in_flight)]),
                ("edgespec_queue_limit", "gauge", "Most requests admitted at once, the one generating included.",
                 [("", max_queue)])]
        lines = []
        for name, kind, help_text, samples in rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{labels} {value}" for labels, value in samples]
        return "\n".join(lines) + "\n"


class CountResponses:
    """ASGI middleware counting the statuses of /v1 responses (a pure one: it leaves streams and disconnect
    detection alone, as Starlette's BaseHTTPMiddleware would not)."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)

        async def counted(message):
            if message["type"] == "http.response.start":
                self.metrics.responses[message["status"]] += 1
            await send(message)

        await self.app(scope, receive, counted)
