"""The engine's thread: one decoding core that every request joins as a row, the HTTP side's
event loop never waiting on it.

Requests wait in a bounded queue; the core takes them as rows free up (decoding.arrivals), and
each row's events go back to the loop that asked, through `call_soon_threadsafe`, in the order the
core made them. A request given up (its client gone) leaves the batch at the next step. A fault
in a step ends the requests in that batch with an error and the engine goes on with the next ones.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable, Hashable

from ..decoding.batched import BatchedDecoder, Request
from ..decoding.events import Event, Finished, Verified
from .metrics import ServerMetrics

log = logging.getLogger("specdec")


class QueueFull(Exception):
    """The queue holds its most: the request is refused (429), not kept waiting without end."""


@dataclass(frozen=True)
class EngineFault:
    """The event a request gets in place of Finished when the engine failed on its batch."""

    message: str


Sink = Callable[[Event | EngineFault], None]


def _sink(loop: asyncio.AbstractEventLoop, events: asyncio.Queue) -> Sink:
    """Hands events to `loop`; once the loop is closed (the server has stopped) they go nowhere."""

    def put(event: Event | EngineFault) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the loop is closed: its request is gone with it
            pass

    return put


class Engine:
    """Runs `decoder` on its own thread over the requests submitted from any thread."""

    def __init__(self, decoder: BatchedDecoder, metrics: ServerMetrics, *, max_queue: int):
        self.decoder = decoder
        self.metrics = metrics
        self.max_queue = max_queue
        self._waiting: deque[Request] = deque()
        self._sinks: dict[Hashable, Sink] = {}
        self._cancelled: set[Hashable] = set()
        self._condition = threading.Condition()
        self._closing = False
        self._keys = itertools.count()
        self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, make_request: Callable[[Hashable], Request], loop: asyncio.AbstractEventLoop,
               events: asyncio.Queue) -> Hashable:
        """Queue the request made for a fresh key; its events arrive in `events` on `loop`.
        QueueFull when `max_queue` requests already wait."""
        with self._condition:
            if len(self._waiting) >= self.max_queue:
                raise QueueFull
            key = next(self._keys)
            self._sinks[key] = _sink(loop, events)
            self._waiting.append(make_request(key))
            self.metrics.waiting.set(len(self._waiting))
            self._condition.notify()
        return key

    def cancel(self, key: Hashable) -> None:
        """Give up a request: dropped if it still waits, else its row leaves at the next step."""
        with self._condition:
            kept = [request for request in self._waiting if request.key != key]
            if len(kept) < len(self._waiting):
                self._waiting = deque(kept)
                self._sinks.pop(key, None)
                self.metrics.waiting.set(len(self._waiting))
                self.metrics.requests.labels(outcome="cancelled").inc()
            elif key in self._sinks:
                self._cancelled.add(key)

    def close(self) -> None:
        """No more requests: the thread ends once the rows running now have finished."""
        with self._condition:
            self._closing = True
            self._condition.notify()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def in_flight(self) -> int:
        """Requests queued or decoding."""
        return len(self._sinks)

    # --- the core's Arrivals (decoding/arrivals.py), called on the engine's thread
    def take(self, wait: bool) -> Request | None:
        with self._condition:
            while wait and not self._waiting and not self._closing:
                self._condition.wait()
            if not self._waiting:
                return None
            request = self._waiting.popleft()
            self.metrics.waiting.set(len(self._waiting))
            return request

    def cancelled(self, key: Hashable) -> bool:
        return key in self._cancelled

    # --- the thread
    def _run(self) -> None:
        while not self._closing or self._waiting:
            try:
                for key, event in self.decoder.stream(self):
                    self._deliver(key, event)
            except Exception as exc:  # one batch's fault: its requests end with it, the engine goes on
                log.error("the engine failed on a batch: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
                self._fail_running(f"the engine failed: {exc}")

    def _deliver(self, key: Hashable, event: Event) -> None:
        self.metrics.observe(event)
        with self._condition:
            sink = self._sinks.get(key)
            if isinstance(event, Finished):
                self._sinks.pop(key, None)
                self._cancelled.discard(key)
            if not isinstance(event, Verified):  # a row joined or left
                self.metrics.running.set(len(self._sinks) - len(self._waiting))
        if sink is not None:
            sink(event)

    def _fail_running(self, message: str) -> None:
        """Every request taken from the queue and not finished ends with `message`."""
        with self._condition:
            waiting = {request.key for request in self._waiting}
            failed = {key: sink for key, sink in self._sinks.items() if key not in waiting}
            for key in failed:
                del self._sinks[key]
            self._cancelled.clear()
            self.metrics.running.set(0)
        for sink in failed.values():
            self.metrics.requests.labels(outcome="error").inc()
            sink(EngineFault(message))
