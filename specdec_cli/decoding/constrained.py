"""A step's drafts under each row's constraint (structured output), and the masks its verify applies.

Before the verify, each constrained row's draft is walked by its matcher (constraints/matcher.py):
a node the constraint forbids is cut with its subtree (the verify is narrower, not wasted), and a
chain is extended with the tokens the constraint forces next (a JSON key, a closing quote), free
drafts with no drafter forward. The verify's choice at the root and after every node is then made
among the tokens the constraint allows there (masked before temperature, top-k, top-p and the
seeded choice): each token the acceptance rule keeps is the target's choice from its distribution
restricted to what the constraint allows, so the text is exactly constrained decoding's, for any
drafter, k or tree.

Masking a whole verify (151,936 logits a position) cost more than the rest of a CPU step, so the
choices are made unmasked first and made again, masked, only where the constraint forbids one: the
argmax, and the seeded race under temperature alone, over fewer tokens is the same token when the
constraint allows it (softmax keeps the ratios of the tokens left). Top-k's and top-p's cuts depend
on which tokens are left (a token past the top k of all can be in the top k of those allowed): under
either, every constrained position is chosen again, masked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import torch

from ..constraints.matcher import ALL_ALLOWED, RowMatcher, Walk, allows, mask_logits
from ..drafters.base import Draft, DraftPart
from ..primitives.device_calls import to_host, to_numpy
from ..primitives.sampling import choose
from ..specs import SamplingSpec

FORCED_DRAFTER = "forced"  # a draft of forced tokens alone (no drafter's proposal this step)
FORCED_MAX = 16  # forced tokens one step may add where its width is free (eager steps)


@dataclass
class ConstrainedStep:
    """What the constraints did to a step's drafts: per row its walk (None: unconstrained) and the
    seconds it took, and the seconds checking the verify's choices took (the batch's)."""

    walks: list[Walk | None]
    walk_seconds: list[float]
    choose_seconds: float = 0.0

    def seconds(self, b: int) -> float:
        """Row b's share of the step's constraint work: its walk, and its part of the check."""
        constrained = sum(walk is not None for walk in self.walks)
        return self.walk_seconds[b] + self.choose_seconds / max(1, constrained)

    def own_path(self, b: int, path: Sequence[int]) -> list[int]:
        """Row b's accepted nodes as its drafter numbered them (forced nodes are not its own)."""
        walk = self.walks[b]
        if walk is None:
            return list(path)
        return [walk.kept[i] for i in path if i < len(walk.kept)]

    def forced(self, b: int) -> int:
        """Forced tokens appended to row b's draft."""
        walk = self.walks[b]
        return 0 if walk is None else len(walk.forced)

    def cut(self, b: int) -> int:
        """The nodes of row b's proposal its constraint cut."""
        walk = self.walks[b]
        return 0 if walk is None else walk.proposed - len(walk.kept)

    def bitmasks(self, width: int) -> np.ndarray:
        """int32 [B, width, words]: the tokens allowed at each verify position, a bit a token (all
        on an unconstrained row and past a row's nodes)."""
        words = next(walk.masks.shape[1] for walk in self.walks if walk is not None)
        bitmasks = np.full((len(self.walks), width, words), ALL_ALLOWED, dtype=np.int32)
        for b, walk in enumerate(self.walks):
            if walk is not None:
                bitmasks[b, : len(walk.masks)] = walk.masks
        return bitmasks

    def choose(self, logits: torch.Tensor, choices: torch.Tensor, samplings: Sequence[SamplingSpec],
               noises: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """The verify's choices [B, T] made unmasked (sampling.choose_rows over `logits` [B, T, V]
        with these samplings and noise rows), as each row's constraint has them: a choice it allows
        stands; elsewhere (and everywhere on a constrained row under top-k or top-p) the choice is
        made again over the tokens it allows."""
        chosen = to_numpy(choices)  # a host read: the matchers are on the host (rows read drafts there too)
        started = time.perf_counter()
        bits = self.bitmasks(logits.shape[1])
        again = ~allows(bits, chosen)
        for b, (walk, sampling) in enumerate(zip(self.walks, samplings)):
            if walk is None:
                again[b] = False
            elif not sampling.greedy and (sampling.top_k or sampling.top_p < 1.0):
                again[b, : len(walk.masks)] = True
        if again.any():
            choices = choices.clone()
            for b in np.flatnonzero(again.any(axis=1)).tolist():
                at = np.flatnonzero(again[b])
                where = torch.from_numpy(at).to(logits.device)
                noise = None if noises[b] is None else noises[b].index_select(0, where)
                choices[b, where] = choose(mask_logits(logits[b, where], bits[b, at]), samplings[b], noise)
        self.choose_seconds += time.perf_counter() - started
        return choices


def constrain_drafts(matchers: Sequence[RowMatcher | None], drafts: Sequence[Draft | None],
                     limits: Sequence[int], device: torch.device) -> tuple[list[Draft | None], ConstrainedStep]:
    """Each constrained row's draft cut to what its constraint allows and, for a chain, extended
    with forced tokens up to its limit of nodes; unconstrained rows' drafts as they were."""
    walks: list[Walk | None] = []
    seconds: list[float] = []
    shaped: list[Draft | None] = []
    for matcher, draft, limit in zip(matchers, drafts, limits):
        started = time.perf_counter()
        if matcher is None:
            walks.append(None)
            shaped.append(draft)
        else:
            tokens = to_host(draft.token_ids) if draft is not None else []
            walks.append(matcher.walk(tokens, draft.shape if draft is not None else (), limit))
            shaped.append(_rebuilt(draft, walks[-1], device))
        seconds.append(time.perf_counter() - started)
    return shaped, ConstrainedStep(walks, seconds)


def _rebuilt(draft: Draft | None, walk: Walk, device: torch.device) -> Draft | None:
    """The draft of the walk's kept nodes and forced tokens (None where nothing is left)."""
    if not walk.kept and not walk.forced:
        return None
    if draft is not None and len(walk.kept) == len(draft) and not walk.forced:
        return draft
    forced = torch.tensor(walk.forced, dtype=torch.long, device=device)
    if draft is None:
        return Draft(forced, FORCED_DRAFTER)
    kept = torch.tensor(walk.kept, dtype=torch.long, device=draft.token_ids.device)
    ids = torch.cat([draft.token_ids.index_select(0, kept), forced.to(draft.token_ids.device)])
    confidences = None
    if draft.confidences is not None:
        confidences = tuple(draft.confidences[node] for node in walk.kept) + (None,) * len(walk.forced)
    parents = None if draft.parents is None or walk.forced else tuple(walk.parents)
    position = {node: i for i, node in enumerate(walk.kept)}
    return replace(draft, token_ids=ids, parents=parents, confidences=confidences,
                   parts=tuple(_part_kept(part, position) for part in draft.parts))


def _part_kept(part: DraftPart, position: dict[int, int]) -> DraftPart:
    """A merged draft's part, keeping the nodes the constraint kept (renumbered)."""
    own = [i for i, node in enumerate(part.nodes) if node in position]
    confidences = None if part.confidences is None else tuple(part.confidences[i] for i in own)
    return replace(part, nodes=tuple(position[part.nodes[i]] for i in own), confidences=confidences)
