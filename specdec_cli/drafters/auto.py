"""`drafter: {kind: auto}`: every step, the candidate that has committed the most tokens a second
in steps like this one; a plain step (no draft at all) is one of them.

Which drafter pays differs by prompt and within one: prompt lookup where the answer copies text
seen before, a draft model or head where it does not, and no draft where neither is kept enough to
pay for its verify. What is measured is what is wanted: each candidate's goodput, the tokens its
steps committed over those steps' wall time (its drafting, the verify, a draft model's catching up
on tokens it sat out), recent steps weighing most.

Free candidates (prompt lookup: no model runs) propose every step, and their proposal is judged by
how long a match it came from: a lookup guess from a 1-token match is kept far less often than one
from a 3-token match, so each match length is a candidate of its own.

A paid candidate (a draft model, heads) is worth what it commits when it runs step after step: run
now and then, each run first reads every token it sat out, and drafts shallower while its
forwards look dear, so a step-by-step choice would judge it by its worst steps and never run it
long enough to see its best. So paid candidates run in modes, EPISODE steps at a time: in a paid
candidate's mode each step takes that candidate or a free one's guess, whichever has committed
more a second; in the free mode a free guess or a plain step. After each episode the mode with the
higher rate over its episodes runs the next one. A draft model begins at its first step, reading
the prompt and what was committed since as one prefill: a prompt it never drafts for costs it
nothing (heads begin with the prompt: they read the target's states of it).

Exploration: every candidate and mode is tried before rates are compared; then one out of the lead
runs again after a wait that grows the slower it was (EXPLORE_EVERY / x steps at x of the leader's
rate, MODE_EXPLORE_EVERY / x for a mode), so that one whose worth has changed is found again; and
each generation tries once more every mode within NEAR of the leader, since prompts differ. That
is what the rule's exploration costs.

Which candidate drafts never changes the text (the target verifies every token under the same
seeded rule), only how fast it comes.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from ..primitives.sampling import PositionNoise
from ..specs import DrafterSpec, SamplingSpec, TreeSpec
from .base import Draft, DraftContext, Drafter
from .chain import ChainDrafter

TRIES = 2  # steps of each candidate before rates are compared
EXPLORE_EVERY = 16  # steps before a candidate out of the lead runs again (more, the slower it was)
EPISODE = 8  # steps a mode runs before the modes are compared again
MODE_EXPLORE_EVERY = 128  # steps before a mode out of the lead runs again (more, the slower it was)
NEAR = 0.8  # a mode at least this share of the leader's rate is tried again in each generation
DECAY = 0.85  # each earlier step's (or episode's) weight in a rate: memory of ~7
PLAIN = "plain"
FREE_MODE = "free"


class _Rate:
    """A candidate's committed tokens and seconds, earlier steps weighing DECAY times less each."""

    def __init__(self):
        self.tokens = self.seconds = 0.0
        self.steps = 0
        self.last_step = -1  # the decoder step it last ran in
        self.warm = False  # its first step ran (not counted: a process's first call of a forward pays once)

    def add(self, tokens: int, seconds: float, step: int) -> None:
        self.tokens = DECAY * self.tokens + tokens
        self.seconds = DECAY * self.seconds + seconds
        self.steps += 1
        self.last_step = step

    @property
    def value(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def lookup_key(draft: Draft) -> str:
    """A free candidate's proposal as a candidate of its own: its name and its match's length."""
    return f"{draft.drafter}@{min(draft.matched, 3)}" if draft.matched else draft.drafter


class AutoDrafter(ChainDrafter):
    """ChainDrafter's members, hooks and catching up; its own choice of who drafts each step."""

    def __init__(self, drafters: Sequence[Drafter], clock: Callable[[], float] = time.perf_counter):
        super().__init__(drafters)
        self.name = "auto"
        self.clock = clock
        self.paid = {d.name: d for d in self.drafters if not d.free}
        self.rates: dict[str, _Rate] = {}  # per step: free guesses by match length, paid candidates, plain
        self.mode_rates: dict[str, _Rate] = {}  # per episode: the free mode, each paid candidate's
        self.mode = FREE_MODE
        self.episode_left = 0  # steps before the modes are compared again
        self.episode = [0, 0.0]  # this episode's tokens and seconds so far
        self.retry: list[str] = []  # modes this generation tries once more
        self.step = 0
        # the step under way: its candidate, when it began; the tokens it committed, the commits seen
        self._running: tuple[str, float] | None = None
        self._tokens = 0
        self._commits = 0
        self.sequence: list[int] = []  # the committed tokens, for a draft model's late begin
        self.started: set[int] = set()  # the members (by id) that have begun this sequence
        self.sampling, self.noise = SamplingSpec(), None

    @property
    def modes(self) -> list[str]:
        return [*self.paid, FREE_MODE]  # a paid candidate first: what the profile named to draft

    def begin(self, prompt_ids, sampling: SamplingSpec, noise: PositionNoise | None) -> None:
        """Free candidates and heads begin now; a draft model at its first step, reading the
        sequence so far as its prompt, so that a prompt it never drafts for costs it nothing."""
        self.sequence = prompt_ids.tolist()
        self.started = {id(d) for d in self.drafters if d.free or d.feature_layers}
        self.sampling, self.noise = sampling, noise
        for drafter in self.drafters:
            if id(drafter) in self.started:
                drafter.begin(prompt_ids, sampling, noise)
        self.winners = {}
        self._running = None  # a step's time ends at the next step's start: never across generations
        if all(m in self.mode_rates for m in self.modes):
            lead = max(self.modes, key=lambda m: self.mode_rates[m].value)
            self.retry = [m for m in self.modes if m != lead and self.mode_rates[m].value >= NEAR * self.mode_rates[lead].value]

    def rate(self, key: str) -> _Rate:
        return self.rates.setdefault(key, _Rate())

    def _close_step(self) -> None:
        """The step that ended now: its candidate and the mode learn its tokens and seconds (a span
        of several commits, where a batch drafted nothing for this row in between, is not one
        step's figure)."""
        if self._running is not None and self._commits == 1:
            key, started = self._running
            seconds = self.clock() - started
            rate = self.rate(key)
            if rate.warm:
                rate.add(self._tokens, seconds, self.step)
                self.episode[0] += self._tokens
                self.episode[1] += seconds
            rate.warm = True
        self._running, self._tokens, self._commits = None, 0, 0

    def _next_mode(self) -> None:
        """Close the episode and choose the mode of the next one."""
        if self.episode[1] > 0:
            self.mode_rates.setdefault(self.mode, _Rate()).add(self.episode[0], self.episode[1], self.step)
        self.episode = [0, 0.0]
        self.episode_left = EPISODE
        untried = [m for m in self.modes if m not in self.mode_rates]
        if untried:
            self.mode = untried[0]
        elif self.retry:
            self.mode = self.retry.pop(0)
        else:
            self.mode = pick(self.modes, self.mode_rates, self.step, MODE_EXPLORE_EVERY)

    def choose(self, keys: Sequence[str]) -> str:
        """The candidate to run among `keys` (on offer this step, in order of preference on a tie)."""
        untried = [key for key in keys if self.rate(key).steps < TRIES]
        if untried:
            return untried[0]
        return pick(keys, self.rates, self.step, EXPLORE_EVERY)

    def propose(self, shape: TreeSpec, budget=None) -> Draft | None:
        self._close_step()
        if self.episode_left == 0:
            self._next_mode()
        self.episode_left -= 1
        self.step += 1
        offers: dict[str, tuple[Drafter | None, Draft | None]] = {}
        for drafter in self.drafters:
            if drafter.free:
                draft = drafter.propose(shape, budget.fresh() if budget is not None else None)
                if draft is not None and len(draft):
                    offers.setdefault(lookup_key(draft), (drafter, draft))
        paid = self.paid.get(self.mode)
        offers[paid.name if paid is not None else PLAIN] = (paid, None)
        key = self.choose(list(offers))
        self._running = (key, self.clock())
        self.winners = {}
        drafter, draft = offers[key]
        if drafter is None:
            return None
        if id(drafter) not in self.started:
            drafter.begin(torch.tensor(self.sequence), self.sampling, self.noise)
            self.started.add(id(drafter))
        if draft is None:
            draft = drafter.propose(shape, budget)
        if draft is not None:
            self.winners = {id(drafter): None}
        return draft

    def accept(self, new_tokens: Sequence[int], path: Sequence[int]) -> None:
        self._tokens += len(new_tokens)
        self._commits += 1
        self.sequence.extend(new_tokens)
        for drafter in self.drafters:
            if id(drafter) in self.started:
                drafter.accept(new_tokens, path if id(drafter) in self.winners else ())
        self.winners = {}


def pick(keys: Sequence[str], rates: dict[str, _Rate], step: int, explore_every: int) -> str:
    """The key with the best rate, or one out of the lead whose wait is over (at a rate x of the
    leader's, explore_every / x steps since it last ran: each run costs 1 - x of a step's worth, so
    exploring takes at most a quarter of 1 / explore_every of the time)."""
    best = max(keys, key=lambda key: rates[key].value)
    lead = rates[best].value

    def wait(key: str) -> float:
        value = rates[key].value
        return explore_every * lead / value if value > 0 else explore_every * 8

    due = [key for key in keys if step - rates[key].last_step >= wait(key)]
    return min(due, key=lambda key: rates[key].last_step) if due else best


def build(spec: DrafterSpec, context: DraftContext) -> AutoDrafter:
    from .chain import build_members

    return AutoDrafter(build_members(spec, context))
