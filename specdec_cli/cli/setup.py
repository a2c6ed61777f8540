"""What every command does first: the profile with the command line's models and options, the
output, the pipeline, and the prompt read from the command line, a file or stdin."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from ..errors import UsageError
from .options import DEFAULT_PROFILE
from .output import Output, configure_logging


def profile_name(profile: str | None) -> str:
    return profile or os.environ.get("SPECDEC_PROFILE") or DEFAULT_PROFILE


def resolved_profile(profile: str | None, *, target: str | None = None, draft: str | None = None,
                     drafter: str | None = None, **overrides):
    """The profile named by -p (or $SPECDEC_PROFILE, or the demo), with the command line's models
    (--target, --draft, --drafter) and then its other options in place of the profile's."""
    from ..profile import with_overrides
    from ..profile_models import with_models

    if profile is not None and is_model_folder(profile):
        if target is not None:
            raise UsageError(f"-p: '{profile}' is a model folder and --target names another; give the target once")
        notice(f"-p {profile}: a model folder, not a profile: running it as --target {profile}")
        profile, target = None, profile
    chosen = with_models(base_profile(profile), target=target, draft=draft, drafter=drafter)
    return with_overrides(chosen, **overrides)


def base_profile(profile: str | None):
    """-p's profile, else $SPECDEC_PROFILE's (an error says the name came from it), else the demo."""
    from ..profile import ProfileError, load_profile

    from_environment = os.environ.get("SPECDEC_PROFILE") if profile is None else None
    if not from_environment:
        return load_profile(profile or DEFAULT_PROFILE)
    try:
        return load_profile(from_environment)
    except ProfileError as exc:
        raise ProfileError(f"$SPECDEC_PROFILE: {exc}") from None


def is_model_folder(path: str) -> bool:
    """A folder with a config.json: a model's, which -p takes as --target."""
    try:
        folder = Path(path).expanduser()
        return folder.is_dir() and (folder / "config.json").is_file()
    except (OSError, ValueError):  # a name too long for the file system, an embedded NUL: not a folder
        return False


def notice(text: str) -> None:
    import logging

    logging.getLogger("specdec.notice").info(text)


def start(verbose: int) -> Output:
    """Every command's preamble: logging at the asked verbosity, then the one output object."""
    configure_logging(verbose)
    from ..cache_dirs import inductor_cache_dir

    inductor_cache_dir()  # our cache dir, before anything loads torch's compiler (which would pick /tmp)
    return Output()


def load_pipeline(profile, out: Output, workload=None):
    """`workload` (compile_choice.Workload): the generations the command will run, which
    `compile: auto` weighs against the compile's cost; None: one of the profile's max_new_tokens."""
    from ..run_clock import timed

    with timed("imports"):  # transformers' loaders too, which it would import lazily inside the parts below
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

        from ..api import Pipeline
    with out.info.status(f"loading {profile.target.model} and drafter {profile.drafter.describe()} ...", spinner="dots"):
        return Pipeline(profile, workload=workload)


# --------------------------------------------------------------------------- prompt input


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """The prompt from the argument, --prompt-file, or stdin (`-`, or nothing with stdin piped).

    A file's or stdin's last line end is not part of the prompt (`echo hi |`, an editor's final
    newline), as with "$(cat FILE)"; blank lines before it are kept, which $(...) would drop."""
    if prompt is not None and prompt_file is not None:
        raise UsageError("give the prompt once: as an argument or with --prompt-file, not both")
    if prompt_file is not None:
        if not prompt_file.is_file():
            raise UsageError(f"--prompt-file: '{prompt_file}' is not a file")
        return without_line_end(decode_prompt_bytes(prompt_file.read_bytes(), f"--prompt-file '{prompt_file}'"))
    if prompt == "-" or (prompt is None and not sys.stdin.isatty()):
        return without_line_end(decode_prompt_bytes(sys.stdin.buffer.read(), "stdin"))
    if prompt is None:
        raise UsageError("no prompt: pass it as an argument, with --prompt-file, or on stdin")
    return prompt


def without_line_end(text: str) -> str:
    """The text less one final line end (\\n or \\r\\n)."""
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


STOP_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def check_stops(stops) -> tuple[str, ...]:
    """--stop values as texts: \\n, \\t, \\r and \\\\ mean what they do in C (`--stop '\\n\\n'`
    is a blank line, as a shell cannot easily type one); each must be non-empty."""
    texts = []
    for stop in stops:
        text = re.sub(r"\\([ntr\\])", lambda m: STOP_ESCAPES[m.group(1)], stop)
        if not text:
            raise UsageError("--stop: an empty text would stop at once; give at least one character")
        texts.append(text)
    return tuple(dict.fromkeys(texts))


def decode_prompt_bytes(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where} is not valid UTF-8 (byte {exc.start}); pass text") from None
