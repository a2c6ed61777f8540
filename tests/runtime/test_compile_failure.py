"""A compile that fails never aborts a run: on a machine whose C++ compiler fails (inductor's CPU
code is C++), `generate --compile on` says so once and gives the tokens `--compile off` gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from profile_helpers import model_profile


def generate(profile, compile_mode: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specdec_cli", "generate", "def add(a, b):", "-p", str(profile), "-n", "12",
         "-f", "json", "--no-chat", "--compile", compile_mode],
        capture_output=True, text=True, timeout=600, env=env,
    )


def test_a_failing_compiler_under_compile_on_gives_the_eager_tokens(tmp_path, llama_pair):
    profile = model_profile(tmp_path, llama_pair)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SPECDEC_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # a cache of its own: no kernel compiled before may serve
    eager = generate(profile, "off", env)
    assert eager.returncode == 0, eager.stderr
    broken = generate(profile, "on", {**env, "CXX": "/bin/false", "SPECDEC_REQUIRE_KERNELS": "0",
                                      "TORCH_EXTENSIONS_DIR": str(tmp_path / "kernels")})
    assert broken.returncode == 0, broken.stderr
    assert json.loads(broken.stdout)["token_ids"] == json.loads(eager.stdout)["token_ids"]
    failed = [line for line in broken.stderr.splitlines() if "compile failed" in line]
    assert len(failed) == 1 and failed[0].startswith("specdec: warning:"), broken.stderr
    assert "decoding uncompiled" in failed[0]
    assert "Traceback" not in broken.stderr
