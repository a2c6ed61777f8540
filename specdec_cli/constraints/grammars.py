"""Constraints from where users give them (generate's options, a profile's `constraint:` key, a
prompt file's row, a server request) to the grammar engine's own form, checked before any model
loads: a bad schema, regex or grammar is a one-line UsageError naming where it was given.

The engine is llguidance (Lark, GBNF through its converter, JSON schemas and regexes; the one the
large servers use): chosen over xgrammar for its draft-token API (validate_tokens, forced tokens,
rollback) and its mask cost at Qwen's 151,936-token vocabulary (BENCHMARKS.md). Importing it
costs no torch: these checks run before the CLI imports torch.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from ..errors import UsageError
from ..specs import CONSTRAINT_KINDS, ConstraintSpec

ANY_JSON_OBJECT = '{"type": "object"}'
# JSON's whitespace between tokens, bounded: pretty-printed JSON fits, and a model that would
# write whitespace forever (a known failure of unbounded JSON grammars) cannot. A schema's own
# "x-guidance" options (llguidance's: e.g. {"whitespace_flexible": false}, compact JSON) replace it.
GRAMMAR_SUFFIXES = (".lark", ".gbnf", ".ebnf", ".txt")  # a grammar: a file of this kind, or the text itself
BOUNDED_WHITESPACE = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,40}"}


@lru_cache(maxsize=64)  # a server's requests often repeat a schema; checked once
def grammar_of(spec: ConstraintSpec) -> str:
    """The engine's grammar for `spec`, checked (the tokenizer's own checks come with the matcher)."""
    from llguidance import LLMatcher, grammar_from

    try:
        if spec.kind in ("json_schema", "json"):
            schema = json.loads(spec.text if spec.kind == "json_schema" else ANY_JSON_OBJECT)
            grammar = LLMatcher.grammar_from_json_schema(schema, defaults=None if "x-guidance" in schema
                                                         else BOUNDED_WHITESPACE)
        elif spec.kind == "regex":
            grammar = LLMatcher.grammar_from_regex(spec.text)
        else:
            grammar = grammar_from("grammar", spec.text)  # Lark, or GBNF converted to Lark
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{spec.origin}: {_first_line(exc)}") from None
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise UsageError(f"{spec.origin}: {_what_to_fix(spec)}: {_first_line(messages[0])}")
    return grammar


def _what_to_fix(spec: ConstraintSpec) -> str:
    return {"json_schema": "the schema cannot be used", "json": "internal JSON grammar failed",
            "regex": "the regex cannot be used", "grammar": "the grammar cannot be used"}[spec.kind]


def _first_line(message: object) -> str:
    """The engine's message on one line (a regex error spans several: its gist is on the next)."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    joined = " ".join(lines[:3]) if lines else "invalid"
    return joined if len(joined) <= 240 else joined[:237] + "..."


def from_options(*, json_schema: str | None = None, any_json: bool = False, regex: str | None = None,
                 grammar: Path | None = None) -> ConstraintSpec | None:
    """The constraint of generate's (bench's, verify's) options: at most one of --json-schema
    (a file or the JSON itself), --json, --regex, --grammar (a Lark or GBNF file); None without one.
    Checked here, before any model loads."""
    given = [name for name, value in (("--json-schema", json_schema), ("--json", any_json), ("--regex", regex),
                                      ("--grammar", grammar)) if value]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)}: give one constraint")
    if json_schema is not None:
        spec = ConstraintSpec("json_schema", schema_text(json_schema, "--json-schema"), "--json-schema")
    elif any_json:
        spec = ConstraintSpec("json", origin="--json")
    elif regex is not None:
        spec = ConstraintSpec("regex", regex, "--regex")
    elif grammar is not None:
        spec = ConstraintSpec("grammar", read_text(grammar, "--grammar"), "--grammar")
    else:
        return None
    grammar_of(spec)
    return spec


def from_mapping(value: Any, where: str, base: Path | None = None) -> ConstraintSpec:
    """A constraint given as a mapping of one key (a profile's `constraint:`, a prompt row's):
    json_schema (an object, or a file), json: true, regex (a string) or grammar (a file, or the
    grammar's text where no file of that name exists). `base`: the folder relative files are in."""
    if not isinstance(value, Mapping) or len(value) != 1 or next(iter(value)) not in CONSTRAINT_KINDS:
        raise UsageError(f"{where}: give one of {', '.join(CONSTRAINT_KINDS)} (e.g. {{json_schema: {{type: object}}}})")
    kind, given = next(iter(value.items()))
    origin = f"{where}.{kind}"
    if kind == "json":
        if given is not True:
            raise UsageError(f"{origin}: give true (any JSON object), or json_schema for a shape")
        spec = ConstraintSpec("json", origin=origin)
    elif kind == "json_schema":
        text = json.dumps(given) if isinstance(given, Mapping) else None
        if text is None and isinstance(given, str):
            text = schema_text(given, origin, base)
        if text is None:
            raise UsageError(f"{origin}: give the schema as an object, or a file holding it")
        spec = ConstraintSpec("json_schema", text, origin)
    elif not isinstance(given, str) or not given:
        raise UsageError(f"{origin}: give a non-empty string")
    elif kind == "regex":
        spec = ConstraintSpec("regex", given, origin)
    else:
        path = _relative(Path(given), base)
        if not _is_file(path) and "\n" not in given and path.suffix in GRAMMAR_SUFFIXES:
            raise UsageError(f"{origin}: no file '{path}'")
        spec = ConstraintSpec("grammar", read_text(path, origin) if _is_file(path) else given, origin)
    grammar_of(spec)
    return spec


def to_mapping(spec: ConstraintSpec) -> dict[str, Any]:
    """The constraint in profile syntax (from_mapping reads it back)."""
    if spec.kind == "json":
        return {"json": True}
    return {spec.kind: json.loads(spec.text) if spec.kind == "json_schema" else spec.text}


def schema_text(value: str, origin: str, base: Path | None = None) -> str:
    """A JSON schema given inline (it starts with '{') or as a file; its text, checked to be a JSON object."""
    text = value if value.lstrip()[:1] in ("{", "[") else read_text(_relative(Path(value), base), origin)
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{origin}: the schema is not JSON ({exc.msg.lower()} at line {exc.lineno}, "
                         f"column {exc.colno})") from None
    except RecursionError:
        raise UsageError(f"{origin}: the schema is not JSON (nested too deeply)") from None
    if not isinstance(schema, dict):
        raise UsageError(f"{origin}: a JSON schema is an object, e.g. {{\"type\": \"object\"}}")
    return text


def read_text(path: Path, origin: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{origin}: no file '{path}'") from None
    except UnicodeDecodeError:
        raise UsageError(f"{origin}: '{path}' is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"{origin}: cannot read '{path}' ({exc.strerror or exc})") from None


def _relative(path: Path, base: Path | None) -> Path:
    return path if base is None or path.is_absolute() else base / path


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a grammar's text, too long or odd to be a file name
        return False
