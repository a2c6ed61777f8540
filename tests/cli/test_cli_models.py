"""Running a model without a profile file (--target, --draft, --drafter), stop texts, prompt files,
and the everyday CLI details, through the CLI as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, default_sigint, run_cli
from specdec_cli import Pipeline
from specdec_cli.decoding.transformers_generate import transformers_generate
from tiny_models import build_model, llama_config, save

# the demo profile's other settings, made quick and exact for the tiny models
QUICK = ("--compile", "off", "--dtype", "float32", "--device", "cpu", "--no-chat")
PROMPT = "def add(a, b):"


def generate_json(capsys, *args: str) -> dict:
    code, out, err = run_cli(capsys, "generate", PROMPT, *QUICK, "-f", "json", *args)
    assert code == 0, err
    return json.loads(out)


def greedy_ids(target: Path, n: int) -> tuple[int, ...]:
    """The target's own greedy continuation (plain decoding, transformers' generate)."""
    from specdec_cli.profile import load_profile, with_overrides
    from specdec_cli.profile_models import with_models

    profile = with_overrides(with_models(load_profile("smollm2-demo"), target=str(target), drafter="ngram"),
                             dtype="float32", device="cpu", compile="off", chat=False)
    pipe = Pipeline(profile)
    return transformers_generate(pipe, pipe.encode(PROMPT), n)


# --------------------------------------------------------------------------- models from the command line


def test_target_and_draft_without_a_profile(capsys, llama_pair):
    obj = generate_json(capsys, "--target", str(llama_pair["target"]), "--draft", str(llama_pair["draft"]), "-n", "16")
    assert obj["profile"] == "llama-target"  # the target's name, not the demo's
    assert obj["stats"]["drafted"] > 0 and obj["stats"]["accepted"] > 0
    assert tuple(obj["token_ids"]) == greedy_ids(llama_pair["target"], 16)[: obj["new_tokens"]]


@pytest.mark.parametrize("kind", ["ngram", "early-exit"])
def test_drafter_kind_alone(capsys, llama_pair, kind):
    obj = generate_json(capsys, "--target", str(llama_pair["target"]), "--drafter", kind, "-n", "16")
    assert tuple(obj["token_ids"]) == greedy_ids(llama_pair["target"], 16)[: obj["new_tokens"]]


def test_target_overrides_a_profile(capsys, llama_profile, llama_pair):
    obj = generate_json(capsys, "-p", str(llama_profile), "--target", str(llama_pair["stranger"]), "--drafter", "ngram", "-n", "8")
    assert obj["profile"] == "llama-stranger"
    stranger = generate_json(capsys, "--target", str(llama_pair["stranger"]), "--drafter", "ngram", "-n", "8")
    assert obj["token_ids"] == stranger["token_ids"]


def test_model_folder_as_profile_runs_it_as_target(capsys, llama_pair):
    code, out, err = run_cli(capsys, "generate", PROMPT, "-p", str(llama_pair["target"]), *QUICK, "-f", "json", "-n", "8")
    assert code == 0, err
    assert f"running it as --target {llama_pair['target']}" in err
    assert tuple(json.loads(out)["token_ids"]) == greedy_ids(llama_pair["target"], 8)[:8]


def test_bench_and_verify_take_target_and_draft(capsys, llama_pair):
    models = ("--target", str(llama_pair["target"]), "--draft", str(llama_pair["draft"]))
    code, out, err = run_cli(capsys, "bench", *models, "--compile", "off", "--dtype", "float32", "--device", "cpu",
                             "--methods", "specdec", "-n", "8", "--repeats", "1", "--warmup", "0", "--limit", "1", "-f", "json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["outputs_identical"] is True and {r["method"] for r in summary["results"]} == {"plain", "specdec"}
    code, out, err = run_cli(capsys, "verify", *models, "--compile", "off", "--dtype", "float32", "--device", "cpu",
                             "--samples", "0", "--limit", "1", "-n", "8", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["passed"] is True


def test_export_takes_hub_ids(capsys):
    code, out, err = run_cli(capsys, "export", "--to", "vllm", "--target", "Qwen/Qwen2.5-Coder-1.5B-Instruct",
                             "--draft", "Qwen/Qwen2.5-Coder-0.5B-Instruct")
    assert code == 0, err
    assert "Qwen/Qwen2.5-Coder-1.5B-Instruct" in out and "Qwen/Qwen2.5-Coder-0.5B-Instruct" in out


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--drafter", "medusaa"], ["--drafter: 'medusaa' is not one of", "did you mean medusa?"]),
        (["--drafter", "ngram", "--draft", "x"], ["--draft:", "--drafter model"]),
        (["--drafter", "model"], ["--drafter model:", "--draft MODEL"]),
        (["--drafter", "eagle"], ["--drafter eagle:", "--draft DIR"]),
        (["--target", " "], ["--target: must not be empty"]),
    ],
)
def test_bad_model_options_exit_2_before_loading(capsys, args, fragments):
    code, out, err = run_cli(capsys, "generate", "hi", *args)
    assert code == 2 and out == ""
    assert_one_line_error(err, *fragments)


# --------------------------------------------------------------------------- stop texts


def test_stop_text_ends_generation_before_it(capsys, llama_pair):
    models = ("--target", str(llama_pair["target"]), "--draft", str(llama_pair["draft"]), "-n", "24")
    full = generate_json(capsys, *models)
    text = full["text"]
    stop = next(text[i : i + 2] for i in range(4, len(text) - 2) if text[i : i + 2].isprintable() and text[i : i + 2] not in text[: i + 1])
    cut = text[: text.index(stop)]
    stopped = generate_json(capsys, *models, "--stop", stop, "--stop", "never seen")
    assert stopped["finish_reason"] == "stop" and stopped["text"] == cut
    ids = stopped["token_ids"]
    assert ids == full["token_ids"][: len(ids)]  # the target's own tokens, to the one that completed the stop text
    code, out, _ = run_cli(capsys, "generate", PROMPT, *QUICK, *models, "--stop", stop, "-f", "text")
    assert code == 0 and out == cut + "\n"  # streamed, and never printed past the stop text
    code, out, _ = run_cli(capsys, "generate", PROMPT, *QUICK, *models, "--stop", stop, "-f", "human", "--no-live")
    assert code == 0 and stop not in out


def test_stop_escapes_and_empty(capsys):
    from specdec_cli.cli.setup import check_stops

    assert check_stops(["\\n\\n", "a\\tb", "c\\\\n"]) == ("\n\n", "a\tb", "c\\n")
    code, out, err = run_cli(capsys, "generate", "hi", "--stop", "")
    assert code == 2
    assert_one_line_error(err, "--stop")


# --------------------------------------------------------------------------- help and usage


def test_h_is_help_everywhere(capsys):
    for command in ([], ["generate"], ["bench"], ["profiles"], ["profiles", "show"]):
        code, short, _ = run_cli(capsys, *command, "-h")
        code_long, long, _ = run_cli(capsys, *command, "--help")
        assert code == code_long == 0 and short == long and "Usage:" in short


def test_no_command_prints_the_help_and_exits_0(capsys):
    code, out, err = run_cli(capsys)
    assert code == 0 and err == ""
    assert out.startswith("Usage: specdec") and "generate" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "hi", "--samples", "0"], "--samples: 0 is below the minimum of 1"),
        (["generate", "hi", "-n", "abc"], "--max-new-tokens: 'abc' is not a whole number"),
        (["bench", "-f", "xml"], "--format: 'xml' is not one of human, json, csv"),
        (["train-draft", "--kind", "medusaa", "--out", "x"], "--kind: 'medusaa' is not one of medusa, eagle (did you mean medusa?)"),
    ],
)
def test_bad_values_read_like_every_other_error(capsys, args, message):
    code, out, err = run_cli(capsys, *args)
    assert code == 2 and out == ""
    assert_one_line_error(err, message)
    assert "Value error" not in err and "Input should" not in err


def test_help_shows_readable_metavars(capsys):
    code, out, _ = run_cli(capsys, "generate", "--help")
    assert "--samples N" in out and "range>" not in out
    code, out, _ = run_cli(capsys, "train-draft", "--help")
    assert "range>" not in out


def test_profile_from_the_environment_says_so(capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_PROFILE", "nosuch")
    code, _, err = run_cli(capsys, "generate", "hi")
    assert code == 2
    assert_one_line_error(err, "$SPECDEC_PROFILE:", "'nosuch'")


def test_drafter_kind_typo_in_a_profile_gets_a_suggestion(capsys, tmp_path, llama_pair):
    from profile_helpers import model_profile

    profile = model_profile(tmp_path, llama_pair, drafter={"kind": "medusaa", "heads": "x"})
    code, _, err = run_cli(capsys, "generate", "hi", "-p", str(profile))
    assert code == 2
    assert_one_line_error(err, "drafter.kind: 'medusaa' is not one of", "(did you mean medusa?)")


# --------------------------------------------------------------------------- prompts


def test_prompt_file_drops_one_final_newline(capsys, llama_profile, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(PROMPT + "\n")
    code, from_file, _ = run_cli(capsys, "generate", "--prompt-file", str(prompt), "-p", str(llama_profile), "-f", "json")
    code, from_arg, _ = run_cli(capsys, "generate", PROMPT, "-p", str(llama_profile), "-f", "json")
    assert json.loads(from_file)["prompt_tokens"] == json.loads(from_arg)["prompt_tokens"]
    assert json.loads(from_file)["token_ids"] == json.loads(from_arg)["token_ids"]


def test_one_reader_for_every_prompt_file(tmp_path):
    from specdec_cli.training.corpus import read_prompts
    from specdec_cli.bench.workload import load_prompts

    rows = [{"prompt": "a"}, {"text": "b"}, {"instruction": "c"}, {"question": "d"}, {"turns": ["e", "f"], "category": "x"}, "g"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert [p.text for p in load_prompts(jsonl)] == read_prompts(str(jsonl)) == list("abcdeg")
    assert [p.category for p in load_prompts(jsonl)][4] == "x"
    plain = tmp_path / "p.txt"
    plain.write_text("one\n\ntwo\n")
    assert [p.text for p in load_prompts(plain)] == read_prompts(str(plain)) == ["one", "two"]


@pytest.mark.parametrize(
    "line, fragment",
    [('{"prompt": ', "not JSON"), ('{"answer": "x"}', "no prompt: give a string, or an object with one of prompt"), ("[1]", "no prompt")],
)
@pytest.mark.parametrize("command", [["bench", "--prompts"], ["verify", "--prompts"], ["tune-k", "--prompts"]])
def test_a_broken_prompt_line_names_file_and_line(capsys, tmp_path, command, line, fragment):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n\n' + line + "\n")
    code, out, err = run_cli(capsys, *command, str(path))
    assert code == 2 and out == ""
    assert_one_line_error(err, f"{path}:3: {fragment}")
    assert "Error)" not in err and "KeyError" not in err


def test_train_draft_reads_prompt_files_alike(capsys, tmp_path, llama_profile):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\nnot json\n')
    code, _, err = run_cli(capsys, "train-draft", "--kind", "medusa", "--out", str(tmp_path / "head"),
                           "-p", str(llama_profile), "--data", str(path))
    assert code == 2
    assert_one_line_error(err, f"{path}:2: not JSON")


def test_prompt_ids_outside_the_embedding_exit_2(capsys, tmp_path, tokenizer):
    """A tokenizer that knows more tokens than the model has embedding rows."""
    short = build_model(llama_config(tokenizer, layers=2, vocab_padding=-60), seed=5)
    folder = save(short, tokenizer, tmp_path / "short-vocab")
    text = "Speculative decoding drafts tokens with a small model and verifies them with a large one."
    assert max(tokenizer(text)["input_ids"]) >= len(tokenizer) - 60  # the prompt does reach past the rows
    code, out, err = run_cli(capsys, "generate", text, "--target", str(folder), "--drafter", "ngram", *QUICK)
    assert code == 2 and out == ""
    assert_one_line_error(err, "outside the target's", "embedding")


# --------------------------------------------------------------------------- output details


def test_seed_is_null_at_temperature_0_and_kept_when_sampling(capsys, llama_profile):
    code, out, _ = run_cli(capsys, "generate", PROMPT, "-p", str(llama_profile), "-f", "json", "-n", "4")
    assert json.loads(out)["seed"] is None
    code, out, _ = run_cli(capsys, "generate", PROMPT, "-p", str(llama_profile), "-f", "json", "-n", "4", "-t", "0.7", "-s", "9")
    assert json.loads(out)["seed"] == 9


def test_human_format_through_a_pipe_keeps_the_status_line_off_stdout(llama_profile):
    done = subprocess.run(
        [sys.executable, "-m", "specdec_cli", "generate", PROMPT, "-p", str(llama_profile), "-f", "human", "-n", "8"],
        capture_output=True, text=True, timeout=600, preexec_fn=default_sigint,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and "tokens/forward" not in done.stdout and "undrafted" not in done.stdout
    assert "tau" in done.stderr  # the summary


def test_verbose_lines_start_on_their_own_line_under_2_and_1(llama_profile):
    done = subprocess.run(
        [sys.executable, "-m", "specdec_cli", "generate", PROMPT, "-p", str(llama_profile), "-f", "text", "-n", "8",
         "-k", "auto", "-v"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, preexec_fn=default_sigint,
    )
    assert done.returncode == 0, done.stdout
    assert all(line.startswith("specdec:") or "specdec:" not in line for line in done.stdout.splitlines()), done.stdout


def test_samples_in_human_format_are_separated(capsys, llama_profile):
    code, out, _ = run_cli(capsys, "generate", PROMPT, "-p", str(llama_profile), "-f", "human", "--no-live",
                           "--samples", "2", "-n", "4")
    assert code == 0 and "sample 1 of 2" in out and "sample 2 of 2" in out


def test_pipeline_loads_without_transformers_bars(capfd, llama_profile):
    Pipeline.from_profile(str(llama_profile))
    assert "Loading weights" not in capfd.readouterr().err
