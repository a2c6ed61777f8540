"""How each draft model of a profile pairs its tokens with the target's (drafter.vocab), read from
the two tokenizers and configs alone, no weights: the rule `auto` comes to and the shared tokens,
counted by the same function the drafter uses (vocab_map.shared_vocab). For `profiles show`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from ..errors import ModelLoadError, SpecdecError, first_line
from ..models.gguf import converted_gguf_folder, gguf_path
from ..models.loading import LoadOptions, load_tokenizer
from ..models.properties import declared_vocabulary_size
from ..models.sources import is_local_reference
from ..specs import DrafterSpec, ModelSpec, Profile
from .model_choice import resolve_vocab
from .vocab_map import VocabOverlap, shared_vocab


@dataclass(frozen=True)
class VocabPairing:
    """One draft model's pairing: `vocab` as configured, `rule` what it comes to, and the overlap;
    where the tokenizers could not be read, `rule` and `overlap` are None and `unknown` says why."""

    drafter: str  # where in the profile: "drafter", or "drafter.drafters[i]" in a chain
    model: str
    vocab: str
    rule: str | None = None
    overlap: VocabOverlap | None = None
    unknown: str | None = None

    def to_dict(self) -> dict[str, Any]:
        overlap = self.overlap
        return {
            "drafter": self.drafter, "model": self.model, "vocab": self.vocab, "rule": self.rule,
            "shared": overlap.shared if overlap else None,
            "draft_size": overlap.draft_size if overlap else None,
            "target_size": overlap.target_size if overlap else None,
            "draft_share": overlap.draft_share if overlap else None,
            "target_share": overlap.target_share if overlap else None,
            "unknown": self.unknown,
        }


def vocab_pairings(profile: Profile) -> list[VocabPairing]:
    """A pairing for each draft model whose vocab is not `shared` (that one is checked at load)."""
    options = LoadOptions(device=torch.device("cpu"), trust_remote_code=profile.trust_remote_code,
                          allow_pickle=profile.allow_pickle)
    found = profile.drafter.paired_drafters()
    if not found:
        return []
    try:
        target_tok, target_size = read_vocabulary(profile.target, options)
    except SpecdecError as exc:
        return [VocabPairing(where, spec.model.model, spec.vocab, unknown=first_line(exc)) for where, spec in found]
    return [pairing(where, spec, profile, options, target_tok, target_size) for where, spec in found]


def read_vocabulary(spec: ModelSpec, options: LoadOptions) -> tuple[object, int]:
    """The tokenizer and the count of real token ids, without the weights."""
    if spec.gguf_file:
        spec = converted_gguf(spec)
    tokenizer = load_tokenizer(spec, options)
    return tokenizer, declared_vocabulary_size(spec, options, tokenizer)


def converted_gguf(spec: ModelSpec) -> ModelSpec:
    """A GGUF model's tokenizer is read from the copy the first load converts (gguf.convert_gguf:
    converting is the whole model, not cheap); before that run, the overlap is unknown."""
    folder = converted_gguf_folder(gguf_path(spec, {})) if is_local_reference(spec.model) else None
    if folder is None or not (folder / "tokenizer_config.json").is_file():
        raise ModelLoadError(f"'{spec.model}' is a GGUF file, whose tokenizer is read when the model first loads "
                             "(converted once); after a first `specdec generate`, this shows the overlap")
    return replace(spec, model=str(folder), gguf_file=None, revision=None)


def pairing(where: str, spec: DrafterSpec, profile: Profile, options: LoadOptions, target_tok, target_size: int) -> VocabPairing:
    vocab = spec.vocab
    try:
        draft_tok, draft_size = read_vocabulary(spec.model, options)
    except SpecdecError as exc:
        return VocabPairing(where, spec.model.model, vocab, unknown=first_line(exc))
    rule = resolve_vocab(vocab, target_tok, draft_tok, profile.target.model, spec.model.model)
    overlap = shared_vocab(target_tok, draft_tok, target_size, draft_size, spec.model.model, profile.target.model, minimum=0.0).overlap
    return VocabPairing(where, spec.model.model, vocab, rule, overlap)
