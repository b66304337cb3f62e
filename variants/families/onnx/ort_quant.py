"""ONNX Runtime's own quantizers on an fp32 graph (``onnxruntime.quantization``), as variants.

- ``dynamic``: ``quantize_dynamic`` with its defaults but ``per_channel``: int8 (QInt8) weights
  of MatMul / Gather / Attention nodes, activations quantized per tensor at run time
  (``DynamicQuantizeLinear`` + ``MatMulInteger``); what teams ship as "ORT int8".
- ``static``: ``quantize_static``, QDQ format, int8 weights and activations, MinMax ranges from
  ``calib_rows`` fit-split rows fed as the reference tokenizes them (batches of
  :data:`CALIB_BATCH`).

The quantized graph is written once under ``<cache>/onnx/`` keyed by the source graph's
SHA-256, the settings, the onnxruntime version and (static) the calibration rows' ids, and
reused. On x86 CPUs without VNNI, ONNX Runtime's u8 x s8 GEMMs may saturate 16-bit pair sums
(its documentation's reason for ``reduce_range``): the verdict of a quantized graph is the
verdict on this CPU, whose int8 ISA the record names.
"""

import hashlib
import json
import logging

import numpy as np

from runs.io import file_sha256
from variants.onnx.graph import cached_graph
from variants.onnx.session import feeds, make_session, ort

#: rows per calibration batch of static quantization
CALIB_BATCH = 16


def _key(src, cfg, fit):
    h = hashlib.sha256(file_sha256(src).encode())
    parts = {"quant": cfg.quant, "per_channel": cfg.per_channel, "ort": ort().__version__}
    if cfg.quant == "static":
        parts.update(calib_rows=cfg.calib_rows,
                     rows=list(map(str, calibration_rows(fit, cfg.calib_rows).ids)))
    h.update(json.dumps(parts, sort_keys=True).encode())
    return h.hexdigest()[:20]


def calibration_rows(fit, n):
    """The first ``n`` rows of the fit split (a TaskSet); ValueError without a fit split."""
    if fit is None or len(fit) == 0:
        raise ValueError("--ort-quant static needs fit-split rows to calibrate on; pass "
                         "--n-fit N (N >= 1)")
    if int(n) > len(fit):
        raise ValueError(f"--ort-calib-rows {n} exceeds the fit split's {len(fit)} rows; pass "
                         f"--ort-calib-rows {len(fit)} or fewer, or a larger --n-fit")
    return fit.subset(np.arange(int(n)))


class _Reader:
    """``onnxruntime.quantization.CalibrationDataReader``: the calibration rows' feeds."""

    def __init__(self, session, reference, rows):
        batches, _ = reference.prepare(rows, batch_size=CALIB_BATCH)
        self._feeds = iter([feeds(session, b.input_ids, b.attention_mask, b.token_type_ids)
                            for b in batches])

    def get_next(self):
        return next(self._feeds, None)


def quantized(src, cfg, reference, fit=None, cache_dir=None):
    """Path of ONNX Runtime's quantization of the graph at ``src`` for ``cfg``, written (atomically)
    under ``cache_dir/onnx`` when it is not there yet (a temporary folder without a cache)."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_dynamic, quantize_static

    def write(tmp):
        # its "consider pre-processing" advice goes to the root logger, multi-line: not ours
        logging.disable(logging.WARNING)
        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level  # it may configure the root logger
        try:
            if cfg.quant == "dynamic":
                quantize_dynamic(str(src), str(tmp), per_channel=cfg.per_channel)
            else:
                reader = type("Reader", (_Reader, CalibrationDataReader), {})(
                    make_session(src), reference, calibration_rows(fit, cfg.calib_rows))
                quantize_static(str(src), str(tmp), reader, per_channel=cfg.per_channel)
        finally:
            logging.disable(logging.NOTSET)
            root.handlers[:], root.level = handlers, level
            for extra in tmp.parent.glob(tmp.stem + "*"):  # its augmented-model leftovers
                if extra != tmp:
                    extra.unlink(missing_ok=True)

    return cached_graph(cache_dir, f"ortq-{_key(src, cfg, fit)}.onnx", write)

def record(cfg, reference=None):
    """build.json's ``ort_quant``: the function, per-channel, weight / activation types, the
    calibration rows (static) and this CPU's int8 instructions (VNNI / AMX, or none: ONNX
    Runtime's u8 x s8 kernels may saturate there)."""
    from variants.runtime.cpu import _cpuinfo

    _, flags = _cpuinfo()
    int8 = [n for f, n in (("avx512_vnni", "AVX-512 VNNI"), ("avx_vnni", "AVX-VNNI"),
                           ("amx_int8", "AMX-INT8")) if f in flags]
    out = {"function": f"quantize_{cfg.quant}", "per_channel": bool(cfg.per_channel),
           "weight_type": "QInt8",
           "activation_type": "QInt8" if cfg.quant == "static" else "QUInt8 (dynamic)",
           "calib_rows": int(cfg.calib_rows) if cfg.quant == "static" else None,
           "cpu_int8": ", ".join(int8) if int8 else
           "no VNNI / AMX: u8 x s8 pair sums may saturate (ONNX Runtime's reduce_range note)"}
    return out
