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

from ..drafters.head_files import CONFIG as HEAD_CONFIG
from ..drafters.head_files import head_kind, read_config
from ..errors import ModelSourceError, UsageError
from ..models.loading import PACKAGE_PREFIX, is_local_reference, local_path
from ..profile import DEFAULT_TREE
from ..specs import MAX_K, DrafterSpec, ModelSpec, Profile, TreeSpec

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
    except UnicodeDecodeError as exc:
        raise UsageError(f"--from-report: '{path}' is not a JSON report (not UTF-8 text: byte {exc.start}); {hint}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--from-report: '{path}' is not a JSON report ({exc.msg.lower()} at line {exc.lineno}); {hint}") from None
    except OSError as exc:
        raise UsageError(f"--from-report: cannot read '{path}' ({exc.strerror or exc}); {hint}") from None
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
    if not isinstance(tau, (int, float)) or not isinstance(acceptance, (int, float)) or tau < 1:
        raise UsageError(f"--from-report: {label}'s specdec row has no acceptance and tau to derive k from")
    if acceptance <= 0:  # a measured 0%: every draft was rejected, so their length left no trace in tau
        raise UsageError(f"--from-report: {label}'s specdec row kept no drafts (acceptance 0%, tau {tau:.2f}), so it "
                         "cannot tell how long k: auto's drafts were; bench at a fixed k (-k N) or run tune-k")
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
    """`~` expanded, `package:NAME/sub` resolved in the installed package (as models/loading.py loads it),
    relative folders made absolute; anything else is a hub id."""
    if is_local_reference(spec.model):
        folder = local_path(spec.model)
        return ModelRef(spec, os.path.abspath(folder), True)
    return ModelRef(spec, spec.model, False)


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


# --------------------------------------------------------------------------- draft heads (medusa, eagle)

HEAD_OPTION = {"medusa": "heads", "eagle": "head"}  # the profile key naming the head folder, per kind


@dataclass(frozen=True)
class HeadRef:
    """A draft-head folder as an engine names it: a hub id, or the absolute local path it resolves to."""

    name: str
    local: bool

    @property
    def stem(self) -> str:
        return Path(self.name.rstrip("/")).name or "head"


def head_reference(member: DrafterSpec) -> str | None:
    """What the profile wrote for a head drafter's folder (`heads:` / `head:`); None for other kinds."""
    option = HEAD_OPTION.get(member.kind)
    value = member.options.get(option) if option else None
    return value if isinstance(value, str) and value else None


def head_ref(reference: str) -> HeadRef:
    """As model_ref: `~` expanded, `package:NAME/sub` resolved, relative folders made absolute."""
    if is_local_reference(reference):
        return HeadRef(os.path.abspath(local_path(reference)), True)
    return HeadRef(reference, False)


@dataclass(frozen=True)
class EagleInfo:
    """An EAGLE head as its config.json describes it: kind 'eagle' (EAGLE-1) or 'eagle3'; None with
    `problem` (one sentence, what to do) when config.json cannot be read here. `assumed`: the local
    folder does not exist yet, and the head is taken for the EAGLE-3 head `specdec train-draft --kind
    eagle` writes there (a shipped profile names a head the user trains later)."""

    ref: HeadRef
    kind: str | None
    config: dict[str, Any] = field(default_factory=dict)
    problem: str = ""
    assumed: bool = False


def read_eagle(member: DrafterSpec) -> EagleInfo:
    """Tell EAGLE-1 from EAGLE-3 from the head's config.json only (no weights are read). A local
    folder is read where it is; a hub id only from the local Hugging Face cache (export makes no
    network requests)."""
    ref = head_ref(head_reference(member) or "")
    if ref.local:
        folder = Path(ref.name)
        if not folder.exists():
            return EagleInfo(ref, "eagle3", assumed=True)
        if not (folder / HEAD_CONFIG).is_file():
            return EagleInfo(ref, None, problem=(
                f"cannot tell EAGLE from EAGLE-3: head folder '{ref.name}' has no {HEAD_CONFIG} (export reads only that "
                "file); fix drafter.head, or train a head there with `specdec train-draft --kind eagle`"))
    else:
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(ref.name, HEAD_CONFIG)
        except ValueError:  # huggingface_hub's HFValidationError: not a repo id
            return EagleInfo(ref, None, problem=(
                f"drafter.head '{ref.name}' is neither an existing folder nor a hub repo id: fix drafter.head"))
        if not isinstance(cached, str):
            return EagleInfo(ref, None, problem=(
                f"cannot tell EAGLE from EAGLE-3 for hub head {ref.name} without its {HEAD_CONFIG}, which is not in "
                f"the local Hugging Face cache: fetch it (`hf download {ref.name} {HEAD_CONFIG}`) and export again"))
        folder = Path(cached).parent
    try:
        config = read_config(folder)
    except ModelSourceError as error:
        return EagleInfo(ref, None, problem=str(error))
    if "medusa_num_heads" in config:
        return EagleInfo(ref, None, config, problem=(
            f"'{ref.name}' holds Medusa heads (its {HEAD_CONFIG} has medusa_num_heads), not an EAGLE head: "
            "set drafter kind medusa with `heads:`"))
    return EagleInfo(ref, head_kind(config), config)


# --------------------------------------------------------------------------- drafters


def drafter_members(drafter: DrafterSpec) -> list[DrafterSpec]:
    """A chain's members in order; any other drafter alone."""
    if drafter.kind == "chain":
        return [d for d in drafter.drafters if d is not None]
    return [drafter]


KIND_NAMES = {"model": "draft model", "ngram": "prompt lookup (ngram)", "early-exit": "early exit",
              "medusa": "Medusa heads", "eagle": "EAGLE-1 head", "eagle3": "EAGLE-3 head"}
SLOTS = {"model": "model", "ngram": "ngram", "early-exit": "early_exit", "eagle": "head"}  # Medusa: none yet
PREFERENCE = ("model", "head", "early_exit", "ngram")  # Selection's slots, the strongest drafter first


def _preference(member: DrafterSpec) -> int:
    """A member's place in PREFERENCE; kinds no engine runs (Medusa) last."""
    slot = SLOTS.get(member.kind)
    return PREFERENCE.index(slot) if slot in PREFERENCE else len(PREFERENCE)


def _kind_name(d: DrafterSpec, head: str | None = None) -> str:
    if d.kind == "eagle" and head is None:
        return "EAGLE head"
    return KIND_NAMES.get(head or d.kind, d.kind)


@dataclass
class Selection:
    """The drafters an engine runs, and what of the profile's drafter it leaves behind."""

    model: DrafterSpec | None = None
    ngram: DrafterSpec | None = None
    early_exit: DrafterSpec | None = None
    head: DrafterSpec | None = None  # kind eagle (Medusa heads are carried nowhere)
    eagle: EagleInfo | None = None  # with head: its folder and kind
    not_carried: list[str] = field(default_factory=list)

    def first(self) -> DrafterSpec | None:
        return self.model or self.ngram or self.early_exit or self.head


def _member_key(member: DrafterSpec, unsupported: dict[str, str]) -> tuple[str, EagleInfo | None, str | None]:
    """The key `unsupported` is looked up by ('model-gguf', 'eagle', 'eagle3', or the kind), an EAGLE
    head's info, and the reason an EAGLE head cannot be carried when its kind cannot be told here
    (not needed when the engine refuses both kinds alike)."""
    if member.kind == "model" and member.model and member.model.gguf_file:
        return "model-gguf", None, None
    if member.kind != "eagle":
        return member.kind, None, None
    info = read_eagle(member)
    if info.kind is not None:
        return info.kind, info, None
    refusals = {unsupported.get("eagle"), unsupported.get("eagle3")}
    if len(refusals) == 1 and None not in refusals:
        return "eagle", info, None
    return "eagle", info, info.problem


def select_drafters(drafter: DrafterSpec, engine: str, unsupported: dict[str, str]) -> Selection:
    """Members the engine can run: `unsupported` maps a member (kind, 'model-gguf', or for EAGLE heads
    'eagle' (EAGLE-1) / 'eagle3') to the reason it cannot. llama.cpp combines one n-gram drafter with
    one draft model or EAGLE-3 head (those two share its one draft slot); the others take one drafter."""
    title = ENGINE_INFO[engine].title
    members = drafter_members(drafter)
    chosen = Selection()
    reasons = []
    # an engine with one drafter gets the one that drafts on every step: a draft model or head
    # before early exit, and those before prompt lookup (which drafts only where the text repeats)
    ranked = sorted(enumerate(members), key=lambda item: _preference(item[1]))
    for i, member in ranked:
        where = f"drafter.drafters[{i}]" if drafter.kind == "chain" else "drafter"
        key, info, problem = _member_key(member, unsupported)
        label = _kind_name(member, info.kind if info else None)
        slot = SLOTS.get(member.kind)
        if problem or key in unsupported:
            reasons.append(f"{where} ({label}): {problem or unsupported[key]}")
            continue
        if slot is None:
            reasons.append(f"{where} ({label}): {title} has no drafter of kind {member.kind}")
            continue
        if engine == "llama.cpp":
            combinable = chosen.ngram is None if slot == "ngram" else (chosen.model is None and chosen.head is None)
        else:
            combinable = False
        if chosen.first() is not None and not combinable:
            kept = _kind_name(chosen.first(), chosen.eagle.kind if chosen.eagle else None)
            reasons.append(f"{where} ({label}): {title} runs one drafter; the chain's {kept} is written")
            continue
        setattr(chosen, slot, member)
        if slot == "head":
            chosen.eagle = info
    ngram = chosen.ngram
    # solo_ngram merges lookup's short matches with a later member's proposals
    solo = ngram.options.get("solo_ngram") if ngram is not None and ngram is not members[-1] else None
    if solo is not None and solo > ngram.options["min_ngram"]:
        reasons.append(f"drafter solo_ngram {solo} ({title} does not verify a shorter match's guess and another "
                       "drafter's in one tree)")
    if chosen.first() is None:
        raise NotCarriedError(f"{title} cannot carry profile drafter {drafter.describe()}: " + "; ".join(
            r.split(": ", 1)[1] for r in reasons))
    chosen.not_carried = reasons
    return chosen


# what to do instead of Medusa heads, where an engine cannot run them
MEDUSA_NEXT = "or train an EAGLE-3 head for this target (`specdec train-draft --kind eagle`)"


def fixed_tree(tree: TreeSpec) -> TreeSpec:
    """The tree an engine drafts every step. `tree: auto` grows within bounds that are a safety limit
    (48 nodes, depth 24), as k_max is for k: auto; as k: auto becomes the default fixed k, tree: auto
    becomes the default fixed tree (profile.DEFAULT_TREE: 16 nodes, width 4, depth 6) within its bounds."""
    if not tree.auto:
        return tree
    nodes = min(tree.nodes, DEFAULT_TREE["nodes"])
    return TreeSpec(nodes, min(tree.width, DEFAULT_TREE["width"]), min(tree.depth, DEFAULT_TREE["depth"], nodes))


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


def head_notes(chosen: Selection) -> list[str]:
    """Header lines about the EAGLE head written: a folder that does not exist yet."""
    if chosen.eagle is None or not chosen.eagle.assumed:
        return []
    return [f"head folder {chosen.eagle.ref.name} does not exist here yet: written as an EAGLE-3 head, what "
            f"`specdec train-draft --kind eagle --out {chosen.eagle.ref.name}` writes there"]


def architecture_note(engine: str, info: EagleInfo) -> str | None:
    """SGLang picks a draft head's model class by its config.json `architectures`: a head whose config
    names no Eagle class loads as another model."""
    architectures = info.config.get("architectures") or []
    if engine != "sglang" or info.assumed or any("Eagle" in str(a) for a in architectures):
        return None
    wanted = "LlamaForCausalLMEagle3" if info.kind == "eagle3" else "LlamaForCausalLMEagle"
    return (f"drafter.head {HEAD_CONFIG} architectures {json.dumps(architectures)} (SGLang loads a draft head by that "
            f"name: set it to [\"{wanted}\"] in a copy of the head folder and serve that copy)")


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


def common_not_carried(profile: Profile, engine: str, k_choice: KChoice, tree_carried: bool = False) -> list[str]:
    """k: auto; and a token tree, which an engine that drafts one chain gets as a chain of k (as for
    every drafter). `tree_carried`: the engine drafts the profile's tree itself (k is then unused, and
    only `tree: auto`'s growth rule is named)."""
    items = []
    tree = profile.tree if not tree_carried else None
    if profile.k == "auto" and not (tree_carried and profile.tree is not None):
        items.append("k: auto (specdec's per-step stopping rule, tuned online from acceptance and costs; "
                     f"written as the fixed k = {k_choice.k})")
    if tree is not None:
        items.append(f"tree: {tree.describe()} ({ENGINE_INFO[engine].title} drafts one chain here; "
                     f"written as a chain of k = {k_choice.k})")
    elif tree_carried and profile.tree is not None and profile.tree.auto:
        fixed = fixed_tree(profile.tree)
        items.append(f"tree: {profile.tree.describe()} (specdec grows a node only while it is expected to pay for its "
                     f"verification; written as the default fixed tree, {fixed.describe()})")
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
        "medusa": ("vLLM's medusa method loads only its own converted layout (blocks.{h}.layers.{l}.*, lm_heads.{h}.*) "
                   "and skips other tensor names without a word, so these heads would draft untrained: convert "
                   "medusa_lm_head.safetensors to that layout first, " + MEDUSA_NEXT),
    })
    not_carried = chosen.not_carried + common_not_carried(profile, engine, k_choice)
    spec: dict[str, Any]
    eagle_source = []
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
                  header_lines(profile, engine, k_choice, [*head_notes(chosen), *eagle_source, request_note(profile)]))


# --------------------------------------------------------------------------- SGLang


def export_sglang(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    engine, k = "sglang", k_choice.k
    title = ENGINE_INFO[engine].title
    target = model_ref(profile.target)
    chosen = select_drafters(profile.drafter, engine, {
        "early-exit": "SGLang has no early-exit (layer-skip) drafter",
        "model-gguf": "SGLang's draft model path takes a Hugging Face model, not a GGUF file",
        "medusa": "SGLang has no Medusa drafter (its head drafters are EAGLE, EAGLE-3 and MTP): " + MEDUSA_NEXT.removeprefix("or "),
    })
    tree_carried = chosen.eagle is not None and profile.tree is not None
    not_carried = chosen.not_carried + common_not_carried(profile, engine, k_choice, tree_carried)
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
        note = architecture_note(engine, eagle)
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


EAGLE3_BUILD = ("draft-eagle3 needs a llama.cpp build with PR #18039 (EAGLE-3, merged June 2026); the head is "
                "converted as docs/speculative.md's EAGLE-3 section shows (convert_hf_to_gguf.py --target-model-dir)")


def export_llama_cpp(profile: Profile, k_choice: KChoice, gpus: int = 1) -> Export:
    engine, k = "llama.cpp", k_choice.k
    target = model_ref(profile.target)
    unsupported = {
        "early-exit": "llama.cpp has no early-exit (layer-skip) drafter",
        "medusa": "llama.cpp has no Medusa drafter (its head drafter is draft-eagle3): " + MEDUSA_NEXT.removeprefix("or "),
        "eagle": ("llama.cpp has no EAGLE-1 drafter (draft-eagle3 takes EAGLE-3 heads only): serve this head with vLLM or "
                  "SGLang (`specdec export --to vllm`), or train an EAGLE-3 head (`specdec train-draft --kind eagle`)"),
    }
    if target.spec.gguf_file:
        unsupported["eagle3"] = (
            "converting an EAGLE-3 head to GGUF (convert_hf_to_gguf.py --target-model-dir) needs the target's Hugging Face "
            f"folder, and the profile names only the GGUF file {target.spec.gguf_file}: point target.model at the "
            "original model")
    chosen = select_drafters(profile.drafter, engine, unsupported)
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
    export = Export(engine, ENGINE_INFO[engine].version, script, config, not_carried,
                    header_lines(profile, engine, k_choice, [*notes, request_note(profile)]))
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
        "medusa": ("TensorRT-LLM runs Medusa only in its TensorRT engine flow (examples/medusa convert_checkpoint.py, "
                   "then trtllm-build), not in the PyTorch backend trtllm-serve --config is written for: build that "
                   "engine, " + MEDUSA_NEXT),
        "eagle": ("TensorRT-LLM's PyTorch backend runs EAGLE-3 heads only (decoding_type Eagle is an alias of Eagle3; "
                  "EAGLE-1 checkpoints do not load): serve this head with vLLM or SGLang (`specdec export --to vllm`)"),
    })
    not_carried = chosen.not_carried + common_not_carried(profile, engine, k_choice)
    spec: dict[str, Any]
    if chosen.eagle is not None:
        spec = {"decoding_type": "Eagle3", "max_draft_len": k, "speculative_model": chosen.eagle.ref.name}
    elif chosen.model is not None:
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
    notes = [*head_notes(chosen),
             "--config is the preferred name of --extra_llm_api_options (releases before 1.2 know only the latter)",
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
    whole_lm = "generate()'s assistant_model is a whole causal LM, not a head over the target's hidden states"
    eagle = (f"transformers has no EAGLE drafter ({whole_lm}): run the head with specdec itself (`specdec generate`), "
             "or serve it with vLLM or SGLang")
    chosen = select_drafters(profile.drafter, engine, {
        "medusa": f"transformers has no Medusa drafter ({whole_lm}): run these heads with specdec itself (`specdec generate`)",
        "eagle": eagle,
        "eagle3": eagle,
    })
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
