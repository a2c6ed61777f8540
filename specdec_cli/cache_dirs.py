"""Where specdec keeps what it makes once and reuses: converted GGUF models, packed int4 weights,
its built CPU kernels, inductor's compiled kernels, compile costs, distillation data."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SPECDEC_CACHE_DIR, else $XDG_CACHE_HOME/specdec, else ~/.cache/specdec."""
    if os.environ.get("SPECDEC_CACHE_DIR"):
        return Path(os.environ["SPECDEC_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specdec"


def inductor_cache_dir() -> str:
    """Where inductor keeps compiled kernels across processes: TORCHINDUCTOR_CACHE_DIR if set,
    else <specdec cache>/inductor (~/.cache/specdec/inductor; $SPECDEC_CACHE_DIR/inductor)."""
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]
