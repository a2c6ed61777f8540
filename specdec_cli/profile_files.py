"""Where profiles live and how one is read: the user's and the shipped folders, a name or a path,
bounded reads of a regular UTF-8 file, and YAML through safe_load only."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from .errors import ProfileError

MAX_PROFILE_BYTES = 1 << 20
PROFILE_SUFFIXES = (".yaml", ".yml")


def shipped_profiles_dir() -> Path:
    """The profiles that come with the package (specdec_cli/profiles links to the top-level profiles/)."""
    return Path(__file__).resolve().parent / "profiles"


def user_config_dir() -> Path:
    if os.environ.get("SPECDEC_CONFIG_DIR"):
        return Path(os.environ["SPECDEC_CONFIG_DIR"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "specdec"


def user_profiles_dir() -> Path:
    return user_config_dir() / "profiles"


def profile_search_dirs() -> list[Path]:
    """Where `-p NAME` looks, first match wins: the user's own (tuned copies), then the shipped ones."""
    return [user_profiles_dir(), shipped_profiles_dir()]


def list_profiles() -> list[Path]:
    """Every profile file a name can reach, one per name, in search order."""
    seen: dict[str, Path] = {}
    for folder in profile_search_dirs():
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                if path.suffix in PROFILE_SUFFIXES and path.stem not in seen:
                    seen[path.stem] = path
    return sorted(seen.values(), key=lambda p: p.stem)


def resolve_profile_path(name_or_path: str) -> Path:
    """A path as given when it looks like one or exists; otherwise a profile name in the search dirs."""
    candidate = Path(name_or_path).expanduser()
    looks_like_path = os.sep in name_or_path or candidate.suffix in PROFILE_SUFFIXES
    if candidate.exists() or looks_like_path:
        return candidate
    for folder in profile_search_dirs():
        for suffix in PROFILE_SUFFIXES:
            if (folder / f"{name_or_path}{suffix}").is_file():
                return folder / f"{name_or_path}{suffix}"
    names = ", ".join(p.stem for p in list_profiles()) or "none"
    raise ProfileError(f"no profile named '{name_or_path}' (shipped and yours: {names}); or give a path to a .yaml file")


def read_profile_text(path: Path) -> str:
    label = str(path)
    if not path.exists():
        raise ProfileError(f"{label}: no such file")
    if path.is_dir():
        raise ProfileError(f"{label}: is a directory, not a profile file (a model folder holds a config.json: give it with --target)")
    if not path.is_file():  # a FIFO blocks the reader and /dev/zero never ends: never open those
        raise ProfileError(f"{label}: is not a regular file (a device, pipe or socket), not a profile file")
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_PROFILE_BYTES + 1)  # bounded, whatever the file claims
    except OSError as exc:
        raise ProfileError(f"{label}: cannot be read ({exc.strerror or exc})") from None
    if len(raw) > MAX_PROFILE_BYTES:
        raise ProfileError(f"{label}: is too large for a profile (limit {MAX_PROFILE_BYTES} bytes)")
    if b"\0" in raw:
        raise ProfileError(f"{label}: is a binary file, not YAML")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"{label}: is not UTF-8 text (byte {exc.start})") from None


def parse_yaml(text: str, label: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.constructor.ConstructorError as exc:
        problem = (getattr(exc, "problem", "") or str(exc)).strip()
        if "could not determine a constructor" in problem:
            raise ProfileError(f"{label}: YAML tags are not allowed in a profile ({problem})") from None
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ProfileError(f"{label}: not valid YAML{at}: {problem}") from None
    except (ValueError, TypeError, AttributeError, LookupError, OverflowError) as exc:
        # PyYAML's scalar constructors let these escape: an impossible date, `!!float abc`, huge ints
        raise ProfileError(f"{label}: not valid YAML: a value cannot be read ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise ProfileError(f"{label}: not valid YAML{at}: {problem}") from None
    except RecursionError:
        raise ProfileError(f"{label}: YAML nested too deeply") from None
