"""Prompt files, one reader for every command (generate, bench, tune-k and verify --prompts,
train-draft --data): a text file, one prompt a line, or JSONL, one a line as a string or an object
with the prompt under one of PROMPT_FIELDS or as turns[0] (Spec-Bench: the first turn only), and
optionally question_id or id, category, and a constraint of its own (one of specs.CONSTRAINT_KINDS
as a key: read by constraints.grammars.from_mapping). A .jsonl or .json file is JSONL; any other file (and
stdin, '-') is JSONL when every non-empty line is a JSON object, else text. A line that cannot be
read is a one-line error naming FILE:LINE."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import UsageError
from .specs import CONSTRAINT_KINDS

PROMPT_FIELDS = ("prompt", "text", "instruction", "question", "input")
JSONL_SUFFIXES = (".jsonl", ".json")
STDIN = "-"


@dataclass(frozen=True)
class PromptRow:
    """`id`: a label (the row's question_id or id, else line-N for text, N for JSONL); `line`: the
    1-based line number; `given_id`: the row's question_id or id as its JSON holds it, else None."""

    id: str
    text: str
    category: str | None = None
    line: int = 0
    given_id: Any = None
    constraint: dict[str, Any] | None = None  # the row's own constraint fields, as given

    @property
    def row_id(self) -> Any:
        """What an output row is named by: the row's own id, else its line number."""
        return self.line if self.given_id is None else self.given_id


def read_prompt_file(path: Path, option: str, *, keep_empty: bool = False) -> list[PromptRow]:
    """Every prompt in the file ('-': stdin), blank lines skipped; `option` names where the file
    was given. `keep_empty`: a JSON row whose prompt is blank is kept (the caller reports it as
    that row's failure) instead of failing the whole file."""
    where = "stdin" if str(path) == STDIN else str(path)
    lines = read_lines(path, option).splitlines()
    jsonl = path.suffix in JSONL_SUFFIXES or all_json_objects(lines)
    rows = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            rows.append(json_row(line, f"{where}:{number}", number, keep_empty) if jsonl
                        else PromptRow(f"line-{number}", line, line=number))
    return rows


def read_lines(path: Path, option: str) -> str:
    where = "stdin" if str(path) == STDIN else f"'{path}'"
    try:
        if str(path) == STDIN:
            raw = sys.stdin.buffer.read()
        elif not path.is_file():
            raise UsageError(f"{option}: '{path}' is not a file")
        else:
            raw = path.read_bytes()
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{option}: {where} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"{option}: cannot read {where} ({exc.strerror or exc})") from None


def all_json_objects(lines: list[str]) -> bool:
    """Every non-empty line a JSON object (and at least one): a JSONL file whatever its name."""
    filled = [line for line in lines if line.strip()]
    return bool(filled) and all(is_json_object(line) for line in filled)


def is_json_object(line: str) -> bool:
    if not line.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except (json.JSONDecodeError, RecursionError):
        return False


def json_row(line: str, where: str, number: int, keep_empty: bool = False) -> PromptRow:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not JSON ({exc.msg.lower()} at column {exc.colno})") from None
    except RecursionError:
        raise UsageError(f"{where}: not JSON (nested too deeply)") from None
    if isinstance(record, str) and (record.strip() or keep_empty):
        return PromptRow(str(number), record, line=number)
    if isinstance(record, dict):
        texts = [record[f] for f in PROMPT_FIELDS if isinstance(record.get(f), str)]
        turns = record.get("turns")
        if isinstance(turns, list) and turns and isinstance(turns[0], str):
            texts.append(turns[0])
        text = next((t for t in texts if t.strip()), texts[0] if keep_empty and texts else None)
        if text is not None:
            given = record.get("question_id", record.get("id"))
            category = record.get("category")
            constraint = {key: record[key] for key in CONSTRAINT_KINDS if key in record} or None
            return PromptRow(str(number if given is None else given), text,
                             category if isinstance(category, str) else None, number, given, constraint)
    raise UsageError(
        f"{where}: no prompt: give a string, or an object with one of {', '.join(PROMPT_FIELDS)} or turns (a list)"
    )
