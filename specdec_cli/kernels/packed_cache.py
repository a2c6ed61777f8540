"""int4 weights packed for specdec's CPU kernel, kept on disk: loading the 1.5B Qwen target with
its head in int4 took 27.9 s the first time on a 2-core EPYC (packing) and 3.7 s from this cache
(829 MB). One safetensors file per model, dtype, group size, head choice and layout, in
<specdec cache>/packed; deleting it only costs the next run a repack."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch

from ..files import replace_atomically

log = logging.getLogger("specdec")

LAYOUT_VERSION = 2  # int4_matmul.pack's layout (2: float16 scales): a change makes older files unreachable (a new key)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")


def model_identity(source: str, model: torch.nn.Module | None) -> str | None:
    """What the weights came from: a local folder's weight files (name, size, modification time),
    or a hub id with the commit transformers resolved; None where neither is known (no cache)."""
    folder = Path(source).expanduser()
    if folder.is_dir():
        files = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES)
        stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
        return json.dumps([str(folder.resolve()), stats]) if stats else None
    commit = getattr(model.config, "_commit_hash", None)
    return f"{source}@{commit}" if commit else None


def cache_file(folder: Path, identity: str, dtype: torch.dtype, group_size: int, head: bool) -> Path:
    """The file in `folder` (<specdec cache>/packed) for these weights packed this way."""
    key = json.dumps([identity, str(dtype), group_size, head, LAYOUT_VERSION, torch.__version__])
    return folder / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.safetensors"


def load_packed(path: Path) -> dict[str, torch.Tensor] | None:
    """The stored tensors, or None (absent, or unreadable: then repacked and rewritten)."""
    if not path.is_file():
        return None
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (OSError, SafetensorError) as exc:  # a truncated or foreign file
        log.warning("ignoring unreadable packed weights %s (%s); packing again", path, exc)
        return None


def save_packed(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    try:
        replace_atomically(path, lambda temp: save_file({k: v.contiguous() for k, v in tensors.items()}, temp))
    except OSError as exc:  # a full or read-only disk costs the next run a repack, nothing more
        log.warning("could not keep the packed int4 weights in %s (%s)", path.parent, exc)
        return
    log.info("kept the packed int4 weights in %s (%.2f GB)", path, os.path.getsize(path) / 1e9)
