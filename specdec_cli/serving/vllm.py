"""vLLM: `vllm serve MODEL --speculative-config JSON` (draft_model, ngram, eagle, eagle3), a draft with
another tokenizer as draft_model with use_heterogeneous_vocab."""

from __future__ import annotations

import json
from typing import Any

from ..specs import Profile
from .common import (
    GPU_ONLY,
    EngineInfo,
    Export,
    common_not_carried,
    cuda_env,
    gguf_from_hub,
    header_lines,
    k_table_setting,
    quantize_notes,
    request_note,
    shell_command,
)
from .k_choice import KChoice
from .refs import model_ref
from .selection import MEDUSA_NEXT, head_notes, other_vocab, select_drafters

INFO = EngineInfo(
    "vllm", "vLLM", "vLLM 0.33",
    "docs.vllm.ai features/speculative_decoding: configuration.md (--speculative-config keys), draft_model.md, n_gram.md",
)

SCHEDULE_SOURCE = ("vLLM PR #32374: vllm/config/speculative.py, vllm/v1/spec_decode/dynamic/utils.py "
                   "(validate_and_normalize_dynamic_sd_schedule)")


# read in the vLLM 0.25.0 and 0.33.0 source releases (0.24.0 has no such key)
HETEROGENEOUS_SOURCE = (
    "drafter vocab: intersect as use_heterogeneous_vocab, vLLM 0.25.0 and later (vllm/config/speculative.py: "
    "method draft_model only, greedy drafting only; vllm/v1/spec_decode/vocab_mapping.py: vLLM intersects the token "
    "strings itself, the space mark normalised, where specdec compares the bytes tokens stand for)")


def build(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    k = k_choice.k
    title = INFO.title
    target = model_ref(profile.target)
    chosen = select_drafters(profile.drafter, INFO, {
        "early-exit": "vLLM has no early-exit (layer-skip) drafter",
        "model-gguf": "vLLM cannot run a GGUF draft model",
        "model-text": ("vLLM drafts with another tokenizer by token-level intersection only (use_heterogeneous_vocab), "
                       "not by text: set drafter vocab: intersect"),
        "medusa": ("vLLM's medusa method loads only its own converted layout (blocks.{h}.layers.{l}.*, lm_heads.{h}.*) "
                   "and skips other tensor names without a word, so these heads would draft untrained: convert "
                   "medusa_lm_head.safetensors to that layout first, " + MEDUSA_NEXT),
    })
    not_carried = chosen.not_carried + common_not_carried(profile, INFO, k_choice, k_table_carried=True)
    spec: dict[str, Any]
    eagle_source: list[str] = []
    vocab_source: list[str] = []
    if chosen.eagle is not None:
        # EAGLE heads draft with the target's own tensor parallelism: no draft_tensor_parallel_size
        spec = {"method": chosen.eagle.kind, "model": chosen.eagle.ref.name, "num_speculative_tokens": k}
        eagle_source = [f"method {chosen.eagle.kind}: docs.vllm.ai features/speculative_decoding eagle.md"]
    elif chosen.model is not None:
        draft = model_ref(chosen.model.model)
        spec = {"method": "draft_model", "model": draft.path, "num_speculative_tokens": k}
        if draft.spec.revision:
            spec["revision"] = draft.spec.revision
        if gpus > 1:
            spec["draft_tensor_parallel_size"] = 1
        if draft.spec.dtype != profile.target.dtype:
            not_carried.append(f"drafter dtype {draft.spec.dtype} (vLLM runs the draft in the target's dtype)")
        if other_vocab(chosen.model):  # intersect: text was refused above
            spec["use_heterogeneous_vocab"] = True
            vocab_source = [HETEROGENEOUS_SOURCE]
            not_carried += heterogeneous_notes(profile, draft.spec.revision)
    else:
        ngram = chosen.ngram
        spec = {"method": "ngram", "num_speculative_tokens": k,
                "prompt_lookup_min": ngram.options["min_ngram"], "prompt_lookup_max": ngram.options["max_ngram"]}
    not_carried += quantize_notes(
        profile, INFO, chosen.model.model if chosen.model is not None else None,
        "serve a checkpoint quantized ahead as the model (torchao-serialized: transformers' TorchAoConfig, then "
        "save_pretrained; or AWQ / GPTQ)",
        "give a draft checkpoint quantized ahead (AWQ / GPTQ) as the draft model, its method as \"quantization\" "
        "in --speculative-config")
    if profile.k_by_batch_size:
        spec["num_speculative_tokens_per_batch_size"] = batch_schedule(profile.k_by_batch_size, k)
        # vLLM caps each entry at num_speculative_tokens: it must be the table's largest k
        spec["num_speculative_tokens"] = max(k, *(entry[2] for entry in spec["num_speculative_tokens_per_batch_size"]))
    config: dict[str, Any] = {"model": target.path}
    options: list[tuple[str, Any]] = []
    notes = []
    if target.spec.gguf_file:
        if not target.local:
            raise gguf_from_hub(title, target)
        notes.append("GGUF needs vLLM's GGUF plugin (pip install vllm-gguf-plugin); add --tokenizer <the original "
                     "hub repo> to skip its slow tokenizer conversion")
    if target.spec.revision:
        options.append(("--revision", target.spec.revision))
        config["revision"] = target.spec.revision
    if target.spec.dtype != "auto":
        options.append(("--dtype", target.spec.dtype))
        config["dtype"] = target.spec.dtype
    if gpus > 1:
        options.append(("--tensor-parallel-size", gpus))
        config["tensor_parallel_size"] = gpus
    if profile.trust_remote_code:
        options.append(("--trust-remote-code", None))
        config["trust_remote_code"] = True
    if profile.compile == "off":
        options.append(("--enforce-eager", None))
        config["enforce_eager"] = True
    if profile.device == "cpu":
        not_carried.append("device: cpu (" + GPU_ONLY.format(title=title) + ")")
    options.append(("--speculative-config", json.dumps(spec)))
    config["speculative_config"] = spec
    command = shell_command(["vllm", "serve", target.path], options, cuda_env(profile))
    command = "\n".join([f"# {n}" for n in notes] + [command])
    return Export(INFO.name, INFO.version, command, config, not_carried,
                  header_lines(profile, INFO, k_choice, [*head_notes(chosen), *eagle_source, *vocab_source,
                                                         *schedule_notes(profile, spec),
                                                         request_note(profile)]))


def heterogeneous_notes(profile: Profile, draft_revision: str | None) -> list[str]:
    """What use_heterogeneous_vocab leaves out of a `vocab: intersect` draft."""
    notes = []
    if not profile.sampling.greedy:
        notes.append("drafter vocab: intersect's sampled drafts (specdec samples the draft over the shared tokens; "
                     "vLLM drafts their argmax, draft_sample_method greedy being the only one use_heterogeneous_vocab "
                     "allows, and verifies that draft as one-hot)")
    if draft_revision:
        notes.append(f"drafter revision {draft_revision} for the draft's tokenizer (vLLM 0.33 builds the token mapping "
                     "from the draft's default revision: vllm/v1/spec_decode/draft_model.py)")
    return notes


def batch_schedule(table: tuple[tuple[int, int], ...], k: int) -> list[list[int]]:
    """k_by_batch_size ('from this batch size up') as vLLM's schedule: [first, last, k] with inclusive
    ranges from batch size 1 (below the table's first entry: the exported k). vLLM applies the last
    entry's k to every batch size past its end, so the last range ends where it starts."""
    starts = list(table if table[0][0] == 1 else ((1, k), *table))
    ends = [start - 1 for start, _ in starts[1:]] + [starts[-1][0]]
    return [[start, end, value] for (start, value), end in zip(starts, ends)]


def schedule_notes(profile: Profile, spec: dict[str, Any]) -> list[str]:
    if not profile.k_by_batch_size:
        return []
    return [f"{k_table_setting(profile)} as num_speculative_tokens_per_batch_size (inclusive batch-size ranges; the "
            f"last k holds past its end; num_speculative_tokens {spec['num_speculative_tokens']}, its largest k): "
            f"{SCHEDULE_SOURCE}"]
