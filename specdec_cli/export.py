"""A profile as each serving engine's own settings: `specdec export --to vllm|sglang|llama.cpp|trt-llm|transformers|all`.

Pure functions from a Profile (and optionally a bench or tune-k report) to an `Export`: the command
line (or, for transformers, a Python snippet), the same settings as structured data, and every
profile setting the engine cannot carry, each with the reason. Nothing here prints; the CLI renders.

Each engine's syntax was looked up in its own documentation; ENGINE_INFO names the release written
for and where, and the text output repeats it in its first comment line. The rules:

- a drafter maps to the engine's own drafter of the same kind: a draft model to vLLM's `draft_model`,
  SGLang's STANDALONE, llama.cpp's `draft-simple`, TensorRT-LLM's DraftTarget, transformers'
  `assistant_model`; prompt lookup (kind ngram) to vLLM's and TensorRT-LLM's ngram, SGLang's NGRAM,
  llama.cpp's `ngram-simple`, transformers' `prompt_lookup_num_tokens`; early exit only to
  transformers' `assistant_early_exit`. A chain keeps the members the engine can combine (llama.cpp
  runs an n-gram drafter beside a draft model) or its first carriable member; the rest are named.
- drafts form a chain (one token per position), never a tree: SGLang gets topk 1 and `k + 1` draft
  tokens (its count includes the verified root token), its NGRAM a BFS breadth of 1.
- `k: auto` becomes a fixed k (see `choose_k`); the adaptive stopping rule itself is named as not carried.
- a drafter with `quantize: int8` (a dynamic int8 CPU draft) has no GPU-server equivalent: the draft
  model is carried at the engine's dtype and the quantization is named as not carried.
- models named as `package:NAME/sub` or local folders are written as the absolute path they resolve
  to here (the GGUF file's path when the profile names one).
"""

from __future__ import annotations

import json
import math
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from .errors import UsageError
from .models import PACKAGE_PREFIX, is_local_reference, local_path
from .specs import MAX_K, DrafterSpec, ModelSpec, Profile

ENGINES = ("vllm", "sglang", "llama.cpp", "trt-llm", "transformers")


@dataclass(frozen=True)
class EngineInfo:
    title: str
    version: str  # the release written for
    source: str  # where its syntax was read


ENGINE_INFO: dict[str, EngineInfo] = {
    "vllm": EngineInfo(
        "vLLM", "vLLM 0.33",
        "docs.vllm.ai features/speculative_decoding: configuration.md (--speculative-config keys), draft_model.md, n_gram.md",
    ),
    "sglang": EngineInfo(
        "SGLang", "SGLang 0.5.23",
        "docs.sglang.ai advanced_features/speculative_decoding.md (STANDALONE, NGRAM, full parameter reference)",
    ),
    "llama.cpp": EngineInfo(
        "llama.cpp", "llama.cpp llama-server, builds after PR #22964 (May 2026)",
        "ggml-org/llama.cpp tools/server/README.md @00dc805 (--spec-* flags), PRs #22397 and #22964 (the 2026 renames)",
    ),
    "trt-llm": EngineInfo(
        "TensorRT-LLM", "TensorRT-LLM 1.2",
        "nvidia.github.io/TensorRT-LLM features/speculative-decoding.md (trtllm-serve --config YAML speculative_config)",
    ),
    "transformers": EngineInfo(
        "transformers", "transformers 5.24",
        "transformers 5.24 generation/configuration_utils.py and candidate_generator.py (assistant knobs read from the assistant's generation_config)",
    ),
}


class NotCarriedError(UsageError):
    """The profile cannot be carried to this engine at all (exit 2); the message says why."""


@dataclass
class Export:
    engine: str
    version_written_for: str
    command: str | None
    config: dict[str, Any] | None
    not_carried: list[str] = field(default_factory=list)
    header: list[str] = field(default_factory=list)  # comment lines for the text format

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "version_written_for": self.version_written_for,
            "command": self.command,
            "config": self.config,
            "not_carried": list(self.not_carried),
        }


# --------------------------------------------------------------------------- k


@dataclass(frozen=True)
class KChoice:
    k: int
    reason: str  # for the output's comment line
    warning: str | None = None  # for stderr


def read_report(path: Path) -> dict[str, Any]:
    """A bench or tune-k JSON report (`specdec bench|tune-k --format json -o FILE`)."""
    hint = "write one with `specdec tune-k --format json -o FILE` or `specdec bench --format json -o FILE`"
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--from-report: '{path}' is not a file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, OSError) as exc:
        raise UsageError(f"--from-report: '{path}' is not a JSON report ({type(exc).__name__}); {hint}") from None
    if not isinstance(data, dict) or not ("best_fixed_k" in data or isinstance(data.get("results"), list)):
        raise UsageError(f"--from-report: '{path}' is not a bench or tune-k report; {hint}")
    return data


def _valid_k(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_K


def k_from_report(report: dict[str, Any], label: str) -> tuple[int, str]:
    """The fixed k a report recommends, and how it was chosen.

    tune-k: its fastest fixed k (`best_fixed_k`; `best_k` may be 'auto').
    bench at a fixed k: that k. bench at k: auto: the mean draft length auto chose per target
    forward, (tau - 1) / acceptance, from the specdec row (tau = tokens per target forward).
    """
    if "best_fixed_k" in report:
        k = report.get("best_fixed_k")
        if not _valid_k(k):
            raise UsageError(f"--from-report: {label} has no fixed k that finished (best_fixed_k is {k!r})")
        return k, f"the fastest fixed k of the tune-k report {label}"
    row = next((r for r in report["results"] if isinstance(r, dict) and r.get("method") == "specdec"), None)
    if row is None:
        raise UsageError(f"--from-report: {label} has no specdec row (run bench with --methods including specdec)")
    measured_k = (report.get("settings") or {}).get("k")
    if _valid_k(measured_k):
        return measured_k, f"the k the bench report {label} was measured at"
    tau, acceptance = row.get("mean_accepted_length"), row.get("acceptance_rate")
    if not isinstance(tau, (int, float)) or not isinstance(acceptance, (int, float)) or acceptance <= 0 or tau < 1:
        raise UsageError(f"--from-report: {label}'s specdec row has no acceptance and tau to derive k from")
    mean_k = (tau - 1.0) / acceptance
    k = min(MAX_K, max(1, math.floor(mean_k + 0.5)))
    return k, (f"the mean draft length k: auto chose in the bench report {label} "
               f"((tau {tau:.2f} - 1) / acceptance {acceptance:.1%} = {mean_k:.2f})")


def choose_k(profile: Profile, report: dict[str, Any] | None = None, label: str = "") -> KChoice:
    """A fixed k for the engines: the report's, if one is given, else the profile's fixed k, else
    (k: auto and no report) the default fixed k (5, at most adaptive.k_max), with a warning."""
    if report is not None:
        k, reason = k_from_report(report, label)
        warning = None
        named = report.get("profile")
        if isinstance(named, str) and named != profile.name:
            warning = f"--from-report: {label} was measured on profile '{named}', not '{profile.name}'"
        return KChoice(k, f"k = {k}: {reason}", warning)
    if profile.k != "auto":
        return KChoice(profile.k, f"k = {profile.k}: the profile's k")
    # adaptive.k_max is a safety bound (32), far deeper than any fixed k should be
    k = min(profile.adaptive.k_max, Profile.k)
    return KChoice(
        k, f"k = {k}: the default fixed k (k: auto has no engine equivalent; give --from-report for a tuned k)",
        f"k: auto has no serving-engine equivalent; writing k = {k} (the default fixed k). "
        "Pass --from-report FILE (a tune-k or bench JSON report) for the k your runs chose",
    )


# --------------------------------------------------------------------------- where models live


@dataclass(frozen=True)
class ModelRef:
    """A model as an engine names it: a hub id, or the absolute local path it resolves to."""

    spec: ModelSpec
    name: str  # hub id or absolute folder
    local: bool

    @property
    def gguf(self) -> str | None:
        """The GGUF file: its absolute path for a local model, its file name in a hub repo."""
        if self.spec.gguf_file is None:
            return None
        return str(Path(self.name) / self.spec.gguf_file) if self.local else self.spec.gguf_file

    @property
    def path(self) -> str:
        """What a loader that takes one path needs: the GGUF file if there is one, else the model."""
        return self.gguf or self.name

    @property
    def stem(self) -> str:
        """A short file name for converted copies."""
        base = Path(self.spec.gguf_file).stem if self.spec.gguf_file else Path(self.name.rstrip("/")).name
        return base or "model"


def model_ref(spec: ModelSpec) -> ModelRef:
    """`~` expanded, `package:NAME/sub` resolved in the installed package (as models.py loads it),
    relative folders made absolute; anything else is a hub id."""
    if is_local_reference(spec.model):
        folder = local_path(spec.model)
        return ModelRef(spec, os.path.abspath(folder), True)
    return ModelRef(spec, spec.model, False)


def missing_local_models(profile: Profile) -> list[str]:
    """Local model folders that do not exist on this machine (the command still names them)."""
    specs = [profile.target] + [d.model for d in drafter_members(profile.drafter) if d.model is not None]
    missing = []
    for spec in specs:
        if spec.model.startswith(PACKAGE_PREFIX):
            continue  # resolving it already proved the package is installed
        ref = model_ref(spec)
        if ref.local and not Path(ref.path).exists():
            missing.append(ref.path)
    return missing


# --------------------------------------------------------------------------- drafters


def drafter_members(drafter: DrafterSpec) -> list[DrafterSpec]:
    """A chain's members in order; any other drafter alone."""
    if drafter.kind == "chain":
        return [d for d in drafter.drafters if d is not None]
    return [drafter]


def _kind_name(d: DrafterSpec) -> str:
    return {"model": "draft model", "ngram": "prompt lookup (ngram)", "early-exit": "early exit"}.get(d.kind, d.kind)


@dataclass
class Selection:
    """The drafters an engine runs, and what of the profile's drafter it leaves behind."""

    model: DrafterSpec | None = None
    ngram: DrafterSpec | None = None
    early_exit: DrafterSpec | None = None
    not_carried: list[str] = field(default_factory=list)


def select_drafters(drafter: DrafterSpec, engine: str, unsupported: dict[str, str]) -> Selection:
    """Members the engine can run: `unsupported` maps a member (kind, or 'model-gguf') to the reason it
    cannot. llama.cpp combines one n-gram drafter with one draft model; the others take one drafter."""
    title = ENGINE_INFO[engine].title
    members = drafter_members(drafter)
    chosen = Selection()
    reasons = []
    for i, member in enumerate(members):
        where = f"drafter.drafters[{i}]" if drafter.kind == "chain" else "drafter"
        key = "model-gguf" if member.kind == "model" and member.model and member.model.gguf_file else member.kind
        slot = {"model": "model", "ngram": "ngram", "early-exit": "early_exit"}[member.kind]
        if key in unsupported:
            reasons.append(f"{where} ({_kind_name(member)}): {unsupported[key]}")
            continue
        taken = chosen.model or chosen.ngram or chosen.early_exit
        combinable = engine == "llama.cpp" and getattr(chosen, slot) is None
        if taken is not None and not combinable:
            reasons.append(f"{where} ({_kind_name(member)}): {title} runs one drafter; the chain's first carriable one is written")
            continue
        setattr(chosen, slot, member)
    if not (chosen.model or chosen.ngram or chosen.early_exit):
        raise NotCarriedError(f"{title} cannot carry profile drafter {drafter.describe()}: " + "; ".join(
            r.split(": ", 1)[1] for r in reasons))
    chosen.not_carried = reasons
    return chosen


# --------------------------------------------------------------------------- rendering helpers


def quote(value: Any) -> str:
    return shlex.quote(str(value))


def shell_command(words: Sequence[str], options: Sequence[tuple[str, Any]], env: Sequence[str] = ()) -> str:
    """`ENV=1 program args \\` then one `--flag value` per line (a value of None: a bare flag)."""
    head = " ".join([*env, *(quote(w) for w in words)])
    lines = [head] + [f"{flag}" if value is None else f"{flag} {quote(value)}" for flag, value in options]
    return " \\\n  ".join(lines)


def py_str(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def cuda_env(profile: Profile) -> list[str]:
    """`device: cuda:N` as the variable every CUDA server honours."""
    base, _, index = profile.device.partition(":")
    return [f"CUDA_VISIBLE_DEVICES={index}"] if base == "cuda" and index else []


def request_note(profile: Profile) -> str:
    s = profile.sampling
    sampling = "temperature 0.0 (greedy)" if s.greedy else f"temperature {s.temperature}"
    if s.top_k:
        sampling += f", top_k {s.top_k}"
    if s.top_p < 1.0:
        sampling += f", top_p {s.top_p}"
    return f"per request (not a server flag): {sampling}, max_tokens {profile.max_new_tokens}"


def common_not_carried(profile: Profile, engine: str, k_choice: KChoice) -> list[str]:
    items = []
    if profile.k == "auto":
        items.append("k: auto (specdec's per-step stopping rule, tuned online from acceptance and costs; "
                     f"written as the fixed k = {k_choice.k})")
    return items


def int8_note(engine: str) -> str:
    nearest = {"llama.cpp": "; the nearest in llama.cpp is a q8_0 GGUF: convert the draft with --outtype q8_0"}.get(engine, "")
    return (f"drafter.quantize: int8 (a dynamic int8 CPU draft; {ENGINE_INFO[engine].title} has no equivalent, "
            f"the draft runs unquantized{nearest})")


def header_lines(profile: Profile, engine: str, k_choice: KChoice, extra: Sequence[str] = ()) -> list[str]:
    info = ENGINE_INFO[engine]
    return [
        f"{info.version}: profile '{profile.name}' (written by specdec export)",
        f"syntax from {info.source}",
        k_choice.reason,
        *extra,
    ]


# --------------------------------------------------------------------------- vLLM

GPU_ONLY = "{title}'s CPU backend is a separate build, chosen at install, not a serve flag"


def gguf_from_hub(title: str, target) -> NotCarriedError:
    """A GGUF file named inside a hub repo: the servers that read GGUF want it on disk."""
    return NotCarriedError(
        f"{title} cannot load GGUF file {target.spec.gguf_file} from hub repo {target.name} by name; download it "
        f"(`hf download {target.name} {target.spec.gguf_file} --local-dir DIR`) and point target.model at DIR")


def export_vllm(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    engine, k = "vllm", k_choice.k
    title = ENGINE_INFO[engine].title
    target = model_ref(profile.target)
    chosen = select_drafters(profile.drafter, engine, {
        "early-exit": "vLLM has no early-exit (layer-skip) drafter",
        "model-gguf": "vLLM cannot run a GGUF draft model",
    })
    not_carried = chosen.not_carried + common_not_carried(profile, engine, k_choice)
    spec: dict[str, Any]
    if chosen.model is not None:
        draft = model_ref(chosen.model.model)
        spec = {"method": "draft_model", "model": draft.path, "num_speculative_tokens": k}
        if draft.spec.revision:
            spec["revision"] = draft.spec.revision
        if gpus > 1:
            spec["draft_tensor_parallel_size"] = 1
        if chosen.model.options.get("quantize"):
            not_carried.append(int8_note(engine))
        if draft.spec.dtype != profile.target.dtype:
            not_carried.append(f"drafter dtype {draft.spec.dtype} (vLLM runs the draft in the target's dtype)")
    else:
        ngram = chosen.ngram
        spec = {"method": "ngram", "num_speculative_tokens": k,
                "prompt_lookup_min": ngram.options["min_ngram"], "prompt_lookup_max": ngram.options["max_ngram"]}
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
    return Export(engine, ENGINE_INFO[engine].version, command, config, not_carried,
                  header_lines(profile, engine, k_choice, [request_note(profile)]))


# --------------------------------------------------------------------------- SGLang


def export_sglang(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    engine, k = "sglang", k_choice.k
    title = ENGINE_INFO[engine].title
    target = model_ref(profile.target)
    chosen = select_drafters(profile.drafter, engine, {
        "early-exit": "SGLang has no early-exit (layer-skip) drafter",
        "model-gguf": "SGLang's draft model path takes a Hugging Face model, not a GGUF file",
    })
    not_carried = chosen.not_carried + common_not_carried(profile, engine, k_choice)
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
    if gpus > 1:
        add("--tp-size", gpus)
    if profile.trust_remote_code:
        add("--trust-remote-code", None)
    if profile.compile == "off":
        add("--disable-cuda-graph", None)
    if profile.device == "cpu":
        add("--device", "cpu")
    if chosen.model is not None:
        draft = model_ref(chosen.model.model)
        add("--speculative-algorithm", "STANDALONE")
        add("--speculative-draft-model-path", draft.path)
        if draft.spec.revision:
            add("--speculative-draft-model-revision", draft.spec.revision)
        add("--speculative-num-steps", k)
        add("--speculative-eagle-topk", 1)
        add("--speculative-num-draft-tokens", k + 1)
        if chosen.model.options.get("quantize"):
            not_carried.append(int8_note(engine))
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
    command = shell_command(["python", "-m", "sglang.launch_server"], options, cuda_env(profile))
    notes = ["--speculative-num-draft-tokens counts the verified root token too: k drafts + 1"]
    return Export(engine, ENGINE_INFO[engine].version, command, config, not_carried,
                  header_lines(profile, engine, k_choice, [*notes, request_note(profile)]))


# --------------------------------------------------------------------------- llama.cpp

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


def export_llama_cpp(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    engine, k = "llama.cpp", k_choice.k
    target = model_ref(profile.target)
    chosen = select_drafters(profile.drafter, engine, {
        "early-exit": "llama.cpp has no early-exit (layer-skip) drafter",
    })
    not_carried = chosen.not_carried + common_not_carried(profile, engine, k_choice)
    prepare, target_file = gguf_steps(target)
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
        if chosen.model.options.get("quantize"):
            not_carried.append(int8_note(engine))
    current.insert(1, ("--spec-type", ",".join(types)))
    if profile.device == "cpu":
        current.append(("--n-gpu-layers", 0))
        legacy.append(("-ngl", 0))
        if chosen.model is not None:
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
        "flags_before_2026_04": _flag_dict(legacy),
    }
    notes = ["drafting is a fixed k: --spec-draft-p-min 0.0 never stops a draft early"] if chosen.model else []
    notes.append("--metrics serves /metrics (spec_decode_* counters) for `specdec bench --endpoint`")
    export = Export(engine, ENGINE_INFO[engine].version, script, config, not_carried,
                    header_lines(profile, engine, k_choice, [*notes, request_note(profile)]))
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


# --------------------------------------------------------------------------- TensorRT-LLM


def export_trt_llm(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    engine, k = "trt-llm", k_choice.k
    title = ENGINE_INFO[engine].title
    target = model_ref(profile.target)
    if target.spec.gguf_file:
        raise NotCarriedError(
            f"{title} cannot load GGUF (target gguf_file {target.spec.gguf_file}); point target.model at the "
            "original Hugging Face model")
    chosen = select_drafters(profile.drafter, engine, {
        "early-exit": "TensorRT-LLM has no early-exit (layer-skip) drafter",
        "model-gguf": "TensorRT-LLM cannot load a GGUF draft model",
    })
    not_carried = chosen.not_carried + common_not_carried(profile, engine, k_choice)
    spec: dict[str, Any]
    if chosen.model is not None:
        draft = model_ref(chosen.model.model)
        spec = {"decoding_type": "DraftTarget", "max_draft_len": k, "speculative_model": draft.path}
        if draft.spec.revision:
            not_carried.append(f"drafter revision {draft.spec.revision} (TensorRT-LLM's speculative_model takes "
                               "no revision: download that revision and give its folder)")
        if chosen.model.options.get("quantize"):
            not_carried.append(int8_note(engine))
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
    notes = ["--config is the preferred name of --extra_llm_api_options (releases before 1.2 know only the latter)",
             "disable_overlap_scheduler: true, as the draft/target and NGram examples set it"]
    return Export(engine, ENGINE_INFO[engine].version, script, {"model": target.path, **config}, not_carried,
                  header_lines(profile, engine, k_choice, [*notes, request_note(profile)]))


# --------------------------------------------------------------------------- transformers


def _early_exit_layers(profile: Profile, member: DrafterSpec) -> int:
    layers = member.options.get("layers")
    if layers:
        return layers
    target = model_ref(profile.target)
    config_file = Path(target.name) / "config.json"
    if target.local and config_file.is_file():
        try:
            n_layers = int(json.loads(config_file.read_text(encoding="utf-8"))["num_hidden_layers"])
            return max(1, n_layers // 4)  # drafters/early_exit.default_layers
        except (ValueError, KeyError, TypeError, OSError):
            pass
    raise NotCarriedError(
        "transformers' assistant_early_exit needs a layer count: set drafter.layers in the profile (its default, a "
        "quarter of the target's layers, is known only once the model is loaded)")


def _from_pretrained(ref: ModelRef, dtype: str, device_map: str, trust: bool) -> str:
    args = [py_str(ref.name)]
    if ref.spec.gguf_file:
        args.append(f"gguf_file={py_str(ref.spec.gguf_file)}")
    if ref.spec.revision:
        args.append(f"revision={py_str(ref.spec.revision)}")
    args.append(f"dtype={py_str(dtype)}")
    args.append(f"device_map={py_str(device_map)}")
    if trust:
        args.append("trust_remote_code=True")
    return f"AutoModelForCausalLM.from_pretrained({', '.join(args)})"


def export_transformers(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    engine, k = "transformers", k_choice.k
    target = model_ref(profile.target)
    chosen = select_drafters(profile.drafter, engine, {})
    not_carried = chosen.not_carried + common_not_carried(profile, engine, k_choice)
    device_map = profile.device_map or ("auto" if profile.device == "auto" else profile.device)
    trust = profile.trust_remote_code
    tokenizer_args = [py_str(target.name)]
    if target.spec.gguf_file:
        tokenizer_args.append(f"gguf_file={py_str(target.spec.gguf_file)}")
    if target.spec.revision:
        tokenizer_args.append(f"revision={py_str(target.spec.revision)}")
    int8_draft = chosen.model is not None and chosen.model.options.get("quantize") == "int8"
    lines = [
        *(["import torch"] if int8_draft else []),
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({', '.join(tokenizer_args)})",
        f"model = {_from_pretrained(target, target.spec.dtype, device_map, trust)}",
    ]
    generate_kwargs: dict[str, Any] = {}
    assistant_config: dict[str, Any] = {}
    config: dict[str, Any] = {"model": target.name}
    if chosen.model is not None:
        draft = model_ref(chosen.model.model)
        int8 = int8_draft
        draft_dtype = "float32" if int8 else draft.spec.dtype  # int8 quantization starts from float32 weights
        lines.append(f"assistant = {_from_pretrained(draft, draft_dtype, 'cpu' if int8 else device_map, trust)}")
        if int8:
            lines += [
                "# drafter.quantize: int8: dynamic int8 Linear layers, on the CPU, as specdec quantizes its draft",
                "assistant = torch.ao.quantization.quantize_dynamic(assistant, {torch.nn.Linear}, dtype=torch.qint8)",
            ]
            config["assistant_quantize"] = "int8 (torch.ao.quantization.quantize_dynamic, CPU)"
        assistant_config = {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
                            "assistant_confidence_threshold": 0.0}
        lines.append("# transformers 5 reads these from the ASSISTANT's generation_config; passing them to generate() does nothing")
        lines += [f"assistant.generation_config.{key} = {json.dumps(value)}" for key, value in assistant_config.items()]
        config["assistant_model"] = draft.name
        generate_kwargs["assistant_model"] = "assistant"
    elif chosen.ngram is not None:
        n = chosen.ngram.options
        generate_kwargs.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=n["max_ngram"])
        if n["min_ngram"] > 1:
            not_carried.append(f"drafter min_ngram {n['min_ngram']} (transformers' prompt lookup falls back to 1-grams)")
    else:
        generate_kwargs["assistant_early_exit"] = _early_exit_layers(profile, chosen.early_exit)
    s = profile.sampling
    if s.greedy:
        generate_kwargs["do_sample"] = False
    else:
        generate_kwargs.update(do_sample=True, temperature=s.temperature)
        if s.top_k:
            generate_kwargs["top_k"] = s.top_k
        if s.top_p < 1.0:
            generate_kwargs["top_p"] = s.top_p
    generate_kwargs["max_new_tokens"] = profile.max_new_tokens
    if profile.compile == "on":
        not_carried.append("compile: on (specdec's static caches and compiled steps; generate() runs eagerly here)")
    if gpus > 1 and not profile.device_map:
        not_carried.append(f"--gpus {gpus} (set device_map in the profile to spread the target over GPUs)")
    prompt = 'prompt = "Write a Python function that reverses a linked list."'
    if profile.chat is False:
        encode = ['inputs = tokenizer(prompt, return_tensors="pt").to(model.device)']
    else:
        encode = [
            *(["if tokenizer.chat_template:  # chat: auto"] if profile.chat == "auto" else ["if True:  # chat: true"]),
            '    inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,',
            '                                           return_tensors="pt", return_dict=True).to(model.device)',
            *(["else:", '    inputs = tokenizer(prompt, return_tensors="pt").to(model.device)'] if profile.chat == "auto" else []),
        ]
    kwargs_text = ", ".join(
        f"{key}={value}" if key == "assistant_model" else f"{key}={json.dumps(value)}" for key, value in generate_kwargs.items()
    ).replace("=false", "=False").replace("=true", "=True")
    lines += [
        "",
        prompt,
        *encode,
        f"output = model.generate(**inputs, {kwargs_text})",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))',
    ]
    config["generate_kwargs"] = {key: ("<assistant>" if key == "assistant_model" else value) for key, value in generate_kwargs.items()}
    if assistant_config:
        config["assistant_generation_config"] = assistant_config
    notes = ["Python, not a shell command: run it with python"]
    return Export(engine, ENGINE_INFO[engine].version, "\n".join(lines), config, not_carried,
                  header_lines(profile, engine, k_choice, notes))


# --------------------------------------------------------------------------- entry points

BUILDERS = {
    "vllm": export_vllm,
    "sglang": export_sglang,
    "llama.cpp": export_llama_cpp,
    "trt-llm": export_trt_llm,
    "transformers": export_transformers,
}


def parse_engine(value: str) -> list[str]:
    """--to: one engine, or 'all'."""
    name = value.strip().lower()
    aliases = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "tensorrt-llm": "trt-llm", "trtllm": "trt-llm",
               "hf": "transformers"}
    name = aliases.get(name, name)
    if name == "all":
        return list(ENGINES)
    if name not in ENGINES:
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
    return BUILDERS[engine](profile, k_choice, gpus)


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
            info = ENGINE_INFO[engine]
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
