"""The exceptions the CLI turns into one-line messages, each with its exit code."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (a one-line report); its type's name where it has none."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class SpecdecError(Exception):
    """A failure a user can act on: the message says what to fix."""

    exit_code = EXIT_FAILURE


class Interrupted(SpecdecError):
    """Ctrl-C, after the command kept what finished: the message says how far it got."""

    exit_code = EXIT_INTERRUPTED


class UsageError(SpecdecError):
    """Bad options or input: exit 2."""

    exit_code = EXIT_USAGE


class ProfileError(UsageError):
    """A profile that cannot be read or does not validate; the message names the file and key."""


class ModelLoadError(SpecdecError):
    """A model or tokenizer that cannot be loaded (missing, offline, unsafe format)."""


class ModelSourceError(UsageError):
    """The profile points at something that is not a usable model (missing folder, pickle-only weights)."""


class IncompatibleModelsError(UsageError):
    """Target and draft cannot be paired (different tokenizers)."""


class ContextLengthError(UsageError):
    """The prompt does not fit in the model's context."""
