"""Training prompts for `specdec train-draft --data`: a file of the user's, or `python-docs`.

`python-docs` is made offline from the text every Python installation ships in
`pydoc_data.topics` (the language reference's help topics; Python Software Foundation License),
each paragraph put to the model with one of a few instructions (explain, summarise, translate,
write...). It shares nothing with the benchmark prompts (Spec-Bench, workload.py's built-ins).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .errors import UsageError

BUILTIN = "python-docs"

TEMPLATES = (
    "Explain the following passage in plain words:\n\n{text}",
    "Summarize this in two sentences:\n\n{text}",
    "Write a short Python example that illustrates this:\n\n{text}",
    "Translate into French:\n\n{text}",
    "List three questions a student might ask about this text, with answers:\n\n{text}",
    "Rewrite this for a ten-year-old:\n\n{text}",
    "Write a short story in which a programmer runs into the following rule:\n\n{text}",
    "What are the key points of the '{topic}' topic described here?\n\n{text}",
    "Write a friendly email to a colleague explaining this:\n\n{text}",
    "Give a one-paragraph critique of how clearly this is written:\n\n{text}",
)
JSON_FIELDS = ("prompt", "text", "instruction", "question", "input")


def python_docs_prompts() -> list[str]:
    """Every usable paragraph of the help topics under one template each, in a fixed order."""
    from pydoc_data.topics import topics

    prompts = []
    for topic in sorted(topics):
        for paragraph in topics[topic].split("\n\n"):
            text = " ".join(paragraph.split())
            if 120 <= len(text) <= 700 and not text.startswith(("*", "|", "+")):
                template = TEMPLATES[len(prompts) % len(TEMPLATES)]
                prompts.append(template.format(text=text, topic=topic))
    random.Random(0).shuffle(prompts)
    return prompts


def json_prompt(record: object, where: str) -> str:
    if isinstance(record, str):
        return record
    if isinstance(record, dict):
        for field in JSON_FIELDS:
            if isinstance(record.get(field), str) and record[field].strip():
                return record[field]
        turns = record.get("turns")
        if isinstance(turns, list) and turns and isinstance(turns[0], str):
            return turns[0]
    raise UsageError(f"{where}: each line must be a string or an object with one of {', '.join(JSON_FIELDS)} or turns")


def read_prompts(data: str) -> list[str]:
    """`python-docs`, a .jsonl file (one prompt or object per line), or a text file (one per line)."""
    if data == BUILTIN:
        return python_docs_prompts()
    path = Path(data).expanduser()
    if not path.is_file():
        raise UsageError(f"--data: '{data}' is not a file (give a .txt or .jsonl of prompts, or '{BUILTIN}')")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--data: cannot read '{data}' as UTF-8 text ({error})") from error
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise UsageError(f"--data: {path}:{number} is not JSON ({error.msg})") from error
            prompts.append(json_prompt(record, f"--data: {path}:{number}"))
        else:
            prompts.append(line)
    if len(prompts) < 2:
        raise UsageError(f"--data: '{data}' holds {len(prompts)} prompt(s); give at least 2 (one is held out to measure)")
    return prompts
