"""What `edgespec serve` lets in and what it counts: the admission queue and the /metrics counters.

An Engine serves one generation at a time, a Parallel one a stream: requests take these slots as they come free
(first come, first served). At most `max_queue` are admitted at once, those generating included; the app refuses
more with a 429 whose Retry-After is one mean generation over the slots (`Metrics.retry_after`). A request's wait
for a slot ends at its deadline (the app's `request_timeout` from its arrival); the app answers past it with a
504.

Metrics are updated on the event loop only and rendered in Prometheus' text format for GET /metrics.
Nothing here imports FastAPI: the middleware is a plain ASGI one.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, deque
from dataclasses import dataclass, field

from edgespec.decode.loop import Stats


class Admission:
    """At most `size` requests admitted at once, those generating included; they take the `slots` engines (a
    stream each, or the one engine) as these come free, first come, first served. Every admitted request that got
    a slot leaves exactly once, through `leave`; one that gave up waiting left already."""

    def __init__(self, size: int, slots: int = 1):
        self.size, self.slots, self.admitted = size, slots, 0
        self.free = set(range(slots))
        self._waiters: deque[asyncio.Future] = deque()
        self._woken = 0  # waiters handed a free slot that have not taken it yet

    @property
    def in_flight(self) -> int:
        return self.slots - len(self.free)

    @property
    def waiting(self) -> int:
        return self.admitted - self.in_flight

    def admit(self) -> bool:
        if self.admitted >= self.size:
            return False
        self.admitted += 1
        return True

    async def turn(self, deadline: float | None, pick=min) -> int:
        """Wait for a free slot until `deadline` (loop time; None: no limit) and take the one pick(free slots)
        names. TimeoutError past the deadline, which, like a cancelled wait, leaves the queue."""
        try:
            if self._waiters or len(self.free) <= self._woken:
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    async with asyncio.timeout_at(deadline):
                        await waiter
                except BaseException:
                    if waiter.done() and not waiter.cancelled():  # woken as it gave up: the next one goes instead
                        self._woken -= 1
                        self._wake()
                    else:
                        self._waiters.remove(waiter)
                    raise
                self._woken -= 1
        except BaseException:
            self.admitted -= 1
            raise
        slot = pick(sorted(self.free))
        self.free.remove(slot)
        return slot

    def leave(self, slot: int = 0) -> None:
        """The slot is free again: the request that held it leaves."""
        self.free.add(slot)
        self.admitted -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and len(self.free) > self._woken:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._woken += 1


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

    def retry_after(self, slots: int = 1) -> int:
        """Seconds until a full queue likely has room: one mean generation over the slots, at least 1."""
        return max(1, math.ceil(self.generation_s / self.generations / slots)) if self.generations else 1

    def text(self, waiting: int, in_flight: int, max_queue: int, slots: int = 1,
             prompt_cache: dict | None = None) -> str:
        """Prometheus' text exposition format, version 0.0.4. prompt_cache: PromptCache.stats(), where the server
        keeps one."""
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
                ("edgespec_requests_in_flight", "gauge", "Requests generating (one a slot).", [("", in_flight)]),
                ("edgespec_slots", "gauge", "Generations the server runs at once (--parallel).", [("", slots)]),
                ("edgespec_queue_limit", "gauge", "Most requests admitted at once, those generating included.",
                 [("", max_queue)])]
        if prompt_cache is not None:
            rows += [("edgespec_prompt_cache_bytes", "gauge", "Host memory the saved prompt states take.",
                      [("", prompt_cache["bytes"])]),
                     ("edgespec_prompt_cache_restored_total", "counter",
                      "Prompts that started from a saved state (their conversation's earlier turn).",
                      [("", prompt_cache["restored"])]),
                     ("edgespec_prompt_cache_tokens_total", "counter",
                      "Prompt tokens not read again thanks to a saved state.", [("", prompt_cache["restored_tokens"])])]
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
