"""The engines per machine (mlmkit/runtime/engines.py): the CPU's flags, read and forced."""

from __future__ import annotations

import pytest

from mlmkit.errors import ConfigError
from mlmkit.runtime.engines import cpu_feature, cpu_flags

NO_BF16 = "-amx_bf16,-avx512_bf16"


def test_cpu_flags_are_read_and_forced(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16\n")
    monkeypatch.delenv("MLMKIT_CPU_FLAGS", raising=False)
    assert {"avx512_vnni", "avx512_bf16"} <= cpu_flags(info)
    assert (cpu_feature("int8", cpu_flags(info)) == "AVX512-VNNI" and cpu_feature("bf16", cpu_flags(info))
            == "AVX512-BF16")
    info.write_text("flags\t: fpu avx2 avx512_vnni amx_tile amx_int8 amx_bf16 avx512_bf16\n")
    # the fastest
    assert cpu_feature("int8", cpu_flags(info)) == "AMX-INT8" and cpu_feature("bf16",
                                                                              cpu_flags(info)) == "AMX-BF16"
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", NO_BF16)
    assert cpu_feature("bf16", cpu_flags(info)) is None and cpu_feature("int8", cpu_flags(info)) == "AMX-INT8"
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", "+avx512_bf16")
    assert cpu_feature("bf16", cpu_flags(tmp_path / "missing")) == "AVX512-BF16"  # not Linux, forced on
    monkeypatch.delenv("MLMKIT_CPU_FLAGS")
    assert cpu_flags(tmp_path / "missing") == frozenset()
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", "amx_bf16")
    with pytest.raises(ConfigError, match=r"MLMKIT_CPU_FLAGS: 'amx_bf16' is not \+FLAG or -FLAG"):
        cpu_flags(info)
