"""Structured output from the command line: --json-schema, --json, --regex and --grammar on generate,
a profile's `constraint:` key, a prompt file's rows with their own, bench and verify under one, and
every bad constraint a one-line error with exit 2 before any model loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_helpers import assert_one_line_error, run_cli
from profile_helpers import model_profile, write_profile

REPO = Path(__file__).resolve().parents[2]
ENUM_SCHEMA = {"type": "object", "properties": {"tag": {"enum": ["alpha", "beta"]}, "n": {"type": "integer",
               "minimum": 0, "maximum": 99}}, "required": ["tag", "n"], "additionalProperties": False,
               "x-guidance": {"whitespace_flexible": False}}  # compact: a random tiny model would pad it with spaces
DATE = "[0-9]{4}-[0-9]{2}-[0-9]{2}"


@pytest.fixture
def profile(tmp_path, llama_pair) -> Path:
    return model_profile(tmp_path, llama_pair, max_new_tokens=80)


def generate_json(capsys, profile: Path, *args: str) -> dict:
    code, out, err = run_cli(capsys, "generate", "-p", str(profile), "-f", "json", *args)
    assert code == 0, err
    return json.loads(out)


def test_json_schema_from_a_file_and_inline_give_the_same_valid_json(capsys, tmp_path, profile):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(ENUM_SCHEMA))
    from_file = generate_json(capsys, profile, "def add(a, b):", "--json-schema", str(schema))
    inline = generate_json(capsys, profile, "def add(a, b):", "--json-schema", json.dumps(ENUM_SCHEMA))
    assert from_file["token_ids"] == inline["token_ids"]
    value = json.loads(from_file["text"])
    assert value["tag"] in ("alpha", "beta") and 0 <= value["n"] <= 99
    assert from_file["finish_reason"] == "eos" and from_file["stats"]["constraint"]["complete"] is True
    assert from_file["stats"]["constraint"]["forced_kept"] > 0


def test_regex_and_grammar_hold_the_whole_text(capsys, tmp_path, profile):
    import re

    date = generate_json(capsys, profile, "The day was", "--regex", DATE)
    assert re.fullmatch(DATE, date["text"]), date["text"]
    lark = tmp_path / "answer.lark"
    lark.write_text('start: "answer: " ("yes" | "no")\n')
    gbnf = tmp_path / "answer.gbnf"
    gbnf.write_text('root ::= "answer: " ("yes" | "no")\n')
    texts = {generate_json(capsys, profile, "Is it?", "--grammar", str(path))["text"] for path in (lark, gbnf)}
    assert len(texts) == 1 and texts.pop() in ("answer: yes", "answer: no")


def test_any_json_object_and_a_text_cut_short_says_so(capsys, profile):
    code, out, err = run_cli(capsys, "generate", "-p", str(profile), "-f", "json", "--json", "-n", "3", "hello")
    assert code == 0, err
    result = json.loads(out)
    assert result["text"].lstrip().startswith("{") and result["finish_reason"] == "length"
    assert result["stats"]["constraint"]["complete"] is False
    assert "cut short" in err and "--max-new-tokens" in err


def test_a_profiles_constraint_key_and_a_rows_own_constraint(capsys, tmp_path, llama_pair, monkeypatch):
    regex_profile = model_profile(tmp_path, llama_pair, name="dates", max_new_tokens=80, constraint={"regex": DATE})
    alone = generate_json(capsys, regex_profile, "The day was")
    assert alone["token_ids"] == generate_json(capsys, model_profile(tmp_path, llama_pair, max_new_tokens=80),
                                               "The day was", "--regex", DATE)["token_ids"]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "The day was"}) + "\n"
                    + json.dumps({"prompt": "def add(a, b):", "json_schema": ENUM_SCHEMA}) + "\n")
    code, out, err = run_cli(capsys, "generate", "-p", str(regex_profile), "--prompts", str(rows), "--batch-size", "2")
    assert code == 0, err
    first, second = [json.loads(line) for line in out.splitlines()]
    assert first["token_ids"] == alone["token_ids"]  # the profile's constraint
    assert json.loads(second["text"])["tag"] in ("alpha", "beta")  # the row's own, in place of it
    code, out, err = run_cli(capsys, "profiles", "show", str(regex_profile))
    assert code == 0 and DATE in out


@pytest.mark.parametrize("args, fragment", [
    (["--json-schema", '{"type": "strng"}'], "strng"),
    (["--json-schema", "missing.json"], "no file"),
    (["--json-schema", "[1, 2]"], "object"),
    (["--regex", "(("], "regex"),
    (["--json", "--regex", "a"], "give one constraint"),
    (["--grammar", "nowhere.lark"], "no file"),
])
def test_a_bad_constraint_is_one_line_and_exit_2_before_any_model_loads(capsys, tmp_path, args, fragment):
    """The profile names a model that does not exist: the constraint's error comes first."""
    profile = write_profile(tmp_path, target={"model": str(tmp_path / "no-model")}, drafter={"kind": "ngram"})
    code, _, err = run_cli(capsys, "generate", "-p", str(profile), "hello", *args)
    assert code == 2
    assert_one_line_error(err, fragment)


def test_a_bad_grammar_file_a_bad_row_and_a_bad_profile_key(capsys, tmp_path, profile):
    bad = tmp_path / "bad.gbnf"
    bad.write_text("root ::= (((\n")
    code, _, err = run_cli(capsys, "generate", "-p", str(profile), "hello", "--grammar", str(bad))
    assert code == 2
    assert_one_line_error(err, "--grammar")
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"prompt": "b", "regex": "(("}) + "\n")
    code, _, err = run_cli(capsys, "generate", "-p", str(profile), "--prompts", str(rows))
    assert code == 2
    assert_one_line_error(err, "rows.jsonl:2")
    data = yaml.safe_load(profile.read_text()) | {"constraint": {"json_schema": {"type": "strng"}}}
    profile.write_text(yaml.safe_dump(data))
    code, _, err = run_cli(capsys, "generate", "-p", str(profile), "hello")
    assert code == 2
    assert_one_line_error(err, "constraint.json_schema", "strng")


def test_constraint_errors_import_no_torch(tmp_path):
    """The checks run before torch loads (python -X importtime lists what was imported)."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "specdec_cli", "generate", "hi", "--regex", "(("],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert not any(line.split("|")[-1].strip() == "torch" for line in result.stderr.splitlines()
                   if line.startswith("import time:"))


def test_bench_and_verify_under_a_constraint(capsys, profile):
    code, out, err = run_cli(capsys, "bench", "-p", str(profile), "--regex", DATE, "--prompts", "-", "-n", "12",
                             "--repeats", "1", "--warmup", "0", "-f", "json", "--no-drift",
                             stdin=b"The day was\nOn", monkeypatch=pytest.MonkeyPatch())
    assert code == 0, err
    report = json.loads(out)
    assert report["settings"]["methods"] == ["plain", "specdec"] and report["outputs_identical"]
    assert report["settings"]["constraint"] == f"the regex {DATE!r}"
    code, _, err = run_cli(capsys, "bench", "-p", str(profile), "--regex", DATE, "--methods", "plain,hf-plain")
    assert code == 2
    assert_one_line_error(err, "hf-plain", "constraint")
    code, out, err = run_cli(capsys, "verify", "-p", str(profile), "--regex", DATE, "--samples", "40", "-f", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["passed"] and {row["against"] for row in report["greedy"]} == {"plain"}


def test_batch_sizes_refuse_a_profiles_constraint_and_a_missing_grammar_file_is_named(capsys, tmp_path, llama_pair):
    constrained = model_profile(tmp_path, llama_pair, name="dated", constraint={"regex": DATE})
    code, _, err = run_cli(capsys, "bench", "-p", str(constrained), "--batch-sizes", "1,2")
    assert code == 2
    assert_one_line_error(err, "--batch-sizes", "constraint")
    misspelt = model_profile(tmp_path, llama_pair, name="misspelt", constraint={"grammar": "answr.lark"})
    code, _, err = run_cli(capsys, "generate", "-p", str(misspelt), "hello")
    assert code == 2
    assert_one_line_error(err, "no file", "answr.lark")
