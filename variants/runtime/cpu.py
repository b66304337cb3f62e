"""The CPU a run measured on: its model name and the vector ISA levels that change which kernels
run (AVX2, AVX-512, VNNI, AMX), and what oneDNN's int8 GEMMs do there. Recorded in run.json
(``cpu``) and named in the report, so every verdict and speed figure says where it was measured.
"""

import platform

#: the /proc/cpuinfo flags named in records, in the report's order: (flag, name)
FLAGS = (("avx2", "AVX2"), ("fma", "FMA"), ("avx512f", "AVX-512"), ("avx512_vnni", "AVX-512 VNNI"),
         ("avx_vnni", "AVX-VNNI"), ("amx_int8", "AMX-INT8"))


def _cpuinfo():
    """(model name, set of flags) from /proc/cpuinfo; (platform.processor(), empty set)
    elsewhere or when it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return platform.processor() or platform.machine(), set()
    model, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model or platform.machine(), flags


def cpu_info():
    """{"model": str, "isa": [names of :data:`FLAGS` present], "onednn_isa": str or None,
    "int8_scheme": str or None} of this machine (the last two from
    :mod:`variants.runtime.int8_linear`: oneDNN's effective ISA, which ``ONEDNN_MAX_CPU_ISA``
    caps, and how its int8 GEMMs are exact; None without the compiled int8 ops)."""
    from variants.runtime import int8_linear

    model, flags = _cpuinfo()
    return {"model": model, "isa": [name for flag, name in FLAGS if flag in flags],
            "onednn_isa": int8_linear.cpu_isa(), "int8_scheme": int8_linear.scheme()}
