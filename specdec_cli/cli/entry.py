"""The `specdec` command as a process: the app's main(), then out of the process at once."""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

from .app import main


def run() -> NoReturn:
    """The `specdec` command: main(), then out of the process. Once torch is loaded, the
    interpreter's own teardown (every module and tensor freed one by one) took about 1 s of a
    one-off run's wall (BENCHMARKS.md, "A one-off run from a shell"): by then everything the
    command writes is written, so the exit handlers run, the streams are flushed, and only that
    teardown is skipped."""
    code = main()
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's; elsewhere a normal exit
    if "torch" not in sys.modules or run_exit_handlers is None:
        sys.exit(code)
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (a closed pipe): nothing left to tell it
            pass
    os._exit(code)
