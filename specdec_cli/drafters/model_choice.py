"""Drafter kind `model`: which rule pairs the draft's tokens with the target's (`vocab`).

shared: the target's tokenizer (model.py); intersect or text: another tokenizer (other_vocab.py);
auto: shared where the tokenizers match, else intersect.
"""

from __future__ import annotations

from ..errors import IncompatibleModelsError
from ..models.pair_checks import check_tokenizers_match
from ..specs import DrafterSpec
from . import model, other_vocab
from .base import DraftContext, Drafter


def resolve_vocab(vocab: str, target_tok, draft_tok, target_name: str, draft_name: str) -> str:
    """The rule `vocab` comes to: auto is shared where the tokenizers match, else intersect."""
    if vocab != "auto":
        return vocab
    try:
        check_tokenizers_match(target_tok, draft_tok, target_name, draft_name)
        return "shared"
    except IncompatibleModelsError:
        return "intersect"


def build(spec: DrafterSpec, context: DraftContext) -> Drafter:
    draft_tokenizer = context.load_tokenizer(spec.model)
    vocab = resolve_vocab(spec.vocab, context.tokenizer, draft_tokenizer, context.target_name, spec.model.model)
    if vocab == "shared":
        return model.build(spec, context)
    return other_vocab.build(spec, context, draft_tokenizer, vocab)
