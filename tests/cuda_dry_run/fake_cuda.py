"""The CUDA dry run's machinery: specdec's decoding on fake CUDA tensors (torch's FakeTensorMode:
shapes, dtypes and devices, no values, no driver), with a CUDA build of torch on a machine that
has no GPU.

A run is made twice: first for real on the CPU, in the same dtype, recording every value specdec
reads back to the host (primitives/device_calls.to_host); then on fake CUDA, where those reads are
answered with the recorded values, so that the fake run takes the real run's path (the same
acceptances, the same stops) and reads the same shapes. Both runs read one deterministic clock, so
that k: auto and tree: auto decide alike. What fails a dry run:
- a device mismatch (torch's own FakeTensorDeviceMismatchError) or an op refusing a dtype;
- a value read on the host outside device_calls (a hidden sync: FakeTensorMode refuses `.item()`,
  `.tolist()`, `bool(t)`; WatchedFakeMode catches a device -> host copy);
- floating-point tensors of two dtypes meeting in one elementwise op (bf16 beside float32);
- floating-point work on the CPU during the decode (a path that fell back to the CPU);
- a read whose shape differs from the real run's (the paths diverged by device).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import sys
import time
import traceback
from typing import Any, Iterator
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from specdec_cli.kernels.quantize import quantize_model
from specdec_cli.primitives import device_calls
from specdec_cli.primitives.device_calls import CudaProperties, DeviceRuntime

# an H100's figures: what `device: auto`, `dtype: auto` and `compile: auto` read
FAKE_GPU = CudaProperties(name="fake CUDA device (dry run)", memory_bandwidth=3.35e12, bf16=True)


class DryRunFailure(AssertionError):
    """Something a real GPU would have run differently from what specdec means (see the module doc)."""


@dataclasses.dataclass
class Read:
    shape: tuple[int, ...]
    value: Any


class RecordingRuntime(DeviceRuntime):
    """The real runtime, keeping every value read back to the host in order."""

    def __init__(self):
        self.reads: list[Read] = []

    def to_host(self, tensor: torch.Tensor) -> Any:
        value = super().to_host(tensor)
        self.reads.append(Read(tuple(tensor.shape), value))
        return value

    def to_numpy(self, tensor: torch.Tensor) -> np.ndarray:
        value = super().to_numpy(tensor)
        self.reads.append(Read(tuple(tensor.shape), value.copy()))
        return value


class HostEvent:
    """A timing event the dry run's clock stamps (there are no CUDA events without a driver)."""

    def __init__(self):
        self.at = time.perf_counter()

    def elapsed_time(self, later: "HostEvent") -> float:
        return (later.at - self.at) * 1000.0


class FakeCudaRuntime(DeviceRuntime):
    """The CUDA runtime of a GPU that is not there: its properties stood in, its host reads
    answered with a real run's values (`reads`), checked shape by shape."""

    def __init__(self, reads: list[Read], properties: CudaProperties = FAKE_GPU):
        self.reads = list(reads)
        self.properties = properties
        self.taken = 0
        self.device_reads: list[str] = []  # where each read of a device tensor was made (a sync on a GPU)

    def cuda_available(self) -> bool:
        return True

    def cuda_device_count(self) -> int:
        return 1

    def cuda_properties(self, device: torch.device) -> CudaProperties:
        return self.properties

    def synchronize(self, device: torch.device) -> None:
        pass

    def timing_event(self) -> HostEvent:
        return HostEvent()

    def generator(self, device: torch.device) -> None:
        return None  # fake tensors draw no numbers: the draw's shape and device are what is checked

    def exponential(self, generator: Any, seed: int, size: int, device: torch.device) -> torch.Tensor:
        return torch.empty(size, device=device).exponential_()

    def _next(self, tensor: torch.Tensor) -> Any:
        if self.taken == len(self.reads):
            raise DryRunFailure(f"host read #{self.taken + 1} {tuple(tensor.shape)}: the CPU run read only {len(self.reads)}")
        read = self.reads[self.taken]
        if read.shape != tuple(tensor.shape):
            raise DryRunFailure(f"host read #{self.taken + 1}: {tuple(tensor.shape)} on {tensor.device}, where the "
                                f"CPU run read {read.shape}: the paths diverged")
        self.taken += 1
        if isinstance(tensor, FakeTensor):
            self.device_reads.append(_where(skip=1))
            return read.value
        if tensor.device.type != "cpu":
            raise DryRunFailure(f"host read #{self.taken}: a real {tensor.device} tensor, made outside the dry run")
        return None  # the host's own tensor: the caller reads it for real

    def to_host(self, tensor: torch.Tensor) -> Any:
        value = self._next(tensor)
        return super().to_host(tensor) if value is None else value

    def to_numpy(self, tensor: torch.Tensor) -> np.ndarray:
        value = self._next(tensor)
        return super().to_numpy(tensor) if value is None else np.array(value)


# ops that convert or copy (their inputs' dtypes differ by design), and ops whose meta kernels
# already refuse mixed dtypes
_CONVERSIONS = {"_to_copy", "copy_", "copy", "clone", "lift_fresh", "lift_fresh_copy", "index_put_", "index_put",
                "masked_scatter_", "where"}


class WatchedFakeMode(FakeTensorMode):
    """Fake CUDA tensors, and every op watched for what torch itself lets through (see the module
    doc). Only the device is faked: an op on real CPU tensors that makes no CUDA tensor runs for
    real, so the host's own bookkeeping (token lists, which cached columns are valid) keeps its
    values; a tensor bound for CUDA becomes fake there. A subclass, not a mode stacked above:
    torch.tensor() keeps its fake-mode path only when a FakeTensorMode is the innermost mode."""

    def __init__(self):
        super().__init__(allow_non_fake_inputs=True)
        self.decoding = False
        self.in_attention = 0  # inside scaled_dot_product_attention, whose fake kernel is its math
        # decomposition: it upcasts where a GPU's fused kernels do not (AttentionWatch checks the call)
        self.found: list[str] = []

    def loading(self, load):
        """`load` (a head's loader, called when a decoder is built) with the decode's watch paused:
        weights are read and built on the CPU before they move to the device."""

        def paused(*args, **kwargs):
            kept, self.decoding = self.decoding, False
            try:
                return load(*args, **kwargs)
            finally:
                self.decoding = kept

        return paused

    def _fake(self, tensor: torch.Tensor) -> torch.Tensor:
        """A fake twin of a real tensor; fresh each time (from_tensor's memo would hold a weak
        reference to the real one, and a module moved to the fake device could not swap it out)."""
        if isinstance(tensor, FakeTensor):
            return tensor
        empty = torch.ops.aten.empty_strided.default
        return super().__torch_dispatch__(empty, (), (tuple(tensor.shape), tuple(tensor.stride())),
                                          {"dtype": tensor.dtype, "device": tensor.device})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        name = func.overloadpacket.__name__
        if _on_host(tensors, args, kwargs):
            with unset_fake_temporarily():
                out = func(*args, **kwargs)
        else:  # real inputs made fake first: torch would run some ops (a lift, `to`) on them for real
            args, kwargs = pytree.tree_map_only(torch.Tensor, self._fake, (args, kwargs))
            out = super().__torch_dispatch__(func, types, args, kwargs)
        if name in ("_to_copy", "copy_") and tensors:
            source = tensors[-1] if name == "copy_" else tensors[0]
            target = out if isinstance(out, torch.Tensor) else None
            if target is not None and source.device.type == "cuda" and target.device.type == "cpu":
                self.found.append(f"{func}: a device -> host copy outside device_calls.to_host (a hidden sync), "
                                  f"at {_where()}")
        floats = {t.dtype for t in tensors if t.is_floating_point() and t.dim() > 0}
        if self.decoding and len(floats) > 1 and name not in _CONVERSIONS and not self.in_attention:
            self.found.append(f"{func}: {' and '.join(sorted(str(d) for d in floats))} in one op, at {_where()}")
        if self.decoding:
            for result in pytree.tree_leaves(out):
                if isinstance(result, torch.Tensor) and result.device.type == "cpu" and result.is_floating_point() \
                        and name not in ("lift_fresh", "lift_fresh_copy", "_to_copy") and not _building_module():
                    self.found.append(f"{func}: floating-point work on the CPU during the decode "
                                      f"{tuple(result.shape)}, at {_where()}")
        return out


class AttentionWatch(TorchFunctionMode):
    """Checks each attention call as a GPU's fused kernels take it: the mask boolean or in the
    query's dtype (a float32 mask beside bf16 queries is refused there), all on the query's device."""

    def __init__(self, mode: WatchedFakeMode):
        super().__init__()
        self.mode = mode

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        query, key, value = args[:3]
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        if mask is not None and mask.dtype not in (torch.bool, query.dtype):
            self.mode.found.append(f"attention: a {mask.dtype} mask beside {query.dtype} queries, at {_where()}")
        devices = {t.device for t in (query, key, value, mask) if t is not None}
        if len(devices) > 1:
            self.mode.found.append(f"attention: tensors on {sorted(map(str, devices))}, at {_where()}")
        self.mode.in_attention += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.mode.in_attention -= 1


def _on_host(tensors: list[torch.Tensor], args: Any, kwargs: dict) -> bool:
    """An op of the host's alone: no fake input, and no CUDA device named."""
    if any(isinstance(t, FakeTensor) for t in tensors):
        return False
    named = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.device)]
    return all(device.type == "cpu" for device in named)


def _building_module() -> bool:
    """Inside a module's __init__ (a head built when a decoder is): its weights start on the CPU."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), torch.nn.Module):
            return True
        frame = frame.f_back
    return False


def _where(skip: int = 0) -> str:
    """Where the op was made: the innermost frame of the model's code, and the two innermost of
    specdec (less the `skip` innermost: device_calls itself)."""
    stack = [f for f in traceback.extract_stack() if "cuda_dry_run" not in f.filename]
    stack = stack[: len(stack) - skip] if skip else stack
    frames = [f for f in stack if "/transformers/" in f.filename][-1:] + [f for f in stack if "specdec_cli" in f.filename][-2:]
    return " <- ".join(f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in frames)


@contextlib.contextmanager
def steady_clock() -> Iterator[None]:
    """time.perf_counter as a counter of its calls (a millisecond each): the real run and the fake one
    read the same times, so timing-driven choices (k: auto, tree: auto) come out alike."""
    ticks = itertools.count()
    real = time.perf_counter
    time.perf_counter = lambda: next(ticks) * 1e-3
    try:
        yield
    finally:
        time.perf_counter = real


@contextlib.contextmanager
def on_fake_cuda(reads: list[Read], properties: CudaProperties = FAKE_GPU,
                 ) -> Iterator[tuple[FakeCudaRuntime, WatchedFakeMode]]:
    """Fake CUDA for the block: every tensor made in it is fake, the runtime stood in, the watch on."""
    runtime = FakeCudaRuntime(reads, properties)
    # no constants: torch keeps the values of 1-element tensors made from Python data and runs ops on
    # them for real, and under inference_mode `aten.to` on such a constant would reach for a driver
    kept, fake_tensor.CONSTANT_NUMEL_LIMIT = fake_tensor.CONSTANT_NUMEL_LIMIT, -1
    # a module moved to the fake device gets new Parameters: a fake tensor cannot be swapped into a real one
    overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        with device_calls.standing_in(runtime), mock.patch.object(torch.utils, "swap_tensors", _swap_unless_in_place), \
                WatchedFakeMode() as watch, AttentionWatch(watch):
            yield runtime, watch
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = kept
        torch.__future__.set_overwrite_module_params_on_conversion(overwrite)


_swap_tensors = torch.utils.swap_tensors


def _swap_unless_in_place(first: torch.Tensor, second: torch.Tensor) -> None:
    """Module.to() onto the device a fake parameter is already on (a no-op on a GPU) swaps it with
    itself, which torch refuses for fake tensors: there, nothing is swapped."""
    if isinstance(first, FakeTensor) and isinstance(second, FakeTensor) and first.device == second.device \
            and first.dtype == second.dtype and first.shape == second.shape:
        return
    _swap_tensors(first, second)


def read_for_real(read):
    """A stand-in for a function that reads weights from files: it runs with fake tensors set aside
    (safetensors' reads need values), and what it returns is real, on the CPU."""

    def real_read(*args, **kwargs):
        with unset_fake_temporarily():
            return read(*args, **kwargs)

    return real_read


def loaded_on_cpu(load_model):
    """A stand-in for the model loader: the model loaded for real on the CPU, then moved to the fake
    device asked for, where its weights become fake, and quantized there. (transformers' own
    placement, device_map, is the part of loading the dry run does not run.)"""

    def load(spec, options):
        model = read_for_real(load_model)(dataclasses.replace(spec, quantize="none"),
                                          dataclasses.replace(options, device=torch.device("cpu")))
        # quantized on the fake device, in its layout there (as loading does after from_pretrained)
        return quantize_model(model.to(options.device), spec.quantize, spec.group_size, spec.quantize_head, None)

    return load
