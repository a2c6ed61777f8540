"""Prompt files, one reader for every command (bench, tune-k and verify --prompts, train-draft
--data): a text file, one prompt a line, or JSONL (.jsonl, .json), one a line as a string or an
object with the prompt under one of PROMPT_FIELDS or as turns[0] (Spec-Bench), and optionally
question_id or id, and category. A line that cannot be read is a one-line error naming FILE:LINE."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError

PROMPT_FIELDS = ("prompt", "text", "instruction", "question", "input")
JSONL_SUFFIXES = (".jsonl", ".json")


@dataclass(frozen=True)
class PromptRow:
    id: str
    text: str
    category: str | None = None


def read_prompt_file(path: Path, option: str) -> list[PromptRow]:
    """Every prompt in the file, blank lines skipped; `option` names where the file was given."""
    if not path.is_file():
        raise UsageError(f"{option}: '{path}' is not a file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise UsageError(f"{option}: '{path}' is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"{option}: cannot read '{path}' ({exc.strerror or exc})") from None
    jsonl = path.suffix in JSONL_SUFFIXES
    rows = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            rows.append(json_row(line, f"{path}:{number}", number) if jsonl else PromptRow(f"line-{number}", line))
    return rows


def json_row(line: str, where: str, number: int) -> PromptRow:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON ({exc.msg.lower()} at column {exc.colno})") from None
    except RecursionError:
        raise UsageError(f"{where}: not JSON (nested too deeply)") from None
    if isinstance(record, str) and record.strip():
        return PromptRow(str(number), record)
    if isinstance(record, dict):
        text = next((record[f] for f in PROMPT_FIELDS if isinstance(record.get(f), str) and record[f].strip()), None)
        turns = record.get("turns")
        if text is None and isinstance(turns, list) and turns and isinstance(turns[0], str) and turns[0].strip():
            text = turns[0]
        if text is not None:
            named = record.get("question_id", record.get("id", number))
            category = record.get("category")
            return PromptRow(str(named), text, category if isinstance(category, str) else None)
    raise UsageError(
        f"{where}: no prompt: give a string, or an object with one of {', '.join(PROMPT_FIELDS)} or turns (a list)"
    )
