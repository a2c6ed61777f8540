"""The AVX2 build of specdec's CPU kernels (cpu_kernels.cpp) against the AVX512 one: the same bits
for the int4 matmul and the attention, and rows independent of each other in the AVX2 build. A
process loads one build only (both register the same ops), so the AVX2 one runs in a subprocess
under SPECDEC_CPU_KERNELS=avx2, building into this session's extension folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from kernel_helpers import KERNELS_RUN

from specdec_cli.kernels import build, int4_matmul
from specdec_cli.kernels.isa import ISA_VARIABLE, kernel_isa

needs_both = pytest.mark.skipif(not (KERNELS_RUN and kernel_isa() == "avx512"),
                                reason="compares the AVX2 build with the AVX512 one: needs an AVX512-VNNI CPU")

# what the subprocess runs: each call's op on its arguments, with the AVX2 build
AVX2_CALLS = """
import sys, torch
from specdec_cli.kernels import build, isa
ops = build.kernels()
calls = torch.load(sys.argv[1])
outputs = {name: getattr(ops, op)(*args) for name, (op, args) in calls.items()}
torch.save({"isa": isa.kernel_isa(), "outputs": outputs}, sys.argv[2])
"""


def int4_calls() -> dict[str, tuple[str, tuple]]:
    """int4_linear on float32 and bfloat16 rows (1, 3 and 5 of them, then the 5 one at a time),
    groups of 32 and 128, with and without a bias; a row with a NaN and large values besides."""
    calls = {}
    generator = torch.Generator().manual_seed(0)
    for group, bias in ((32, True), (32, False), (128, True), (128, False)):
        weight = torch.randn(48, 256, generator=generator) * torch.linspace(0.2, 3.0, 48)[:, None]
        packed, scales, mins = int4_matmul.pack(weight, group)
        shift = torch.randn(48, generator=generator) if bias else torch.empty(0)
        for dtype in (torch.float32, torch.bfloat16):
            for rows in (1, 3, 5):
                x = (torch.randn(rows, 256, generator=generator) * torch.linspace(0.1, 4.0, 256)).to(dtype)
                if rows == 5:
                    x[2] *= 50
                    x[4, 7] = float("nan")
                name = f"int4 g{group} bias={bias} {dtype} x{rows}"
                calls[name] = ("int4_linear", (x, packed, scales, mins, group, shift))
                if rows == 5:
                    calls.update({f"{name} row {row}": ("int4_linear", (x[row:row + 1], packed, scales, mins, group, shift))
                                  for row in range(rows)})
    return calls


def attention_calls() -> dict[str, tuple[str, tuple]]:
    """masked_attention in float32 and bfloat16: 3 query rows (then each alone) over 100 slots
    (not a multiple of 16), 40% of them shut; head sizes 32 and 128, grouped keys."""
    calls = {}
    generator = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        for dim in (32, 128):
            query = torch.randn(2, 3, 8, dim, generator=generator).to(dtype).transpose(1, 2)  # as transformers makes it
            key, value = (torch.randn(2, 2, 100, dim, generator=generator).to(dtype) for _ in range(2))
            shut = torch.rand(2, 1, 3, 100, generator=generator) < 0.4
            shut[..., 0] = False
            mask = torch.zeros(2, 1, 3, 100, dtype=dtype).masked_fill_(shut, torch.finfo(dtype).min)
            name = f"attention {dtype} d{dim}"
            calls[name] = ("masked_attention", (query, key, value, mask, dim ** -0.5))
            for row in range(3):
                calls[f"{name} row {row}"] = ("masked_attention", (query[:, :, row:row + 1], key, value,
                                                                   mask[:, :, row:row + 1], dim ** -0.5))
    return calls


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int32 if tensor.element_size() == 4 else torch.int16)


@needs_both
def test_the_avx2_build_gives_the_avx512_builds_bits(tmp_path):
    calls = {**int4_calls(), **attention_calls()}
    torch.save(calls, tmp_path / "calls.pt")
    environment = {**os.environ, ISA_VARIABLE: "avx2", "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", AVX2_CALLS, str(tmp_path / "calls.pt"), str(tmp_path / "avx2.pt")],
                   env=environment, check=True, timeout=600)
    avx2 = torch.load(tmp_path / "avx2.pt")
    assert avx2["isa"] == "avx2"
    ops = build.kernels()  # this process: the AVX512 build
    for name, (op, args) in calls.items():
        theirs = avx2["outputs"][name]
        assert torch.equal(bits(theirs), bits(getattr(ops, op)(*args))), name
    outputs = avx2["outputs"]
    assert outputs["int4 g32 bias=True torch.bfloat16 x5"][4].isnan().all()
    for name in [n for n in calls if n.startswith("int4") and n.endswith("x5")]:  # rows independent, AVX2 build
        assert torch.equal(bits(torch.cat([outputs[f"{name} row {r}"] for r in range(5)])), bits(outputs[name])), name
    for name in [n for n in calls if n.startswith("attention") and "row" not in n]:
        alone = torch.cat([outputs[f"{name} row {r}"] for r in range(3)], dim=2)
        assert torch.equal(bits(alone), bits(outputs[name])), name
