"""Prompt lookup across requests: one pool of every sequence a process has decoded (prompts and
answers, those still running included), searched by n-gram.

In a batch job from one template, an agent loop or a server, answers repeat across requests: the
second request's answer often continues the way the first one's did. Each prompt lookup drafter
(ngram.py) writes its sequence here as it grows and, where its own sequence has no match as long as
the pool's, proposes what followed the pool's latest match (vLLM's `suffix` method and llama.cpp's
ngram-mod pool do the same). The pool is bounded: past `limit` tokens the oldest sequences leave.

An index maps each n-gram (n in NGRAMS) to where its latest occurrence was followed by a token;
an entry is written only once that token exists, so a hit always has a continuation. A sequence
that leaves takes its entries with it (those no later occurrence has overwritten).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np

NGRAMS = (4, 3, 2)  # longest first: a longer match is the more specific guess
DEFAULT_LIMIT = 100_000  # tokens (prompts and answers); the index costs ~100 bytes a token per n
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # a 64-bit odd constant: n-grams hash by a polynomial in it


def _hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """The hash of every n-gram of `tokens` in order (uint64, wrapping). Two n-grams may share a
    hash: a hit is checked against the tokens before it is used."""
    windows = np.lib.stride_tricks.sliding_window_view(tokens.astype(np.uint64), n)
    hashes = np.full(windows.shape[0], n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in range(n):
            hashes = hashes * _MULTIPLIER + windows[:, column]
    return hashes


class TokenHistory:
    """The committed token ids in a numpy buffer that grows by doubling."""

    def __init__(self, ids: Sequence[int]):
        self.buffer = np.zeros(max(64, 2 * len(ids)), dtype=np.int64)
        self.size = 0
        self.extend(ids)

    def extend(self, ids: Sequence[int]) -> None:
        needed = self.size + len(ids)
        if needed > self.buffer.shape[0]:
            grown = np.zeros(2 * needed, dtype=np.int64)
            grown[: self.size] = self.buffer[: self.size]
            self.buffer = grown
        self.buffer[self.size : needed] = ids
        self.size = needed

    def view(self) -> np.ndarray:
        return self.buffer[: self.size]


class LookupPool:
    """Sequences by id, oldest first; `index`: n-gram hash -> where its latest occurrence's
    continuation starts (sequence id << 32 | position)."""

    def __init__(self, limit: int = DEFAULT_LIMIT):
        self.limit = limit
        self.sequences: OrderedDict[int, TokenHistory] = OrderedDict()  # each one's tokens so far
        self.index: dict[int, int] = {}
        self.tokens = 0
        self._next_id = 0

    def clear(self) -> None:
        """Forget every sequence (bench does before each measured generation, so that none reads
        an earlier repeat's answer)."""
        self.sequences.clear()
        self.index.clear()
        self.tokens = 0

    def open(self, prompt: Sequence[int]) -> int:
        """A new sequence starting with `prompt`; its id, for extend()."""
        sequence_id, self._next_id = self._next_id, self._next_id + 1
        self.sequences[sequence_id] = TokenHistory([])
        self.extend(sequence_id, prompt)
        return sequence_id

    def extend(self, sequence_id: int, tokens: Sequence[int]) -> None:
        """Tokens committed to a sequence (ignored where it has left the pool)."""
        history = self.sequences.get(sequence_id)
        if history is None or not len(tokens):
            return
        start = history.size
        history.extend(tokens)
        sequence = history.view()
        self.tokens += len(tokens)
        for n in NGRAMS:
            first = max(start, n)  # the first position whose n tokens before it exist
            if first < sequence.shape[0]:
                hashes = _hashes(sequence[first - n : -1], n)
                self.index.update(zip(hashes.tolist(), range(sequence_id << 32 | first, sequence_id << 32 | sequence.shape[0])))
        while self.tokens > self.limit and len(self.sequences) > 1:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        sequence_id, history = self.sequences.popitem(last=False)
        sequence = history.view()
        self.tokens -= sequence.shape[0]
        for n in NGRAMS:
            if sequence.shape[0] > n:
                for position, key in enumerate(_hashes(sequence[:-1], n).tolist(), start=n):
                    if self.index.get(key) == sequence_id << 32 | position:
                        del self.index[key]

    def find(self, suffix: np.ndarray, k: int, shorter_than: int) -> tuple[np.ndarray, int]:
        """Up to k tokens that followed the latest occurrence of the longest n-gram ending
        `suffix` that is longer than `shorter_than` (what the asker found alone), and its length;
        (empty, 0) where none is."""
        for n in NGRAMS:
            if n <= shorter_than or n > suffix.shape[0]:
                continue
            tail = suffix[-n:]
            hit = self.index.get(int(_hashes(tail, n)[0]))
            if hit is None:
                continue
            sequence = self.sequences[hit >> 32].view()
            position = hit & 0xFFFFFFFF
            if np.array_equal(sequence[position - n : position], tail):  # not another n-gram of the same hash
                return sequence[position : position + k], n
        return suffix[:0], 0
