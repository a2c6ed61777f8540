"""The instruction set specdec's CPU kernels are built for here, found through torch's public CPU
capability and, for VNNI (which that capability does not say), the CPU's own flags."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import torch

from ..errors import UsageError

ISA_VARIABLE = "SPECDEC_CPU_KERNELS"
ISA_NAMES = {"avx512": "AVX512-VNNI", "avx2": "AVX2"}  # as logs and notices name them
CPUINFO = Path("/proc/cpuinfo")


@lru_cache(maxsize=1)
def kernel_isa() -> str | None:
    """The instruction set specdec's CPU kernels run on here, fixed for the process: 'avx512'
    (AVX512 with VNNI), else 'avx2' (every AVX2 CPU has FMA and F16C too), else None (no kernel:
    int4 runs on torchao's, attention on sdpa). $SPECDEC_CPU_KERNELS=avx2 picks AVX2 over AVX512;
    torch's ATEN_CPU_CAPABILITY=avx2 (an AVX2 CPU emulated) holds the kernels to AVX2 too."""
    wanted = os.environ.get(ISA_VARIABLE, "auto")
    if wanted not in ("auto", "avx2"):
        raise UsageError(f"{ISA_VARIABLE}={wanted}: set it to auto or avx2, or unset it")
    capability = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2", "DEFAULT"; others off x86
    if wanted == "auto" and capability == "AVX512" and has_vnni():
        return "avx512"
    return "avx2" if capability in ("AVX512", "AVX2") else None


def has_vnni() -> bool:
    """Whether the CPU has AVX512-VNNI: Linux's flags, else torch's private probe where this torch
    still has it, else no (the AVX2 build, which gives the same bits)."""
    flags = cpu_flags()
    if flags:
        return "avx512_vnni" in flags
    probe = getattr(torch.cpu, "_is_vnni_supported", None)
    return bool(probe()) if callable(probe) else False


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them; empty where /proc/cpuinfo cannot be read."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()
