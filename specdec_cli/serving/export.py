"""A profile as each serving engine's own settings: `specdec export --to vllm|sglang|llama.cpp|trt-llm|transformers|all`.

Pure functions from a Profile (and optionally a bench or tune-k report) to an `Export`: the command
line (or, for transformers, a Python snippet), the same settings as structured data, and every
profile setting the engine cannot carry, each with the reason. Nothing here prints; the CLI renders.

One file per engine (vllm.py, sglang.py, llama_cpp.py, trt_llm.py, hf_transformers.py), each with its
`INFO` and one `build`, found by name through registry.py; the helpers they share are in common.py
(command lines, comment lines), refs.py (where models and heads live), selection.py (which drafters an
engine runs) and k_choice.py (the fixed k). Each engine's syntax was looked up in its own
documentation; its INFO names the release written for and where, and the text output repeats it in its
first comment line. The rules:

- a drafter maps to the engine's own drafter of the same kind: a draft model to vLLM's `draft_model`,
  SGLang's STANDALONE, llama.cpp's `draft-simple`, TensorRT-LLM's DraftTarget, transformers'
  `assistant_model`; prompt lookup (kind ngram) to vLLM's and TensorRT-LLM's ngram, SGLang's NGRAM,
  llama.cpp's `ngram-simple`, transformers' `prompt_lookup_num_tokens`; early exit only to
  transformers' `assistant_early_exit`. A chain keeps the members the engine can combine (llama.cpp
  runs an n-gram drafter beside a draft model) or its strongest carriable member (a draft model or
  EAGLE head, then early exit, then prompt lookup); the rest are named.
- draft heads (kinds medusa, eagle): an EAGLE-3 head to vLLM's `eagle3`, SGLang's EAGLE3,
  TensorRT-LLM's Eagle3 and llama.cpp's `draft-eagle3` (after a GGUF conversion against the target);
  an EAGLE-1 head to vLLM's `eagle` and SGLang's EAGLE. EAGLE-1 and EAGLE-3 are told apart by the
  head's config.json alone (head_files.head_kind), never its weights; a hub head is read from the
  local Hugging Face cache. Medusa heads are carried nowhere (each engine's reason is named).
- drafts form a chain (one token per position): SGLang gets topk 1 and `k + 1` draft tokens (its
  count includes the verified root token), its NGRAM a BFS breadth of 1. A profile `tree:` is
  carried only by SGLang's EAGLE drafters (depth, width and nodes as num-steps, topk and draft
  tokens); elsewhere it is written as a chain of k and named as not carried.
- `k: auto` becomes a fixed k (see `choose_k`); the adaptive stopping rule itself is named as not carried.
- a quantized target or draft model (`quantize: int8 | int4`, torchao weight-only) is carried where
  the engine quantizes the same way at load (transformers' TorchAoConfig; SGLang's --torchao-config
  for the target); elsewhere it is named as not carried, with what the engine offers instead
  (a checkpoint quantized ahead, a Q8_0 / Q4_K_M GGUF): common.quantize_note.
- a draft model with another tokenizer (`vocab: intersect | text`): vLLM's `use_heterogeneous_vocab`
  (its token-level intersection; it has no string-level drafting, so `text` is not carried there),
  transformers' `tokenizer=` and `assistant_tokenizer=` (Universal Assisted Generation, which picks
  its own rule: re-encoded text when greedy, token-level intersection when sampling); SGLang,
  TensorRT-LLM and llama.cpp draft only with the target's tokenizer, which each names. `vocab: auto`
  is written as a shared tokenizer: which it is, export (loading no tokenizer) cannot tell.
- models named as `package:NAME/sub` or local folders are written as the absolute path they resolve
  to here (the GGUF file's path when the profile names one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..errors import UsageError
from ..models.sources import PACKAGE_PREFIX
from ..specs import Profile
from .common import Export, NotCarriedError
from .k_choice import KChoice
from .refs import head_ref, head_reference, model_ref
from .registry import ENGINES, canonical_name, engine_module
from .selection import drafter_members


def missing_local_models(profile: Profile) -> list[str]:
    """Local model and head folders that do not exist on this machine (the command still names them)."""
    members = drafter_members(profile.drafter)
    specs = [profile.target] + [d.model for d in members if d.model is not None]
    missing = []
    for spec in specs:
        if spec.model.startswith(PACKAGE_PREFIX):
            continue  # resolving it already proved the package is installed
        ref = model_ref(spec)
        if ref.local and not Path(ref.path).exists():
            missing.append(ref.path)
    for member in members:
        reference = head_reference(member)
        if reference is None or reference.startswith(PACKAGE_PREFIX):
            continue
        head = head_ref(reference)
        if head.local and not Path(head.name).exists():
            missing.append(head.name)
    return missing


def parse_engine(value: str) -> list[str]:
    """--to: one engine, or 'all'."""
    if value.strip().lower() == "all":
        return list(ENGINES)
    name = canonical_name(value)
    if name is None:
        raise UsageError(f"--to: '{value}' is not one of {', '.join(ENGINES)}, all")
    return [name]


def check_gpus(gpus: int | None) -> int:
    if gpus is None:
        return 1
    if not 1 <= gpus <= 1024:
        raise UsageError(f"--gpus: {gpus} must be between 1 and 1024")
    return gpus


def export_profile(profile: Profile, engine: str, k_choice: KChoice, gpus: int = 1) -> Export:
    """One engine's export; NotCarriedError (exit 2) when the profile cannot be carried at all."""
    return engine_module(engine).build(profile, k_choice, gpus)


def export_engines(profile: Profile, engines: Sequence[str], k_choice: KChoice, gpus: int = 1) -> list[Export]:
    """Several engines (`--to all`): an engine that cannot carry the profile gets an entry with no
    command and the reason as its one not_carried item, rather than failing the others."""
    if len(engines) == 1:
        return [export_profile(profile, engines[0], k_choice, gpus)]
    exports = []
    for engine in engines:
        try:
            exports.append(export_profile(profile, engine, k_choice, gpus))
        except NotCarriedError as exc:
            info = engine_module(engine).INFO
            exports.append(Export(engine, info.version, None, None, [str(exc)],
                                  [f"{info.version}: profile '{profile.name}' cannot be carried"]))
    return exports


def render_text(exports: Sequence[Export]) -> str:
    """Comment lines (release written for, where the syntax comes from, k, what is not carried), then
    the command or snippet; engines one after another, a blank line between them."""
    blocks = []
    for e in exports:
        lines = [f"# {line}" if line else "#" for line in e.header]
        lines += [f"# not carried: {item}" for item in e.not_carried]
        if e.command is not None:
            lines.append(e.command)
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def render_json(exports: Sequence[Export], single: bool) -> Any:
    data = [e.to_dict() for e in exports]
    return data[0] if single else data


def export_warnings(profile: Profile, k_choice: KChoice, gpus: int | None) -> list[str]:
    """What the user should know on stderr: a k that was not tuned, models missing here, GPUs unknown."""
    warnings = [k_choice.warning] if k_choice.warning else []
    warnings += [f"'{path}' does not exist on this machine; the command names it as the profile resolves it"
                 for path in missing_local_models(profile)]
    if profile.device_map and gpus is None:
        warnings.append(f"device_map: {profile.device_map} spreads the target over several GPUs; "
                        "give --gpus N to write the engines' tensor parallel size (written for 1 GPU)")
    return warnings
