"""SGLang: `python -m sglang.launch_server` with --speculative-algorithm STANDALONE, NGRAM, EAGLE or EAGLE3."""

from __future__ import annotations

import json
from typing import Any

from ..drafters.head_files import CONFIG as HEAD_CONFIG
from ..specs import ModelSpec, Profile, TreeSpec
from .common import (
    EngineInfo,
    Export,
    common_not_carried,
    cuda_env,
    fixed_tree,
    gguf_from_hub,
    header_lines,
    quantize_method,
    quantize_notes,
    request_note,
    shell_command,
)
from .k_choice import KChoice
from .refs import EagleInfo, model_ref
from .selection import MEDUSA_NEXT, head_notes, other_vocab_refused, select_drafters

INFO = EngineInfo(
    "sglang", "SGLang", "SGLang 0.5.23",
    "docs.sglang.ai advanced_features/speculative_decoding.md (STANDALONE, NGRAM, full parameter reference)",
)


# SGLang 0.5.23 srt/speculative/standalone_worker_v2.py (_validate_vocab_compatibility): STANDALONE
# refuses a draft whose vocab_size or token-to-id map is not the target's; no algorithm drafts across them
OTHER_VOCAB = other_vocab_refused(
    "SGLang drafts only with the target's tokenizer (its STANDALONE drafter refuses a draft whose vocabulary differs)")


def sglang_eagle_tree(tree: TreeSpec | None, k: int) -> tuple[int, int, int]:
    """SGLang's EAGLE draft shape as (num_steps, eagle_topk, num_draft_tokens). A chain of k: (k, 1,
    k + 1). A tree (fixed_tree): its depth, its width, and its nodes + 1 (SGLang counts the verified
    root token), the nodes capped at what SGLang's drafting offers: topk at the first step, then
    topk x topk at each later one."""
    if tree is None:
        return k, 1, k + 1
    tree = fixed_tree(tree)
    offered = tree.width + (tree.depth - 1) * tree.width * tree.width
    return tree.depth, tree.width, min(tree.nodes, offered) + 1


def architecture_note(info: EagleInfo) -> str | None:
    """SGLang picks a draft head's model class by its config.json `architectures`: a head whose config
    names no Eagle class loads as another model."""
    architectures = info.config.get("architectures") or []
    if info.assumed or any("Eagle" in str(a) for a in architectures):
        return None
    wanted = "LlamaForCausalLMEagle3" if info.kind == "eagle3" else "LlamaForCausalLMEagle"
    return (f"drafter.head {HEAD_CONFIG} architectures {json.dumps(architectures)} (SGLang loads a draft head by that "
            f"name: set it to [\"{wanted}\"] in a copy of the head folder and serve that copy)")


def torchao_config(spec: ModelSpec) -> str | None:
    """The model's quantize as SGLang's --torchao-config value (int8wo, int4wo-GROUP), or None."""
    return {"int8": "int8wo", "int4": f"int4wo-{spec.group_size}"}.get(spec.quantize)


def build(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    k = k_choice.k
    title = INFO.title
    target = model_ref(profile.target)
    chosen = select_drafters(profile.drafter, INFO, {
        "early-exit": "SGLang has no early-exit (layer-skip) drafter",
        "model-gguf": "SGLang's draft model path takes a Hugging Face model, not a GGUF file",
        **OTHER_VOCAB,
        "medusa": "SGLang has no Medusa drafter (its head drafters are EAGLE, EAGLE-3 and MTP): " + MEDUSA_NEXT.removeprefix("or "),
    })
    tree_carried = chosen.eagle is not None and profile.tree is not None
    not_carried = chosen.not_carried + common_not_carried(profile, INFO, k_choice, tree_carried)
    if target.spec.gguf_file and not target.local:
        raise gguf_from_hub(title, target)
    config: dict[str, Any] = {"model_path": target.path}
    options: list[tuple[str, Any]] = [("--model-path", target.path)]

    def add(flag: str, value: Any) -> None:
        options.append((flag, value))
        config[flag.removeprefix("--").replace("-", "_")] = True if value is None else value

    if target.spec.revision:
        add("--revision", target.spec.revision)
    if target.spec.dtype != "auto":
        add("--dtype", target.spec.dtype)
    torchao = torchao_config(target.spec)
    if torchao:
        add("--torchao-config", torchao)
    if gpus > 1:
        add("--tp-size", gpus)
    if profile.trust_remote_code:
        add("--trust-remote-code", None)
    if profile.compile == "off":
        add("--disable-cuda-graph", None)
    if profile.device == "cpu":
        add("--device", "cpu")
    notes = ["--speculative-num-draft-tokens counts the verified root token too: k drafts + 1"]
    if chosen.eagle is not None:
        eagle = chosen.eagle
        steps, topk, draft_tokens = sglang_eagle_tree(profile.tree, k)
        add("--speculative-algorithm", "EAGLE3" if eagle.kind == "eagle3" else "EAGLE")
        add("--speculative-draft-model-path", eagle.ref.name)
        add("--speculative-num-steps", steps)
        add("--speculative-eagle-topk", topk)
        add("--speculative-num-draft-tokens", draft_tokens)
        notes = [*head_notes(chosen), *notes]
        if profile.tree is not None:
            tree = fixed_tree(profile.tree)
            notes = [*head_notes(chosen), f"the tree ({tree.describe()}), not k: --speculative-num-steps {steps} (its depth), "
                     f"--speculative-eagle-topk {topk} (its width), --speculative-num-draft-tokens {draft_tokens} "
                     "(its nodes + the verified root token)"]
            if draft_tokens - 1 < tree.nodes:
                not_carried.append(f"tree nodes {tree.nodes} (SGLang's EAGLE drafting offers at most {draft_tokens - 1} "
                                   f"nodes at width {topk} and depth {steps}: topk, then topk x topk per later step)")
        note = architecture_note(eagle)
        if note:
            not_carried.append(note)
    elif chosen.model is not None:
        draft = model_ref(chosen.model.model)
        add("--speculative-algorithm", "STANDALONE")
        add("--speculative-draft-model-path", draft.path)
        if draft.spec.revision:
            add("--speculative-draft-model-revision", draft.spec.revision)
        add("--speculative-num-steps", k)
        add("--speculative-eagle-topk", 1)
        add("--speculative-num-draft-tokens", k + 1)
        if draft.spec.dtype != profile.target.dtype:
            not_carried.append(f"drafter dtype {draft.spec.dtype} (SGLang runs the draft in the target's dtype)")
    else:
        ngram = chosen.ngram
        add("--speculative-algorithm", "NGRAM")
        add("--speculative-num-draft-tokens", k + 1)
        add("--speculative-ngram-min-match-window-size", ngram.options["min_ngram"])
        add("--speculative-ngram-max-match-window-size", ngram.options["max_ngram"])
        add("--speculative-ngram-max-bfs-breadth", 1)
        not_carried.append("prompt lookup's source: specdec copies from the latest match in this request; SGLang's "
                           "NGRAM drafts from a cache of recent tokens shared by all requests (CUDA only)")
    not_carried += quantize_notes(
        profile, INFO, chosen.model.model if chosen.model is not None else None, None,
        "give a draft checkpoint quantized ahead (AWQ / GPTQ) as --speculative-draft-model-path")
    if torchao:
        notes.append(f"--torchao-config {torchao}: torchao's weight-only {quantize_method(target.spec)} on the target, "
                     "as specdec quantizes it (SGLang quantizes at load)")
    command = shell_command(["python", "-m", "sglang.launch_server"], options, cuda_env(profile))
    return Export(INFO.name, INFO.version, command, config, not_carried,
                  header_lines(profile, INFO, k_choice, [*notes, request_note(profile)]))
