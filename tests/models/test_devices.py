"""Device and dtype choices as a user's environment sets them."""

import os
import subprocess
import sys

import pytest
import torch

from specdec_cli.models.devices import device_description, resolve_dtype

PROBE = (
    "import torch; from specdec_cli.models.devices import device_description, resolve_dtype; "
    "cpu = torch.device('cpu'); print(resolve_dtype('auto', cpu)); print(device_description(cpu))"
)


def test_cpu_held_to_avx2_kernels_decodes_in_float32_and_says_so():
    """ATEN_CPU_CAPABILITY=avx2 (an AVX2-only CPU, or one emulated): bf16 would be emulated, so auto is fp32."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2")
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    dtype, description = done.stdout.strip().splitlines()
    assert dtype == "torch.float32"
    assert description.startswith("CPU ") and "AVX2 kernels" in description


@pytest.mark.parametrize(
    ("capability", "amx", "avx512_bf16", "unit"),
    [
        ("AVX512", True, True, "AMX"),
        ("AVX512", False, True, "AVX512-BF16"),
        ("AVX512", False, False, None),
        ("AVX2", True, True, None),  # held to AVX2 kernels: bf16 would be emulated
    ],
)
def test_reports_name_the_unit_that_runs_bf16(monkeypatch, capability, amx, avx512_bf16, unit):
    """Bench reports carry the description, so a figure says whether AMX or AVX512-BF16 made it."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    cpu = torch.device("cpu")
    description = device_description(cpu)
    assert f"{capability} kernels" in description
    if unit:
        assert description.endswith(f", bf16 on {unit})")
        assert resolve_dtype("auto", cpu) == torch.bfloat16
    else:
        assert "bf16 on" not in description
        assert resolve_dtype("auto", cpu) == torch.float32
