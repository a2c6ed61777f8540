"""Prompt lookup: propose what followed the most recent earlier occurrence of the latest n-gram.

As a tree (shape.width > 1), the distinct continuations of up to `width` earlier matches, most
recent first, merged where they agree (a trie). No model and no probabilities: the guesses are the same at
every temperature, and each is kept where it equals the target's choice.
The search is vectorised with numpy over a growing token buffer: no Python loop over the context
per step.

In a chain, `solo_ngram` marks a guess from a match shorter than it as weak (Draft.tentative):
the chain's next drafter then proposes too, and both are verified as one tree (chain.py).

Where the process shares a lookup pool (lookup_pool.py: every sequence decoded so far, prompts and
answers), a sequence's own match is set against the pool's: the pool's is proposed where it is
longer (`ngram/pool`, so that k: auto learns how often those guesses are kept apart from the rest).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from ..primitives.sampling import PositionNoise
from ..specs import DrafterSpec, SamplingSpec, TreeSpec
from .base import Draft, DraftContext, Drafter
from .lookup_pool import LookupPool, TokenHistory


def find_continuations(
    tokens: np.ndarray, max_ngram: int, min_ngram: int, k: int, branches: int = 1
) -> tuple[list[np.ndarray], int]:
    """Up to `branches` distinct runs of up to k tokens that followed earlier matches of the
    longest suffix n-gram that has any, most recent match first, and that n-gram's length.

    n runs from max_ngram down to min_ngram; the suffix itself does not count as a match, and a
    match must be followed by at least one token. ([], 0) when nothing matches.
    """
    length = tokens.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = tokens[length - n :]
        # windows that end before the last token, so that each has a next token to propose
        windows = sliding_window_view(tokens[: length - 1], n)
        starts = np.flatnonzero((windows == suffix).all(axis=1))
        found: list[np.ndarray] = []
        for start in starts[::-1]:
            run = tokens[start + n : start + n + k]
            if not any(np.array_equal(run, seen) for seen in found):
                found.append(run)
                if len(found) == branches:
                    break
        if found:
            return found, n
    return [], 0


def find_continuation(tokens: np.ndarray, max_ngram: int, min_ngram: int, k: int) -> np.ndarray:
    """Up to k tokens that followed the most recent earlier match of the longest suffix n-gram."""
    found, _ = find_continuations(tokens, max_ngram, min_ngram, k)
    return found[0] if found else tokens[:0]


def merge_runs(runs: list[np.ndarray], max_nodes: int) -> tuple[list[int], list[int]]:
    """The runs as one tree (token ids, parents), sharing their common prefixes, at most
    `max_nodes` nodes; earlier runs first, so a node's first child is the most recent guess."""
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for run in runs:
        parent = -1
        for token in run.tolist():
            node = children.get((parent, token))
            if node is None:
                if len(tokens) == max_nodes:
                    break
                node = len(tokens)
                tokens.append(token)
                parents.append(parent)
                children[(parent, token)] = node
            parent = node
    return tokens, parents


class NgramDrafter(Drafter):
    """Prompt lookup: runs no model (draft_model None)."""

    free = True

    def __init__(
        self, context: DraftContext, max_ngram: int = 3, min_ngram: int = 1, name: str = "ngram",
        solo_ngram: int | None = None, pool: LookupPool | None = None,
    ):
        """`pool`: the sequences other requests decoded, searched too (None: this sequence alone)."""
        self.name = name
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        # in a chain, a match shorter than this is a weak guess: the next drafter adds its own tree
        self.solo_ngram = min_ngram if solo_ngram is None else solo_ngram
        self.device = context.device
        self.history = TokenHistory([])
        self.pool = pool
        self.pool_id: int | None = None  # this sequence's in the pool

    def begin(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, noise: PositionNoise | None) -> None:
        prompt = prompt_ids.tolist()
        self.history = TokenHistory(prompt)
        if self.pool is not None:
            self.pool_id = self.pool.open(prompt)

    def propose(self, shape: TreeSpec, budget=None) -> Draft | None:
        # tree: auto drafts a chain here, cut by the budget as under k: auto: with no confidence
        # of its own, every branch at a depth would be judged alike, and measured on Spec-Bench
        # extraction and summarization the extra branches never paid for their verification
        branches = 1 if shape.is_chain or shape.auto else shape.width
        history = self.history.view()
        runs, matched = find_continuations(history, self.max_ngram, self.min_ngram, shape.depth, branches)
        pooled = False
        if self.pool is not None:
            run, pool_matched = self.pool.find(history, shape.depth, shorter_than=matched)
            if len(run):
                runs = [run, *(r for r in runs if not np.array_equal(r, run))][:branches]
                matched, pooled = pool_matched, True
        if not runs:
            return None
        tentative = matched < self.solo_ngram
        # a short match's guesses are kept less often than a long one's, and the pool's
        # otherwise again: k: auto learns each apart
        name = f"{self.name}/pool" if pooled else f"{self.name}/short" if tentative else self.name
        # and they leave half the nodes to the chain's next drafter, whose guesses join them
        nodes = max(1, shape.nodes // 2) if tentative else shape.nodes
        if branches == 1:
            guess = runs[0][:nodes]
            if budget is not None:
                # no confidence of its own: the budget judges by how often each position has been kept
                length = 1
                while length < guess.shape[0] and budget.allows_more(name, None):
                    length += 1
                guess = guess[:length]
            return Draft(torch.from_numpy(guess.copy()).to(self.device), name, tentative=tentative, matched=matched)
        tokens, parents = merge_runs(runs, nodes)
        return Draft(torch.tensor(tokens, dtype=torch.long).to(self.device), name, parents=tuple(parents),
                     tentative=tentative, matched=matched)

    def accept(self, new_tokens: Sequence[int], path: Sequence[int]) -> None:
        self.history.extend(new_tokens)
        if self.pool is not None:
            self.pool.extend(self.pool_id, new_tokens)


def build(spec: DrafterSpec, context: DraftContext) -> NgramDrafter:
    options = spec.options
    pool = None
    if options.get("pool_tokens", 0) and context.lookup_pool is not None:
        pool = context.lookup_pool
        pool.limit = options["pool_tokens"]
    return NgramDrafter(context, options["max_ngram"], options["min_ngram"], solo_ngram=options.get("solo_ngram"), pool=pool)
