"""Drafter kind `model`: which rule pairs the draft's tokens with the target's (`vocab`).

shared: the target's tokenizer (model.py); intersect or text: another tokenizer (other_vocab.py);
auto: shared where the tokenizers match, else intersect.
"""

from __future__ import annotations

from ..errors import IncompatibleModelsError
from ..models.loading import check_tokenizers_match
from ..specs import DrafterSpec
from . import model, other_vocab
from .base import DraftContext, Drafter


def build(spec: DrafterSpec, context: DraftContext) -> Drafter:
    vocab = spec.options.get("vocab", "auto")
    draft_tokenizer = context.load_tokenizer(spec.model)
    if vocab == "auto":
        try:
            check_tokenizers_match(context.tokenizer, draft_tokenizer, context.target_name, spec.model.model)
            vocab = "shared"
        except IncompatibleModelsError:
            vocab = "intersect"
    if vocab == "shared":
        return model.build(spec, context)
    return other_vocab.build(spec, context, draft_tokenizer, vocab)
