"""The instruction set specdec's CPU kernels are built for (isa.py): torch's public CPU capability
decides AVX512 or AVX2, the CPU's own flags whether AVX512 has VNNI, and $SPECDEC_CPU_KERNELS can
hold an AVX512 CPU to the AVX2 build."""

from __future__ import annotations

import pytest
import torch

from specdec_cli.errors import UsageError
from specdec_cli.kernels import isa
from specdec_cli.kernels.isa import ISA_VARIABLE, kernel_isa


@pytest.fixture
def fresh_choice(monkeypatch):
    """kernel_isa() computed anew under this test's settings, and this process's own choice (the
    one its loaded build was made for) back afterwards."""
    monkeypatch.delenv(ISA_VARIABLE, raising=False)
    kernel_isa.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    kernel_isa.cache_clear()


def test_the_variable_picks_the_build_and_a_wrong_value_says_what_to_set(fresh_choice):
    capability = torch.backends.cpu.get_cpu_capability()
    fresh_choice.setenv(ISA_VARIABLE, "avx2")
    assert kernel_isa() == ("avx2" if capability in ("AVX512", "AVX2") else None)
    fresh_choice.setenv(ISA_VARIABLE, "avx-512")
    kernel_isa.cache_clear()
    with pytest.raises(UsageError, match="SPECDEC_CPU_KERNELS=avx-512: set it to auto or avx2, or unset it"):
        kernel_isa()


@pytest.mark.parametrize("capability, flags, expected", [
    ("AVX512", {"avx512f", "avx512_vnni"}, "avx512"),
    ("AVX512", {"avx512f"}, "avx2"),  # AVX512 without VNNI: the AVX2 build
    ("AVX2", {"avx2", "avx512_vnni"}, "avx2"),  # torch held to AVX2 (ATEN_CPU_CAPABILITY=avx2): so are we
    ("DEFAULT", {"sse4_2"}, None),
])
def test_the_choice_follows_torchs_capability_and_the_cpus_flags(fresh_choice, capability, flags, expected):
    fresh_choice.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    fresh_choice.setattr(isa, "cpu_flags", lambda: frozenset(flags))
    assert kernel_isa() == expected


def test_without_linuxs_flags_vnni_is_asked_of_torch_where_it_can_say(monkeypatch):
    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset())
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: True, raising=False)
    assert isa.has_vnni()
    monkeypatch.delattr(torch.cpu, "_is_vnni_supported")  # a torch without the private probe
    assert not isa.has_vnni()


def test_the_flags_are_read_from_cpuinfo(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_vnni\n\nprocessor\t: 1\n")
    monkeypatch.setattr(isa, "CPUINFO", cpuinfo)
    isa.cpu_flags.cache_clear()
    try:
        assert isa.cpu_flags() == {"fpu", "avx2", "avx512_vnni"}
        monkeypatch.setattr(isa, "CPUINFO", tmp_path / "absent")
        isa.cpu_flags.cache_clear()
        assert isa.cpu_flags() == frozenset()
    finally:
        monkeypatch.undo()
        isa.cpu_flags.cache_clear()
