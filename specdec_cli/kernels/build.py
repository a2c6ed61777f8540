"""specdec's C++ CPU kernels (cpu_kernels.cpp: the int4 matmul, the static-cache attention), built
once per machine and loaded once per process behind one cached answer: the ops, or why not.

A build that fails costs a process one notice (the build starting) and one warning (why, and what
runs instead); every later caller gets the cached answer, and int4 runs on torchao's kernel,
attention on sdpa. $SPECDEC_REQUIRE_KERNELS=1 (CI sets it) makes a failed build on a CPU the
kernels take an error instead, so that a broken kernel fails the tests rather than skipping them.

Built at first use with torch's JIT extension builder, not at install. Measured on a 2-core AMD
EPYC (AVX512-VNNI/BF16), torch 2.13 (BENCHMARKS.md, "CPU kernels: built when"): the first use
pays one build of this CPU's instruction set, 11.5 s wall once per machine, later processes load
it in 0.1 s beyond importing torch; an ahead-of-time setuptools extension took 32.3 s for the two
instruction sets a wheel must carry (it cannot know the user's CPU), on every install and upgrade,
with torch in pip's isolated build environment (a second torch download, gigabytes for CUDA's),
tied to the torch it was built against (an upgrade of torch breaks it, so the JIT build would stay
as the fallback anyway), and a machine without a compiler would fail at install for an optional
part."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import subprocess
import sys
import warnings
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import torch

from ..cache_dirs import kernels_dir
from ..errors import SpecdecError, first_line
from ..run_clock import timed
from .isa import ISA_NAMES, kernel_isa

log = logging.getLogger("specdec")
notice = logging.getLogger("specdec.notice")  # one-time notices, shown like the compile notice

KERNEL_SOURCE = Path(__file__).with_name("cpu_kernels.cpp")
REQUIRE_VARIABLE = "SPECDEC_REQUIRE_KERNELS"
# -fopenmp: at::parallel_for is inline OpenMP code; compiled without it, it runs on one thread
BUILD_FLAGS = {
    "avx512": ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mfma"],
    "avx2": ["-O3", "-fopenmp", "-mavx2", "-mfma", "-mf16c"],
}
LINK_FLAGS = ["-fopenmp"]
BUILD_LOG = "build.log"  # the builder's whole output, kept beside a failed build
REASON_MARKERS = (": error:", "not found", "FAILED")  # what the line that says why contains, best first


class KernelsUnavailable(SpecdecError):
    """specdec's CPU kernels do not run in this process; the message says why."""


class KernelBuildFailed(KernelsUnavailable):
    """The CPU takes the kernels, but they did not build (no compiler, no ninja, a compile error)."""


def kernels() -> Any:
    """torch.ops.specdec_kernels, the kernels' ops, built (first use on this machine) and loaded
    (first use in this process); raises KernelsUnavailable, saying why, where they cannot run."""
    outcome = _outcome()
    if isinstance(outcome, KernelsUnavailable):
        raise outcome
    return outcome


def available() -> bool:
    """Whether the kernels run here, building them if need be: False where the CPU has neither
    AVX512-VNNI nor AVX2 or the build failed (warned once). Under $SPECDEC_REQUIRE_KERNELS=1 a
    failed build raises KernelBuildFailed instead."""
    outcome = _outcome()
    if isinstance(outcome, KernelBuildFailed) and required():
        raise outcome
    return not isinstance(outcome, KernelsUnavailable)


def required() -> bool:
    return os.environ.get(REQUIRE_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


@lru_cache(maxsize=1)
def _outcome() -> Any:
    """The ops or a KernelsUnavailable, once a process: a failure is kept as well as a success, so
    no caller builds again."""
    isa = kernel_isa()
    if isa is None:
        log.debug("specdec's CPU kernels: this CPU has neither AVX512-VNNI nor AVX2")
        return KernelsUnavailable("this CPU has neither AVX512-VNNI nor AVX2")
    folder = build_directory(isa)
    try:
        with timed("CPU kernels"):
            return _load(isa, folder)
    except Exception as exc:  # the builder raises RuntimeError, OSError, CalledProcessError...
        failure = KernelBuildFailed(describe_failure(isa, exc, folder))
    if required():
        return KernelBuildFailed(f"{failure}; {REQUIRE_VARIABLE}=1 asks for them: fix the build or unset it")
    log.warning("%s; int4 runs on torchao's slower kernel and attention on sdpa", failure)
    return failure


def build_directory(isa: str) -> Path:
    """Where this build of the kernels lives: under cache_dirs.kernels_dir(), in a folder keyed by
    everything the library depends on (the C++, the flags, the instruction set, torch and Python),
    so a changed key builds anew beside the old."""
    key = json.dumps([KERNEL_SOURCE.read_text(encoding="utf-8"), BUILD_FLAGS[isa], LINK_FLAGS, torch.__version__,
                      sys.implementation.cache_tag])
    return kernels_dir() / f"specdec_cpu_kernels_{isa}_{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def library_name(isa: str) -> str:
    return f"specdec_cpu_kernels_{isa}"


def _load(isa: str, folder: Path) -> Any:
    library = folder / f"{library_name(isa)}.so"
    if library.is_file() and not (folder / "lock").exists():  # built, and no build under way
        torch.ops.load_library(str(library))
    else:
        notice.info("building specdec's CPU kernels (%s) once for this machine (about 10 s)", ISA_NAMES[isa])
        _build(isa, folder)
    return torch.ops.specdec_kernels


def _build(isa: str, folder: Path) -> None:
    """Compiles and loads the library (its TORCH_LIBRARY block registers the ops); torch's builder
    takes a lock in `folder`, so processes that start together build once."""
    from torch.utils.cpp_extension import load

    folder.mkdir(parents=True, exist_ok=True)
    with builder_quiet():
        load(name=library_name(isa), sources=[str(KERNEL_SOURCE)], extra_cflags=BUILD_FLAGS[isa],
             extra_ldflags=LINK_FLAGS, build_directory=str(folder), is_python_module=False)


@contextmanager
def builder_quiet() -> Iterator[None]:
    """torch's builder warns in its own words (a compiler it does not know, a banner of !!): the
    one warning a failed build gets is ours, so its words go to the debug log."""
    builder_log = logging.getLogger("torch.utils.cpp_extension")
    level = builder_log.level
    builder_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        builder_log.setLevel(level)
        for warning in caught:
            log.debug("torch's extension builder: %s", warning.message)


def describe_failure(isa: str, exc: Exception, folder: Path) -> str:
    """One line: the build that failed, the line of the builder's output that says why (the
    compiler's first error, else ninja's, else the exception's first line), and where the whole
    output is kept."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if isinstance(exc, subprocess.CalledProcessError):  # the builder's check of $CXX, before any build
        reason = f"`{shlex.join(map(str, exc.cmd))}` exited with status {exc.returncode}"
    else:
        reason = next((line for marker in REASON_MARKERS for line in lines if marker in line), first_line(exc))
    text = f"specdec's CPU kernels ({ISA_NAMES[isa]}) did not build: {reason}"
    if len(lines) > 1:
        try:
            (folder / BUILD_LOG).write_text(str(exc), encoding="utf-8")
            text += f" (the whole output: {folder / BUILD_LOG})"
        except OSError:  # a read-only cache: the one line is all there is
            pass
    return text
