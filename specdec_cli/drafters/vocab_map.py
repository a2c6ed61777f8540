"""Two tokenizers' shared tokens: which token strings both vocabularies hold, and the draft's
logits moved onto the target's ids (token-level intersection, Timor et al. 2025).

Tokens are compared as the bytes they stand for, not as vocabulary strings, because the two
families spell a space differently: byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) maps every byte to
a printable character ("Ġ" is a space), SentencePiece (Llama 2, Gemma) writes a space as "▁" and
unknown bytes as "<0xNN>"; a vocabulary is read the way more of its pieces write a space. Tokens
added to a vocabulary are their text. Special tokens (BOS, EOS, chat markers) take no part: they
are never drafted, and the target adds them itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import torch

from ..errors import IncompatibleModelsError
from .heads import full_vocabulary

# a pair sharing fewer than this share of the draft's vocabulary is refused: most of what the draft
# would say could not be proposed at all
MIN_SHARED = 0.10

SPACE_MARK = "\u2581"  # SentencePiece's "▁"
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(frozen=True)
class VocabOverlap:
    """How many token strings the two vocabularies share, and what share of each that is."""

    shared: int
    draft_size: int
    target_size: int

    @property
    def draft_share(self) -> float:
        return self.shared / self.draft_size if self.draft_size else 0.0

    @property
    def target_share(self) -> float:
        return self.shared / self.target_size if self.target_size else 0.0

    def describe(self) -> str:
        return (f"{self.shared:,} tokens shared ({self.draft_share:.1%} of the draft's {self.draft_size:,}, "
                f"{self.target_share:.1%} of the target's {self.target_size:,})")


def _byte_level_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


def token_bytes(tokenizer, size: int) -> dict[int, bytes]:
    """The bytes each token id below `size` stands for, special tokens left out. Added tokens are
    their text; the vocabulary's own pieces are read as byte-level BPE or as SentencePiece, whichever
    way of writing a space ("Ġ" or "▁") more of them use."""
    added = {i: a for i, a in getattr(tokenizer, "added_tokens_decoder", {}).items() if i < size}
    special = set(tokenizer.all_special_ids) | {i for i, a in added.items() if a.special}
    literal = {i: a.content.encode("utf-8") for i, a in added.items() if i not in special}
    pieces = {i: t for i, t in enumerate(tokenizer.convert_ids_to_tokens(list(range(size))))
              if t is not None and i not in special and i not in literal}
    byte_level = _byte_level_decoder()
    space = next(c for c, b in byte_level.items() if b == ord(" "))
    if sum(space in p for p in pieces.values()) >= sum(SPACE_MARK in p for p in pieces.values()):
        spelled = {i: bytes(byte_level[c] for c in p) if set(p) <= byte_level.keys() else p.encode("utf-8")
                   for i, p in pieces.items()}
    else:
        spelled = {i: bytes([int(m.group(1), 16)]) if (m := BYTE_TOKEN.fullmatch(p)) else p.replace(SPACE_MARK, " ").encode("utf-8")
                   for i, p in pieces.items()}
    return {**spelled, **literal}


def _first_id_of(spelled: dict[int, bytes]) -> dict[bytes, int]:
    """bytes -> the id that spells them; where several do (SentencePiece's "A" and "<0x41>"), the
    lowest id, which is the one a tokenizer emits for a piece it knows."""
    out: dict[bytes, int] = {}
    for i in sorted(spelled):
        out.setdefault(spelled[i], i)
    return out


@lru_cache(maxsize=4)  # bench and tune-k build a drafter per decoder over the same two tokenizers
def shared_pairs(target_tok, draft_tok, target_size: int, draft_size: int) -> tuple[tuple[int, int], ...]:
    """(draft id, target id) of every token both spell alike, by draft id."""
    target_spelled = _first_id_of(token_bytes(target_tok, target_size))
    draft_spelled = _first_id_of(token_bytes(draft_tok, draft_size))
    return tuple(sorted((d, target_spelled[b]) for b, d in draft_spelled.items() if b in target_spelled))


class VocabMap:
    """The shared tokens as id pairs, and the draft's logits over the target's ids."""

    def __init__(self, draft_ids: torch.Tensor, target_ids: torch.Tensor, overlap: VocabOverlap):
        self.draft_ids = draft_ids  # [shared]: pair i is draft id draft_ids[i], target id target_ids[i]
        self.target_ids = target_ids
        self.overlap = overlap
        self.draft_of_target = torch.full((overlap.target_size,), -1, dtype=torch.long)
        self.draft_of_target[target_ids] = draft_ids
        # the same table on the host: committed tokens are known there, and mapping them on the
        # device would cost a device -> host read (a sync) every step
        self.host_draft_of_target = self.draft_of_target.tolist()

    def to(self, device: torch.device) -> "VocabMap":
        moved = VocabMap.__new__(VocabMap)
        moved.overlap, moved.host_draft_of_target = self.overlap, self.host_draft_of_target
        moved.draft_ids, moved.target_ids, moved.draft_of_target = (
            t.to(device) for t in (self.draft_ids, self.target_ids, self.draft_of_target))
        return moved

    def target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[rows, draft vocab] -> [rows, target vocab]: a shared token's logit at its target id,
        -inf (no mass) elsewhere, so a softmax (after any warp) is the draft's distribution
        restricted to the shared tokens and renormalised."""
        return full_vocabulary(draft_logits.index_select(-1, self.draft_ids), self.target_ids, self.overlap.target_size)

    def draft_tokens(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids that are shared tokens -> the draft's ids for them."""
        return self.draft_of_target[target_ids]

    def host_draft_tokens(self, target_ids: Sequence[int]) -> list[int]:
        """draft_tokens for ids on the host, mapped there (-1: a token the draft cannot spell)."""
        return [self.host_draft_of_target[token] for token in target_ids]


def shared_vocab(
    target_tok, draft_tok, target_size: int, draft_size: int, draft_name: str, target_name: str, minimum: float = MIN_SHARED,
) -> VocabMap:
    """The tokens both vocabularies spell alike (ids below each size); IncompatibleModelsError when
    they share under `minimum` of the draft's vocabulary."""
    pairs = shared_pairs(target_tok, draft_tok, target_size, draft_size)
    overlap = VocabOverlap(len(pairs), draft_size, target_size)
    if overlap.draft_share < minimum:
        raise IncompatibleModelsError(
            f"draft '{draft_name}' and target '{target_name}' have different tokenizers that share only "
            f"{overlap.shared} of the draft's {draft_size} tokens ({overlap.draft_share:.1%}, under "
            f"{minimum:.0%}); choose a draft whose vocabulary is closer to the target's"
        )
    draft_ids = torch.tensor([d for d, _ in pairs], dtype=torch.long)
    target_ids = torch.tensor([t for _, t in pairs], dtype=torch.long)
    return VocabMap(draft_ids, target_ids, overlap)
