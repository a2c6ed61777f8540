"""int4 weights with int8 activations on CPUs with AVX512-VNNI or AVX2: specdec's own matmul for
`quantize: int4` where it runs: the weights' packing and the layer that multiplies by them.

Why our own kernel: the int4 CPU matmul torch ships (ATen's _weight_int4pack_mm_for_cpu, what
torchao's CPU int4 runs) widens every weight to float32 and is bound by that arithmetic, not by
memory: on a 2-core AVX512 EPYC it read 20 GB/s of a 34-62 GB/s memory at one token, and its cost
grew with the width (a verify of 6 tokens cost what bfloat16 did). llama.cpp's answer, which this
follows, is integer dot products: activations rounded to int8 (one scale a row), four
multiply-adds per instruction (VNNI's vpdpbusd), a float multiply only once a group. torchao has
such a kernel (da8w4) in C++ extensions its PyPI wheels do not carry; so the C++ (cpu_kernels.cpp)
is compiled once per machine (build.py) and registered as a torch op that torch.compile calls as
it is.

Same weights as torchao's int4 in spirit (4 bits, a scale and a minimum per group of inputs), but a
different model: the activations are quantized too. Exactness is unaffected: each activation row
is quantized on its own and reduced in a fixed order, so a row's logits are the same at any verify
width, and the target is this quantized model.

The C++ is built for one instruction set, the best this CPU has (isa.py): AVX512 with VNNI
(vpdpbusd: four multiply-adds a lane an instruction) or AVX2 with FMA and F16C (vpmaddubsw, then
vpmaddwd: the same integer sums in more instructions, on 8 lanes instead of 16). Both give the same
bits; $SPECDEC_CPU_KERNELS=avx2 takes the AVX2 one on an AVX512 CPU (side-by-sides, tests). Only
one of them is loaded in a process: both register the same ops."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from . import build
from .isa import ISA_NAMES, kernel_isa

LANES = 16  # outputs a vector holds (one AVX512 register, two AVX2 ones): out_features must be a multiple
CHUNK = 8  # inputs one 64-byte chunk carries for 16 outputs
GROUP_MULTIPLE = 16  # the kernel quantizes activations 16 at a time and takes two chunks a step


def fits(linear: torch.nn.Linear, group_size: int) -> bool:
    """Whether the kernel takes this layer: on the CPU, and a shape that shape_fits."""
    return linear.weight.device.type == "cpu" and shape_fits(linear.out_features, linear.in_features, group_size)


def shape_fits(out_features: int, in_features: int, group_size: int) -> bool:
    """Outputs in 16s, inputs in groups of 16s."""
    return out_features % LANES == 0 and group_size % GROUP_MULTIPLE == 0 and in_features % group_size == 0


@lru_cache(maxsize=1)
def int4_ops() -> Any:
    """The kernels' ops (build.kernels(), which raises KernelsUnavailable where they cannot run),
    with int4_linear's output shape told to torch.compile's tracing; the compiled graph then calls
    the C++ op itself (through a Python custom op it cost ~10 us more a layer: 2 ms of a 43 ms
    step of a 1.5B model)."""
    ops = build.kernels()
    torch.library.register_fake("specdec_kernels::int4_linear")(
        lambda x, packed, scales, mins, group_size, bias: x.new_empty((*x.shape[:-1], packed.shape[0] * LANES)))
    return ops


PACK_ROWS = 4096  # output rows packed at a time: a whole 151,936-row head's float32 temporaries took GBs


def pack(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K] -> the kernel's layout: packed uint8 [N/16, K/8, 64], scales and minimums
    float16 [N/16, K/group_size, 16]. Per group w ~ q * scale + min, q = round((w - min) / scale)
    in 0..15, on the grid of the float16 scale and minimum actually stored; for 16 outputs and 8
    inputs, byte 4j + i holds input i (low nibble) and input 4 + i (high nibble) of output j, so one
    load and two masks give the 16 lanes of a VNNI dot product (two loads, AVX2's 2 x 8). Rows are
    packed PACK_ROWS at a time (each output row's bytes depend on that row alone), so the float32
    temporaries stay small whatever the layer. The parts never require grad, whatever `weight`
    did: a compiled step's graph cache keys on it, so parts packed now and parts read from the
    packed cache must look alike."""
    weight = weight.detach()
    parts = [_pack_rows(weight[start : start + PACK_ROWS], group_size) for start in range(0, weight.shape[0], PACK_ROWS)]
    return tuple(torch.cat(chunks) for chunks in zip(*parts))


def _pack_rows(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group_size, group_size)
    low, high = groups.amin(dim=-1).half(), groups.amax(dim=-1)
    scales = ((high - low.float()) / 15).half().clamp_min(torch.finfo(torch.float16).smallest_normal)
    q = ((groups - low.float()[..., None]) / scales.float()[..., None]).round().clamp(0, 15).to(torch.uint8)
    return pack_codes(q.reshape(n, k), scales, low)


def pack_codes(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes already chosen (uint8 [N, K], 0..15) with their float16 scales and minimums [N, groups]
    (w = code * scale + min) -> `pack`'s layout: for checkpoints quantized elsewhere (GPTQ, AWQ)."""
    n, k = codes.shape
    q = codes.reshape(n // LANES, LANES, k // CHUNK, 2, CHUNK // 2)
    packed = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).permute(0, 2, 1, 3)  # [N/16, K/8, 16, 4]
    return (packed.reshape(n // LANES, k // CHUNK, LANES * CHUNK // 2).contiguous(),
            lanes_last(scales), lanes_last(mins))


def lanes_last(per_group: torch.Tensor) -> torch.Tensor:
    """[N, G] -> [N/16, G, 16]: the 16 outputs of a register side by side."""
    n, groups = per_group.shape
    return per_group.reshape(n // LANES, LANES, groups).transpose(1, 2).contiguous()


def unpack(packed: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int) -> torch.Tensor:
    """The float32 weight [N, K] that `pack` stored (for tests and quality checks)."""
    blocks, chunks, _ = packed.shape
    n, k = blocks * LANES, chunks * CHUNK
    nibbles = packed.reshape(blocks, chunks, LANES, CHUNK // 2)
    q = torch.stack([nibbles & 0x0F, nibbles >> 4], dim=3)  # [N/16, K/8, 16, 2, 4]
    q = q.permute(0, 2, 1, 3, 4).reshape(n, k // group_size, group_size).float()
    per_output = lambda t: t.transpose(1, 2).reshape(n, -1).float()  # noqa: E731
    return (q * per_output(scales)[..., None] + per_output(mins)[..., None]).reshape(n, k)


PARTS = ("packed", "scales", "mins")  # what `pack` returns, as Int4Linear's buffers


class Int4Linear(torch.nn.Module):
    """A Linear whose weight is held packed by `pack` (or as `stored`, `pack`'s output kept on
    disk) and multiplied by specdec's kernel (kernel_isa())."""

    def __init__(self, linear: torch.nn.Linear, group_size: int,
                 stored: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
        super().__init__()
        int4_ops()  # forward calls the op, which the kernels' library registers
        self.in_features, self.out_features, self.group_size = linear.in_features, linear.out_features, group_size
        packed, scales, mins = stored if stored is not None else pack(linear.weight.detach(), group_size)
        self.register_buffer("packed", packed)
        self.register_buffer("scales", scales)
        self.register_buffer("mins", mins)
        # a GPTQ/AWQ layer arrives as a Linear without weights (on the meta device) but with its bias
        bias = linear.bias.detach().float() if linear.bias is not None else torch.empty(0)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.specdec_kernels.int4_linear(x, self.packed, self.scales, self.mins, self.group_size, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}, int4 x int8 ({ISA_NAMES[kernel_isa()]})"
