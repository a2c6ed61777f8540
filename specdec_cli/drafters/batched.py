"""Drafters for a batch of sequences (decoding/batched.py): each row drafts its own chain or tree.

- a draft model, or the target's first layers (early exit), drafting chains: one draft forward per
  depth serves every row, over the rows' own cache (runtime/batched_lm.py);
- every other drafter (prompt lookup, Medusa and EAGLE heads, chains of drafters, drafts with
  another tokenizer, and any drafter growing token trees): one batch-1 drafter per row, each
  proposing what it proposes alone (prompt lookup's search is host-side; a head's drafter is handed
  its row's hidden states of the target, which the batch's forward returns for drafters that read
  them; a model drafter per row keeps its own cache over the one shared model and compiled step).
"""

from __future__ import annotations

import time
from typing import Callable, Protocol, Sequence

import torch

from ..constraints.matcher import RowMatcher
from ..models.devices import device_clock
from ..primitives.sampling import PositionNoise, choose
from ..runtime.batched_lm import make_batched_lm
from ..specs import SamplingSpec, TreeSpec
from .base import Draft, DraftBudget, Drafter


class BatchDrafter(Protocol):
    """Rows join at the bottom (add) and leave (remove), in the decoder's row order."""

    name: str
    # the target's hidden states it reads (Drafter.feature_layers); () for none
    feature_layers: tuple[int, ...]
    # a draft model's reading of tokens it missed (rows' prompts, plain steps' tokens) so far:
    # seconds and tokens (k: auto charges drafting for it); 0 for drafters without a model
    catch_up_seconds: float
    catch_up_tokens: int

    def reserve(self, positions: int) -> None:
        """Room for the next row's sequence of up to `positions` tokens, drafts included (static
        caches), before the steps compile and the row joins."""
    def warmup(self) -> float:
        """Compile ahead what its steps need (before any row joins); seconds spent."""
    def add(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, noise: PositionNoise | None,
            features: torch.Tensor | None = None) -> None:
        """A new last row; `features`: the target's states of its prompt but the last token."""
    def remove(self, keep: Sequence[int]) -> None: ...
    def follow(self, constraints: Sequence[RowMatcher | None]) -> None:
        """Per row the constraint its next proposal should keep within (Drafter.follow; None: free)."""
    def propose(self, shapes: Sequence[TreeSpec | None], budgets: Sequence[DraftBudget | None]) -> list[Draft | None]:
        """Per row a draft within shapes[b] (None: that row drafts nothing), asking budgets[b]
        (k: auto, tree: auto) whether one more node pays; None: no guess."""
    def accept(self, emitted: Sequence[Sequence[int]], paths: Sequence[Sequence[int]],
               features: Sequence[torch.Tensor] | None = None) -> None:
        """Per row the tokens committed this step, of which the first len(paths[b]) were its drafted
        nodes paths[b]; `features`: per row the target's states of its fed token and those nodes."""


def batch_drafter(make: Callable[[], Drafter], *, vocab: int, device: torch.device, trees: bool = False,
                  slack: int = 16, compile: str = "off", rows: int = 2,
                  on_compile: Callable[[str], None] | None = None) -> BatchDrafter:
    """The batch form of the drafter `make` builds: a draft model drafting chains over the batch's
    rows at once, anything else (and anything at batch size 1) a drafter per row. `trees`: the rows
    draft token trees.
    `slack`: the draft cache's compaction bound (BatchedLM); `compile`, `rows`, `on_compile`: a
    draft model's batch LM (make_batched_lm)."""
    from .model import ModelDrafter

    first = make()
    if type(first) is ModelDrafter and not trees and rows > 1:
        lm = make_batched_lm(first.lm.model, vocab, compile, slack=slack, rows_hint=rows, on_compile=on_compile)
        return BatchedModelDrafter(lm, device=device, name=first.name)
    return RowDrafters(make, first)


class RowDrafters:
    """One batch-1 drafter per row, each driven as the batch-1 engine drives it: begin, propose
    within its row's shape, take its row's states of the target (heads), accept its kept path."""

    def __init__(self, make: Callable[[], Drafter], first: Drafter):
        self.make = make
        self.spare: Drafter | None = first
        self.name = first.name
        self.feature_layers = tuple(first.feature_layers)
        self.catch_up_seconds, self.catch_up_tokens = 0.0, 0  # nothing to read: no model of its own
        self.drafters: list[Drafter] = []

    def _next(self) -> Drafter:
        """The drafter the next row takes (made now if there is none spare)."""
        if self.spare is None:
            self.spare = self.make()
        return self.spare

    def reserve(self, positions: int) -> None:
        self._next().reserve(positions)

    def warmup(self) -> float:
        """A draft model's compiled steps (shared by every row's drafter of that model); seconds spent."""
        started = time.perf_counter()
        self._next().warmup()
        return time.perf_counter() - started

    def add(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, noise: PositionNoise | None,
            features: torch.Tensor | None = None) -> None:
        drafter, self.spare = self._next(), None
        drafter.begin(prompt_ids, sampling, noise)
        if features is not None and features.shape[0]:
            drafter.take_features(features)
        self.drafters.append(drafter)

    def remove(self, keep: Sequence[int]) -> None:
        self.drafters = [self.drafters[b] for b in keep]

    def follow(self, constraints: Sequence[RowMatcher | None]) -> None:
        for drafter, constraint in zip(self.drafters, constraints):
            drafter.follow(constraint)

    def propose(self, shapes: Sequence[TreeSpec | None], budgets: Sequence[DraftBudget | None]) -> list[Draft | None]:
        drafts = [d.propose(shape, budget) if shape is not None else None
                  for d, shape, budget in zip(self.drafters, shapes, budgets)]
        return [draft if draft is not None and len(draft) else None for draft in drafts]

    def accept(self, emitted: Sequence[Sequence[int]], paths: Sequence[Sequence[int]],
               features: Sequence[torch.Tensor] | None = None) -> None:
        for b, (drafter, tokens, path) in enumerate(zip(self.drafters, emitted, paths)):
            if features is not None:  # as the engine: the states first, then the tokens
                drafter.take_features(features[b])
            drafter.accept(tokens, path)


CATCH_UP_ALONE = 16  # a row with more tokens waiting than this reads them in a forward of its own


class BatchedModelDrafter:
    """A draft LM over the batch: its cache (`cached`) plus each row's `pending` spell that row's
    committed sequence, as in ModelDrafter. A proposal's first forward reads the pending tokens
    (one, or two after a full acceptance), each further forward one drafted token per row; a row
    whose chain is shorter than the longest pads. A chain's last token is never fed (it waits in
    pending if the target keeps it).

    The draft reads nothing until a step drafts: a row joins with its whole prompt pending, so
    where k: auto keeps the batch plain (drafting does not pay at that batch size) the draft model
    never runs. A row with more than CATCH_UP_ALONE tokens pending (its prompt, or what plain steps
    committed) reads them first in a forward of its own: in the batch's forward every other row
    would pad to its length."""

    def __init__(self, lm, *, device: torch.device, name: str = "model"):
        """`lm`: a BatchedLM or BatchedStaticLM over the draft model (make_batched_lm)."""
        self.name = name
        self.feature_layers = ()
        self.catch_up_seconds, self.catch_up_tokens = 0.0, 0
        self.lm = lm
        self.out_device = device
        self.cached: list[list[int]] = []  # per row, the tokens its cache holds
        self.pending: list[list[int]] = []
        self.samplings: list[SamplingSpec] = []
        self.noises: list[PositionNoise | None] = []
        self.fed: list[int] = []  # drafts of the last proposal in the cache, per row
        self.mark: int | None = None  # the cache's width before the last proposal; None: it read nothing

    def warmup(self) -> float:
        """Compile ahead the draft's steps (both widths: a proposal's first read may take two tokens)."""
        return self.lm.warmup((1, 2))

    def reserve(self, positions: int) -> None:
        self.lm.reserve(positions)

    def add(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, noise: PositionNoise | None,
            features: torch.Tensor | None = None) -> None:
        self.lm.add_row(prompt_ids[:0])
        self.cached.append([])
        self.pending.append(prompt_ids.tolist())
        self.samplings.append(sampling)
        self.noises.append(noise)

    def remove(self, keep: Sequence[int]) -> None:
        self.lm.remove_rows(keep)
        self.cached = [self.cached[b] for b in keep]
        self.pending = [self.pending[b] for b in keep]
        self.samplings = [self.samplings[b] for b in keep]
        self.noises = [self.noises[b] for b in keep]

    def follow(self, constraints: Sequence[RowMatcher | None]) -> None:
        pass  # the batch's chains are drawn for every row in one go, unconstrained: the core cuts them

    def propose(self, shapes: Sequence[TreeSpec | None], budgets: Sequence[DraftBudget | None]) -> list[Draft | None]:
        """Chains only (batch_drafter): row b drafts shapes[b].depth tokens; budgets are not asked
        (in a batch, k: auto chooses each step's k for every row)."""
        rooms = [0 if shape is None else shape.depth for shape in shapes]
        depth = max(rooms, default=0)
        if depth < 1:
            self.mark = None
            return [None] * len(rooms)
        self._catch_up()
        self.mark = self.lm.width
        logits = self._read_pending()
        tokens = []
        for d in range(1, depth + 1):
            tokens.append(self._choose(logits, d))
            if d == depth:
                break
            real = torch.tensor([[d < room] for room in rooms])
            logits = self.lm.forward(tokens[-1].view(-1, 1), real)[:, 0]
        self.fed = [max(0, room - 1) for room in rooms]
        chains = torch.stack(tokens, dim=1).to(self.out_device)
        return [Draft(chains[b, :room], self.name) if room > 0 else None for b, room in enumerate(rooms)]

    def _catch_up(self) -> None:
        """Rows with more than CATCH_UP_ALONE tokens pending read all but the last in a forward alone
        (timed on the device's clock: catch_up_seconds)."""
        behind = [b for b, tokens in enumerate(self.pending) if len(tokens) > CATCH_UP_ALONE]
        if not behind:
            return
        started = device_clock(self.lm.device)
        for b in behind:
            tokens = self.pending[b]
            self.lm.extend_row(b, self.cached[b], tokens[:-1])
            self.cached[b] = self.cached[b] + tokens[:-1]
            self.pending[b] = tokens[-1:]
            self.catch_up_tokens += len(tokens) - 1
        self.catch_up_seconds += device_clock(self.lm.device) - started

    def _read_pending(self) -> torch.Tensor:
        """The forward over every row's pending tokens; each row's logits after its last one [B, V]."""
        width = max(len(p) for p in self.pending)
        ids = torch.zeros(len(self.pending), width, dtype=torch.long)
        real = torch.zeros(len(self.pending), width, dtype=torch.bool)
        for b, tokens in enumerate(self.pending):
            ids[b, : len(tokens)] = torch.tensor(tokens)
            real[b, : len(tokens)] = True
        logits = self.lm.forward(ids, real)
        last = torch.tensor([len(p) - 1 for p in self.pending], device=logits.device)
        return logits[torch.arange(len(self.pending), device=logits.device), last]

    def _choose(self, logits: torch.Tensor, depth: int) -> torch.Tensor:
        """Each row's draft token at `depth`: the argmax of q, above temperature 0 argmax(q / e)
        with the target's noise of that position (what TreeGrower drafts in a chain)."""
        return torch.cat([
            choose(logits[b : b + 1], sampling, None if noise is None else noise.ahead([depth]))
            for b, (sampling, noise) in enumerate(zip(self.samplings, self.noises))
        ])

    def accept(self, emitted: Sequence[Sequence[int]], paths: Sequence[Sequence[int]],
               features: Sequence[torch.Tensor] | None = None) -> None:
        accepted = [len(path) for path in paths]
        if self.mark is None:  # no proposal read the pending tokens: they still wait, before these
            self.pending = [p + list(tokens) for p, tokens in zip(self.pending, emitted)]
            return
        kept = [min(n, fed) for n, fed in zip(accepted, self.fed)]
        self.lm.keep_new([len(p) + n for p, n in zip(self.pending, kept)], self.mark)
        self.cached = [c + p + list(tokens[:n]) for c, p, tokens, n in zip(self.cached, self.pending, emitted, kept)]
        self.pending = [list(tokens[n:]) for tokens, n in zip(emitted, kept)]
