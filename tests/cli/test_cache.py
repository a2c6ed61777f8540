"""`specdec cache` lists what specdec keeps, part by part, and `cache clear` removes only the parts
named (and in a shared extensions folder only specdec's own builds), through the real command."""

from __future__ import annotations

import os
import subprocess
import sys

from cli_helpers import assert_one_line_error


def specdec(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def listing(env: dict[str, str]) -> dict[str, list[str]]:
    done = specdec(env, "cache")
    assert done.returncode == 0, done.stderr
    return {line.split("\t")[0]: line.split("\t")[1:] for line in done.stdout.splitlines()}


def test_cache_lists_and_clears_the_parts_named(tmp_path):
    root, shared = tmp_path / "specdec", tmp_path / "torch_extensions"
    env = {**os.environ, "SPECDEC_CACHE_DIR": str(root), "TORCH_EXTENSIONS_DIR": str(shared)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    (root / "gguf" / "model-1").mkdir(parents=True)
    (root / "gguf" / "model-1" / "model.safetensors").write_bytes(b"x" * 2500)
    (root / "packed").mkdir()
    (root / "packed" / "a.safetensors").write_bytes(b"x" * 1000)
    (root / "compile_costs.json").write_text("{}")
    (shared / "specdec_cpu_kernels_avx2_0123").mkdir(parents=True)
    (shared / "specdec_cpu_kernels_avx2_0123" / "lib.so").write_bytes(b"x" * 300)
    (shared / "someone_elses_extension").mkdir()

    parts = listing(env)
    assert list(parts) == ["gguf", "packed", "kernels", "inductor", "compile-costs", "distill"]
    assert parts["gguf"][:3] == ["2.5 KB", "1", str(root / "gguf")]
    assert parts["kernels"][:3] == ["300 B", "1", str(shared)]
    assert parts["inductor"][2] == str(root / "inductor")

    done = specdec(env, "cache", "clear", "packed", "kernels")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"cleared packed (1.0 KB, {root / 'packed'})",
                                        f"cleared kernels (300 B, {shared})"]
    assert not list((root / "packed").iterdir()) and (root / "gguf" / "model-1").is_dir()
    assert sorted(p.name for p in shared.iterdir()) == ["someone_elses_extension"]

    assert specdec(env, "cache", "clear", "--all").returncode == 0
    assert all(fields[1] == "0" for fields in listing(env).values())
    assert (shared / "someone_elses_extension").is_dir()


def test_cache_clear_says_what_to_name(tmp_path):
    env = {**os.environ, "SPECDEC_CACHE_DIR": str(tmp_path)}
    for args, fragment in ((("cache", "clear"), "name the parts to clear"),
                           (("cache", "clear", "weights"), "'weights' is not a part of the cache"),
                           (("cache", "clear", "gguf", "--all"), "or give --all, not both")):
        done = specdec(env, *args)
        assert done.returncode == 2, done.stderr
        assert_one_line_error(done.stderr, fragment)


def test_the_inductor_cache_is_emptied_over_its_bound_and_a_users_folder_is_left_alone(tmp_path, monkeypatch):
    from specdec_cli.cache_dirs import bound_inductor_cache

    root = tmp_path / "specdec"
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(root))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("SPECDEC_INDUCTOR_MAX_GB", str(2000 / 1024 ** 3))  # a 2000-byte bound
    kernels = root / "inductor" / "ab"
    kernels.mkdir(parents=True)
    (kernels / "kernel.so").write_bytes(b"x" * 1500)
    assert bound_inductor_cache() == 0 and (kernels / "kernel.so").exists()  # within the bound
    (kernels / "graph.py").write_bytes(b"x" * 1000)
    assert bound_inductor_cache() == 2500 and not (root / "inductor").exists()

    users = tmp_path / "my-inductor"
    (users / "ab").mkdir(parents=True)
    (users / "ab" / "kernel.so").write_bytes(b"x" * 5000)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(users))
    assert bound_inductor_cache() == 0 and (users / "ab" / "kernel.so").exists()
