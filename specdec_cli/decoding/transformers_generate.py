"""transformers' own generate() over a loaded target: the reference the engine's output is checked
against (verify, the tests), the baseline bench times beside it (hf-plain, hf-assisted), and the
target's answers that train-draft distils (in batches)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from ..models.properties import input_device
from .stack_room import with_stack_room


class LoadedTarget(Protocol):
    """What these functions read of a loaded pipeline (api.Pipeline is one)."""

    target: torch.nn.Module
    tokenizer: Any
    eos_ids: frozenset[int]


def pad_token_id(loaded: LoadedTarget) -> int:
    """What generate pads with: the tokenizer's pad token, else the smallest EOS id."""
    pad = loaded.tokenizer.pad_token_id
    return pad if pad is not None else min(loaded.eos_ids)


def transformers_generate(loaded: LoadedTarget, ids: list[int], max_new_tokens: int,
                          model: torch.nn.Module | None = None, **generate_kwargs: Any) -> tuple[int, ...]:
    """The target's own continuation of `ids` by generate(), greedy unless `generate_kwargs` say
    otherwise, ending at its first EOS (included). `model`: another model with the target's
    tokenizer in its place (the unquantized target)."""
    return transformers_generate_batch(loaded, [ids], max_new_tokens, model, **generate_kwargs)[0]


def transformers_generate_batch(loaded: LoadedTarget, prompts: list[list[int]], max_new_tokens: int,
                                model: torch.nn.Module | None = None, **generate_kwargs: Any) -> list[tuple[int, ...]]:
    """transformers_generate for several prompts in one batch (left-padded, masked); each
    continuation ends at its first EOS. In float32 each equals its unbatched one; in bf16 the
    batch's other matmul shapes can flip a near-tie."""
    model = model or loaded.target
    pad = pad_token_id(loaded)
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, width - len(ids):] = 1
    device = input_device(model)
    settings = {"do_sample": False, **generate_kwargs}
    with torch.inference_mode():  # on a fresh frame-stack chunk, as our own steps run (stack_room.py)
        out = with_stack_room(
            model.generate,
            input_ids.to(device), attention_mask=attention_mask.to(device), max_new_tokens=max_new_tokens,
            eos_token_id=sorted(loaded.eos_ids), pad_token_id=pad, **settings,
        )
    answers = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, token in enumerate(row) if token in loaded.eos_ids), len(row))
        answers.append(tuple(row[:end]))
    return answers
