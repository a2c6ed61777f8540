"""Paired speedups, and what a run's own counts allow them to be.

Methods run interleaved (prompt 1: A B C, repeat: A B C, prompt 2: ...), so each run of a method is
paired with the reference's run of the same prompt and repeat, minutes apart at most: a paired
ratio cancels most of the drift in the machine's speed. The speedup is the median over prompts of
each prompt's median paired ratio.

A method that emits tau tokens per target forward is at best about tau times plain decoding: its
step is a target forward (a verify of several tokens costs at least nearly one plain step) plus
drafting. A figure above `BOUND_MARGIN` x tau did not come from decoding: a stall of the machine or
a one-time cost landed in the reference's time. Such a figure, and one whose repeats disagree
widely, is marked and never ranked.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence

# a verify of several tokens can cost a little less than one 1-token step (bf16 on AMX: 237 vs 275 ms),
# never much less: at most ~tau x 1.16 from the counts, the rest is room for drafting that costs nothing
BOUND_MARGIN = 1.25
# repeats of one prompt whose paired ratios differ by more than this factor: the machine's speed varied
WIDE_SPREAD = 1.25
# a winner beats another outside the noise when it was faster in this share of at least MIN_PAIRS
# paired runs, by more than TIE in the median
CONSISTENT_SHARE = 0.75
MIN_PAIRS = 3
TIE = 0.01

ABOVE_BOUND = "above_tau_bound"
WIDE = "wide_spread"


class TimedRun(Protocol):
    method: str  # what ran it: a method, or a server's role
    prompt: Any  # has .id
    repeat: int

    @property
    def tokens_per_second(self) -> float | None: ...


@dataclass(frozen=True)
class PairedRatios:
    """Rate of a method / rate of a reference, one per prompt and repeat run by both."""

    per_prompt: dict[str, list[float]] = field(default_factory=dict)

    @property
    def ratios(self) -> list[float]:
        return [r for values in self.per_prompt.values() for r in values]

    @property
    def median(self) -> float | None:
        """The speedup: median over prompts of each prompt's median ratio over its repeats."""
        medians = [statistics.median(values) for values in self.per_prompt.values() if values]
        return statistics.median(medians) if medians else None

    @property
    def low(self) -> float | None:
        return min(self.ratios, default=None)

    @property
    def high(self) -> float | None:
        return max(self.ratios, default=None)

    @property
    def wins(self) -> int:
        """Paired runs in which the method was the faster."""
        return sum(r > 1 for r in self.ratios)

    def repeat_spread(self) -> float | None:
        """The largest max/min of one prompt's ratios over its repeats (None: no prompt ran twice)."""
        spreads = [max(v) / min(v) for v in self.per_prompt.values() if len(v) > 1]
        return max(spreads) if spreads else None

    def outside_noise(self) -> bool:
        """Faster in (nearly) every paired run, over enough of them to tell."""
        n = len(self.ratios)
        median = self.median
        return (n >= MIN_PAIRS and median is not None and median > 1 + TIE
                and self.wins >= CONSISTENT_SHARE * n)

    def describe(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "pairs": len(self.ratios),
                "wins": self.wins}


class InterleavedRuns:
    """What a bench over interleaved runs (the local bench, the endpoint bench) reads back from them.

    A subclass has `prompts`, `results` (TimedRuns) and `settings.repeats`, and says in
    `runs_per_repeat` how many methods (or servers) run each prompt in each repeat."""

    def runs_per_repeat(self) -> int:
        raise NotImplementedError

    def complete_prompts(self) -> list:
        """Prompts that every method finished every repeat of (all of them, unless interrupted)."""
        done: dict[str, int] = {}
        for r in self.results:
            done[r.prompt.id] = done.get(r.prompt.id, 0) + 1
        need = self.settings.repeats * self.runs_per_repeat()
        return [p for p in self.prompts if done.get(p.id, 0) == need]

    def runs(self, method: str, prompts: Sequence[Any]) -> list:
        ids = {p.id for p in prompts}
        return [r for r in self.results if r.method == method and r.prompt.id in ids]

    def prompt_rate(self, method: str, prompt: Any) -> float | None:
        rates = [r.tokens_per_second for r in self.runs(method, [prompt]) if r.tokens_per_second]
        return statistics.median(rates) if rates else None

    def paired(self, method: str, reference: str, prompts: Sequence[Any]) -> PairedRatios:
        """Each run of method against reference's run of the same prompt and repeat."""
        return pair_runs(self.runs(method, prompts), self.runs(reference, prompts))


def pair_runs(runs: Iterable[TimedRun], reference: Iterable[TimedRun]) -> PairedRatios:
    """Each run against the reference's run of the same prompt and repeat (both with a rate)."""
    rates = {(r.prompt.id, r.repeat): r.tokens_per_second for r in reference}
    per_prompt: dict[str, list[float]] = {}
    for run in runs:
        base = rates.get((run.prompt.id, run.repeat))
        if run.tokens_per_second and base:
            per_prompt.setdefault(run.prompt.id, []).append(run.tokens_per_second / base)
    return PairedRatios(per_prompt)


def speedup_bound(tau: float | None) -> float | None:
    """The most a method emitting tau tokens per target forward can gain over plain decoding."""
    return BOUND_MARGIN * tau if tau else None


def flags(paired: PairedRatios, tau: float | None) -> list[str]:
    """Why this speedup must not be taken at its word: above the tau bound, or repeats that disagree."""
    found = []
    bound, median = speedup_bound(tau), paired.median
    if bound is not None and median is not None and median > bound:
        found.append(ABOVE_BOUND)
    spread = paired.repeat_spread()
    if spread is not None and spread > WIDE_SPREAD:
        found.append(WIDE)
    return found


def speedup_fields(paired: PairedRatios, tau: float | None, bounded: bool = True) -> dict[str, Any]:
    """The report's fields for one speedup: the figure, its spread, its bound, its marks.
    `bounded` False where tau does not bound the figure (another implementation than the reference's)."""
    return {
        "speedup": paired.median,
        "speedup_min": paired.low,
        "speedup_max": paired.high,
        "speedup_pairs": len(paired.ratios),
        "speedup_repeat_spread": paired.repeat_spread(),
        "speedup_bound": speedup_bound(tau) if bounded else None,
        "speedup_flags": flags(paired, tau if bounded else None),
    }
