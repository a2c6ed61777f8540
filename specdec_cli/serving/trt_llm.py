"""TensorRT-LLM: `trtllm-serve MODEL --config FILE`, the YAML's speculative_config DraftTarget, NGram or Eagle3."""

from __future__ import annotations

from typing import Any

import yaml

from ..specs import Profile
from .common import (
    EngineInfo,
    Export,
    NotCarriedError,
    common_not_carried,
    cuda_env,
    header_lines,
    quantize_notes,
    quote,
    request_note,
    shell_command,
)
from .k_choice import KChoice
from .refs import model_ref
from .selection import MEDUSA_NEXT, head_notes, other_vocab_refused, select_drafters

INFO = EngineInfo(
    "trt-llm", "TensorRT-LLM", "TensorRT-LLM 1.2",
    "nvidia.github.io/TensorRT-LLM features/speculative-decoding.md (trtllm-serve --config YAML speculative_config)",
)


# features/speculative-decoding.md (Draft/Target: draft and target trained with the same tokenizer);
# llmapi/llm_args.py's DraftTargetDecodingConfig has no vocabulary setting
OTHER_VOCAB = other_vocab_refused(
    "TensorRT-LLM's DraftTarget drafts only with the target's tokenizer (it has no vocabulary mapping setting)")


def build(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    k = k_choice.k
    title = INFO.title
    target = model_ref(profile.target)
    if target.spec.gguf_file:
        raise NotCarriedError(
            f"{title} cannot load GGUF (target gguf_file {target.spec.gguf_file}); point target.model at the "
            "original Hugging Face model")
    chosen = select_drafters(profile.drafter, INFO, {
        "early-exit": "TensorRT-LLM has no early-exit (layer-skip) drafter",
        "model-gguf": "TensorRT-LLM cannot load a GGUF draft model",
        **OTHER_VOCAB,
        "medusa": ("TensorRT-LLM runs Medusa only in its TensorRT engine flow (examples/medusa convert_checkpoint.py, "
                   "then trtllm-build), not in the PyTorch backend trtllm-serve --config is written for: build that "
                   "engine, " + MEDUSA_NEXT),
        "eagle": ("TensorRT-LLM's PyTorch backend runs EAGLE-3 heads only (decoding_type Eagle is an alias of Eagle3; "
                  "EAGLE-1 checkpoints do not load): serve this head with vLLM or SGLang (`specdec export --to vllm`)"),
    })
    not_carried = chosen.not_carried + common_not_carried(profile, INFO, k_choice)
    spec: dict[str, Any]
    if chosen.eagle is not None:
        spec = {"decoding_type": "Eagle3", "max_draft_len": k, "speculative_model": chosen.eagle.ref.name}
    elif chosen.model is not None:
        draft = model_ref(chosen.model.model)
        spec = {"decoding_type": "DraftTarget", "max_draft_len": k, "speculative_model": draft.path}
        if draft.spec.revision:
            not_carried.append(f"drafter revision {draft.spec.revision} (TensorRT-LLM's speculative_model takes "
                               "no revision: download that revision and give its folder)")
        if draft.spec.dtype != profile.target.dtype:
            not_carried.append(f"drafter dtype {draft.spec.dtype} (TensorRT-LLM runs the draft in its own checkpoint dtype)")
    else:
        n = chosen.ngram.options
        # is_public_pool false: each request looks up its own tokens, as specdec's prompt lookup does;
        # is_use_oldest false: the latest match, as specdec's
        spec = {"decoding_type": "NGram", "max_draft_len": k, "max_matching_ngram_size": n["max_ngram"],
                "is_public_pool": False, "is_use_oldest": False}
        if n["min_ngram"] > 1:
            not_carried.append(f"drafter min_ngram {n['min_ngram']} (TensorRT-LLM matches suffixes down to one token)")
    modelopt = ("it reads quantization from the checkpoint: give one quantized ahead with NVIDIA ModelOpt "
                "(e.g. FP8, INT4 AWQ)")
    not_carried += quantize_notes(profile, INFO, chosen.model.model if chosen.model is not None else None,
                                  modelopt, modelopt)
    config: dict[str, Any] = {"speculative_config": spec, "disable_overlap_scheduler": True}
    if target.spec.dtype != "auto":
        config["dtype"] = target.spec.dtype
    if gpus > 1:
        config["tensor_parallel_size"] = gpus
    if profile.trust_remote_code:
        config["trust_remote_code"] = True
    if target.spec.revision:
        config["revision"] = target.spec.revision
    if profile.device == "cpu":
        not_carried.append("device: cpu (TensorRT-LLM runs on NVIDIA GPUs only)")
    if profile.compile == "off":
        not_carried.append("compile: off (TensorRT-LLM's CUDA graphs are configured per batch size, not switched off here)")
    yaml_name = f"specdec-{profile.name}-trtllm.yaml"
    yaml_text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    serve = shell_command(["trtllm-serve", target.path], [("--config", yaml_name)], cuda_env(profile))
    script = f"cat > {quote(yaml_name)} <<'EOF'\n{yaml_text}EOF\n{serve}"
    notes = [*head_notes(chosen),
             "--config is the preferred name of --extra_llm_api_options (releases before 1.2 know only the latter)",
             "disable_overlap_scheduler: true, as the draft/target and NGram examples set it"]
    return Export(INFO.name, INFO.version, script, {"model": target.path, **config}, not_carried,
                  header_lines(profile, INFO, k_choice, [*notes, request_note(profile)]))
