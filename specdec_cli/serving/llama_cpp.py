"""llama.cpp: `llama-server` with --spec-type ngram-simple, draft-simple or draft-eagle3, GGUF files made
first where the profile names a Hugging Face model, and the same settings as builds before the 2026
renames spell them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..specs import Profile
from .common import (
    EngineInfo,
    Export,
    common_not_carried,
    cuda_env,
    header_lines,
    quantize_note,
    quote,
    request_note,
    shell_command,
)
from .k_choice import KChoice
from .refs import HeadRef, ModelRef, model_ref
from .selection import MEDUSA_NEXT, head_notes, other_vocab_refused, select_drafters

INFO = EngineInfo(
    "llama.cpp", "llama.cpp", "llama.cpp llama-server, builds after PR #22964 (May 2026)",
    "ggml-org/llama.cpp tools/server/README.md @00dc805 (--spec-* flags), PRs #22397 and #22964 (the 2026 renames)",
    pairs_ngram=True,
)


# the nearest llama.cpp formats to torchao's weight-only int8 / int4 (their rounding differs: the
# greedy text can too)
GGUF_NEAREST = {
    "int8": "the nearest is a Q8_0 GGUF (convert_hf_to_gguf.py --outtype q8_0)",
    "int4": "the nearest is a Q4_K_M GGUF (convert at f16 or bf16, then llama-quantize IN.gguf OUT.gguf Q4_K_M)",
}
OUTTYPES = {"auto": "auto", "float32": "f32", "float64": "f32", "bfloat16": "bf16", "float16": "f16"}


def gguf_steps(ref: ModelRef) -> tuple[list[str], str]:
    """Shell lines that make a GGUF file of a model llama.cpp cannot read as it is, and that file."""
    if ref.gguf and ref.local:
        return [], ref.gguf
    lines = []
    folder = ref.name
    if not ref.local:
        folder = Path(ref.name).name
        download = ["hf", "download", ref.name]
        if ref.spec.gguf_file:
            download.append(ref.spec.gguf_file)
        download += ["--local-dir", folder]
        if ref.spec.revision:
            download += ["--revision", ref.spec.revision]
        lines.append(" ".join(quote(w) for w in download))
        if ref.spec.gguf_file:
            return lines, str(Path(folder) / ref.spec.gguf_file)
    outfile = f"{ref.stem}.gguf"
    outtype = OUTTYPES.get(ref.spec.dtype, "auto")
    lines.append(" ".join(quote(w) for w in [
        "python", "convert_hf_to_gguf.py", folder, "--outtype", outtype, "--outfile", outfile]))
    return lines, outfile


def hf_folder(ref: ModelRef) -> str:
    """Where the model's Hugging Face folder is once gguf_steps ran: its own folder, or the download."""
    return ref.name if ref.local else Path(ref.name).name


def eagle3_gguf_steps(head: HeadRef, target: ModelRef) -> tuple[list[str], str]:
    """Shell lines that convert an EAGLE-3 head to GGUF against the target's Hugging Face folder
    (llama.cpp reads the target's tokenizer and the hidden-state layers from it), and that file."""
    lines = []
    folder = head.name
    if not head.local:
        folder = Path(head.name).name
        lines.append(" ".join(quote(w) for w in ["hf", "download", head.name, "--local-dir", folder]))
    stem = head.stem if "eagle" in head.stem.lower() else f"{head.stem}-eagle3"
    outfile = f"{stem}.gguf"
    lines.append(" ".join(quote(w) for w in [
        "python", "convert_hf_to_gguf.py", folder, "--target-model-dir", hf_folder(target),
        "--outtype", OUTTYPES.get(target.spec.dtype, "auto"), "--outfile", outfile]))
    return lines, outfile


# common/speculative.cpp (common_speculative_are_compatible: vocab type, BOS/EOS, sizes within 128,
# the same token text from id 5): draft-simple throws on a pair that fails it. Older builds translated
# the pair through text instead (--spec-replace); the current source has no such path.
OTHER_VOCAB = other_vocab_refused(
    "llama.cpp's draft-simple drafts only with the target's vocabulary (it refuses a draft whose tokens differ: "
    "common_speculative_are_compatible)")


EAGLE3_BUILD = ("draft-eagle3 needs a llama.cpp build with PR #18039 (EAGLE-3, merged June 2026); the head is "
                "converted as docs/speculative.md's EAGLE-3 section shows (convert_hf_to_gguf.py --target-model-dir)")


def build(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    k = k_choice.k
    target = model_ref(profile.target)
    unsupported = {
        "early-exit": "llama.cpp has no early-exit (layer-skip) drafter",
        **OTHER_VOCAB,
        "medusa": "llama.cpp has no Medusa drafter (its head drafter is draft-eagle3): " + MEDUSA_NEXT.removeprefix("or "),
        "eagle": ("llama.cpp has no EAGLE-1 drafter (draft-eagle3 takes EAGLE-3 heads only): serve this head with vLLM or "
                  "SGLang (`specdec export --to vllm`), or train an EAGLE-3 head (`specdec train-draft --kind eagle`)"),
    }
    if target.spec.gguf_file:
        unsupported["eagle3"] = (
            "converting an EAGLE-3 head to GGUF (convert_hf_to_gguf.py --target-model-dir) needs the target's Hugging Face "
            f"folder, and the profile names only the GGUF file {target.spec.gguf_file}: point target.model at the "
            "original model")
    chosen = select_drafters(profile.drafter, INFO, unsupported)
    not_carried = chosen.not_carried + common_not_carried(profile, INFO, k_choice)
    prepare, target_file = gguf_steps(target)
    if target.spec.quantize != "none":
        not_carried.append(quantize_note(INFO, "target", target.spec, GGUF_NEAREST[target.spec.quantize]))
    current: list[tuple[str, Any]] = [("-m", target_file)]
    legacy: list[tuple[str, Any]] = [("-m", target_file)]
    types = []
    if chosen.ngram is not None:
        n = chosen.ngram.options
        types.append("ngram-simple")
        current += [("--spec-ngram-simple-size-n", n["max_ngram"]), ("--spec-ngram-simple-size-m", k)]
        legacy += [("--spec-type", "ngram-simple"), ("--spec-ngram-size-n", n["max_ngram"]),
                   ("--spec-ngram-size-m", k), ("--draft-max", k)]
        if n["min_ngram"] < n["max_ngram"]:
            not_carried.append(f"drafter min_ngram {n['min_ngram']} (llama.cpp's ngram-simple matches n-grams of one "
                               f"length, max_ngram {n['max_ngram']}; it does not fall back to shorter ones)")
    if chosen.model is not None:
        draft = model_ref(chosen.model.model)
        steps, draft_file = gguf_steps(draft)
        prepare += steps
        types.append("draft-simple")
        current += [("--spec-draft-model", draft_file), ("--spec-draft-n-max", k), ("--spec-draft-p-min", "0.0")]
        legacy += [("-md", draft_file), ("--draft-max", k), ("--draft-min", 0), ("--draft-p-min", "0.0")]
        if draft.spec.quantize != "none":
            not_carried.append(quantize_note(INFO, "drafter", draft.spec, GGUF_NEAREST[draft.spec.quantize]))
    if chosen.eagle is not None:
        steps, head_file = eagle3_gguf_steps(chosen.eagle.ref, target)
        prepare += steps
        types.append("draft-eagle3")
        current += [("--spec-draft-model", head_file), ("--spec-draft-n-max", k), ("--spec-draft-p-min", "0.0")]
    current.insert(1, ("--spec-type", ",".join(types)))
    if profile.device == "cpu":
        current.append(("--n-gpu-layers", 0))
        legacy.append(("-ngl", 0))
        if chosen.model is not None or chosen.eagle is not None:
            current.append(("--spec-draft-ngl", 0))
            legacy.append(("-ngld", 0))
    if profile.trust_remote_code:
        not_carried.append("trust_remote_code (llama.cpp runs no model code; convert_hf_to_gguf.py reads only config and weights)")
    current.append(("--metrics", None))
    legacy.append(("--metrics", None))
    legacy = _dedupe(legacy)
    env = cuda_env(profile)
    command = shell_command(["llama-server"], current, env)
    legacy_command = shell_command(["llama-server"], legacy, env)
    script = "\n".join([
        *(["# GGUF files for llama.cpp (convert_hf_to_gguf.py ships with llama.cpp; run it where its "
           "requirements are installed)"] if prepare else []),
        *prepare,
        command,
    ])
    config = {
        "prepare": prepare,
        "flags": _flag_dict(current),
        # EAGLE-3 came to llama.cpp after the 2026 renames: older builds have no spelling of it
        "flags_before_2026_04": None if chosen.eagle is not None else _flag_dict(legacy),
    }
    notes = ["drafting is a fixed k: --spec-draft-p-min 0.0 never stops a draft early"] if chosen.model or chosen.eagle else []
    if chosen.eagle is not None:
        notes += [*head_notes(chosen), EAGLE3_BUILD]
    notes.append("--metrics serves /metrics (spec_decode_* counters) for `specdec bench --endpoint`")
    export = Export(INFO.name, INFO.version, script, config, not_carried,
                    header_lines(profile, INFO, k_choice, [*notes, request_note(profile)]))
    if chosen.eagle is None:
        export.header.append("builds before PR #22397 (April 2026) spell the same settings:")
        export.header += ["  " + line for line in legacy_command.splitlines()]
    return export


def _dedupe(options: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """One --draft-max when both drafters set it (to the same k)."""
    seen, kept = set(), []
    for flag, value in options:
        if flag == "--draft-max" and flag in seen:
            continue
        seen.add(flag)
        kept.append((flag, value))
    return kept


def _flag_dict(options: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    return {flag: (True if value is None else value) for flag, value in options}
