"""Models and draft heads as an engine names them: a hub id, or the absolute local path a profile's
reference resolves to here; an EAGLE head's kind read from its config.json alone."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..drafters.head_files import CONFIG as HEAD_CONFIG
from ..drafters.head_files import head_kind, read_config
from ..errors import ModelSourceError
from ..models.sources import is_local_reference, local_path
from ..specs import DrafterSpec, ModelSpec


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
    """`~` expanded, `package:NAME/sub` resolved in the installed package (as models/sources.py finds it),
    relative folders made absolute; anything else is a hub id."""
    if is_local_reference(spec.model):
        folder = local_path(spec.model)
        return ModelRef(spec, os.path.abspath(folder), True)
    return ModelRef(spec, spec.model, False)


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
