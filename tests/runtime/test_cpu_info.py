"""The CPU a run measured on (variants/runtime/cpu.py): model name and ISA levels read from
/proc/cpuinfo, oneDNN's ISA and int8 scheme beside them, and the report's phrase for them."""

import builtins
import io

from runs.report import _cpu_text
from variants.runtime import cpu, int8_linear

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 7B13 64-Core Processor
flags\t\t: fpu sse2 avx fma avx2 bmi2
processor\t: 1
model name\t: AMD EPYC 7B13 64-Core Processor
flags\t\t: fpu sse2 avx fma avx2 bmi2 avx512f
"""


def test_model_and_isa_levels_from_cpuinfo(monkeypatch):
    real = builtins.open

    def fake(path, *a, **kw):
        return io.StringIO(CPUINFO) if path == "/proc/cpuinfo" else real(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", fake)
    info = cpu.cpu_info()
    # the first processor's lines (an AVX2-only Zen 3: no AVX-512, no VNNI, no AMX)
    assert info["model"] == "AMD EPYC 7B13 64-Core Processor"
    assert info["isa"] == ["AVX2", "FMA"]
    assert info["onednn_isa"] == int8_linear.cpu_isa()
    assert info["int8_scheme"] == int8_linear.scheme()


def test_this_machine_and_the_report_phrase():
    info = cpu.cpu_info()
    assert info["model"] and isinstance(info["isa"], list)
    assert _cpu_text(None) == "" and _cpu_text({}) == ""
    assert _cpu_text({"model": "X", "isa": ["AVX2", "FMA"], "onednn_isa": "avx2",
                      "int8_scheme": "u8s8-split7"}) == \
        "; CPU X (AVX2, FMA), oneDNN avx2, int8 u8s8-split7"
    assert _cpu_text({"model": "Y", "isa": [], "onednn_isa": None}) == "; CPU Y"
