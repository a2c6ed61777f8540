"""How far a quantized target's greedy text is from its unquantized model's. Quantization changes
the target (speculation never does), so a bench of a quantized target also says what the fewer
bytes cost in quality: the share of identical tokens and where each text first differs."""

from __future__ import annotations

import gc
import statistics
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from ..decoding.transformers_generate import transformers_generate
from ..kernels.quantize import quantization_of
from ..models.devices import dtype_name
from ..models.loading import load_model

if TYPE_CHECKING:
    from ..api import Pipeline


def compare_tokens(reference: Sequence[int], other: Sequence[int]) -> tuple[int, int, int | None]:
    """(positions equal, positions compared: the longer text's length, first differing position or None)."""
    equal = sum(a == b for a, b in zip(reference, other))
    first = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
    if first is None and len(reference) != len(other):
        first = min(len(reference), len(other))
    return equal, max(len(reference), len(other)), first


def quantization_drift(pipeline: "Pipeline", prompts: Sequence[list[int]], quantized: Sequence[Sequence[int]],
                       max_new_tokens: int) -> dict[str, Any] | None:
    """Greedy continuations of `prompts` by the unquantized target (transformers' generate, loaded
    once more and freed after) against `quantized`, the quantized target's; None if the target is
    not quantized."""
    spec = pipeline.profile.target
    if spec.quantize == "none":
        return None
    reference_model = load_model(replace(spec, quantize="none", group_size=None, quantize_head=False), pipeline.options)
    try:
        reference_dtype = dtype_name(reference_model.dtype)
        references = [transformers_generate(pipeline, ids, max_new_tokens, model=reference_model) for ids in prompts]
    finally:
        del reference_model
        gc.collect()
    compared = [compare_tokens(ref, got) for ref, got in zip(references, quantized)]
    firsts = [first for _, _, first in compared if first is not None]
    return {
        "quantization": quantization_of(pipeline.target),
        "reference": f"unquantized, {reference_dtype}",
        "prompts": len(compared),
        "identical_prompts": sum(first is None for _, _, first in compared),
        "identical_token_share": sum(e for e, _, _ in compared) / max(1, sum(n for _, n, _ in compared)),
        "first_differences": [first for _, _, first in compared],
        "median_first_difference": statistics.median(firsts) if firsts else None,
    }
