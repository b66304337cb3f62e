"""The onnx family: a model served by ONNX Runtime, judged by the same contract. No MLX.

A variant is an ONNX graph run by ONNX Runtime on the very tokenized rows the reference reads
(:mod:`variants.onnx.session`): the user's file (``--onnx FILE``) or, without one, the suite's
own fp32 export of the reference (:mod:`variants.onnx.graph`), as it is (``--ort-quant none``)
or quantized by ONNX Runtime's own quantizers (``onnxruntime.quantization``): ``dynamic``
(``quantize_dynamic``: int8 weights, activations quantized per tensor at run time,
``MatMulInteger`` / ``DynamicQuantizeLinear``) or ``static`` (``quantize_static``: QDQ, int8
weights and activations with ranges from MinMax calibration on fit-split rows), per tensor or
per channel (``--ort-per-channel``). A token output (B, L, D) replaces the encoder and goes
through the model's own readout; an output shaped as the decision module's (its logits
(B, K), or a choice model's text embedding) replaces the whole module (:mod:`variants.onnx.check`).
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

from variants.families.family import BuildInputs, Family

QUANTS = ("none", "dynamic", "static")
PER_CHANNEL_CHOICES = ("off", "on")
OPT_LEVELS = ("disable", "basic", "extended", "all")
_SUFFIX = {"none": "fp32", "dynamic": "dyn", "static": "static"}


def file_digest(path):
    """SHA-256 (hex) of the file at ``path``; ValueError naming ``--onnx`` when unreadable."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"--onnx {path}: no such file; pass the path of an .onnx model file")
    if not p.is_file():
        raise ValueError(f"--onnx {path} is not a file (a folder?); pass the path of the .onnx "
                         "model file itself")
    from runs.io import file_sha256

    return file_sha256(p)


@dataclass(frozen=True)
class OnnxConfig:
    """One ONNX Runtime variant.

    ``source``: the ONNX file ("" = the suite's own fp32 export of the reference); ``digest``:
    its SHA-256 (names the variant, so an edited file is a new variant); ``quant``: one of
    :data:`QUANTS`; ``per_channel``: ONNX Runtime's per-channel weight scales (quantized only);
    ``output``: the graph output read (None: ``last_hidden_state`` / ``logits`` / the only
    one); ``opt_level``: ONNX Runtime's graph optimisation level; ``calib_rows``: fit-split
    rows for static calibration."""

    source: str = ""
    digest: str = ""
    quant: str = "none"
    per_channel: bool = False
    output: str | None = None
    opt_level: str = "all"
    calib_rows: int = 128

    def __post_init__(self):
        if self.quant not in QUANTS:
            raise ValueError(f"--ort-quant {self.quant!r} is not one of {', '.join(QUANTS)}")
        if self.opt_level not in OPT_LEVELS:
            raise ValueError(f"--ort-opt-level {self.opt_level!r} is not one of "
                             f"{', '.join(OPT_LEVELS)}")
        if int(self.calib_rows) < 1:
            raise ValueError(f"--ort-calib-rows {self.calib_rows} must be >= 1; pass e.g. 128")

    @property
    def name(self):
        src = ""
        if self.source:
            stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(self.source).stem)[:40] or "model"
            src = f"-{stem}-{self.digest[:6]}"
        out = ""
        if self.output is not None:
            out = "-out-" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", self.output)[:30] or "x")
        return (f"onnx{src}-{_SUFFIX[self.quant]}"
                + ("-pc" if self.per_channel and self.quant != "none" else "")
                + ("" if self.calib_rows == 128 or self.quant != "static"
                   else f"-cal{self.calib_rows}")
                + ("" if self.opt_level == "all" else f"-opt{self.opt_level}") + out)


PARAMS = ("onnx", "ort_quant", "ort_per_channel", "onnx_output", "ort_opt_level",
          "ort_calib_rows")


def add_arguments(parser):
    """This family's ``variants sweep`` flags (dests are PARAMS)."""
    g = parser.add_argument_group("onnx family (--family onnx; needs pip install "
                                  "'mlx-variants[onnx]')")
    g.add_argument("--onnx", default=None, metavar="FILE",
                   help="the ONNX model to judge, run by ONNX Runtime on the reference's own "
                        "tokenized rows; inputs input_ids / attention_mask / token_type_ids, "
                        "output the encoder's tokens (batch, tokens, hidden: read through the "
                        "model's pooling and head) or the decision module's output (the logits, or a choice model's embedding) "
                        "(default: the suite's own fp32 ONNX export of the reference)")
    g.add_argument("--ort-quant", nargs="+", choices=QUANTS, default=None, metavar="Q",
                   help="none (the graph as it is), dynamic (onnxruntime.quantization."
                        "quantize_dynamic: int8 weights, activations quantized at run time) "
                        "and/or static (quantize_static: QDQ, ranges calibrated on fit-split "
                        "rows); one variant each (default: none)")
    g.add_argument("--ort-per-channel", nargs="+", choices=PER_CHANNEL_CHOICES, default=None,
                   metavar="PC", help="per-tensor (off) and/or per-channel (on) weight scales of "
                                      "the quantized variants (default: off on)")
    g.add_argument("--onnx-output", default=None, metavar="NAME",
                   help="the graph output to read (default: last_hidden_state, else logits, "
                        "else its only output)")
    g.add_argument("--ort-opt-level", choices=OPT_LEVELS, default="all",
                   help="ONNX Runtime's graph optimisation level (default: all)")
    g.add_argument("--ort-calib-rows", type=int, default=128, metavar="N",
                   help="fit-split rows for static quantization's MinMax calibration "
                        "(default: 128)")


def ladder(*, onnx=None, ort_quant=None, ort_per_channel=None, onnx_output=None,
           ort_opt_level="all", ort_calib_rows=128):
    """One OnnxConfig per --ort-quant (and per --ort-per-channel for quantized ones)."""
    source, digest = "", ""
    if onnx is not None:
        source, digest = os.path.abspath(onnx), file_digest(onnx)
    pcs = [p == "on" for p in dict.fromkeys(ort_per_channel or PER_CHANNEL_CHOICES)]
    out = []
    for q in dict.fromkeys(ort_quant or ["none"]):
        for pc in ([False] if q == "none" else pcs):
            out.append(OnnxConfig(source, digest, q, pc, onnx_output, ort_opt_level,
                                  int(ort_calib_rows)))
    return out


def run_name(*, onnx=None, ort_quant=None, **_):
    """Default run-folder suffix."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(onnx).stem)[:40] if onnx else "export"
    return f"onnx-{stem}-" + "-".join(_SUFFIX[q] for q in dict.fromkeys(ort_quant or ["none"]))


def build(reference, config, inputs=BuildInputs(), mode="simulated"):
    """The family's build: :func:`variants.families.onnx.build.build`."""
    from variants.families.onnx import build as onnx_build

    return onnx_build.build(reference, config, fit=inputs.fit, cache_dir=inputs.cache_dir)


def check_decision(decision, configs):
    """Raise ValueError (one line) unless ONNX Runtime is installed and each config's graph
    fits ``decision`` (:func:`variants.onnx.check.check_graph`), before anything is written."""
    from variants.families.onnx import build as onnx_build

    onnx_build.check_decision(decision, configs)


def describe(info, timing=None):
    """Markdown: the runtime and its settings, the graph, ONNX Runtime's quantization."""
    ort = info.get("ort") or {}
    lines = [f"- ONNX Runtime {ort.get('onnxruntime')} ({', '.join(ort.get('providers', []))}), "
             f"graph optimisation {ort.get('graph_optimization_level')}, "
             f"{ort.get('intra_op_num_threads')} intra-op threads",
             f"- graph: {info.get('graph')} ({info.get('model_bytes', 0) / 1e6:.1f} MB, sha256 "
             f"{str(info.get('graph_sha256'))[:12]}); output {info.get('output')!r} stands for "
             + ("the encoder (the model's pooling and head run in MLX)"
                if info.get("stands_for") == "encoder" else "the whole decision module (its head included)")]
    if info.get("per_row"):
        lines.append(f"- one row per call, padding cut ({', '.join(info['per_row'])} picks one "
                     "activation scale per tensor, so batched rows would change each other's "
                     "logits; judged and timed as a server running each request alone)")
    q = info.get("ort_quant")
    if q:
        lines.append(f"- quantized by onnxruntime.quantization.{q['function']} "
                     f"({'per channel' if q['per_channel'] else 'per tensor'}, weights "
                     f"{q['weight_type']}"
                     + (f", activations {q['activation_type']}, {q['calib_rows']} fit-split "
                        "calibration rows" if q.get("calib_rows") else "") + ")")
        if q.get("cpu_int8"):
            lines.append(f"- int8 on this CPU: {q['cpu_int8']}")
    return "\n".join(lines) + "\n"


FAMILY = Family(name="onnx", config=OnnxConfig, params=PARAMS, add_arguments=add_arguments,
                ladder=ladder, run_name=run_name, build=build, describe=describe,
                inputs=("fit", "cache_dir"), check_decision=check_decision)
