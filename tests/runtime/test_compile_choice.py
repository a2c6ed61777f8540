"""`compile: auto`: the decision from numbers, the cost record on disk, and the CLI's choice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from profile_helpers import model_profile
from tiny_models import build_model, llama_config

from specdec_cli.runtime import compile_choice as compile_choice
from specdec_cli.runtime.compile_choice import (
    TYPICAL_ANSWER_TOKENS,
    CompileCosts,
    costs_for,
    decide,
    expected_tokens,
    read_records,
    record_compile,
    records_path,
)
from specdec_cli.runtime.lm import resolve_compile
from specdec_cli.specs import Workload

REPO = Path(__file__).resolve().parents[2]

# the demo model as measured: 49 s cold, 30 s warm, ~9 ms saved per token
DEMO = CompileCosts(eager_step_s=0.034, compiled_step_s=0.025, compile_cold_s=49.0, compile_warm_s=30.0)


# --------------------------------------------------------------------------- the rule, from numbers


def test_a_small_job_stays_eager_and_a_big_one_compiles():
    small = decide(expected_tokens(Workload.of(2, 20)), [DEMO])  # --samples 2 -n 20
    assert not small.on and small.tokens == 40
    big = decide(expected_tokens(Workload.of(10 * 3 * 2, 128)), [DEMO])  # bench: 10 prompts, 3 repeats, 2 methods
    assert big.on and big.tokens == 7680


def test_a_warm_cache_lowers_the_bar():
    tokens = 4000  # 36 s saved: less than a cold compile (49 s), more than a warm one (30 s)
    assert not decide(tokens, [DEMO]).on
    assert decide(tokens, [CompileCosts(**{**DEMO.__dict__, "warm_cache": True})]).on
    # a warm cache with no warm figure measured yet counts the cold one
    cold_only = CompileCosts(0.034, 0.025, 49.0, compile_warm_s=None, warm_cache=True)
    assert decide(tokens, [cold_only]).compile_s == 49.0


def test_a_huge_max_new_tokens_counts_as_a_typical_answer():
    assert expected_tokens(Workload.of(1, 1_000_000_000)) == TYPICAL_ANSWER_TOKENS
    assert not decide(expected_tokens(Workload.of(1, 1_000_000_000)), [DEMO]).on  # "-n 1000000000 hi"
    assert expected_tokens(Workload.of(3, 40), room=30) == 90  # the context's room caps it too
    assert expected_tokens(Workload.of(2, 32) + Workload.of(100, 2)) == 264


def test_every_compiled_model_adds_its_cost_and_its_saving():
    draft = CompileCosts(eager_step_s=0.010, compiled_step_s=0.004, compile_cold_s=20.0)
    both = decide(5000, [DEMO, draft])
    assert both.compile_s == pytest.approx(69.0) and both.saved_per_token_s == pytest.approx(0.015)
    assert both.on  # 75 s saved > 69 s


def test_a_slower_compiled_step_saves_nothing():
    slower = CompileCosts(eager_step_s=0.231, compiled_step_s=0.345, compile_cold_s=60.0)
    assert slower.saved_per_token_s == 0.0 and not decide(10**9, [slower]).on


def test_the_decision_line_says_the_numbers():
    line = decide(40, [DEMO]).describe()
    assert line.startswith("compile: auto -> off (expect ~40 tokens x 9.0 ms saved = 0.4 s <= 49 s to compile")
    assert "measured" in line
    prior = decide(40, [CompileCosts(0.03, 0.021, 60.0, measured=False)]).describe()
    assert "prior" in prior


def test_resolve_compile_passes_on_and_off_and_keeps_other_devices_eager():
    cpu, mps = torch.device("cpu"), torch.device("mps")
    assert resolve_compile("on", cpu) == "on" and resolve_compile("off", cpu) == "off"
    assert resolve_compile("auto", mps, [], Workload.of(10**6, 10**6)) == "off"
    with pytest.raises(ValueError):
        resolve_compile("sometimes", cpu)


# --------------------------------------------------------------------------- the record


@pytest.fixture(scope="module")
def small_model(tokenizer):
    model = build_model(llama_config(tokenizer, layers=1), seed=0)
    model.name_or_path = "/models/tiny"
    return model


def test_with_no_record_the_prior_keeps_a_small_model_eager(small_model):
    cpu = torch.device("cpu")
    costs = costs_for(small_model, cpu)
    assert not costs.measured and costs.compile_s == compile_choice.PRIOR_COMPILE_SECONDS
    assert costs.saved_per_token_s == pytest.approx(costs.eager_step_s * compile_choice.PRIOR_SAVED_SHARE)
    assert resolve_compile("auto", cpu, [small_model], Workload.of(1000, 256)) == "off"


def test_on_cuda_the_prior_reads_the_gpus_own_bandwidth(small_model, monkeypatch):
    """An 8B bf16 target (16 GB) on an H100 (HBM3 at 2.619 GHz on a 5120-bit bus: 3.35 TB/s) is
    estimated at 16 GB over 70% of that a step, about 7 ms, not the CPU prior's 1.6 s: so `auto`
    does not compile a one-off run there before it has measured anything."""
    from specdec_cli.kernels import quantize

    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(memory_clock_rate=2_619_000, memory_bus_width=5120))
    monkeypatch.setattr(quantize, "stored_bytes", lambda model: 16e9)
    gpu = compile_choice.prior_costs(small_model, torch.device("cuda", 0))
    assert gpu.eager_step_s == pytest.approx(16e9 / (2.619e9 * 2 * 640 * compile_choice.PRIOR_GPU_SHARE))
    assert 0.005 < gpu.eager_step_s < 0.01
    cpu = compile_choice.prior_costs(small_model, torch.device("cpu"))
    assert cpu.eager_step_s == pytest.approx(1.6)
    one_off = expected_tokens(Workload.of(1, 256))
    assert not decide(one_off, [gpu]).on and decide(one_off, [cpu]).on


def test_a_record_round_trips_cold_then_warm(small_model, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    cpu = torch.device("cpu")
    record_compile(small_model, cpu, compile_s=49.0, warm=False, eager_step_s=0.034, compiled_step_s=0.025)
    costs = costs_for(small_model, cpu)
    assert costs.measured and costs.compile_cold_s == 49.0 and costs.compile_warm_s is None
    assert costs.saved_per_token_s == pytest.approx(0.009)
    assert not costs.warm_cache  # no inductor cache folder: the next compile is cold whatever the record says
    (tmp_path / "inductor").mkdir()
    (tmp_path / "inductor" / "kernel.so").write_bytes(b"")
    assert costs_for(small_model, cpu).warm_cache
    record_compile(small_model, cpu, compile_s=30.0, warm=True)  # no step figures: the old ones stay
    costs = costs_for(small_model, cpu)
    assert (costs.compile_cold_s, costs.compile_warm_s, costs.compile_s) == (49.0, 30.0, 30.0)
    assert costs.eager_step_s == 0.034
    # another dtype is another key
    assert not costs_for(small_model.to(torch.bfloat16), cpu).measured
    small_model.to(torch.float32)
    leftovers = [p.name for p in records_path().parent.iterdir() if p.name != "compile_costs.json"]
    assert leftovers == []  # written through a temp file renamed over the record


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"version": 99, "models": {}}',
                                     b'{"version": 1, "models": {"KEY": {"eager_step_s": "fast", "compiled_step_s": -1}}}'])
def test_a_corrupt_or_foreign_record_is_ignored_and_replaced(small_model, content, capsys):
    path = records_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    cpu = torch.device("cpu")
    path.write_bytes(content.replace(b"KEY", json.dumps(compile_choice.cost_key(small_model, cpu))[1:-1].encode()))
    assert not costs_for(small_model, cpu).measured
    record_compile(small_model, cpu, compile_s=12.0, warm=False, eager_step_s=0.01, compiled_step_s=0.005)
    assert costs_for(small_model, cpu).compile_cold_s == 12.0
    assert json.loads(path.read_text())["version"] == compile_choice.RECORD_VERSION
    assert "Traceback" not in capsys.readouterr().err


def test_an_unwritable_record_is_no_error(small_model, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be made
    record_compile(small_model, torch.device("cpu"), compile_s=1.0, warm=False)
    assert read_records() == {}


# --------------------------------------------------------------------------- through the CLI


def test_a_short_generate_stays_eager_and_says_why(tmp_path, llama_pair):
    profile = model_profile(tmp_path, llama_pair, compile="auto")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "specdec_cli", "generate", "def add(a, b):", "-p", str(profile),
                           "-n", "5", "-f", "text", "-v"], cwd=REPO, env=env, capture_output=True, timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "compile: auto -> off (expect ~5 tokens x" in err
    assert "compiling" not in err and "compiled the decode steps" not in err


def test_auto_says_once_what_compiling_would_gain_a_longer_job(small_model, caplog):
    """Off for a one-off run while a job of some thousands of tokens would pay the compile back:
    one notice naming where it pays, then never again on this machine; nothing where no job would."""
    cpu = torch.device("cpu")
    record_compile(small_model, cpu, compile_s=30.0, warm=True, eager_step_s=0.034, compiled_step_s=0.025)
    caplog.set_level("INFO", logger="specdec.notice")
    for _ in range(2):
        assert resolve_compile("auto", cpu, [small_model], Workload.of(1, 128)) == "off"
    said = [r.getMessage() for r in caplog.records if r.name == "specdec.notice"]
    assert len(said) == 1, said
    assert "pays from ~3,334 tokens a run (as measured here): --compile on for longer jobs" in said[0]
    caplog.clear()
    record_compile(small_model.to(torch.bfloat16), cpu, compile_s=30.0, warm=True, eager_step_s=0.0101,
                   compiled_step_s=0.0100)  # 0.1 ms a token: 300,000 tokens to pay back
    assert resolve_compile("auto", cpu, [small_model], Workload.of(1, 128)) == "off"
    small_model.to(torch.float32)
    assert not [r for r in caplog.records if r.name == "specdec.notice"]
