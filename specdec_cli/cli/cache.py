"""`specdec cache`: what specdec keeps on disk (converted models, packed weights, built kernels,
compiled steps, measured costs), part by part with its size and folder; `cache clear` removes
the parts named. Everything there is made again when needed: clearing loses time, never data."""

from __future__ import annotations

import shutil
from typing import Annotated, Optional

import typer

from ..cache_dirs import CachePart, cache_parts, size_of
from ..errors import UsageError
from .output import Output

cache_app = typer.Typer(help="List what specdec keeps on disk, or clear parts of it.", invoke_without_command=True)


def human_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


@cache_app.callback()
def cache_list(ctx: typer.Context) -> None:
    """Each part of the cache: name, size, entries, folder, what it holds (tab-separated when piped)."""
    if ctx.invoked_subcommand is not None:
        return
    out = Output()
    rows = []
    for part in cache_parts():
        entries = part.entries()
        rows.append((part.name, human_size(sum(size_of(e) for e in entries)), str(len(entries)), str(part.path), part.what))
    out.listing(("part", "size", "entries", "where", "holds"), rows)


@cache_app.command("clear")
def cache_clear(
    parts: Annotated[Optional[list[str]], typer.Argument(help="the parts to clear (see `specdec cache`)", show_default=False)] = None,
    everything: Annotated[bool, typer.Option("--all", help="clear every part")] = False,
) -> None:
    """Remove the parts named (or --all); each is made again when a run needs it."""
    known = {part.name: part for part in cache_parts()}
    if everything == bool(parts):
        raise UsageError(f"cache clear: name the parts to clear ({', '.join(known)}) or give --all, not both")
    unknown = [name for name in parts or () if name not in known]
    if unknown:
        raise UsageError(f"cache clear: '{unknown[0]}' is not a part of the cache: {', '.join(known)}")
    out = Output()
    for part in known.values() if everything else [known[name] for name in dict.fromkeys(parts)]:
        freed = clear(part)
        out.message(f"cleared {part.name} ({human_size(freed)}, {part.path})")


def clear(part: CachePart) -> int:
    """Removes the part's entries; the bytes freed."""
    freed = 0
    for entry in part.entries():
        freed += size_of(entry)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return freed
