"""Build an onnx-family variant: the graph (the user's, or the suite's export of the reference),
quantized by ONNX Runtime when asked (cached under ``results/.cache/onnx``), an ONNX Runtime
session standing in for the encoder (or the whole classifier module), checked against the model
before it is used."""

import copy
import os
import time
from pathlib import Path

from runs.io import file_sha256
from variants.families.onnx import ort_quant
from variants.onnx.check import check_graph
from variants.onnx.session import (OrtEncoder, OrtModule, batch_dependent, make_session,
                                    session_record)


def source_graph(reference, cfg, cache_dir):
    """Path of the fp32 graph ``cfg`` starts from: ``cfg.source``, or the suite's own ONNX export
    of ``reference``'s encoder (:func:`variants.onnx.graph.reference_graph`, cached)."""
    if cfg.source:
        return Path(cfg.source)
    from variants.onnx.graph import reference_graph

    return reference_graph(reference, cache_dir)


def graph_path(reference, cfg, fit=None, cache_dir=None):
    """Path of the graph a variant runs: the source graph, or ONNX Runtime's quantization of it
    (:mod:`variants.families.onnx.ort_quant`, cached by the source's SHA-256 and the settings)."""
    src = source_graph(reference, cfg, cache_dir)
    if cfg.quant == "none":
        return src
    return ort_quant.quantized(src, cfg, reference, fit, cache_dir)


def _session(path, cfg):
    return make_session(path, opt_level=cfg.opt_level)


def check_decision(decision, configs):
    """Raise ValueError unless each config's source graph loads in ONNX Runtime and fits
    ``decision`` (:func:`variants.onnx.check.check_graph`): before a sweep writes anything.
    The suite's own export is built from the model itself and checked when built."""
    seen = set()
    for cfg in configs:
        if cfg.source and (cfg.source, cfg.output) not in seen:
            seen.add((cfg.source, cfg.output))
            check_graph(_session(cfg.source, cfg), decision, cfg.output)


def standing_in(reference, session, kind, output, nbytes, record, per_row=False):
    """A copy of ``reference.module`` whose encoder is the session (``kind`` "encoder"), or the
    session as the whole module (``kind`` "module"); ``per_row``: one row per call."""
    if kind == "module":
        return OrtModule(session, output, nbytes, record, per_row)
    module = copy.copy(reference.module)  # the head's arrays shared, the encoder replaced
    module["encoder"] = OrtEncoder(session, output, nbytes, record, per_row)
    return module


def build(reference, cfg, fit=None, cache_dir=None):
    """(variant DecisionModel, build.json dict) for one :class:`~variants.families.onnx.family.
    OnnxConfig`. The dict: ``graph`` (path), ``graph_sha256``, ``source_sha256``, ``output``,
    ``stands_for`` ("encoder" / "module"), ``per_row`` (the batch-dependent ops that make each
    row run alone, :func:`variants.onnx.session.batch_dependent`; [] none), ``ort`` (:func:`variants.onnx.session.
    session_record`), ``ort_quant`` (or None), ``kernel``, ``model_bytes`` (the graph file's
    bytes plus the MLX head's), ``build_seconds``. Raises ValueError (one line) for a graph
    that does not fit the model or a missing ONNX Runtime."""
    from variants.runtime.memory import model_bytes

    t0 = time.perf_counter()
    path = graph_path(reference, cfg, fit, cache_dir)
    session = _session(path, cfg)
    kind, output = check_graph(session, reference, cfg.output)
    record = session_record(session, cfg.opt_level)
    nbytes = os.path.getsize(path)
    per_row = batch_dependent(path)  # dynamic quantization: rows run alone (session.py)
    variant = reference.replace_module(
        standing_in(reference, session, kind, output, nbytes, record, bool(per_row)))
    src = source_graph(reference, cfg, cache_dir)
    info = {"graph": str(path), "graph_sha256": file_sha256(path),
            "source": cfg.source or "the suite's fp32 export of the reference",
            "source_sha256": cfg.digest or file_sha256(src), "output": output, "stands_for": kind,
            "ort": record, "per_row": per_row, "ort_quant": ort_quant.record(cfg, reference) if cfg.quant != "none"
            else None, "kernel": f"onnxruntime-{record['onnxruntime']}-cpu",
            "graph_bytes": nbytes, "model_bytes": model_bytes(variant),
            # the plausibility alarm's ceiling (variants.sweep.plausible): int8 lanes do four
            # fp32 lanes' multiply-adds (as the w8a8 family's INT8_GAIN); fp32 the same work
            "ideal_speedup": 4.0 if cfg.quant != "none" else 1.0,
            "build_seconds": time.perf_counter() - t0}
    return variant, info
