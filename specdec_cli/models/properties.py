"""What a loaded model and its tokenizer say about themselves: where inputs go, the context length,
the ids that end a generation, the vocabulary's real size (read from the config alone too)."""

from __future__ import annotations

import torch

from ..errors import ModelLoadError, first_line
from ..specs import ModelSpec
from .loading import LoadOptions, resolve_source


def input_device(model: torch.nn.Module) -> torch.device:
    """Where input ids must go: the embedding's device (differs from the head's under device_map)."""
    return model.get_input_embeddings().weight.device


def context_length(model: torch.nn.Module) -> int | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def eos_token_ids(model: torch.nn.Module, tokenizer) -> frozenset[int]:
    """Every id that ends a generation: the generation config's (an int or a list) and the tokenizer's."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def real_tokens(width: int, tokenizer) -> int:
    """Ids that are real tokens: a logits width, cut to the tokenizer's size (padded rows are not tokens)."""
    return min(width, len(tokenizer))


def vocabulary_size(model: torch.nn.Module, tokenizer) -> int:
    """Ids that are real tokens of a loaded model (real_tokens of its logits' width)."""
    return real_tokens(model.get_output_embeddings().out_features, tokenizer)


def declared_vocabulary_size(spec: ModelSpec, options: LoadOptions, tokenizer) -> int:
    """vocabulary_size without loading the weights: the config's vocab_size (the width of the
    logits) cut to the tokenizer's size; the tokenizer's size where the config names none."""
    from transformers import AutoConfig

    source, access = resolve_source(spec, options)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=options.trust_remote_code, **access)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot read the config of '{spec.model}': {first_line(exc)}") from exc
    width = getattr(config.get_text_config(), "vocab_size", None)
    return real_tokens(width, tokenizer) if isinstance(width, int) and width > 0 else len(tokenizer)
