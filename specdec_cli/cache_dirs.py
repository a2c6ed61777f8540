"""Where specdec keeps what it makes once and reuses: converted GGUF models, packed int4 weights,
its built CPU kernels, inductor's compiled kernels, compile costs, distillation data."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

INDUCTOR_LIMIT_GB = 4.0  # compiled kernels and graphs kept at most (SPECDEC_INDUCTOR_MAX_GB)


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


def inductor_limit_bytes() -> int:
    """The bound on inductor's cache in specdec's folder: $SPECDEC_INDUCTOR_MAX_GB, else INDUCTOR_LIMIT_GB."""
    text = os.environ.get("SPECDEC_INDUCTOR_MAX_GB", "")
    try:
        gigabytes = float(text) if text else INDUCTOR_LIMIT_GB
    except ValueError:
        gigabytes = INDUCTOR_LIMIT_GB
    return int(max(0.0, gigabytes) * 1024 ** 3)


def size_of(path: Path) -> int:
    """Bytes a file or folder takes (links counted as themselves, never followed)."""
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())


def bound_inductor_cache() -> int:
    """Empty specdec's inductor folder where it holds more than its bound; bytes removed (0: within
    it, or a folder the user chose with TORCHINDUCTOR_CACHE_DIR, which is theirs to manage). Whole,
    not the oldest files: a cached graph names the kernel files it loads, and a graph whose kernels
    were taken would fail where a missing graph is compiled again."""
    folder = Path(inductor_cache_dir())
    if folder != cache_dir() / "inductor" or not folder.is_dir():
        return 0
    size = size_of(folder)
    if size <= inductor_limit_bytes():
        return 0
    shutil.rmtree(folder, ignore_errors=True)
    return size


def kernels_dir() -> Path:
    """Where specdec's CPU kernels are built: $TORCH_EXTENSIONS_DIR if set (a folder shared with
    other extensions), else <specdec cache>/kernels."""
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(extensions) if extensions else cache_dir() / "kernels"


@dataclass(frozen=True)
class CachePart:
    """One kind of thing specdec keeps: `specdec cache` lists and clears them by name."""

    name: str
    what: str
    path: Path
    pattern: str = "*"  # what of `path` is specdec's (a shared folder holds others' too)

    def entries(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        return sorted(self.path.glob(self.pattern)) if self.path.is_dir() else []


def cache_parts() -> list[CachePart]:
    """What specdec keeps, each part where it is now (the environment may move some)."""
    root = cache_dir()
    return [
        CachePart("gguf", "GGUF models converted to safetensors", root / "gguf"),
        CachePart("packed", "int4 weights packed for specdec's kernel", root / "packed"),
        CachePart("kernels", "specdec's C++ CPU kernels, built for this CPU",
                  kernels_dir(), "specdec_cpu_kernels_*"),
        CachePart("inductor", "torch.compile's compiled kernels and graphs", Path(inductor_cache_dir())),
        CachePart("compile-costs", "compile and step times `compile: auto` weighs", root / "compile_costs.json"),
        CachePart("distill", "train-draft's target answers", root / "distill"),
    ]
