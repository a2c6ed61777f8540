"""The drafter contract: begin(prompt) / propose(shape, budget) -> Draft / accept(new tokens, path),
and the hooks the engine calls on every drafter (no-ops unless a drafter needs them)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import torch

from ..constraints.matcher import RowMatcher
from ..primitives.sampling import PositionNoise
from ..primitives.tree import chain_parents, is_chain
from ..specs import SamplingSpec, TreeSpec

if TYPE_CHECKING:
    from .lookup_pool import LookupPool


@dataclass
class Draft:
    """Drafted nodes: ids [m] (on the target's device) and the tree's shape.

    `parents` (primitives/tree.py): each node's parent, -1 for the last committed token; None is a chain.
    `confidences`: the draft's probability of each node, where the drafter read it (k: auto and
    tree: auto learn from them), else None.
    `tentative`: a weak guess (prompt lookup from a short match): in a chain, the next drafter's
    nodes join it in one tree instead of the chain ending here.
    `parts`: a tree merged from several drafters' proposals (chain.py), who drafted which node.
    `matched`: prompt lookup's, the length of the match its guess came from (auto.py tells
    guesses from short and long matches apart by it); 0 for other drafters.
    """

    token_ids: torch.Tensor
    drafter: str
    parents: tuple[int, ...] | None = None
    confidences: tuple[float | None, ...] | None = None
    tentative: bool = False
    parts: tuple["DraftPart", ...] = ()
    matched: int = 0

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def shape(self) -> tuple[int, ...]:
        """The parents of every node, a chain's included."""
        return self.parents if self.parents is not None else chain_parents(len(self))

    @property
    def is_tree(self) -> bool:
        return self.parents is not None and not is_chain(self.parents)


@dataclass(frozen=True)
class DraftPart:
    """One drafter's share of a merged draft: `nodes[i]` is the merged node its node i became
    (two drafters' identical guesses share a node), its own confidences, and the seconds its
    proposal took."""

    drafter: str
    nodes: tuple[int, ...]
    seconds: float
    confidences: tuple[float | None, ...] | None = None


@dataclass(frozen=True)
class DraftContext:
    """What every drafter is built from."""

    target: torch.nn.Module
    tokenizer: object
    vocab: int  # ids that are real tokens; q is cut or padded to this width
    device: torch.device  # where drafted ids must end up (the target's input device)
    load_model: object  # callable(ModelSpec) -> nn.Module (quantized as it says), so drafters share the profile's loading
    load_tokenizer: object  # callable(ModelSpec) -> tokenizer
    target_name: str
    compile: str = "off"  # a draft model's steps: "on" static cache and compiled steps (lm.make_lm)
    allow_pickle: bool = False  # the profile's: pickled draft-head weights may load (weights only)
    # every sequence this process decoded, for prompt lookup across requests (drafters/lookup_pool.py)
    lookup_pool: "LookupPool | None" = None


class DraftBudget(Protocol):
    def allows_more(self, drafter: str, confidence: float | None) -> bool:
        """Given the confidence (max q, or None if the drafter has none) of the token `drafter`
        just drafted: draft another one?"""

    def fresh(self) -> "DraftBudget":
        """A budget for another drafter's proposal in the same step."""


class Drafter(ABC):
    """Every drafter derives from this: the engine calls each method below, the hooks included."""

    name: str
    # the separate draft model this drafter runs (one transformers can take as an assistant);
    # None for drafters without one of their own (prompt lookup, the target's own layers)
    draft_model: torch.nn.Module | None = None
    # that model's own tokenizer where it is not the target's (transformers then needs both:
    # tokenizer= and assistant_tokenizer=); None where the draft reads the target's tokens
    draft_tokenizer: object | None = None
    # drafters that read the target's hidden states (Medusa, EAGLE): the engine asks the target
    # for transformers' hidden_states at these layers and hands them over with take_features
    feature_layers: tuple[int, ...] = ()
    # proposing costs next to nothing (no model runs: prompt lookup): drafter: auto asks it every
    # step, and runs the others only where chosen
    free: bool = False

    @abstractmethod
    def begin(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, noise: PositionNoise | None) -> None:
        """Start a new sequence from the prompt, ids on the host (prefill a draft model's cache on its
        own device). Above temperature 0, `noise` is the target's: a drafter that ranks guesses by q
        proposes argmax(q / e) at each depth (sampling.race), the target's own choice wherever q is
        close to p."""

    @abstractmethod
    def propose(self, shape: TreeSpec, budget: "DraftBudget | None" = None) -> Draft | None:
        """Up to shape.nodes tokens that continue the committed sequence, as a chain or, where the
        drafter can and shape.width > 1, a tree; None when there is no guess.

        `budget` (k: auto, tree: auto) is asked whether drafting one more node pays.
        """

    @abstractmethod
    def accept(self, new_tokens: Sequence[int], path: Sequence[int]) -> None:
        """The tokens committed this step: first the accepted nodes `path` of this drafter's
        proposal (empty if it did not propose), then the rest: another chain member's accepted
        nodes, where their proposals were merged, and the target's own token."""

    def follow(self, constraint: RowMatcher | None) -> None:
        """Keep the next proposals' guesses within `constraint` (constraints.matcher.RowMatcher, at
        the committed text; None: free). A no-op unless the drafter can: the core cuts a draft
        where the constraint forbids it either way."""

    def reserve(self, positions: int) -> None:
        """Static caches: room for a generation of `positions` tokens (drafts included)."""

    def warmup(self) -> None:
        """Compile the drafter's steps ahead of the first generation (compile: on)."""

    def take_features(self, features: torch.Tensor) -> None:
        """The target's hidden states at `feature_layers`: after the prefill, every prompt token's
        but the last; after each verify, the root's and the accepted nodes' (never the newest
        token's: its state comes with the next forward). Called only where feature_layers is set."""
