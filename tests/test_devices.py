"""Device and dtype choices as a user's environment sets them."""

import os
import subprocess
import sys

PROBE = (
    "import torch; from specdec_cli.devices import device_description, resolve_dtype; "
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
