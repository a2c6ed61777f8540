"""`k: auto` in a batch: the k of each batched step, chosen by measured goodput (committed tokens
per second of the step's wall time), with k = 0 (plain decoding, no draft forward) a candidate.

Acceptance alone cannot choose: in a batch the target's spare capacity that drafts feed on is the
capacity the batch uses, so a pair can keep its acceptance and still lose time by drafting. What
is measured is what is wanted: tokens out per second.

Schedule, a climb: probe the two smallest candidates (0 and the smallest k) PROBE_STEPS steps
each, interleaved (the batch's rows and lengths drift while it runs, so interleaving gives each
the same mix); while the largest k probed is the best, probe the next larger one; then run the
best. Every REPROBE_EVERY steps on it, one step of each neighbour (the next smaller and next
larger candidate) refreshes their figures, and a neighbour that now wins is run and its own
neighbours probed in turn. So where drafting does not pay, only k = 0 and the cheapest drafting
step are ever tried (a probe of k = 6 at batch 16 costs several plain steps). Each candidate's
figure is its last PROBE_STEPS steps: tokens over seconds. Which k runs never changes a row's
tokens (the acceptance rule is exact for every k), only how fast they come.

Leaving plain decoding costs more than its probe steps: the draft model first reads every token
the plain steps committed (at batch 16 after 64 plain steps, a prefill of 1000 tokens). So while
plain decoding stays the best, each re-probe that confirms it doubles the wait before the next
(up to MAX_REPROBE_EVERY steps); a re-probe that finds another k best starts again from REPROBE_EVERY.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterable

CANDIDATES = (0, 1, 2, 4, 6)
PROBE_STEPS = 3
REPROBE_EVERY = 64
MAX_REPROBE_EVERY = 1024


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
        self.probe_steps = probe_steps
        self.reprobe_every = reprobe_every
        self.samples: dict[int, deque[tuple[int, float]]] = {k: deque(maxlen=probe_steps) for k in self.candidates}
        self.queue: deque[int] = deque(self.candidates[:2] * probe_steps)  # steps still to probe, in order
        self.since_probe = 0
        self.interval = reprobe_every  # steps on the best before the next re-probe
        self.reprobed_from: int | None = None  # the best when the re-probe under way began
        self.plain_run = 0  # k = 0 steps just before this one
        self.drafted = False  # whether any step drafted yet
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

    def neighbours(self, k: int) -> list[int]:
        """The next smaller and the next larger candidate (those that exist)."""
        at = self.candidates.index(k)
        return [self.candidates[i] for i in (at - 1, at + 1) if 0 <= i < len(self.candidates)]

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
        # the first drafting step of all (the draft reads the prompts then) and the first after
        # several plain ones (it reads what they committed) pay for switching, not for this k: the
        # step is not counted and k runs again
        catching_up = k > 0 and (self.plain_run > 1 or not self.drafted)
        self.plain_run = self.plain_run + 1 if k == 0 else 0
        self.drafted = self.drafted or k > 0
        if catching_up:
            return
        self.samples[k].append((tokens, seconds))
        if self.queue:  # k was the probe at its head
            self.queue.popleft()
            if not self.queue:
                self._probes_done()
            return
        self.since_probe += 1
        if self.since_probe >= self.interval:
            self.since_probe = 0
            self.reprobed_from = k
            self.queue.extend(self.neighbours(k))

    def _probes_done(self) -> None:
        """Climb where the best is a neighbour never measured, or set the wait for the next re-probe."""
        best = self.best
        unmeasured = [c for c in self.neighbours(best) if not self.samples[c]]
        if unmeasured:
            self.queue.extend(unmeasured * self.probe_steps)
            return
        if self.reprobed_from is not None:
            kept_plain = self.reprobed_from == 0 and best == 0
            self.interval = min(2 * self.interval, MAX_REPROBE_EVERY) if kept_plain else self.reprobe_every
            self.reprobed_from = None
