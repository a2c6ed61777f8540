"""What the engine reports, in order: Prefilled, then one Verified per target forward, then Finished."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Union

if TYPE_CHECKING:
    from .stats import DecodeStats


@dataclass(frozen=True)
class Prefilled:
    prompt_tokens: int
    seconds: float


class JudgedNode(NamedTuple):
    """A drafted node the target judged (a child of the root or of an accepted node)."""

    confidence: float | None  # the draft's probability of it, where the drafter read one
    position: int  # its depth - 1
    kept: bool  # on the accepted path
    first_child: bool  # its parent's first child (a tree's main line)


@dataclass(frozen=True)
class JudgedPart:
    """One drafter's share of a merged tree's step: its nodes, its proposal's seconds, and its
    judged nodes as in Verified.judged."""

    drafter: str
    nodes: int
    seconds: float
    judged: tuple[JudgedNode, ...]
    levels: int = 0  # depths its nodes span: the draft forwards its proposal ran (0: as many as nodes)


@dataclass(frozen=True)
class Verified:
    """One step: what was drafted, how much the target kept, and what it added.

    `emitted` is what actually joined the output: drafted[:n_accepted] + [target_token], cut at
    the first EOS and at max_new_tokens (so it can be shorter than that at the very end).
    """

    drafter: str | None  # None: plain decoding, or no drafter proposed this step
    drafted: tuple[int, ...]  # the accepted path, then the drafter's first choice from where it ends
    n_accepted: int
    target_token: int  # the correction (after a rejection) or the bonus (all drafts kept)
    emitted: tuple[int, ...]
    seconds: float  # wall time of the step (draft + verify + bookkeeping)
    nodes: int = 0  # drafted tokens the target verified (a tree's nodes; len(drafted) for a chain)
    tree: bool = False  # the draft branched
    judged: tuple[JudgedNode, ...] = ()
    levels: int = 0  # depths the draft spans: the draft forwards it took (0: as many as nodes, a chain)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    parts: tuple[JudgedPart, ...] = ()  # a tree merged from several drafters' proposals: each one's share
    forced: int = 0  # of the nodes, the last ones a constraint forced (free: no drafter proposed them)
    cut: int = 0  # drafted nodes the constraint forbade, cut before the verify
    mask_seconds: float = 0.0  # the constraints' walk of the step's drafts and their masks

    @property
    def accepted(self) -> tuple[int, ...]:
        return self.drafted[: self.n_accepted]

    @property
    def rejected(self) -> tuple[int, ...]:
        return self.drafted[self.n_accepted :]

    @property
    def corrected(self) -> int | None:
        return self.target_token if self.n_accepted < len(self.drafted) else None

    @property
    def bonus(self) -> int | None:
        return self.target_token if self.n_accepted == len(self.drafted) else None


@dataclass(frozen=True)
class Finished:
    token_ids: tuple[int, ...]  # the generated ids (EOS included when it ended the text)
    # "eos" | "length" | "stop" | "cancelled" (given up: decoding.arrivals); a run cut short by
    # Ctrl-C yields no Finished at all
    finish_reason: str
    stats: "DecodeStats"


Event = Union[Prefilled, Verified, Finished]
