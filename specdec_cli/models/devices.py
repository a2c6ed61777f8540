"""Device and dtype choice, and the device clock used for every timing."""

from __future__ import annotations

import time

import torch

from ..errors import UsageError
from ..primitives import device_calls

DTYPE_BY_NAME = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def resolve_device(name: str) -> torch.device:
    """`auto` picks cuda, then mps, then cpu; an explicit accelerator must exist."""
    if name == "auto":
        if device_calls.cuda_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not device_calls.cuda_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise UsageError(
                f"device '{name}' was asked for, but torch sees no CUDA GPU (torch {torch.__version__} is {build}); "
                "use --device cpu, or install a CUDA build of torch (see README)"
            )
        if device.index is not None and device.index >= (count := device_calls.cuda_device_count()):
            raise UsageError(f"device '{name}': this machine has {count} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"device '{name}' was asked for, but MPS is not available here; use --device cpu")
    return device


def cpu_bf16_unit() -> str | None:
    """The unit that runs bf16 matmuls natively here: "AMX" (tiles: a matmul of 16 rows costs about
    one of 1), "AVX512-BF16", or None where bf16 is emulated (slow), which includes torch held to
    AVX2 kernels (ATEN_CPU_CAPABILITY=avx2, as benchmarks/cpu_aims.sh emulates an AVX2 CPU)."""
    if torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2"):
        return None
    for unit, probe in (("AMX", "_is_amx_tile_supported"), ("AVX512-BF16", "_is_avx512_bf16_supported")):
        if getattr(torch.cpu, probe, lambda: False)():
            return unit
    return None


def memory_bandwidth(device: torch.device) -> float | None:
    """A CUDA device's peak memory bandwidth in bytes/s; None where torch does not say it (or off CUDA)."""
    return device_calls.cuda_properties(device).memory_bandwidth if device.type == "cuda" else None


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: bf16 on CUDA that computes it natively (Ampere on), else fp16; on CPU bf16 where the
    CPU computes it natively, else fp32."""
    if name != "auto":
        return DTYPE_BY_NAME[name]
    if device.type == "cuda":
        return torch.bfloat16 if device_calls.cuda_properties(device).bf16 else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.bfloat16 if cpu_bf16_unit() else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def device_clock(device: torch.device) -> float:
    """perf_counter after the device has finished its queued work: the only honest clock read."""
    device_calls.synchronize(device)
    return time.perf_counter()


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return device_calls.cuda_properties(device).name
    if device.type == "cpu":
        # the kernel ISA torch dispatches to (ATEN_CPU_CAPABILITY may hold it below the CPU's own)
        capability = torch.backends.cpu.get_cpu_capability()
        unit = cpu_bf16_unit()
        bf16 = f", bf16 on {unit}" if unit else ""
        return f"CPU {cpu_model_name()} ({torch.get_num_threads()} threads, {capability} kernels{bf16})"
    return device.type


def cpu_model_name() -> str:
    """The CPU's marketing name where Linux tells it (platform.processor() is often empty there)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class PhaseTimer:
    """Sums time per phase (draft, verify) without a host sync per phase on CUDA.

    On CUDA the phases are bracketed with CUDA events and read once, when `totals()` is called;
    on CPU the work is synchronous and perf_counter is exact.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._spans: dict[str, list] = {}
        self._cpu: dict[str, float] = {}

    def start(self):
        if self.cuda:
            return device_calls.timing_event()
        return time.perf_counter()

    def stop(self, phase: str, started) -> None:
        self.add(phase, started, self.start())

    def add(self, phase: str, started, ended) -> None:
        """A span between two marks from start() (of this timer or another): a batch's rows each
        count the step's phases from one pair of marks."""
        if self.cuda:
            self._spans.setdefault(phase, []).append((started, ended))
        else:
            self._cpu[phase] = self._cpu.get(phase, 0.0) + ended - started

    def totals(self) -> dict[str, float]:
        if not self.cuda:
            return dict(self._cpu)
        device_calls.synchronize(self.device)
        return {
            phase: sum(start.elapsed_time(end) for start, end in spans) / 1000.0
            for phase, spans in self._spans.items()
        }


def head_device(model: torch.nn.Module) -> torch.device:
    """The device the logits come out on, whatever holds the head's weights."""
    head = model.get_output_embeddings()
    return next(iter([*head.parameters(), *head.buffers()])).device
