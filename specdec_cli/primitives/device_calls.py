"""Every call that leaves the tensor program: a tensor's values read on the host (a decoding step's
one transfer, a drafter's reads), and the CUDA runtime (availability, device properties,
synchronize, timing events, seeded generators).

They all go through one `DeviceRuntime`, so that a machine with no GPU can stand them in: the CUDA
dry run (tests/cuda_dry_run, run by benchmarks/cuda_dry_run.sh) runs every decoding path on fake
CUDA tensors, which have no values to read and no driver to answer, and swaps in its own runtime
with `standing_in`. Nothing else in specdec calls torch.cuda or reads a device tensor's values
(the host's own tensors, such as prompt ids and which cached columns are valid, are read directly).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch


@dataclass(frozen=True)
class CudaProperties:
    name: str
    # peak memory bandwidth in bytes/s (from the memory's clock and bus width); None where not said
    memory_bandwidth: float | None
    bf16: bool  # native bf16 (compute capability 8.0 or later)


class DeviceRuntime:
    """The real runtime: torch's own calls."""

    def cuda_available(self) -> bool:
        return torch.cuda.is_available()

    def cuda_device_count(self) -> int:
        return torch.cuda.device_count()

    def cuda_properties(self, device: torch.device) -> CudaProperties:
        properties = torch.cuda.get_device_properties(device)
        # the memory's clock (kHz, double data rate) times its bus width (bits)
        clock_khz, bus_bits = getattr(properties, "memory_clock_rate", 0), getattr(properties, "memory_bus_width", 0)
        bandwidth = clock_khz * 1e3 * 2 * bus_bits / 8 if clock_khz and bus_bits else None
        # bf16 in hardware from Ampere (compute capability 8) on; before it torch emulates it, slowly
        bf16 = getattr(properties, "major", 0) >= 8
        return CudaProperties(getattr(properties, "name", "CUDA device"), bandwidth, bf16)

    def synchronize(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elif device.type == "mps":
            torch.mps.synchronize()

    def timing_event(self) -> Any:
        """A CUDA event recorded now on the current stream; `a.elapsed_time(b)` is milliseconds."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def generator(self, device: torch.device) -> Any:
        return torch.Generator(device=device)

    def exponential(self, generator: Any, seed: int, size: int, device: torch.device) -> torch.Tensor:
        """Exp(1) noise of `size` drawn on `device` from `generator` seeded with `seed`."""
        generator.manual_seed(seed)
        return torch.empty(size, device=device).exponential_(generator=generator)

    def to_host(self, tensor: torch.Tensor) -> Any:
        """The values as Python numbers (nested lists): a device -> host transfer, and a sync."""
        return tensor.tolist()

    def to_numpy(self, tensor: torch.Tensor) -> np.ndarray:
        return tensor.cpu().numpy()


_runtime = DeviceRuntime()


@contextmanager
def standing_in(runtime: DeviceRuntime) -> Iterator[DeviceRuntime]:
    """Run the block with `runtime` answering every call here (one thread's run at a time)."""
    global _runtime
    kept, _runtime = _runtime, runtime
    try:
        yield runtime
    finally:
        _runtime = kept


def cuda_available() -> bool:
    return _runtime.cuda_available()


def cuda_device_count() -> int:
    return _runtime.cuda_device_count()


def cuda_properties(device: torch.device) -> CudaProperties:
    return _runtime.cuda_properties(device)


def synchronize(device: torch.device) -> None:
    _runtime.synchronize(device)


def timing_event() -> Any:
    return _runtime.timing_event()


def generator(device: torch.device) -> Any:
    return _runtime.generator(device)


def exponential(generator: Any, seed: int, size: int, device: torch.device) -> torch.Tensor:
    return _runtime.exponential(generator, seed, size, device)


def to_host(tensor: torch.Tensor) -> Any:
    return _runtime.to_host(tensor)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return _runtime.to_numpy(tensor)
