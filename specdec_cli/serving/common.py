"""What every engine module shares: its declared info, the Export it builds, and the helpers that
write shell commands, comment lines and the settings no engine carries."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import UsageError
from ..profile_checks import DEFAULT_TREE
from ..specs import ModelSpec, Profile, TreeSpec
from .k_choice import KChoice


@dataclass(frozen=True)
class EngineInfo:
    """What an engine module declares about itself (its `INFO`)."""

    name: str  # the registry's name, what --to takes
    title: str
    version: str  # the release written for
    source: str  # where its syntax was read
    # runs a prompt-lookup drafter beside its one draft model or head (llama.cpp); others run one drafter
    pairs_ngram: bool = False


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


def k_table_setting(profile: Profile) -> str:
    """`k_by_batch_size: {1: 5, 4: 3}` as the profile writes it."""
    return "k_by_batch_size: {" + ", ".join(f"{size}: {k}" for size, k in profile.k_by_batch_size or ()) + "}"


def common_not_carried(profile: Profile, info: EngineInfo, k_choice: KChoice, tree_carried: bool = False,
                       k_table_carried: bool = False) -> list[str]:
    """k: auto; a token tree, which an engine that drafts one chain gets as a chain of k (as for
    every drafter); and a k per batch size, which an engine with one k for every batch gets as that k.
    `tree_carried`: the engine drafts the profile's tree itself (k is then unused, and only
    `tree: auto`'s growth rule is named). `k_table_carried`: the engine reads the k table itself."""
    items = []
    if profile.k_by_batch_size and not k_table_carried:
        items.append(f"{k_table_setting(profile)} ({info.title} drafts the same k at every batch size; "
                     f"written as the single k = {k_choice.k})")
    tree = profile.tree if not tree_carried else None
    if profile.k == "auto" and not (tree_carried and profile.tree is not None):
        items.append("k: auto (specdec's per-step stopping rule, tuned online from acceptance and costs; "
                     f"written as the fixed k = {k_choice.k})")
    if tree is not None:
        items.append(f"tree: {tree.describe()} ({info.title} drafts one chain here; "
                     f"written as a chain of k = {k_choice.k})")
    elif tree_carried and profile.tree is not None and profile.tree.auto:
        fixed = fixed_tree(profile.tree)
        items.append(f"tree: {profile.tree.describe()} (specdec grows a node only while it is expected to pay for its "
                     f"verification; written as the default fixed tree, {fixed.describe()})")
    return items


def quantize_method(spec: ModelSpec) -> str:
    """'int8', or 'int4, group_size 128'."""
    return f"int4, group_size {spec.group_size}" if spec.quantize == "int4" else spec.quantize


def quantize_note(info: EngineInfo, role: str, spec: ModelSpec, instead: str) -> str:
    """A quantized model (`role`: target or drafter) whose quantization the export does not write;
    `instead`: what this engine offers for it."""
    return (f"{role}.quantize: {quantize_method(spec)} (specdec quantizes at load: torchao's int8 and int4, or its "
            f"own int4 kernel on AVX512-VNNI and AVX2 CPUs; not written here; {info.title}: {instead})")


def quantize_notes(profile: Profile, info: EngineInfo, draft: ModelSpec | None, target_instead: str | None,
                   draft_instead: str) -> list[str]:
    """quantize_note for the target and the draft model, each where it is quantized
    (`target_instead` None: the engine carries the target's)."""
    pairs = (("target", profile.target, target_instead), ("drafter", draft, draft_instead))
    notes = [quantize_note(info, role, spec, instead) for role, spec, instead in pairs
             if spec is not None and spec.quantize != "none" and instead is not None]
    return notes + [f"{role}.quantize_head: true (specdec's int4 output head; {info.title} keeps the head as the "
                    "checkpoint holds it)" for role, spec, _ in pairs if spec is not None and spec.quantize_head]


def header_lines(profile: Profile, info: EngineInfo, k_choice: KChoice, extra: Sequence[str] = ()) -> list[str]:
    return [
        f"{info.version}: profile '{profile.name}' (written by specdec export)",
        f"syntax from {info.source}",
        k_choice.reason,
        *extra,
    ]


def fixed_tree(tree: TreeSpec) -> TreeSpec:
    """The tree an engine drafts every step. `tree: auto` grows within bounds that are a safety limit
    (48 nodes, depth 24), as k_max is for k: auto; as k: auto becomes the default fixed k, tree: auto
    becomes the default fixed tree (profile.DEFAULT_TREE: 16 nodes, width 4, depth 6) within its bounds."""
    if not tree.auto:
        return tree
    nodes = min(tree.nodes, DEFAULT_TREE["nodes"])
    return TreeSpec(nodes, min(tree.width, DEFAULT_TREE["width"]), min(tree.depth, DEFAULT_TREE["depth"], nodes))


GPU_ONLY = "{title}'s CPU backend is a separate build, chosen at install, not a serve flag"


def gguf_from_hub(title: str, target) -> NotCarriedError:
    """A GGUF file named inside a hub repo: the servers that read GGUF want it on disk."""
    return NotCarriedError(
        f"{title} cannot load GGUF file {target.spec.gguf_file} from hub repo {target.name} by name; download it "
        f"(`hf download {target.name} {target.spec.gguf_file} --local-dir DIR`) and point target.model at DIR")
