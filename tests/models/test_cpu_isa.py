"""The instruction-set choice (`hf_vit_plus.models.cpu_isa`): the CPU's widest level, the cap of
`HF_VIT_PLUS_CPU_ISA`, one clear error for a cap the CPU cannot meet, and the variables that cap the other
libraries at the same level."""

from __future__ import annotations

import pytest

from hf_vit_plus.models import cpu_isa


def test_widest_level_follows_the_flags(monkeypatch):
    monkeypatch.setattr(cpu_isa, "is_x86", lambda: True)
    for flags, expected in [
        ({"sse4_2"}, "generic"),
        ({"avx2", "fma"}, "avx2"),
        ({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}, "avx512"),
        ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}, "generic"),  # no FMA: not even AVX2
    ]:
        monkeypatch.setattr(cpu_isa, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert cpu_isa.supported_isa() == expected
    monkeypatch.setattr(cpu_isa, "is_x86", lambda: False)
    assert cpu_isa.supported_isa() == "generic"


def test_cap(monkeypatch):
    monkeypatch.setattr(cpu_isa, "is_x86", lambda: True)
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.delenv(cpu_isa.ISA_ENV, raising=False)
    assert cpu_isa.cpu_isa() == "avx2" and cpu_isa.isa_label() == "avx2"
    monkeypatch.setenv(cpu_isa.ISA_ENV, "GENERIC")
    assert cpu_isa.cpu_isa() == "generic"
    monkeypatch.setenv(cpu_isa.ISA_ENV, "avx512")
    with pytest.raises(ValueError, match="avx512.*more than this CPU has.*'avx2'"):
        cpu_isa.cpu_isa()
    monkeypatch.setenv(cpu_isa.ISA_ENV, "sse9")
    with pytest.raises(ValueError, match="'sse9'.*generic, avx2, avx512"):
        cpu_isa.cpu_isa()


def test_label_names_vnni(monkeypatch):
    monkeypatch.setattr(cpu_isa, "is_x86", lambda: True)
    wide = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset(wide | {"avx512_vnni"}))
    assert cpu_isa.isa_label("avx512") == "avx512_vnni" and cpu_isa.isa_label("avx2") == "avx2"
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset(wide))
    assert cpu_isa.isa_label("avx512") == "avx512"
    # AVX512-BF16 (torch's and oneDNN's bfloat16 kernels) is wider than VNNI
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset(wide | {"avx512_vnni", "avx512_bf16"}))
    assert cpu_isa.isa_label("avx512") == "avx512_bf16" and cpu_isa.isa_label("avx2") == "avx2"
    # AMX tiles (oneDNN's, at the AVX-512 level) are the widest where the CPU has them; a cap at AVX2 leaves them
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset(wide | {"avx512_vnni", "amx_tile", "amx_int8"}))
    assert cpu_isa.isa_label("avx512") == "amx_tile" and cpu_isa.isa_label("avx2") == "avx2"


def test_capped_environment_caps_every_library(monkeypatch):
    monkeypatch.setattr(cpu_isa, "is_x86", lambda: True)
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    env = cpu_isa.capped_environment("avx2", {"PATH": "/bin"})
    assert env["PATH"] == "/bin" and env[cpu_isa.ISA_ENV] == "avx2"
    assert env["CT2_FORCE_CPU_ISA"] == "AVX2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert env["FBGEMM_ENABLE_INSTRUCTIONS"] == "AVX2"
    with pytest.raises(ValueError, match="more than this CPU has"):
        cpu_isa.capped_environment("avx512")


def test_capped_and_described(monkeypatch):
    """A cap below the CPU's widest is a capped run (the line names the cap and the CPU's widest); the CPU's own
    level is not, and FBGEMM is capped with the others (AVX2 is its narrowest)."""
    monkeypatch.setattr(cpu_isa, "is_x86", lambda: True)
    wide = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset(wide))
    monkeypatch.delenv(cpu_isa.ISA_ENV, raising=False)
    assert not cpu_isa.isa_capped() and cpu_isa.describe_isa() == "avx512 (avx512_vnni), the CPU's widest"
    monkeypatch.setenv(cpu_isa.ISA_ENV, "avx2")
    assert cpu_isa.isa_capped() and not cpu_isa.isa_capped("avx512")
    assert cpu_isa.describe_isa() == (
        "avx2 (avx2), capped by HF_VIT_PLUS_CPU_ISA=avx2; the CPU's widest is avx512 (avx512_vnni)"
    )
    assert cpu_isa.capped_environment("generic", {})["FBGEMM_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert cpu_isa.capped_environment("avx512", {})["FBGEMM_ENABLE_INSTRUCTIONS"] == "AVX512_E1"


def test_fast_int8_products_honour_the_cap(monkeypatch):
    """`compat.cpu_has_fast_int8_products` reads the CPU's flags, and a cap below them (which caps oneDNN too)."""
    from hf_vit_plus.models import compat

    monkeypatch.setattr(cpu_isa, "is_x86", lambda: True)
    wide = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset(wide))
    monkeypatch.setattr(compat, "_cpu_flags", lambda: frozenset(wide))
    monkeypatch.delenv(cpu_isa.ISA_ENV, raising=False)
    assert compat.cpu_has_fast_int8_products()
    monkeypatch.setenv(cpu_isa.ISA_ENV, "avx2")
    assert not compat.cpu_has_fast_int8_products()
    monkeypatch.setattr(compat, "_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.delenv(cpu_isa.ISA_ENV)
    assert not compat.cpu_has_fast_int8_products()


def test_a_cpu_runs_first_lines_name_the_instruction_set(monkeypatch):
    """A training run on the CPU says which instruction set its kernels run at; a bad cap is a usage error (one
    line), not a traceback."""
    from hf_vit_plus.errors import UsageError
    from hf_vit_plus.training.plan import cpu_kernels_line

    monkeypatch.delenv(cpu_isa.ISA_ENV, raising=False)
    assert cpu_kernels_line() == f"CPU kernels: instruction set {cpu_isa.describe_isa()}"
    monkeypatch.setenv(cpu_isa.ISA_ENV, "sse9")
    with pytest.raises(UsageError, match="'sse9' is not an instruction set level"):
        cpu_kernels_line()
