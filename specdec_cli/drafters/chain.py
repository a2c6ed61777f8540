"""Several drafters in order: each step, the first one that proposes wins (e.g. ngram, then a model).

A weak guess (a Draft marked `tentative`: prompt lookup from a match shorter than its
`solo_ngram`) does not end the chain: the next drafters propose too, within the nodes left, and the
proposals are verified as one tree, so a short match's continuation and a head's candidates are
judged in the same target forward. Identical guesses share a node: a node is kept when it equals
the target's choice, whoever guessed it.

Every drafter sees every committed token, so a model drafter that sat out a step (because prompt
lookup proposed) catches up in the first forward of its next proposal. Members that read the
target's hidden states (Medusa, EAGLE) get them every step, winners or not: the chain asks the
target for the union of their layers and hands each member its own columns.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import torch

from ..constraints.matcher import RowMatcher
from ..primitives.device_calls import to_host
from ..primitives.sampling import PositionNoise
from ..specs import DrafterSpec, SamplingSpec, TreeSpec
from .base import Draft, DraftContext, Drafter, DraftPart


def merge_drafts(proposals: Sequence[tuple[Draft, float]]) -> Draft:
    """Several drafters' proposals (with the seconds each took) as one tree, in order: each node
    hangs from the merged node of its parent, and a node equal to a sibling already there becomes
    that node (a trie)."""
    ids, parents, confidences, parts = _shared_tree(proposals)
    return Draft(
        torch.tensor(ids, dtype=torch.long, device=proposals[0][0].token_ids.device),
        "+".join(dict.fromkeys(d.drafter for d, _ in proposals)),
        parents=tuple(parents),
        confidences=None if all(c is None for c in confidences) else tuple(confidences),
        parts=tuple(parts),
    )


def _shared_tree(
    proposals: Sequence[tuple[Draft, float]],
) -> tuple[list[int], list[int], list[float | None], list[DraftPart]]:
    """The proposals as a trie (ids, parents, confidences, parts). Reads the drafted ids back to
    the host (one transfer per merged step; a head growing a tree has read its own)."""
    ids: list[int] = []
    parents: list[int] = []
    confidences: list[float | None] = []
    existing: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    parts = []
    for draft, seconds in proposals:
        mapped: list[int] = []
        for node, (token, parent) in enumerate(zip(to_host(draft.token_ids), draft.shape)):
            key = (mapped[parent] if parent >= 0 else -1, token)
            if key not in existing:
                existing[key] = len(ids)
                ids.append(token)
                parents.append(key[0])
                confidences.append(draft.confidences[node] if draft.confidences else None)
            mapped.append(existing[key])
        parts.append(DraftPart(draft.drafter, tuple(mapped), seconds, draft.confidences))
    return ids, parents, confidences, parts


def member_path(part: DraftPart, path: Sequence[int]) -> list[int]:
    """The accepted merged nodes `path` in a member's own numbering: as far down as they are its."""
    own = {merged: node for node, merged in enumerate(part.nodes)}
    out: list[int] = []
    for merged in path:
        if merged not in own:
            break
        out.append(own[merged])
    return out


class ChainDrafter(Drafter):
    def __init__(self, drafters: Sequence[Drafter]):
        self.drafters = list(drafters)
        self.name = "chain"
        # this step's proposers by id(): None where one proposed alone, its part of a merged tree
        self.winners: dict[int, DraftPart | None] = {}
        readers = [d for d in self.drafters if d.feature_layers]
        self.feature_layers: tuple[int, ...] = tuple(dict.fromkeys(layer for d in readers for layer in d.feature_layers))
        self.readers = [(d, [self.feature_layers.index(layer) for layer in d.feature_layers]) for d in readers]

    @property
    def draft_model(self) -> torch.nn.Module | None:
        """The first member's own draft model, if any member has one."""
        return self._model_member.draft_model if self._model_member else None

    @property
    def draft_tokenizer(self) -> object | None:
        """That member's own tokenizer, where it is not the target's."""
        return self._model_member.draft_tokenizer if self._model_member else None

    @property
    def _model_member(self) -> Drafter | None:
        return next((d for d in self.drafters if d.draft_model is not None), None)

    def reserve(self, positions: int) -> None:
        for drafter in self.drafters:
            drafter.reserve(positions)

    def warmup(self) -> None:
        for drafter in self.drafters:
            drafter.warmup()

    def follow(self, constraint: RowMatcher | None) -> None:
        for drafter in self.drafters:
            drafter.follow(constraint)

    def begin(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, noise: PositionNoise | None) -> None:
        for drafter in self.drafters:
            drafter.begin(prompt_ids, sampling, noise)
        self.winners = {}

    def take_features(self, features: torch.Tensor) -> None:
        """features [n, layers * hidden] at self.feature_layers: each reader gets its layers' columns."""
        width = features.shape[-1] // len(self.feature_layers)
        for drafter, blocks in self.readers:
            columns = features.view(features.shape[0], -1, width)[:, blocks]
            drafter.take_features(columns.reshape(features.shape[0], -1))

    def propose(self, shape: TreeSpec, budget=None) -> Draft | None:
        """The first proposal; a tentative one is merged with the next members' within shape.nodes."""
        proposals: list[tuple[Drafter, Draft, float]] = []
        room = shape.nodes
        for drafter in self.drafters:
            started = time.perf_counter()
            # each member's proposal is judged on its own (a chain's k: auto keeps per-step state)
            draft = drafter.propose(replace(shape, nodes=room), budget.fresh() if budget is not None else None)
            if draft is None or not len(draft):
                continue
            proposals.append((drafter, draft, time.perf_counter() - started))
            room -= len(draft)
            if not draft.tentative or room < 1:
                break
        if len(proposals) < 2:
            self.winners = {id(d): None for d, _, _ in proposals}
            return proposals[0][1] if proposals else None
        merged = merge_drafts([(draft, seconds) for _, draft, seconds in proposals])
        self.winners = {id(d): part for (d, _, _), part in zip(proposals, merged.parts)}
        return merged

    def accept(self, new_tokens: Sequence[int], path: Sequence[int]) -> None:
        for drafter in self.drafters:
            if id(drafter) not in self.winners:
                own: Sequence[int] = ()
            else:
                part = self.winners[id(drafter)]
                own = path if part is None else member_path(part, path)
            drafter.accept(new_tokens, own)
        self.winners = {}


def build_members(spec: DrafterSpec, context: DraftContext) -> list[Drafter]:
    """The drafters a chain (or auto) holds, each with a name of its own."""
    from . import build_drafter

    members = [build_drafter(child, context) for child in spec.drafters]
    seen: dict[str, int] = {}
    for member in members:  # statistics are kept per name: make names unique
        count = seen.get(member.name, 0)
        seen[member.name] = count + 1
        if count:
            member.name = f"{member.name}#{count + 1}"
    return members


def build(spec: DrafterSpec, context: DraftContext) -> ChainDrafter:
    return ChainDrafter(build_members(spec, context))
