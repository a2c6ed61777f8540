"""`k: auto` in a batch: the k of each batched step, chosen by measured goodput (committed tokens
per second of the step's wall time), with k = 0 (plain decoding, no draft forward) a candidate.

Acceptance alone cannot choose: in a batch the target's spare capacity that drafts feed on is the
capacity the batch uses, so a pair can keep its acceptance and still lose time by drafting. What
is measured is what is wanted: tokens out per second.

Schedule: explore every candidate PROBE_STEPS steps, round-robin (the batch's rows and lengths
drift while it runs, so interleaving gives each k the same mix); then run the best; every
REPROBE_EVERY steps on it, one more step of each other candidate refreshes their figures, so
a k that starts to pay later (or the best that stops paying) is noticed. Each candidate's figure
is its last PROBE_STEPS steps: tokens over seconds. Which k runs never changes a row's tokens
(the acceptance rule is exact for every k), only how fast they come.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterable

CANDIDATES = (0, 1, 2, 4, 6)
PROBE_STEPS = 3
REPROBE_EVERY = 64


class GoodputK:
    """Chooses each batched step's k: next_k() before the step, record(tokens) after it. One
    per batch size (Pipeline keeps them, so a later run at that size starts from what this one
    learned)."""

    def __init__(self, candidates: Iterable[int] = CANDIDATES, *, clock: Callable[[], float] = time.perf_counter,
                 probe_steps: int = PROBE_STEPS, reprobe_every: int = REPROBE_EVERY):
        """`clock`: seconds, read before and after each step (models/devices.device_clock: after
        the device's queued work is done)."""
        self.candidates = tuple(sorted(set(candidates)))
        self.clock = clock
        self.reprobe_every = reprobe_every
        self.samples: dict[int, deque[tuple[int, float]]] = {k: deque(maxlen=probe_steps) for k in self.candidates}
        self.queue: deque[int] = deque(self.candidates * probe_steps)  # steps still to probe, in order
        self.since_probe = 0
        self.plain_run = 0  # k = 0 steps just before this one
        self._running: tuple[int, float] | None = None

    @property
    def k_max(self) -> int:
        return max(self.candidates)

    def rate(self, k: int) -> float | None:
        """k's goodput, tokens per second over its recorded steps (None: none yet)."""
        tokens = sum(n for n, _ in self.samples[k])
        seconds = sum(s for _, s in self.samples[k])
        return tokens / seconds if self.samples[k] and seconds > 0 else None

    @property
    def best(self) -> int:
        """The candidate of the highest goodput; a tie goes to the smaller k (less drafting)."""
        rated = [(rate, -k) for k in self.candidates if (rate := self.rate(k)) is not None]
        return -max(rated)[1] if rated else self.candidates[0]

    def next_k(self) -> int:
        k = self.queue[0] if self.queue else self.best
        self._running = (k, self.clock())
        return k

    def record(self, tokens: int) -> None:
        """The step that next_k() started has committed `tokens` (every row's together)."""
        if self._running is None:
            raise RuntimeError("record() without next_k()")
        (k, started), self._running = self._running, None
        seconds = self.clock() - started
        # the first drafting step after several plain ones also feeds the draft model what they
        # committed: a cost of switching, not of this k; the step is not counted and k runs again
        catching_up = k > 0 and self.plain_run > 1
        self.plain_run = self.plain_run + 1 if k == 0 else 0
        if catching_up:
            return
        self.samples[k].append((tokens, seconds))
        if self.queue:  # k was the probe at its head
            self.queue.popleft()
            return
        self.since_probe += 1
        if self.since_probe >= self.reprobe_every:
            self.since_probe = 0
            self.queue.extend(c for c in self.candidates if c != k)
