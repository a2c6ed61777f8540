"""The batch's LM interface over one sequence's LM: what the decoding core drives at batch size 1.

A batch of one is the ordinary case, and its steps are the ones worth the most care: so at batch
size 1 the core drives a one-sequence LM (lm.CachedLM, static.StaticLM) through this adapter, and
keeps what only a single sequence has: StaticLM's padded steps whose pads repeat the last token
(free in the int4 kernel), its eager 1-token path where that is faster, CUDA graphs per bucket, and
a cache sized for the generation ahead. A tree's nodes are written after the root and the accepted
path gathered behind it, as the batch caches do per row.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from ..primitives.tree import TreeAttention
from .lm import LM


class OneRowLM:
    """BatchedLM's interface (add_row / remove_rows / forward / keep_new / keep_columns / width)
    for at most one row, over `lm`. Its marks (`width`) are the cache's length."""

    def __init__(self, lm: LM):
        self.lm = lm
        self.model = lm.model
        self.device = lm.device
        self.rows = 0
        self.prefill_features: torch.Tensor | None = None  # the last add_row's [n, F]

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.lm.feature_layers

    def want_features(self, layers: tuple[int, ...]) -> None:
        self.lm.want_features(layers)

    @property
    def features(self) -> torch.Tensor | None:
        """The last forward's states at feature_layers [1, T, F]."""
        return None if self.lm.features is None else self.lm.features[None]

    @property
    def compile_seconds(self) -> float:
        return self.lm.compile_seconds

    @property
    def width(self) -> int:
        return self.lm.length

    def lengths(self) -> list[int]:
        return [self.lm.length] * self.rows

    def warmup(self, widths: Iterable[int]) -> float:
        """Compile ahead forwards of these widths, each keeping all its logits; seconds spent."""
        return self.lm.warmup([(n, n) for n in widths])

    def reserve(self, positions: int) -> None:
        """Room for a sequence of `positions` tokens, before the steps compile (CUDA graphs record
        the cache's buffers) and before the row joins."""
        self.lm.reserve(positions)

    def add_row(self, ids: torch.Tensor) -> None:
        """The row, holding `ids` [n] (prefilled)."""
        if self.rows:
            raise ValueError("OneRowLM holds one row: remove it first")
        self.lm.reset()
        self.lm.prefill(ids.to(self.device))
        self.prefill_features = self.lm.features if self.feature_layers and ids.numel() else None
        self.rows = 1

    def remove_rows(self, keep: Sequence[int]) -> None:
        """Keep the row (keep = [0]) or drop it (the next add_row starts the cache afresh)."""
        self.rows = len(keep)

    def forward(self, ids: torch.Tensor, real: torch.Tensor, trees: Sequence[Sequence[int] | None] | None = None,
                ) -> torch.Tensor:
        """Append ids [1, T] (all real: one row has no pads); logits [1, T, vocab]. `trees`: [None]
        or [the parents of a token tree whose root is the first token]."""
        n = ids.shape[1]
        tree = None
        if trees is not None and trees[0] is not None:
            start = self.lm.length
            tree = TreeAttention.for_nodes(start, trees[0], root_position=start, with_root=True)
        return self.lm.forward(ids[0], keep=n, tree=tree)[None]

    def keep_new(self, kept: Sequence[int], since: int) -> None:
        """Of the tokens appended since the mark `since`, keep the first kept[0]."""
        self.lm.truncate(since + kept[0])

    def keep_columns(self, columns: Sequence[Sequence[int]], since: int) -> None:
        """Of one forward's tokens from the mark `since`, keep those at the offsets columns[0] (a
        tree's root and accepted path, ascending), gathered into consecutive slots."""
        self.lm.keep_path(since, [since + offset for offset in columns[0]])
