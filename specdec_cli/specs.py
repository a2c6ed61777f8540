"""The value types a profile resolves to: frozen, validated elsewhere (profile.py), importing nothing
of the project, so that the engine and the drafters can use them without the YAML reader."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

from .drafter_kinds import REGISTRY

MAX_K = 64  # verifying more than this per pass is never faster; larger values are typos (also a tree's nodes)

QUANTIZE_METHODS = ("none", "int8", "int4")  # weight-only, through torchao (kernels/quantize.py)
GROUP_SIZES = (32, 64, 128)  # int4: weights share a scale and zero point per this many inputs
DEFAULT_GROUP_SIZE = 128


@dataclass(frozen=True)
class ModelSpec:
    """Where a model comes from: a hub id or a local folder, optionally a GGUF file inside it; and
    how its weights are held: `quantize` none, int8 or int4, `group_size` for int4, and with int4
    `quantize_head` (the output head in int4 too; kept in full precision by default)."""

    model: str
    revision: str | None = None
    gguf_file: str | None = None
    dtype: str = "auto"
    quantize: str = "none"
    group_size: int | None = None  # int4 only (DEFAULT_GROUP_SIZE when unset); None otherwise
    quantize_head: bool = False  # int4 only


@dataclass(frozen=True)
class DrafterSpec:
    """A drafter by kind, with its options resolved to their defaults."""

    kind: str
    options: Mapping[str, Any] = field(default_factory=dict)
    model: ModelSpec | None = None  # kind: model
    drafters: tuple["DrafterSpec", ...] = ()  # kind: chain's members, kind: auto's candidates

    def describe(self) -> str:
        if self.kind == "model" and self.model:
            held = "" if self.model.quantize == "none" else f" ({self.model.quantize})"
            return f"model {self.model.model}{held}"
        if self.drafters:
            return f"{self.kind}(" + ", ".join(d.describe() for d in self.drafters) + ")"
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items() if v is not None)
        return f"{self.kind}({opts})" if opts else self.kind

    @property
    def members_key(self) -> str:
        """The profile key listing a chain's members or auto's candidates."""
        return REGISTRY[self.kind].members_key

    @property
    def vocab(self) -> str:
        """A kind-model drafter's vocab option as configured (auto: decided when the tokenizers load)."""
        return self.options.get("vocab", "auto")

    def paired_drafters(self, where: str = "drafter") -> list[tuple[str, "DrafterSpec"]]:
        """Every kind-model drafter in this spec (a chain's members too) whose vocab is not
        `shared`, so that its tokens pair with the target's by a rule, with where it sits."""
        if self.drafters:
            return [found for i, member in enumerate(self.drafters)
                    for found in member.paired_drafters(f"{where}.{self.members_key}[{i}]")]
        return [(where, self)] if self.kind == "model" and self.model is not None and self.vocab != "shared" else []


@dataclass(frozen=True)
class SamplingSpec:
    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class AdaptiveSpec:
    """Knobs of `k: auto`: the longest draft and the starting confidence threshold."""

    k_max: int = 32
    threshold: float = 0.4


@dataclass(frozen=True)
class TreeSpec:
    """The most a draft may hold: `nodes` in all, up to `width` children per node, `depth` levels.
    A chain of k is TreeSpec(k, 1, k). `auto`: within those bounds, grow the tree while a node is
    expected to pay for its verification (tree: auto)."""

    nodes: int
    width: int
    depth: int
    auto: bool = False

    @staticmethod
    def chain(k: int) -> "TreeSpec":
        return TreeSpec(k, 1, k)

    @property
    def is_chain(self) -> bool:
        return self.width == 1

    def describe(self) -> str:
        if self.auto:
            return f"auto (up to {self.nodes} nodes, width {self.width}, depth {self.depth})"
        return f"{self.nodes} nodes, width {self.width}, depth {self.depth}"


CONSTRAINT_KINDS = ("json_schema", "json", "regex", "grammar")


@dataclass(frozen=True)
class ConstraintSpec:
    """What a generation must spell (constraints/grammars.py): `kind` json_schema (`text`: the
    schema, as JSON), json (any JSON object), regex, or grammar (Lark or GBNF); `origin` names
    where it was given, for error messages."""

    kind: Literal["json_schema", "json", "regex", "grammar"]
    text: str = ""
    origin: str = "constraint"

    def describe(self) -> str:
        return {"json_schema": "a JSON schema", "json": "any JSON object", "regex": f"the regex {self.text!r}",
                "grammar": "a grammar"}[self.kind]


AUTO_TREE = TreeSpec(nodes=48, width=4, depth=24, auto=True)


@dataclass(frozen=True)
class Profile:
    name: str
    target: ModelSpec
    drafter: DrafterSpec
    description: str | None = None
    device: str = "auto"
    device_map: str | None = None
    k: int | Literal["auto"] = 5
    # (batch size, k) from that batch size up, ascending (tune-k --batch-sizes --write); k 0: plain decoding
    k_by_batch_size: tuple[tuple[int, int], ...] | None = None
    adaptive: AdaptiveSpec = AdaptiveSpec()
    tree: TreeSpec | None = None  # None: one chain of k drafts per step
    sampling: SamplingSpec = SamplingSpec()
    max_new_tokens: int = 256
    chat: bool | Literal["auto"] = "auto"
    compile: Literal["off", "auto", "on"] = "auto"  # static caches and compiled steps (runtime/static.py)
    trust_remote_code: bool = False
    allow_pickle: bool = False
    constraint: ConstraintSpec | None = None  # every generation spells it (structured output)
    source: Path | None = None  # the file it was read from, if any


def k_for_batch_size(table: tuple[tuple[int, int], ...] | None, batch_size: int) -> int | None:
    """The k a `k_by_batch_size` table gives at this batch size: that of the largest batch size
    listed at or below it (0: plain decoding). None: no table, or the batch size is below its
    first entry (the profile's k then applies)."""
    chosen = None
    for start, k in table or ():
        if start > batch_size:
            break
        chosen = k
    return chosen


@dataclass(frozen=True)
class Workload:
    """The generations a pipeline is expected to run: (count, max_new_tokens) parts."""

    parts: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, count: int, max_new_tokens: int) -> "Workload":
        return cls(((max(0, count), max(0, max_new_tokens)),))

    def __add__(self, other: "Workload") -> "Workload":
        return Workload(self.parts + other.parts)
