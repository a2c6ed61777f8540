"""`k: auto` in a batch: the k of each batched step, chosen by measured goodput (committed tokens
per second of the step's wall time), with k = 0 (plain decoding, no draft forward) a candidate.

Acceptance alone cannot choose: in a batch the target's spare capacity that drafts feed on is the
capacity the batch uses, so a pair can keep its acceptance and still lose time by drafting. What
is measured is what is wanted: tokens out per second.

Schedule, in probe rounds. A round runs the k in use (`current`, at first 0) and its challengers
PROBE_STEPS steps each, interleaved (the batch's rows and lengths drift while it runs, so
interleaving gives each the same mix), and compares them on that round's steps only: a figure
from another moment of the run is never set against a fresh one. A challenger takes over only
when it beats the k in use by SWITCH_MARGIN (one step's figure moves by several per cent; and
leaving plain decoding costs more than its steps, below). The first round sets 0 against the
smallest k; while the k in use has a larger neighbour never tried, the next round tries it (a
climb). After a wait on the k in use (below), a round sets it against its two neighbours; after a
switch, that round comes soon (RECHECK_EVERY steps): a round's few steps can mislead, and the first
ones most (rows that have just begun their answers are the easiest to draft: a bf16 target with an
int4 draft at batch 8 kept 16 of 16 tokens a step in its first round, 13-14 after, and took k = 1
for 64 steps where plain decoding was faster).
So where drafting does not pay, only k = 0 and the cheapest drafting step are ever tried (a probe
of k = 6 at batch 16 costs several plain steps). Which k runs never changes a row's tokens (the
acceptance rule is exact for every k), only how fast they come.

Leaving plain decoding costs more than its probe steps: the draft model first reads every token
the plain steps committed (its rows' prompts and answers: at batch 16, thousands of tokens). That
step is not counted in k's figure (it pays for the switch, not for the k) but in what the round
cost: the seconds its challengers' steps took beyond what the k in use would have taken for their
tokens. The wait before the next round is then long enough that a round costs at most PROBE_SHARE
of the time until it (at least REPROBE_EVERY steps, at most MAX_REPROBE_EVERY): rounds near a
drafting k are cheap and come often, rounds that pull a plain batch's draft up to date come
seldom, and a row that starts and ends between two of them is never read by the draft at all.

Only steps the decoder marks as measured count (a batch as full as it was when the run began): as
a run drains, a step commits fewer tokens whatever its k, and those figures would not compare; nor
does a run's first step, the slowest plain step of a run.

Drafting also costs outside its steps' typical figure: while a batch drafts, every row that joins
is read by the draft model (its prompt) in the first step it is in, a cost that lands in a few steps
and that a round's handful of steps rarely sees (a bf16 target with an int4 draft at batch 8: the
rounds chose k = 1, whose steps tied plain's, and the run lost 12% to those reads). So the decoder
says what drafting costs per committed token (`overhead`: the draft's seconds a prompt token times
the prompt tokens rows bring per token they emit), every drafting k's figure is charged that,
and the steps' own reads are taken out of their seconds (`record(tokens, excluded)`) so that none
is counted twice.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterable

CANDIDATES = (0, 1, 2, 4, 6)
PROBE_STEPS = 3
REPROBE_EVERY = 64
RECHECK_EVERY = 12
MAX_REPROBE_EVERY = 4096
PROBE_SHARE = 0.02
SWITCH_MARGIN = 1.05


class GoodputK:
    """Chooses each batched step's k: next_k() before the step, record(tokens) after it. One
    per batch size (Pipeline keeps them, so a later run at that size starts from what this one
    learned)."""

    def __init__(self, candidates: Iterable[int] = CANDIDATES, *, clock: Callable[[], float] = time.perf_counter,
                 probe_steps: int = PROBE_STEPS, reprobe_every: int = REPROBE_EVERY,
                 recheck_every: int = RECHECK_EVERY, overhead: Callable[[], float] = lambda: 0.0):
        """`clock`: seconds, read before and after each step (models/devices.device_clock: after
        the device's queued work is done). `reprobe_every`: the fewest steps between rounds that keep
        the k in use; `recheck_every`: the steps before the round that checks a switch. `overhead`:
        seconds drafting costs per committed token beyond its steps (the decoder's estimate, read
        when a round is judged)."""
        self.candidates = tuple(sorted(set(candidates)))
        self.clock = clock
        self.overhead = overhead
        self.probe_steps = probe_steps
        self.reprobe_every = reprobe_every
        self.recheck_every = recheck_every
        self.current = self.candidates[0]  # the k run between rounds
        self.samples: dict[int, list[tuple[int, float]]] = {k: [] for k in self.candidates}  # this round's, or the last one k was in
        self.tried: set[int] = set()
        self.queue: deque[int] = deque()  # the round's steps still to run, in order
        self.members: list[int] = []  # the round's ks, the one in use first
        self.challenged: list[tuple[int, float]] = []  # the round's steps of other ks, switches included
        self.since_probe = 0
        self.interval = reprobe_every  # steps on the k in use before the next round
        self.recheck_due = False  # a switch (or a climb's) that no later round has checked yet
        self.plain_run = 0  # k = 0 steps just before this one
        self.drafted = False  # whether any step drafted yet
        self._running: tuple[int, float, bool] | None = None
        if len(self.candidates) > 1:
            self._start_round([self.candidates[1]])

    @property
    def k_max(self) -> int:
        return max(self.candidates)

    def rate(self, k: int) -> float | None:
        """k's goodput, tokens per second over its steps of the last round it was in, a drafting k
        charged `overhead` a token (None: no steps yet)."""
        tokens = sum(n for n, _ in self.samples[k])
        seconds = sum(s for _, s in self.samples[k]) + (tokens * self.overhead() if k > 0 else 0.0)
        return tokens / seconds if self.samples[k] and seconds > 0 else None

    def neighbours(self, k: int) -> list[int]:
        """The next smaller and the next larger candidate (those that exist)."""
        at = self.candidates.index(k)
        return [self.candidates[i] for i in (at - 1, at + 1) if 0 <= i < len(self.candidates)]

    def next_k(self, measured: bool = True) -> int:
        """The k of the next step. `measured` False: a step that does not count (the batch has
        drained below its size): it runs the k in use and leaves any round where it is."""
        k = self.queue[0] if self.queue and measured else self.current
        self._running = (k, self.clock(), measured)
        return k

    def record(self, tokens: int, excluded: float = 0.0) -> None:
        """The step that next_k() started has committed `tokens` (every row's together); `excluded`:
        seconds of it that `overhead` already charges (the draft reading joined rows' prompts)."""
        if self._running is None:
            raise RuntimeError("record() without next_k()")
        (k, started, measured), self._running = self._running, None
        spent = self.clock() - started
        seconds = spent - excluded
        if self.queue and measured and k != self.current:
            self.challenged.append((tokens, spent))  # what the round cost, the draft's reads included
        # the first drafting step of all (the draft reads the prompts then) and the first after
        # several plain ones (it reads what they committed) pay for switching, not for this k: the
        # step is not counted and k runs again
        catching_up = k > 0 and (self.plain_run > 1 or not self.drafted)
        self.plain_run = self.plain_run + 1 if k == 0 else 0
        self.drafted = self.drafted or k > 0
        if catching_up or not measured:
            return
        if self.queue:  # k was the probe at its head
            self.samples[k].append((tokens, seconds))
            self.queue.popleft()
            if not self.queue:
                self._round_done()
            return
        self.since_probe += 1
        if self.since_probe >= self.interval:
            self.since_probe = 0
            self._start_round(self.neighbours(self.current))

    def _start_round(self, challengers: list[int]) -> None:
        """PROBE_STEPS steps of the k in use and of each challenger, interleaved; their figures
        start afresh."""
        self.members = [self.current, *challengers]
        for k in self.members:
            self.samples[k] = []
        self.tried.update(self.members)
        self.challenged = []
        self.queue.extend(self.members * self.probe_steps)

    def _round_done(self) -> None:
        """The best challenger takes over where it beats the k in use by the margin; then climb
        where the k in use has a neighbour never tried, else wait for the next round: briefly
        where this round or the climb it ends switched, else as long as this one cost (`_wait`)."""
        held = self.rate(self.current) or 0.0
        rated = [(rate, -k) for k in self.members[1:] if (rate := self.rate(k)) is not None]
        switched = bool(rated) and max(rated)[0] > SWITCH_MARGIN * held
        if switched:
            self.current = -max(rated)[1]
            self.recheck_due = True
        untried = [c for c in self.neighbours(self.current) if c not in self.tried]
        if untried:
            self._start_round(untried)
            return
        self.interval = self.recheck_every if self.recheck_due else self._wait(held)
        self.recheck_due = False

    def _wait(self, held: float) -> int:
        """Steps on the k in use (`held` tokens a second) before the next round: the round's cost, the
        seconds its challengers' steps took beyond what `held` would have taken for their tokens, is
        PROBE_SHARE of the time those steps take."""
        steps = self.samples[self.current]
        if not held or not steps:
            return self.reprobe_every
        cost = sum(s for _, s in self.challenged) - sum(n for n, _ in self.challenged) / held
        step_seconds = sum(s for _, s in steps) / len(steps)
        wanted = round(cost / (PROBE_SHARE * step_seconds))
        return min(max(wanted, self.reprobe_every), MAX_REPROBE_EVERY)
