"""Profile files for the tiny test models: test defaults (the device under test, float32, compile off)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tiny_models import TEST_DEVICE


def write_profile(folder: Path, name: str = "test", **fields) -> Path:
    """A profile file with sensible test defaults (the device under test, float32), overridden by `fields`."""
    # compile off unless a test asks for it: the compiled path has its own tests (test_compiled.py)
    data = {"device": TEST_DEVICE, "max_new_tokens": 24, "k": 4, "compile": "off"}
    data.update(fields)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def model_profile(folder: Path, pair: dict[str, Path], name: str = "test", **fields) -> Path:
    return write_profile(
        folder,
        name,
        target={"model": str(pair["target"]), "dtype": "float32"},
        drafter=fields.pop("drafter", {"kind": "model", "model": str(pair["draft"])}),
        **fields,
    )
