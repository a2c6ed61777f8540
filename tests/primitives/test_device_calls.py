"""primitives/device_calls: the one module that calls the CUDA runtime and reads tensors on the host,
so that the CUDA dry run (tests/cuda_dry_run) can stand it in."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

import specdec_cli
from specdec_cli.models.devices import resolve_device, resolve_dtype
from specdec_cli.primitives import device_calls
from specdec_cli.primitives.device_calls import CudaProperties, DeviceRuntime

PACKAGE = Path(specdec_cli.__file__).parent


def test_no_other_module_calls_the_cuda_runtime():
    """torch.cuda and torch.mps only in device_calls (export writes a line of Python that names
    torch.cuda for the serving engine's process: text, not a call of specdec's)."""
    calls = re.compile(r"\btorch\.(cuda|mps)\.\w+\(")
    allowed = {"primitives/device_calls.py", "serving/hf_transformers.py"}
    found = [f"{path.relative_to(PACKAGE)}:{n}" for path in PACKAGE.rglob("*.py")
             if str(path.relative_to(PACKAGE)) not in allowed
             for n, line in enumerate(path.read_text().splitlines(), 1) if calls.search(line)]
    assert found == []


def test_the_check_finds_a_call():
    assert re.search(r"\btorch\.(cuda|mps)\.\w+\(", "    torch.cuda.synchronize(device)")


@pytest.mark.parametrize("major, bf16", [(7, False), (8, True), (9, True)])
def test_native_bf16_from_the_compute_capability(monkeypatch, major, bf16):
    """Before Ampere (7.x) torch emulates bf16, slowly: dtype: auto takes fp16 there."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: types.SimpleNamespace(
        name="GPU", major=major, memory_clock_rate=2_619_000, memory_bus_width=5120))
    properties = DeviceRuntime().cuda_properties(torch.device("cuda"))
    assert properties.bf16 == bf16
    assert properties.memory_bandwidth == pytest.approx(3.352e12, rel=1e-3)


class StandIn(DeviceRuntime):
    def __init__(self, bf16: bool):
        self.bf16 = bf16

    def cuda_available(self) -> bool:
        return True

    def cuda_properties(self, device: torch.device) -> CudaProperties:
        return CudaProperties("stand-in", 1e12, self.bf16)


def test_a_stand_in_answers_until_the_block_ends():
    with device_calls.standing_in(StandIn(bf16=False)):
        device = resolve_device("auto")
        assert device.type == "cuda" and resolve_dtype("auto", device) == torch.float16
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert device_calls.to_host(torch.tensor([[1, 2]])) == [[1, 2]]
