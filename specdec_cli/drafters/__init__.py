"""Drafters: one file per way of guessing, named by `drafter.kind` in a profile (see registry.py).

This package's __init__ imports nothing at load time, so that reading the registry (profile.py
does, to validate `drafter:`) does not import torch or any drafter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..specs import DrafterSpec
    from .base import DraftContext, Drafter


def build_drafter(spec: "DrafterSpec", context: "DraftContext") -> "Drafter":
    """The drafter a spec names, built by its module's `build(spec, context)`."""
    from importlib import import_module

    from ..drafter_kinds import REGISTRY

    module = import_module(f"{__name__}.{REGISTRY[spec.kind].module}")
    return module.build(spec, context)
