"""A constraint walked beside one row's decoding: which tokens it allows after the committed text
and after each drafted node, which drafted nodes it forbids, and the tokens it forces next.

Masks are llguidance's bitmasks (one bit a token, [words] int32 per position), filled on the host;
allowed_tokens() turns some of them into the bool [n, V] that masks logits on their device. The
matcher moves only with committed tokens (advance); a step's walk over its drafts, and a drafter's
look at its frontier (masks_after), roll back what they consumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import UsageError
from ..specs import ConstraintSpec
from .grammars import grammar_of

ALL_ALLOWED = -1  # a bitmask word with every bit set


class GrammarVocabulary:
    """The target's tokenizer as the grammar engine reads it (about a second to build at Qwen's
    size: one per pipeline). Any of the model's EOS ids ends a complete text."""

    def __init__(self, tokenizer: object, eos_ids: frozenset[int]):
        from llguidance.hf import from_tokenizer

        try:
            self.engine = from_tokenizer(tokenizer, eos_token=sorted(eos_ids) or None)  # none: the tokenizer's
        except (ValueError, TypeError, AttributeError) as exc:  # a tokenizer whose bytes it cannot tell
            raise UsageError(f"the grammar engine cannot read this model's tokenizer ({str(exc).splitlines()[0]}): "
                             "constraints need a byte-level BPE or SentencePiece tokenizer") from None
        self.words = (self.engine.vocab_size + 31) // 32

    def matcher(self, spec: ConstraintSpec) -> "RowMatcher":
        return RowMatcher(self, grammar_of(spec), spec.origin)


@dataclass
class Walk:
    """A draft as the constraint leaves it: of the `proposed` nodes, the kept ones (old indices, in
    order) and their parents among them, the forced tokens appended after a chain, and a mask for
    the root and each node of the result [1 + nodes, words]."""

    proposed: int
    kept: list[int]
    parents: list[int]
    forced: list[int]
    masks: np.ndarray


class RowMatcher:
    """One generation's constraint. `complete`: the text so far satisfies it."""

    def __init__(self, vocabulary: GrammarVocabulary, grammar: str, origin: str = "constraint"):
        from llguidance import LLMatcher

        self.matcher = LLMatcher(vocabulary.engine, grammar, log_level=0)
        if self.matcher.is_error():  # the grammar needs what this tokenizer cannot spell
            raise UsageError(f"{origin}: {self.matcher.get_error().splitlines()[0]}")
        self.words = vocabulary.words
        self.eos = frozenset(vocabulary.engine.eos_tokens)

    def ends(self, path: Sequence[int]) -> bool:
        """Whether a drafted path ends the text (EOS): nothing can follow it."""
        return bool(path) and path[-1] in self.eos

    @property
    def complete(self) -> bool:
        return self.matcher.is_accepting() or (self.matcher.is_stopped() and not self.matcher.is_error())

    def advance(self, tokens: Sequence[int]) -> None:
        """The step's committed tokens (each was allowed: the verify masked the rest). A complete
        text (stopped) allows only EOS, which ends the row: nothing is left to take."""
        for token in tokens:
            if self.matcher.is_stopped():
                break
            self._take(token)
        self._check()

    def _take(self, token: int) -> None:
        """Consume a token the masks allowed; a refusal (the engine's limits on a grammar too complex
        for it) is an error, never a silent stop that would pass a cut text off as complete."""
        if not self.matcher.consume_token(token):
            self._check()

    def _check(self) -> None:
        if self.matcher.is_error():
            raise RuntimeError(f"the grammar engine failed on this constraint: {self.matcher.get_error()[:200]}")

    def mask(self) -> np.ndarray:
        """The tokens allowed after the committed text [words]."""
        return self._mask()

    def _mask(self) -> np.ndarray:
        row = np.empty(self.words, dtype=np.int32)
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        return row

    def masks_after(self, paths: Sequence[Sequence[int]]) -> np.ndarray:
        """The masks [len(paths), words] after each path of tokens from the committed text (a
        drafter's frontier), each read up to its first token the constraint forbids (a tree's
        lesser guesses can be; consuming one would leave the matcher in its error state for good)
        or a complete text's end. The matcher ends where it began."""
        rows = []
        for path in paths:
            taken = 0
            for token in path:
                if self.matcher.is_stopped() or self.matcher.validate_tokens([token]) != 1:
                    break
                self._take(token)
                taken += 1
            rows.append(self._mask())
            self.matcher.rollback(taken)
        return np.stack(rows)

    def walk(self, tokens: Sequence[int], parents: Sequence[int], limit: int = 0) -> Walk:
        """Drafted nodes (`tokens`, each node's parent, -1 the root; parents before children) checked
        against the constraint: a node it forbids is cut with its subtree. A chain is then extended
        with the tokens the constraint forces next, up to `limit` nodes in all (free drafts: the
        verify judges them as any other). The matcher ends where it began."""
        masks = {-1: self._mask()}  # after each kept node's path (-1: the committed text)
        paths: dict[int, list[int]] = {-1: []}
        consumed: list[int] = []  # the nodes whose tokens the matcher has taken, in order
        ended: set[int] = set()  # EOS nodes after a complete text: nothing follows them
        for node, (token, parent) in enumerate(zip(tokens, parents)):
            if parent not in masks or parent in ended or not allows(masks[parent], np.int64(token)):
                continue
            self._move_to(consumed, paths[parent], tokens)
            if self.matcher.is_stopped():  # the text is complete and `token` its EOS: a stopped matcher
                ended.add(node)  # takes EOS without recording it, so a rollback would undo one too many
                paths[node], masks[node] = paths[parent], masks[parent]
                continue
            self._take(token)
            consumed.append(node)
            paths[node] = paths[parent] + [node]
            masks[node] = self._mask()  # a complete text's mask allows only EOS
        kept = [node for node in masks if node != -1]
        position = {node: i for i, node in enumerate(kept)}
        new_parents = [position.get(parents[node], -1) for node in kept]
        forced: list[int] = []
        rows = [masks[-1]] + [masks[node] for node in kept]
        is_chain = all(parent == node - 1 for node, parent in enumerate(parents))
        if limit > len(kept) and is_chain:
            self._move_to(consumed, paths[kept[-1]] if kept else [], tokens)
            for token in self.matcher.compute_ff_tokens()[: limit - len(kept)]:
                self._take(token)
                consumed.append(-1)
                forced.append(token)
                rows.append(self._mask())
        self.matcher.rollback(len(consumed))
        return Walk(len(tokens), kept, new_parents, forced, np.stack(rows))

    def _move_to(self, consumed: list[int], path: list[int], tokens: Sequence[int]) -> None:
        """Roll the matcher back to the longest common start of what it took and `path`, then
        take the rest of `path`."""
        common = 0
        while common < min(len(consumed), len(path)) and consumed[common] == path[common]:
            common += 1
        if len(consumed) > common:
            self.matcher.rollback(len(consumed) - common)
            del consumed[common:]
        for node in path[common:]:
            self._take(tokens[node])
            consumed.append(node)


def allows(bits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Whether bitmasks [..., words] allow tokens [...] (ids past the words: no)."""
    words = bits.shape[-1]
    word = np.take_along_axis(bits, np.minimum(tokens >> 5, words - 1)[..., None], axis=-1)[..., 0]
    return ((word >> (tokens & 31)) & 1).astype(bool) & (tokens < 32 * words)


def allowed_tokens(bitmasks: np.ndarray, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bitmasks [..., words] int32 -> bool [..., vocab] on `device`: token t allowed where bit t is
    set (ids past the masks' words, a model's padded rows, are not). Unpacked on the host (numpy's
    unpackbits: 20 us a row at Qwen's vocabulary, against 130 us for torch's shifts)."""
    bits = np.unpackbits(np.ascontiguousarray(bitmasks).view(np.uint8), axis=-1, bitorder="little")
    allowed = torch.from_numpy(bits.view(np.bool_))
    width = allowed.shape[-1]
    allowed = allowed[..., :vocab] if width >= vocab else torch.nn.functional.pad(allowed, (0, vocab - width))
    return allowed.to(device, non_blocking=True)


def mask_logits(logits: torch.Tensor, bitmasks: np.ndarray) -> torch.Tensor:
    """logits [..., V] with the tokens the bitmasks [..., words] forbid at -inf."""
    return logits.masked_fill(~allowed_tokens(bitmasks, logits.shape[-1], logits.device), float("-inf"))
