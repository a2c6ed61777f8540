"""Files written all or nothing: an interrupted run never leaves half a report, head or checkpoint."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def write_atomically(path: Path, text: str) -> None:
    """Write text to a temp file beside `path`, fsync, then rename over it: all or nothing."""

    def write(temp: str) -> None:
        with open(temp, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())

    replace_atomically(path, write)


def replace_atomically(path: Path, write) -> None:
    """`write(temp path)` beside `path`, then rename it over `path` with the permissions a new
    file gets (or the old file's): a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    os.close(handle)
    try:
        write(temp)
        os.chmod(temp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~current_umask())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C inside the block takes effect when it ends: files written as one set (a checkpoint's
    state and head) are all written or all left as they were, never some of each."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives SIGINT
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def current_umask() -> int:
    """mkstemp makes 0600 files; a new report should get the permissions any new file would."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
