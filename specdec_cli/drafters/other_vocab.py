"""A draft model with another tokenizer (drafter.vocab: intersect or text).

The draft reads the committed text in its own tokens: the target's committed ids decoded (special
tokens dropped) and encoded with the draft's tokenizer. A new token can change how the text's end
is encoded (a merge), so after each step the text is encoded again, the draft's cache is cut back
to where the old and new encodings part (the longest common prefix) and only the rest is fed, with
the next proposal's first forward. Encoding the whole text each step costs well under a
millisecond for a few thousand tokens (the tokenizers are Rust).

Two ways to carry a guess over to the target's ids (Timor et al. 2025, "Lossless Speculative
Decoding for Heterogeneous Vocabularies"):
- intersect (TLI): the draft's distribution restricted to the tokens both vocabularies spell alike
  (vocab_map.py), renormalised, placed at the target's ids; chains and trees grow from it as from a
  same-tokenizer draft, above temperature 0 too.
- text (SLEM): the draft drafts greedily in its own tokens; its text is encoded with the target's
  tokenizer and those tokens are proposed as a chain (greedy only).
Either way the target verifies by its own choice at each position (decoding/acceptance.py): the
text is the target's whatever the draft proposed.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from dataclasses import replace
from typing import Sequence

import torch

from ..constraints.matcher import RowMatcher
from ..errors import UsageError
from ..models.properties import context_length, vocabulary_size
from ..primitives.device_calls import to_host
from ..primitives.sampling import PositionNoise
from ..runtime.lm import make_lm
from ..specs import DrafterSpec, SamplingSpec, TreeSpec
from .base import Draft, DraftContext
from .growth import Level
from .model import ModelDrafter
from .vocab_map import MIN_SHARED, VocabMap, shared_vocab

log = logging.getLogger("specdec")

# decoded as written: no spaces tidied away, so that encoding it again gives back the same text
DECODE = {"clean_up_tokenization_spaces": False}
# the draft's last tokens decoded before and after its guesses: their difference is its new text
TEXT_WINDOW = 8


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class OtherVocabDrafter(ModelDrafter):
    """A draft model over its own vocabulary, whose cache holds the committed text's encoding in
    draft tokens: `encoding` is that encoding; the cache holds its first `lm.length` tokens (plus, while
    a proposal is out, the drafts it fed) and `pending` the rest."""

    rule: str  # the drafter.vocab it implements

    def follow(self, constraint: RowMatcher | None) -> None:
        pass  # it draws in its own vocabulary, the constraint reads the target's: the core cuts its drafts

    def __init__(self, model: torch.nn.Module, context: DraftContext, draft_tokenizer, mapping: VocabMap):
        draft_vocab = mapping.overlap.draft_size
        # named by its rule (model:intersect, model:text): statistics and messages say which one ran
        super().__init__(model, context, name=f"model:{self.rule}", lm=make_lm(model, draft_vocab, context.compile))
        self.target_tokenizer, self.draft_tokenizer = context.tokenizer, draft_tokenizer
        self.map = mapping.to(self.lm.device)
        self.overlap = mapping.overlap  # shown by -v; bench and `profiles show` can print it
        self.room = context_length(model)  # the draft's context, in draft tokens
        self.target_ids: list[int] = []  # the committed sequence in target ids
        self.encoding: list[int] = []

    def encode(self, target_ids: list[int]) -> list[int]:
        """The committed text in draft tokens (the draft's own BOS first, where its tokenizer adds one)."""
        text = self.target_tokenizer.decode(target_ids, skip_special_tokens=True, **DECODE)
        return self.draft_tokenizer.encode(text, add_special_tokens=True)

    def begin(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, noise: PositionNoise | None) -> None:
        self.sampling, self.noise = sampling, noise
        self.target_ids = prompt_ids.tolist()
        self.encoding = self.encode(self.target_ids)
        self.lm.reset()
        keep = max(0, len(self.encoding) - 1)  # the last token waits for the first proposal
        self.lm.prefill(torch.tensor(self.encoding[:keep], dtype=torch.long, device=self.lm.device))
        self._cut_to(keep)
        self.slot_of = None

    def _cut_to(self, keep: int) -> None:
        """Keep the first `keep` tokens of `encoding` in the cache; the rest waits in `pending`."""
        self.lm.truncate(keep)
        self.pending = torch.tensor(self.encoding[keep:], dtype=torch.long, device=self.lm.device)
        self.committed = len(self.target_ids)

    def propose(self, shape: TreeSpec, budget=None) -> Draft | None:
        """None where the committed text has no draft tokens yet, or where the draft's own context
        (counted in its tokens, which can outnumber the target's) has no room for a proposal."""
        if not self.pending.numel() or self.room is not None and len(self.encoding) + shape.depth > self.room:
            return None
        return super().propose(shape, budget)

    def accept(self, new_tokens: Sequence[int], path: Sequence[int]) -> None:
        """Encode the committed text again; the cache keeps what it holds of the new encoding (the
        drafts it fed included, where the text spells them the same way) and reads the rest later."""
        self.target_ids.extend(new_tokens)
        if self.slot_of is None:  # no proposal this step
            cached = self.encoding[: self.lm.length]
        else:
            cached = self.encoding[: self.base] + self._fed_drafts(new_tokens, path)
        self.encoding = self.encode(self.target_ids)
        self._cut_to(max(0, min(common_prefix(cached, self.encoding), len(self.encoding) - 1)))
        self.slot_of = None

    @abstractmethod
    def _fed_drafts(self, new_tokens: Sequence[int], path: Sequence[int]) -> list[int]:
        """The draft tokens the cache holds after the committed part, in order, once this step's
        proposal is settled (what is cut from there on is rejected or re-encoded)."""


class IntersectDrafter(OtherVocabDrafter):
    """Token-level intersection: q is the draft's distribution over the shared tokens, at the target's ids."""

    rule = "intersect"

    def _scores(self, logits: torch.Tensor) -> torch.Tensor:
        return self.map.target_logits(logits)

    def _forward_nodes(self, levels: list[Level], nodes: list[int], ids: torch.Tensor, tree) -> torch.Tensor:
        """Drafted nodes are target ids of shared tokens, fed as the draft's ids for them. A tree can
        hold a child q gives no mass (top-k of fewer tokens than its width), maybe a token the draft
        cannot spell (draft id -1): it is fed as id 0, and cut when the text is encoded again."""
        draft_ids = self.map.draft_tokens(ids.to(self.lm.device)).clamp_min(0)
        return self._scores(self.lm.forward(draft_ids, keep=len(nodes), tree=tree))

    def _fed_drafts(self, new_tokens: Sequence[int], path: Sequence[int]) -> list[int]:
        """The accepted nodes the draft has fed, moved next to the committed part (a tree's path);
        one it could not spell is -1, which no encoding holds, so the cache is cut before it."""
        fed = [self.slot_of[node] for node in path if node in self.slot_of]
        self.lm.keep_path(self.base, fed)
        return self.map.host_draft_tokens(new_tokens[: len(fed)])


class TextDrafter(OtherVocabDrafter):
    """String-level exact match: a greedy chain in draft tokens, proposed as the target's tokens
    for the same text. A tree shape gets a chain (a proposal may be narrower than its shape)."""

    rule = "text"

    def begin(self, prompt_ids: torch.Tensor, sampling: SamplingSpec, noise: PositionNoise | None) -> None:
        if not sampling.greedy:
            raise UsageError(
                "drafter.vocab: text drafts at temperature 0 only; use vocab: intersect (or auto) to sample"
            )
        super().begin(prompt_ids, sampling, noise)
        self.drafted: list[int] = []

    def propose(self, shape: TreeSpec, budget=None) -> Draft | None:
        """Up to shape.depth draft tokens, greedily; their text in target tokens, as many as the shape holds."""
        draft = super().propose(replace(shape, nodes=shape.depth, width=1), budget)
        self.drafted = to_host(draft.token_ids) if draft is not None else []
        ids = self.target_tokens(self.drafted)[: min(shape.nodes, shape.depth)]
        if not ids:
            return None
        return Draft(torch.tensor(ids, dtype=torch.long, device=self.out_device), self.name)

    def target_tokens(self, drafted: list[int]) -> list[int]:
        """The target's tokens for the text `drafted` adds: encoded after the last committed target
        token's text, so the target's tokenizer sees where the word began; where that encoding
        rewrites the committed token (the text merges across it), the new text is encoded alone."""
        if not drafted:
            return []
        window = self.encoding[-TEXT_WINDOW:]
        before = self.draft_tokenizer.decode(window, skip_special_tokens=True, **DECODE)
        after = self.draft_tokenizer.decode(window + drafted, skip_special_tokens=True, **DECODE)
        # a draft token that ends mid-character decodes to U+FFFD: not text the target would write
        text = after[len(before):].rstrip("\ufffd") if after.startswith(before) else ""
        if not text:
            return []
        anchor = self.target_ids[-1:]
        anchored = self.target_tokenizer.encode(self.target_tokenizer.decode(anchor, **DECODE) + text, add_special_tokens=False)
        if anchored[: len(anchor)] == anchor:
            return anchored[len(anchor):]
        return self.target_tokenizer.encode(text, add_special_tokens=False)

    def _fed_drafts(self, new_tokens: Sequence[int], path: Sequence[int]) -> list[int]:
        """The chain's drafts the draft fed, in its own tokens, in order after the committed part."""
        return self.drafted[: self.lm.length - self.base]


RULES = {cls.rule: cls for cls in (IntersectDrafter, TextDrafter)}


def build(spec: DrafterSpec, context: DraftContext, draft_tokenizer, mode: str) -> OtherVocabDrafter:
    """The drafter for `mode` (intersect or text) over a draft whose tokenizer is not the target's.
    The shared tokens are measured here; under MIN_SHARED of the draft's vocabulary intersect is
    refused (text drafts whole strings: it needs no shared tokens)."""
    model = context.load_model(spec.model)
    mapping = shared_vocab(
        context.tokenizer, draft_tokenizer, context.vocab, vocabulary_size(model, draft_tokenizer),
        spec.model.model, context.target_name, minimum=MIN_SHARED if mode == "intersect" else 0.0,
    )
    log.info("draft vocabulary (%s, vocab: %s): %s", spec.model.model, mode, mapping.overlap.describe())
    return RULES[mode](model, context, draft_tokenizer, mapping)
