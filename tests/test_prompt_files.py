"""The one prompt-file reader: text or JSONL (by name, else by content), stdin, ids and line numbers."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from specdec_cli.errors import UsageError
from specdec_cli.prompt_files import read_prompt_file


def read(tmp_path: Path, name: str, text: str, **kwargs):
    path = tmp_path / name
    path.write_text(text)
    return read_prompt_file(path, "--prompts", **kwargs)


def test_every_line_a_json_object_is_jsonl_whatever_the_name(tmp_path):
    rows = read(tmp_path, "q.txt", '{"question_id": 81, "turns": ["first", "second"]}\n\n{"prompt": "p", "id": "x"}\n')
    assert [(r.text, r.row_id, r.id, r.line) for r in rows] == [("first", 81, "81", 1), ("p", "x", "x", 3)]


def test_text_when_a_line_is_not_a_json_object(tmp_path):
    rows = read(tmp_path, "q.txt", '{"prompt": "p"}\n["a list"]\nplain words\n')
    assert [(r.text, r.row_id, r.id) for r in rows] == [('{"prompt": "p"}', 1, "line-1"), ('["a list"]', 2, "line-2"),
                                                         ("plain words", 3, "line-3")]


def test_a_jsonl_name_stays_strict(tmp_path):
    with pytest.raises(UsageError, match=r"q\.jsonl:2: not JSON"):
        read(tmp_path, "q.jsonl", '{"prompt": "p"}\nplain words\n')


def test_blank_prompts_fail_the_file_unless_kept(tmp_path):
    text = '{"prompt": "p"}\n{"prompt": "  "}\n{"turns": [""]}\n'
    with pytest.raises(UsageError, match=r"q\.jsonl:2: no prompt"):
        read(tmp_path, "q.jsonl", text)
    rows = read(tmp_path, "q.jsonl", text, keep_empty=True)
    assert [(r.text, r.row_id) for r in rows] == [("p", 1), ("  ", 2), ("", 3)]


def test_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"prompt": "a"}\n{"prompt": "b", "id": 9}\n')))
    rows = read_prompt_file(Path("-"), "--prompts")
    assert [(r.text, r.row_id) for r in rows] == [("a", 1), ("b", 9)]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9\n")))
    with pytest.raises(UsageError, match="--prompts: stdin is not UTF-8 text"):
        read_prompt_file(Path("-"), "--prompts")
