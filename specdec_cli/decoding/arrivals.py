"""Where the decoding core takes its requests from: a list read as rows free up (generate
--prompts, bench), or a queue that requests join while others run and that says when one is
cancelled (the server). One protocol, so the core has one loop for both."""

from __future__ import annotations

from typing import Hashable, Iterable, Protocol, runtime_checkable


@runtime_checkable
class Arrivals(Protocol):
    def take(self, wait: bool) -> tuple | None:
        """The next request (a decoding.batched.Request or its tuple), or None: with `wait` False
        none is waiting now; with `wait` True (no row is running) none will come, and the run ends."""

    def cancelled(self, key: Hashable) -> bool:
        """Whether the request with this key was given up (its row leaves at the next step)."""


class InOrder:
    """An iterable's requests, taken in order as rows free up; none is ever cancelled."""

    def __init__(self, requests: Iterable[tuple]):
        self._pending = iter(requests)

    def take(self, wait: bool) -> tuple | None:
        return next(self._pending, None)

    def cancelled(self, key: Hashable) -> bool:
        return False


def as_arrivals(requests: Arrivals | Iterable[tuple]) -> Arrivals:
    return requests if isinstance(requests, Arrivals) else InOrder(requests)
