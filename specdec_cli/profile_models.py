"""A profile with models and drafters named on the command line (--target, --draft, --drafter),
validated as a profile file's keys are."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from .drafter_kinds import REGISTRY
from .errors import ProfileError
from .profile import HEAD_KINDS, drafter_to_dict, parse_profile, profile_to_dict
from .profile_checks import check_choice, check_nonempty_str
from .specs import DrafterSpec, Profile


def with_models(
    profile: Profile, *, target: str | None = None, draft: str | None = None, drafter: str | None = None,
) -> Profile:
    """The profile with models from the command line, validated as a profile's keys are.

    --target M replaces the target (its dtype and quantization stay; revision and gguf_file were the
    old model's);
    --draft M makes the drafter `kind: model` over M (with --drafter medusa or eagle, M is the
    head folder); --drafter KIND makes it KIND with its default options. The result has no file
    behind it (tune-k --write has nothing to write to) and, with a new target, that model's name.
    """
    if target is None and draft is None and drafter is None:
        return profile
    data = profile_to_dict(profile)
    if target is not None:
        data["target"] = {"model": check_nonempty_str(target, "--target"), "dtype": profile.target.dtype,
                          "quantize": profile.target.quantize, "group_size": profile.target.group_size,
                          "quantize_head": profile.target.quantize_head}
        data["name"] = model_short_name(target)
    if draft is not None:
        check_nonempty_str(draft, "--draft")
    kind = "model" if drafter is None and draft is not None else drafter
    if kind is not None:
        data["drafter"] = drafter_from_options(kind, draft, profile.drafter)
    label = str(profile.source or profile.name)
    return replace(parse_profile(data, label, default_name=profile.name), source=None)


def drafter_from_options(kind: str, draft: str | None, current: DrafterSpec) -> dict[str, Any]:
    """--drafter KIND [--draft M] in profile syntax; a profile's drafter of the same kind keeps
    its model or head when --draft does not name another."""
    check_choice(kind, "--drafter", tuple(REGISTRY))
    same = current.kind == kind
    if kind == "model":
        if draft is None and not same:
            raise ProfileError("--drafter model: name the draft model with --draft MODEL (a hub id or a folder)")
        return {"kind": "model", "model": draft} if draft is not None else drafter_to_dict(current)
    if kind in HEAD_KINDS:
        if draft is None and not same:
            raise ProfileError(f"--drafter {kind}: name the head folder with --draft DIR (specdec train-draft --kind {kind} writes one)")
        folder = draft if draft is not None else current.options[HEAD_KINDS[kind]]
        return {"kind": kind, HEAD_KINDS[kind]: folder}
    if kind == "auto":
        return _auto_candidates(draft, current)
    if draft is not None:
        raise ProfileError(f"--draft: a draft model goes with --drafter model, auto (or a head folder with medusa or eagle), not --drafter {kind}")
    return {"kind": kind}


def _auto_candidates(draft: str | None, current: DrafterSpec) -> dict[str, Any]:
    """--drafter auto: prompt lookup (the profile's own, if it has one) and the profile's other
    drafters (its draft model or head, a chain's members), or --draft M's model in their place."""
    if current.kind == "auto" and draft is None:
        return drafter_to_dict(current)
    members = list(current.drafters) if current.drafters else [current]
    lookup = next((drafter_to_dict(m) for m in members if m.kind == "ngram"), {"kind": "ngram"})
    others = [{"kind": "model", "model": draft}] if draft is not None else [drafter_to_dict(m) for m in members if m.kind != "ngram"]
    return {"kind": "auto", "candidates": [lookup, *others]}


def model_short_name(model: str) -> str:
    """A model id or folder as a profile name: its last part, safe in a file name."""
    last = Path(model.rstrip("/\\")).name or "model"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", last)
