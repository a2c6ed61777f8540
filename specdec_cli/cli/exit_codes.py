"""Failures as one line and an exit code: click's usage errors in the style of every other message,
and known library failures said as what to do."""

from __future__ import annotations

import os
import re
from typing import Callable

import typer

from ..errors import EXIT_FAILURE, EXIT_INTERRUPTED, Interrupted, SpecdecError
from .output import Output


def exit_code_of(run_app: Callable[[], object]) -> int:
    """Run the app (click in non-standalone mode) and turn every way it ends into an exit code,
    every failure into one line on stderr; SPECDEC_DEBUG=1 adds the traceback."""
    debug = os.environ.get("SPECDEC_DEBUG", "") not in ("", "0")
    err = Output().info
    try:
        code = run_app()  # without standalone mode click returns typer.Exit's code instead of exiting
        if code == EXIT_INTERRUPTED:  # typer turns a Ctrl-C outside a command's own handler into Exit(130)
            err.print("specdec: interrupted", markup=False)
        return code if isinstance(code, int) else 0
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        err.print("specdec: interrupted", markup=False)
        return EXIT_INTERRUPTED
    except typer.TyperException as exc:  # click's usage errors: typer >= 0.29 carries its own click
        err.print(f"specdec: error: {usage_message(exc)}", markup=False)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("specdec: interrupted", markup=False)
        return EXIT_INTERRUPTED
    except Interrupted as exc:  # the command said how far it got: one line, no "error"
        err.print(f"specdec: {exc}", markup=False)
        return exc.exit_code
    except SpecdecError as exc:
        if debug:
            err.print_exception()
        err.print(f"specdec: error: {exc}", markup=False)
        return exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the last line of defence: never a bare traceback
        if debug:
            err.print_exception()
        message, code = describe_unexpected(exc)
        err.print(f"specdec: error: {message}", markup=False)
        return code


def describe_unexpected(exc: BaseException) -> tuple[str, int]:
    """Known failures from the libraries, as one line that says what to do."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return ("out of memory: try a smaller dtype (--dtype bfloat16 or float16), fewer --max-new-tokens, "
                "or spread the target over GPUs with `device_map: auto` in the profile", EXIT_FAILURE)
    if isinstance(exc, MemoryError):
        return ("out of host memory: use a smaller dtype (--dtype bfloat16) or a smaller model", EXIT_FAILURE)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (f"unexpected {type(exc).__name__}: {first} (SPECDEC_DEBUG=1 shows the traceback)", EXIT_FAILURE)


def usage_message(exc: BaseException) -> str:
    """A usage error from click, in the style of every other message: '--samples: 0 is below the
    minimum of 1' for a bad value (typer checks values with pydantic, whose wording is its own);
    click's own words and a pointer to --help for the rest (an unknown option, a missing one)."""
    param, cause = getattr(exc, "param", None), exc.__cause__
    errors = cause.errors() if param is not None and hasattr(cause, "errors") else []
    if not errors:
        return f"{exc.format_message()}{usage_hint(exc)}"
    name = max(param.opts, key=len) if getattr(param, "opts", None) else param.human_readable_name
    return f"{name}: {invalid_value(errors[0])}"


def invalid_value(error: dict) -> str:
    """One pydantic validation error as 'VALUE is ...'."""
    kind, limits, value = error.get("type", ""), error.get("ctx") or {}, error.get("input")
    shown = repr(value) if isinstance(value, str) else str(value)
    bounds = {"greater_than_equal": ("ge", "is below the minimum of"), "greater_than": ("gt", "must be above"),
              "less_than_equal": ("le", "is above the maximum of"), "less_than": ("lt", "must be below")}
    if kind in bounds:  # a number, as typed
        key, words = bounds[kind]
        return f"{value} {words} {limits[key]}"
    if kind.startswith("int_"):
        return f"{shown} is not a whole number"
    if kind.startswith("float_"):
        return f"{shown} is not a number"
    message = str(limits.get("error", "")) or str(error.get("msg", ""))
    choice = re.fullmatch(r"(.*) is not one of (.*?)\.?", message)
    if choice:  # typer's "'xml' is not one of 'human', 'json'." as the profile's checks say it
        from ..profile_checks import did_you_mean

        choices = tuple(c.strip().strip("'") for c in choice.group(2).split(","))
        return f"{choice.group(1)} is not one of {', '.join(choices)}{did_you_mean(value, choices)}"
    return message.removeprefix("Value error, ")


def usage_hint(exc: BaseException) -> str:
    """Where to read the right usage: the failing command's own --help."""
    ctx = getattr(exc, "ctx", None)
    return f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
