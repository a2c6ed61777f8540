"""The decoding core: B sequences share each target forward (B = 1, one sequence, the ordinary
case), each drafting, accepting and rolling back on its own.

A step is draft -> verify -> commit over every row: each row feeds its last committed token and
its draft, a chain or a token tree, in one target forward (a batch's LM, runtime/batched_lm.py and
batched_static.py: per-row positions, each row's tree under its own mask, pads and rejected drafts
never seen; at batch size 1 the one-sequence LM, runtime/one_row.py), one acceptance rule judges
every row at once (acceptance.accept_rows), and one transfer a step (device_calls.to_host) reads
every row's result. A finished row leaves at once and the next takes its place, so a stream of
requests keeps the batch full. Plain decoding is the same loop with no drafter (k = 0). The core
yields events and never prints; engine.SpeculativeDecoder is its front for one sequence.

Above temperature 0 each row has its own seed and its own position-keyed noise, so a row's text
is the text its prompt gets alone with that seed, whoever shares its batch and whatever it drafts.

Every drafter runs at every batch size (drafters/batched.py): a draft model's chains over the rows
at once in a batch, anything else (prompt lookup, heads, chains of drafters, drafts with another
tokenizer, trees, and every drafter at batch size 1) a drafter per row. How much each row drafts:
with `k: auto` on chains in a batch, the k of each step chosen for the batch by measured goodput, 0
included (batch_k.py); otherwise each row's own lookahead (a chain of k, a tree, `k: auto`'s and
`tree: auto`'s per-token rule; at batch size 1 one lookahead kept across generations). `compile:
on` runs the steps of the target and of a draft model compiled over static caches, compiled
before the first row joins; `compile: off` runs them eagerly over DynamicCaches.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Hashable, Iterable, Iterator, NamedTuple, Sequence

import torch

from ..constraints.matcher import RowMatcher
from ..drafters.base import Draft, DraftBudget, Drafter
from ..drafters.batched import BatchDrafter, batch_drafter
from ..errors import ContextLengthError, UsageError
from ..models.devices import PhaseTimer, device_clock, head_device
from ..primitives.device_calls import to_host
from ..primitives.sampling import PositionNoise, choose_rows
from ..primitives.tree import depths, path_to
from ..runtime.batched_lm import make_batched_lm
from ..runtime.compiled_step import compile_failed
from ..runtime.lm import make_lm
from ..runtime.one_row import OneRowLM
from ..specs import AdaptiveSpec, SamplingSpec, TreeSpec
from .acceptance import accept_rows
from .arrivals import Arrivals, as_arrivals
from .batch_k import GoodputK
from .commit import StopCheck, cut_at_stop, step_event, token_limit
from .constrained import FORCED_MAX, ConstrainedStep, constrain_drafts
from .events import Event, Finished, Prefilled, Verified
from .lookahead import fit_shape, make_lookahead
from .stack_room import with_stack_room
from .stats import DecodeStats

log = logging.getLogger("specdec")


class Request(NamedTuple):
    """One prompt to decode; `key` comes back with its Finished event."""

    key: Hashable
    prompt_ids: Sequence[int]
    max_new_tokens: int
    sampling: SamplingSpec = SamplingSpec()
    seed: int = 0
    stop: StopCheck | None = None
    constraint: RowMatcher | None = None  # what the text must spell (structured output)


class Row:
    """One sequence in the batch: what it has produced and what it waits to feed."""

    def __init__(self, request: Request, limit: int, noise: PositionNoise | None, stats: DecodeStats, lookahead,
                 timer: PhaseTimer):
        """`lookahead`: how much this row drafts each step (lookahead.make_lookahead); None where
        the batch's k: auto chooses for every row. `timer`: its steps' draft and verify time."""
        self.key = request.key
        self.lookahead = lookahead
        self.timer = timer
        self.sampling = request.sampling
        self.stop = request.stop
        self.constraint = request.constraint
        self.limit = limit
        self.noise = noise
        self.stats = stats
        self.generated: list[int] = []
        self.pending = int(request.prompt_ids[-1])  # the last committed token, fed with the next drafts
        self.finish: str | None = None
        self.prefilled: Prefilled | None = None  # its prompt's reading

    @property
    def room(self) -> int:
        """Drafts this row may still verify: one token of what it may emit is the target's own."""
        return self.limit - len(self.generated) - 1


class BatchedDecoder:
    """Speculative decoding of up to `batch_size` sequences at once (1: one sequence, the ordinary
    case), with one drafter (or none). One run at a time: the caches hold that run's rows."""

    def __init__(
        self,
        target: torch.nn.Module,
        drafter: Callable[[], Drafter] | None,
        *,
        vocab: int,
        eos_ids: frozenset[int],
        k: int | str | GoodputK = 5,
        batch_size: int = 8,
        context_length: int | None = None,
        tree: TreeSpec | None = None,
        adaptive: AdaptiveSpec = AdaptiveSpec(),
        slack: int = 16,
        compile: str = "off",
        on_compile: Callable[[str], None] | None = None,
    ):
        """`drafter`: builds a fresh batch-1 drafter (Pipeline.make_drafter), whose batch form
        is made here; None: plain decoding. `k`: a number, "auto" (a fresh GoodputK) or a GoodputK
        that already learned at this batch size. `tree`: each row drafts a token tree of this shape
        (fixed, or `tree: auto` within it, as at batch size 1; `adaptive` its rule's settings).
        `slack`: columns of holes an eager cache may carry before it is compacted. `compile`: "off",
        "on" or "static" (make_batched_lm); `on_compile` is told before a step compiles."""
        if isinstance(k, str) and k != "auto" or isinstance(k, bool):
            raise UsageError(f"k: {k!r} is not a number or auto")
        if batch_size < 1:
            raise UsageError(f"batch size {batch_size}: give 1 or more")
        self.compile = compile
        if batch_size == 1:  # the one-sequence LM: its padded and compiled steps are the fastest for one row
            self.lm = OneRowLM(make_lm(target, vocab, compile, on_compile=on_compile))
        else:
            self.lm = make_batched_lm(target, vocab, compile, slack=slack, rows_hint=batch_size, on_compile=on_compile)
        self.vocab = vocab
        self.eos_ids = eos_ids
        self.batch_size = batch_size
        self.context_length = context_length
        self.output_device = head_device(target)
        self.drafter: BatchDrafter | None = None
        self.tree = tree if drafter is not None and k != 0 else None
        if drafter is not None and k != 0:
            self.drafter = batch_drafter(drafter, vocab=vocab, device=self.lm.device, trees=self.tree is not None,
                                         slack=slack, compile=compile, rows=batch_size, on_compile=on_compile)
            if self.drafter.feature_layers:
                self.lm.want_features(self.drafter.feature_layers)
        self.k = k if self.drafter is not None and isinstance(k, int) else 0  # the k of every step, unless chosen
        # forced tokens a constrained row's draft may gain (_forced_limit); none after a drafter of
        # the target's states: those tokens would come without the states it reads
        self.forced_max = 0 if self.drafter is not None and self.drafter.feature_layers else FORCED_MAX
        self.adaptive = adaptive
        # k: auto on chains in a batch: each step's k for every row, by measured goodput; at batch
        # size 1 (and with trees) each row's own lookahead (k: auto's per-token rule, tree: auto)
        self.chooser: GoodputK | None = None
        if self.drafter is not None and (isinstance(k, GoodputK) or k == "auto" and batch_size > 1 and self.tree is None):
            self.chooser = k if isinstance(k, GoodputK) else GoodputK(clock=lambda: device_clock(self.lm.device))
            self.chooser.overhead = self.draft_overhead  # a GoodputK from an earlier run reads this run's
        self.row_k = "auto" if self.drafter is not None and not isinstance(k, int) else self.k  # rows' own lookahead
        # at batch size 1 one lookahead serves every generation: what k: auto and tree: auto learn
        # of this pair on this machine carries over (generate --samples, bench's repeats)
        self.lookahead = self._new_lookahead() if batch_size == 1 else None
        self.prompt_tokens = 0  # of the rows admitted so far, and the tokens they emitted or may emit
        self.budget_tokens = 0
        self.compile_seconds = 0.0  # ahead-of-decoding compile time (warmup), never in decode timings
        self._warm_for: int | None = None  # the node limit whose step widths are compiled

    @property
    def k_limit(self) -> int:
        """The deepest a row's draft can go."""
        if self.chooser is not None:
            return self.chooser.k_max
        if self.tree is not None:
            return self.tree.depth
        return self.adaptive.k_max if self.row_k == "auto" else self.k

    @property
    def node_limit(self) -> int:
        """The most tokens a row's draft can hold."""
        return self.tree.nodes if self.tree is not None else self.k_limit

    def draft_overhead(self) -> float:
        """Seconds that drafting costs per committed token outside its steps' usual figure: the draft
        reads each joining row's prompt (its seconds a token so far) and rows bring prompt_tokens for
        every budget_tokens they emit (what finished rows emitted, what running rows may: rows that
        stop early bring more prompt a token, and the figure learns it as they finish)."""
        drafter = self.drafter
        if drafter is None or not drafter.catch_up_tokens or not self.budget_tokens:
            return 0.0
        return drafter.catch_up_seconds / drafter.catch_up_tokens * self.prompt_tokens / self.budget_tokens

    def _new_lookahead(self):
        """A row's lookahead (None where the batch's chooser decides, or nothing is drafted)."""
        if self.drafter is None or self.chooser is not None:
            return None
        return make_lookahead(self.row_k, self.adaptive.k_max, self.adaptive.threshold, self.tree)

    def run(self, requests: Arrivals | Iterable[Request | tuple]) -> Iterator[tuple[Hashable, Finished]]:
        """(key, Finished) for each request, in the order they finish (stream's, without the steps)."""
        for key, event in self.stream(requests):
            if isinstance(event, Finished):
                yield key, event

    def stream(self, requests: Arrivals | Iterable[Request | tuple]) -> Iterator[tuple[Hashable, Event]]:
        """(key, event) as each row's events happen: Prefilled when it joins, a Verified per step,
        Finished when it ends. Requests are read as slots free up; each is (key, prompt_ids,
        max_new_tokens, sampling, seed[, stop]). From an Arrivals (arrivals.py), requests join while
        others run, and a cancelled row leaves at the next step with finish reason "cancelled". A
        prompt with no tokens, or one that fills the context, raises ContextLengthError: check them
        first (commit.token_limit) to keep the others running. Each step runs on a fresh chunk of
        CPython's frame stack, so that its cost does not depend on the caller's depth (stack_room.py)."""
        events = self._events(requests)
        try:
            while (item := with_stack_room(next, events, None)) is not None:
                yield item
        finally:
            events.close()

    def _events(self, requests: Arrivals | Iterable[Request | tuple]) -> Iterator[tuple[Hashable, Event]]:
        arrivals = as_arrivals(requests)
        rows: list[Row] = []
        full = 0  # the rows of the run's first step: k: auto measures only steps as full, and not
        # the first (the slowest of a run's plain steps, 10-30% above the next: it stood first in
        # every first round, against plain decoding)
        try:
            while True:
                # with rows running, take only what waits now; with none, wait for the next request
                while len(rows) < self.batch_size and (request := arrivals.take(wait=not rows)) is not None:
                    row = self._admit(Request(*request))
                    rows.append(row)
                    yield row.key, row.prefilled
                if not rows:
                    return
                for row in rows:
                    if arrivals.cancelled(row.key):
                        row.finish = "cancelled"
                rows = yield from self._leave(rows)
                if not rows:
                    continue
                events = self._step(rows, measured=bool(full) and len(rows) >= full)
                full = full or len(rows)
                yield from zip((row.key for row in rows), events)
                rows = yield from self._leave(rows)
                if not rows:  # a server's batch emptied: the next rows' first step is again a first
                    full = 0
        finally:
            self._remove([])  # a closed run leaves empty caches

    def _leave(self, rows: list[Row]) -> Iterator[tuple[Hashable, Finished]]:
        """Finished rows leave the batch (and the caches), each yielding its Finished event; the
        rows that go on are returned."""
        keep = [b for b, row in enumerate(rows) if row.finish is None]
        if len(keep) == len(rows):
            return rows
        self._remove(keep)
        for row in rows:
            if row.finish is not None:
                yield row.key, self._finished(row)
        return [rows[b] for b in keep]

    def _finished(self, row: Row) -> Finished:
        """A row's Finished event: its tokens, why it ended and its stats with its phases' time."""
        self.budget_tokens -= row.limit - len(row.generated)
        phases = row.timer.totals()
        row.stats.draft_seconds = phases.get("draft", 0.0)
        if row.constraint is not None:
            row.stats.constraint_complete = row.constraint.complete
        row.stats.verify_seconds = phases.get("verify", 0.0)
        describe = getattr(row.lookahead, "describe", None)  # k: auto / tree: auto: what it judged by
        if describe is not None and log.isEnabledFor(logging.INFO):
            log.info(describe())
        return Finished(tuple(row.generated), row.finish, row.stats)

    def warmup(self) -> float:
        """Compile ahead every step this decoder runs (none when eager): each verify width up to the
        widest draft's, and the drafter's steps, so that no row's timing (nor k: auto's) counts a
        compile; seconds spent (added to compile_seconds)."""
        if self.compile == "off" or self._warm_for == self.node_limit:
            return 0.0
        started = time.perf_counter()
        # on a fresh frame-stack chunk, as the steps will run: the eager/compiled choice times forwards
        with_stack_room(self.lm.warmup, range(1, self.node_limit + 2))
        if self.drafter is not None:
            with_stack_room(self.drafter.warmup)
        self._warm_for = self.node_limit
        if compile_failed():  # the steps run uncompiled: no compile time to report
            return 0.0
        seconds = time.perf_counter() - started
        self.compile_seconds += seconds
        return seconds

    def _admit(self, request: Request) -> Row:
        """Prefill a new row alone and put it at the bottom of the batch."""
        ids = torch.as_tensor(request.prompt_ids, dtype=torch.long).view(-1).cpu()
        if ids.numel() == 0:
            raise ContextLengthError("the prompt has no tokens")
        limit = token_limit(self.context_length, ids.numel(), request.max_new_tokens)
        self.prompt_tokens += int(ids.numel())
        self.budget_tokens += limit
        sampling = request.sampling
        noise = None if sampling.greedy else PositionNoise(request.seed, self.vocab, self.output_device)
        stats = DecodeStats(k=self.row_k, k_limit=self.k_limit)
        # static caches sized for this row's generation, then every step compiled before it joins
        # (no row's timing counts a compile; CUDA graphs record the buffers the row will use)
        positions = int(ids.numel()) + limit
        self.lm.reserve(positions)
        if self.drafter is not None:
            self.drafter.reserve(positions + self.node_limit)
        self.warmup()
        started = device_clock(self.lm.device)
        self.lm.add_row(ids[:-1])
        if self.drafter is not None:
            self.drafter.add(ids, sampling, noise, self.lm.prefill_features)  # host ids: a drafter moves what it feeds
        prefilled = Prefilled(int(ids.numel()), device_clock(self.lm.device) - started)
        stats.observe(prefilled)
        lookahead = self.lookahead if self.lookahead is not None else self._new_lookahead()
        row = Row(request, limit, noise, stats, lookahead, PhaseTimer(self.lm.device))
        row.prefilled = prefilled
        return row

    def _remove(self, keep: list[int]) -> None:
        self.lm.remove_rows(keep)
        if self.drafter is not None:
            self.drafter.remove(keep)

    def _plans(self, rows: list[Row], k: int | None) -> tuple[list[TreeSpec | None], list[DraftBudget | None]]:
        """Each row's draft shape this step (cut to what it may still emit; None: nothing) and the
        budget its drafter asks (k: auto, tree: auto): the batch's chosen k, or the row's lookahead."""
        plans = [(TreeSpec.chain(k), None) if row.lookahead is None else row.lookahead.plan() for row in rows]
        return [fit_shape(shape, row.room) for (shape, _), row in zip(plans, rows)], [budget for _, budget in plans]

    def _step(self, rows: list[Row], measured: bool = True) -> list[Verified]:
        """One draft -> verify -> commit over every row; each row's Verified event, in row order.
        `measured`: whether k: auto counts the step."""
        k = self.chooser.next_k(measured) if self.chooser else self.k
        read_before = self.drafter.catch_up_seconds if self.drafter is not None else 0.0
        started = time.perf_counter()
        clock = rows[0].timer  # marks on the device's clock (CUDA events), shared by every row's timer
        for row in rows:
            if row.noise is not None:
                row.noise.move_to(len(row.generated))
        # 2. draft: each row a chain or a tree, never past what it may still emit
        draft_mark = clock.start()
        drafts: list[Draft | None] = [None] * len(rows)
        if self.drafter is not None:
            self.drafter.follow([row.constraint for row in rows])
            drafts = self.drafter.propose(*self._plans(rows, k))
        constrained = None
        if any(row.constraint is not None for row in rows):  # cut what the constraints forbid, add what they force
            drafts, constrained = constrain_drafts([row.constraint for row in rows], drafts,
                                                   [self._forced_limit(row) for row in rows], self.lm.device)
        drafted_at, verify_mark = time.perf_counter(), clock.start()
        # 3. verify: ONE target forward over every row's last token and draft
        mark = self.lm.width
        results = self._verify(rows, drafts, constrained)
        verified_at, verified_mark = time.perf_counter(), clock.start()
        # 4. commit: each row emits its accepted path and the target's token; caches keep them
        emitted, paths = self._commit(rows, drafts, results, mark, constrained)
        if self.chooser:  # the draft's reads of missed tokens are charged by draft_overhead instead
            self.chooser.record(sum(len(tokens) for tokens in emitted), self.drafter.catch_up_seconds - read_before)
        timings = dict(seconds=time.perf_counter() - started, draft_seconds=drafted_at - started,
                       verify_seconds=verified_at - drafted_at)
        events = []
        for b, (row, draft, (_, _, token, drafted), path, tokens) in enumerate(zip(rows, drafts, results, paths, emitted)):
            shaped = {} if constrained is None or row.constraint is None else dict(
                forced=constrained.forced(b), cut=constrained.cut(b), mask_seconds=constrained.seconds(b))
            event = step_event(draft, drafted, path, token, tokens, **shaped, **timings)
            if row.lookahead is not None:
                row.lookahead.observe(event)
            row.stats.observe(event)
            row.timer.add("draft", draft_mark, verify_mark)
            row.timer.add("verify", verify_mark, verified_mark)
            events.append(event)
        return events

    def _forced_limit(self, row: Row) -> int:
        """The most nodes a constrained row's draft may hold once forced tokens are added: what it
        may still emit, and no wider than the compiled steps (their widths are the drafts')."""
        widest = self.node_limit if self.compile != "off" else max(self.node_limit, self.forced_max)
        return min(row.room, widest) if self.forced_max else 0

    def _commit(self, rows: list[Row], drafts: list[Draft | None], results: list[tuple[int, int, int, list[int]]],
                mark: int, constrained: ConstrainedStep | None = None) -> tuple[list[list[int]], list[list[int]]]:
        """Each row's tokens of this step (cut at EOS, its limit or a stop text) and its accepted
        path; the target's cache keeps each row's fed token and accepted nodes (of the columns from
        `mark` on), the drafter's the same (its own nodes: not the forced ones a constraint added);
        each row's constraint moves past its tokens."""
        emitted, paths = [], []
        for row, draft, (_, end, token, drafted) in zip(rows, drafts, results):
            path = path_to(draft.shape, end) if draft is not None else []
            tokens, row.finish = cut_at_stop([drafted[i] for i in path] + [token], len(row.generated), row.limit,
                                             self.eos_ids, row.stop, row.generated)
            row.generated.extend(tokens)
            if row.constraint is not None:
                row.constraint.advance(tokens)
            row.pending = tokens[-1] if tokens else row.pending
            emitted.append(tokens)
            paths.append(path)
        if any(draft is not None and draft.is_tree for draft in drafts):
            self.lm.keep_columns([[0] + [1 + i for i in path] for path in paths], mark)
        else:
            self.lm.keep_new([1 + len(path) for path in paths], mark)
        if self.drafter is not None:
            kept = [path[: len(tokens)] for path, tokens in zip(paths, emitted)]
            features = None
            if self.drafter.feature_layers:  # each row's fed token's and kept nodes' (as the batch-1 engine)
                features = [_rows_of(self.lm.features[b], [0] + [1 + i for i in nodes]) for b, nodes in enumerate(kept)]
            own = kept if constrained is None else [constrained.own_path(b, nodes) for b, nodes in enumerate(kept)]
            self.drafter.accept(emitted, own, features)
        return emitted, paths

    def _verify(self, rows: list[Row], drafts: list[Draft | None], constrained: ConstrainedStep | None = None,
                ) -> list[tuple[int, int, int, list[int]]]:
        """The batch's forward, every row's choices (within what its constraint allows) and the
        acceptance rule at once; per row (n accepted, end node, next token, drafted ids), one transfer."""
        sizes = [len(d) if d is not None else 0 for d in drafts]
        width = 1 + max(sizes)
        ids = torch.zeros(len(rows), width, dtype=torch.long, device=self.lm.device)
        ids[:, 0] = torch.tensor([row.pending for row in rows])
        for b, draft in enumerate(drafts):
            if draft is not None:
                ids[b, 1 : 1 + sizes[b]] = draft.token_ids
        real = torch.arange(width)[None, :] <= torch.tensor(sizes)[:, None]
        parents = [draft.shape if draft is not None else () for draft in drafts]
        trees = [draft.parents if draft is not None and draft.is_tree else None for draft in drafts]
        logits = self.lm.forward(ids, real, trees)
        noises = [None if row.noise is None else row.noise.ahead(_depths_ahead(shape, width))
                  for row, shape in zip(rows, parents)]
        choices = choose_rows(logits, [row.sampling for row in rows], noises)
        if constrained is not None:
            choices = constrained.choose(logits, choices, [row.sampling for row in rows], noises)
        draft_ids = ids[:, 1:].to(logits.device)
        n, end, token = accept_rows(draft_ids, parents, choices)
        # the step's one device -> host transfer (a constrained step's drafts and choices are read too)
        values = to_host(torch.cat([n, end, token, draft_ids.reshape(-1)]))
        count = len(rows)
        return [(values[b], values[count + b], values[2 * count + b],
                 values[3 * count + b * (width - 1) : 3 * count + b * (width - 1) + sizes[b]]) for b in range(count)]


def _depths_ahead(parents: Sequence[int], width: int) -> list[int]:
    """How far past the last committed token each of a verify's `width` rows scores: the root's
    row the next token, node i's row the token after it; pads as the root."""
    ahead = [1] + [depth + 1 for depth in depths(parents)]
    return ahead + [1] * (width - len(ahead))


def _rows_of(tensor: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """tensor[rows] (a slice where they are the first ones, as a chain's always are)."""
    if rows == list(range(len(rows))):
        return tensor[: len(rows)]
    return tensor.index_select(0, torch.tensor(rows, device=tensor.device))
