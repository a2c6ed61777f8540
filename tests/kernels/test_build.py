"""A failed build of specdec's CPU kernels (build.py), where a user sees it: one notice and one
warning a process, then the run goes on without them; under SPECDEC_REQUIRE_KERNELS=1 (CI) an
error instead. Each case builds in a fresh folder of its own, in its own process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from cli_helpers import assert_one_line_error
from profile_helpers import write_profile
from tiny_models import build_model, qwen2_config, save

from specdec_cli.kernels import build
from specdec_cli.kernels.isa import kernel_isa

pytestmark = pytest.mark.skipif(kernel_isa() is None, reason="this CPU has neither AVX512-VNNI nor AVX2: nothing to build")

NOTICE = "specdec: building specdec's CPU kernels"
FAILED = "specdec's CPU kernels ({}) did not build: "


@pytest.fixture(scope="module")
def int4_profile(tmp_path_factory, tokenizer):
    """An int4 target 128 wide (int4's default group), lookup drafting: no draft model to load."""
    folder = tmp_path_factory.mktemp("build")
    target = save(build_model(qwen2_config(tokenizer, layers=2, hidden=128), seed=33), tokenizer, folder / "model")
    return write_profile(folder, target={"model": str(target), "dtype": "auto"}, drafter={"kind": "ngram"}, device="cpu")


def no_compiler(tmp_path, **variables) -> dict[str, str]:
    """The environment of a machine whose C++ compiler fails, with no build kept from before."""
    return {**os.environ, "CXX": "/bin/false", "TORCH_EXTENSIONS_DIR": str(tmp_path / "kernels"),
            "OMP_NUM_THREADS": "1", **variables}


def generate_int4(profile, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdec_cli", "generate", "def add(a, b):", "-p", str(profile), "--quantize", "int4",
         "-f", "text", "-n", "8", "--no-chat"],
        capture_output=True, text=True, timeout=600, env=env,
    )


def test_a_failed_build_gives_one_notice_and_one_warning_and_the_run_goes_on(tmp_path, int4_profile):
    """int4 asks for the kernels from several places (the load dtype, each layer, the static
    caches' attention): the answer is computed once, and the run decodes on torchao's kernel."""
    pytest.importorskip("torchao")
    done = generate_int4(int4_profile, no_compiler(tmp_path, **{build.REQUIRE_VARIABLE: "0"}))  # not CI's switch
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    lines = done.stderr.splitlines()
    assert len(lines) == 3, done.stderr
    assert lines[0].startswith(NOTICE)
    assert lines[1].startswith("specdec: warning: " + FAILED.format("AVX512-VNNI" if kernel_isa() == "avx512" else "AVX2"))
    assert "/bin/false" in lines[1] and lines[1].endswith("; int4 runs on torchao's slower kernel and attention on sdpa")
    assert lines[2].startswith("8 tokens in ")


def test_under_the_switch_a_failed_build_is_a_one_line_error(tmp_path, int4_profile):
    done = generate_int4(int4_profile, no_compiler(tmp_path, **{build.REQUIRE_VARIABLE: "1"}))
    assert done.returncode == 1, done.stderr
    assert not done.stdout.strip()
    error = "\n".join(line for line in done.stderr.splitlines() if not line.startswith(NOTICE))
    assert_one_line_error(error, "did not build", "/bin/false", f"{build.REQUIRE_VARIABLE}=1 asks for them")


# a source that does not compile, built as the kernels' (the attention asks for them, as StaticLM does)
BROKEN_BUILD = """
import sys
from pathlib import Path
from specdec_cli.kernels import build, cpu_attention
build.KERNEL_SOURCE = Path(sys.argv[1])
print(cpu_attention.registered(), build.available())
"""


@pytest.mark.parametrize("required", [False, True])
def test_a_compile_error_is_named_by_the_compilers_first_error(tmp_path, required):
    source = tmp_path / "broken.cpp"
    source.write_text("int broken = ;\n")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "kernels"), build.REQUIRE_VARIABLE: "1" if required else "0"}
    done = subprocess.run([sys.executable, "-c", BROKEN_BUILD, str(source)], capture_output=True, text=True,
                          timeout=600, env=env)
    if required:
        assert done.returncode != 0
        assert "KernelBuildFailed" in done.stderr and f"{build.REQUIRE_VARIABLE}=1 asks for them" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["False", "False"]
        assert len(done.stderr.splitlines()) == 1, done.stderr  # the warning: a library's notices are info
    assert "broken.cpp:1:14: error: expected primary-expression" in done.stderr  # gcc's quotes follow the locale
    logs = list((tmp_path / "kernels").glob(f"*/{build.BUILD_LOG}"))
    assert len(logs) == 1 and "ninja: build stopped" in logs[0].read_text()
