"""The search's dimensions beyond per-unit widths: the quantizer (``--quant-method``) and W8A8
Linears (``--w8a8``).

- **Quantizer.** A candidate is a per-unit map plus one method for the whole model (``rtn``,
  ``awq``, ``gptq``, ``dwq``: :mod:`variants.families.quant.learned`); the strategy is walked
  once per method given, on round-to-nearest's sensitivity table, and the cheapest passing
  candidate over all methods wins. With ``--method-sensitivity`` AWQ's and GPTQ's walks read
  their own table instead (:func:`method_sensitivity`: each encoder Linear quantized alone by
  that method, as its build learns it; the embedding tables and any other unit keep
  round-to-nearest's rows, as the build keeps them round-to-nearest): a threshold rule compares
  units' KL divergences with each other, and a learned method lowers the Linears' KL (GPTQ about
  threefold on MiniLM) but not the embedding tables'. Not the default: on minilm-sentiment its
  GPTQ walk ended at a costlier winner than the walk on round-to-nearest's table (24.85 MB
  against 23.40 MB), its cheaper maps failing bound clauses (accuracy drop, ECE) at 800 rows. The winner re-runs as a sweep variant with ``--bits``,
  ``--bits-map`` and ``--quant-method``. Learned methods build each candidate from the fit
  split the head was fitted on (never the search, calibration or eval rows), cached by the
  full map; ``dwq`` trains per candidate (minutes each on 2 cores).
- **W8A8 Linears.** With ``--w8a8`` each Linear unit may also be ``"int8"``
  (:class:`variants.runtime.int8_linear.Int8Linear`): int8 weights per output channel and per-token
  int8 activations on oneDNN's integer GEMM. Its sensitivity is measured like a width's (that
  Linear alone in W8A8, the rest fp32: KL to the reference), its cost by the same cost table
  (:mod:`variants.search.costs`: stored bytes, the ``int8_linear`` op's time in the latency
  model). Embedding tables cannot be int8: a strategy's ``int8`` there becomes 8 bits.
  The options a unit may take are ordered by their cost on this model (all Linears at that
  option; ties by stored bytes), and an option is dropped when a cheaper one is more accurate
  (W8A8 ranked just below 8 bits), so "raising" a unit means paying more for more accuracy, as
  the strategies expect: under ``bytes`` the options are 4, 6, int8, 8; under ``--cost
  latency-b32`` on this CPU int8 is the fastest and 4 and 6 bits are slower than 8, so they are
  int8 and 8. A winner with int8 units re-runs as a sweep variant with
  ``--int8-layers`` (:mod:`variants.families.quant.int8`).
"""

import json
import re
from pathlib import Path

import numpy as np

from variants.search.costs import INT8

VERSION = 1


#: accuracy order of the options, least accurate first: W8A8 (int8 weights per channel, but
#: int8 activations too) is placed just below weight-only 8 bits
def _rank(o):
    return 7.5 if o == INT8 else float(o)


def mode_rank(costs, mode, layers):
    """A microscaling mode's place in :func:`_rank`'s order: the affine width its round trip
    matches in relative squared weight error summed over ``layers`` (measured by the cost
    table), interpolated in log error between the two widths around it (below the narrowest:
    that width minus 0.5; above the widest: plus 0.5)."""
    import math

    def err(o):
        return sum(costs.error[p, o] for p in layers)
    widths = sorted(b for b in {b for _, b in costs.error} if not isinstance(b, str))
    e = math.log(err(mode))
    pts = [(b, math.log(err(b))) for b in widths]  # error falls as the width grows
    if not pts:
        return 0.0
    if e >= pts[0][1]:
        return pts[0][0] - 0.5
    if e <= pts[-1][1]:
        return pts[-1][0] + 0.5
    for (b0, e0), (b1, e1) in zip(pts, pts[1:]):
        if e1 <= e <= e0:
            return b0 + (b1 - b0) * (e0 - e) / (e0 - e1 or 1.0)
    return 0.0


def options(costs, cost, bits, w8a8, layers, modes=()):
    """The per-unit options, cheapest first, each more accurate than the one before: ``bits``
    plus ``"int8"`` when ``w8a8`` plus the microscaling ``modes`` (without either: ``bits`` as
    given), ordered by the cost of
    every Linear at that option (ties by stored bytes), then an option dropped when a cheaper
    (or equally priced) one is more accurate (:func:`_rank`; a mode by :func:`mode_rank`): it
    could only lose. Under ``latency-b32`` on this CPU 4 and 6
    bits run slower than 8 (their unpacking), so a latency search has int8 and 8 only.
    ``costs``: a :class:`~variants.search.costs.CostTable` (latency loaded when ``cost`` is a
    latency); ``layers``: the Linear units (the options are priced on them)."""
    opts = [int(b) for b in bits] + ([INT8] if w8a8 else []) + list(modes)
    if not (w8a8 or modes) or not layers:  # the widths as given (a search without --w8a8)
        return [int(b) for b in bits]
    ranks = {o: (mode_rank(costs, o, layers) if o in modes else _rank(o)) for o in opts}

    def key(o):
        m = {p: o for p in layers}
        return (costs.of(cost, m), costs.model_bytes(m), ranks[o])
    chain = []
    for o in sorted(opts, key=key):
        if chain and key(chain[-1])[:2] == key(o)[:2] and ranks[o] > ranks[chain[-1]]:
            chain.pop()  # the same price, more accurate: it replaces the one before
        if not chain or ranks[o] > max(ranks[c] for c in chain):
            chain.append(o)
    return chain


def sanitise(layer_bits, lookup):
    """``layer_bits`` with ``"int8"`` on an embedding unit (``lookup``) replaced by 8 bits."""
    return {p: (8 if b == INT8 and p in lookup else b) for p, b in layer_bits.items()}


def int8_pattern(paths):
    """An exact-path regex matching ``paths`` only ("" for none): ``--int8-layers``."""
    return "^(?:" + "|".join(re.escape(p) for p in paths) + ")$" if paths else ""


def int8_sensitivity(reference, taskset, paths, cache_dir=None, batch_size=32, log=None):
    """``{(path, "int8"): kl_mean}``: each Linear of ``paths`` alone as a simulated
    :class:`~variants.runtime.int8_linear.Int8Linear` (the others fp32), mean KL divergence of the
    reference's logits to the variant's on ``taskset`` (as :mod:`variants.search.sensitivity` does
    for a width). Cached as JSON under ``cache_dir/search/`` by weights, split and paths."""
    import copy

    from variants.arch import activations
    from variants.runtime.int8_linear import Int8Linear
    from variants.search.sensitivity import _compare

    path = None
    if cache_dir is not None:
        key = reference.cache_key(activations.module_fingerprint(reference.module),
                                  taskset.fingerprint(), list(paths), "int8-sensitivity",
                                  VERSION)
        path = Path(cache_dir) / "search" / f"int8-sensitivity-{key}.json"
        if path.exists():
            try:
                return {(p, INT8): float(v) for p, v in json.loads(path.read_text()).items()}
            except (OSError, ValueError):
                pass
    work = reference.replace_module(copy.deepcopy(reference.module))
    batches, _ = work.prepare(taskset, batch_size)
    ref = work.raw_logits(taskset, batches).astype(np.float64)
    mask = np.asarray(taskset.option_mask, bool)
    mods = dict(work.module.named_modules())
    out = {}
    from tqdm import tqdm

    for p in tqdm(paths, desc="int8 sensitivity", unit="layer", leave=False, disable=None):
        lin = mods[p]
        activations.set_module(work.module, p, Int8Linear(lin, native=False))
        work._reset_caches()
        out[p] = _compare(ref, work.raw_logits(taskset, batches), mask)[1]
        activations.set_module(work.module, p, lin)
        work._reset_caches()
    if path is not None:
        from runs.io import write_json

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, out)
    if log:
        log(f"int8 sensitivity: {len(out)} Linears measured")
    return {(p, INT8): v for p, v in out.items()}


def method_sensitivity(state, method, taskset, units, opts, log=None):
    """``{(path, bits): kl_mean}`` of ``method`` (``awq``, ``gptq``) for the encoder Linears
    among ``units``: each quantized alone by the method (learned on the fit split the head was
    fitted on, through the per-layer cache) on ``taskset`` (the search's sensitivity rows),
    :func:`variants.search.sensitivity.measure` with the method's round trip; {} for a method
    without per-Linear learning (``rtn``, ``dwq``) or no fit rows. Cached as CSV under
    ``cache_dir/sensitivity/<model>-<method>-<key>.csv``, the key over the reference's weights,
    the rows, widths, group size, Linears, the method, its settings and the fit split."""
    if method not in ("awq", "gptq"):
        return {}
    import pandas as pd

    from variants.arch.activations import module_fingerprint, target_linears
    from variants.families.quant import learned
    from variants.search import sensitivity

    fit = state["tasksets"].get("fit")
    if fit is None or len(fit) == 0:
        return {}
    reference = state["reference"]
    cache = Path(opts.results_dir) / ".cache"
    linears = [p for p in target_linears(reference.module) if p in set(units)]
    if not linears:
        return {}
    key = reference.cache_key(module_fingerprint(reference.module), taskset.fingerprint(),
                              sorted(int(b) for b in opts.bits), int(opts.group_size), linears,
                              method, learned.SETTINGS[method], fit.fingerprint(),
                              learned.VERSION, "method-sensitivity", VERSION)
    path = cache / "sensitivity" / f"{reference.name}-{method}-{key}.csv"
    frame = None
    if path.exists():
        try:
            frame = pd.read_csv(path)
        except (OSError, ValueError):
            frame = None
    if frame is None or list(frame.columns) != sensitivity.COLUMNS or not len(frame):
        weight = learned.round_trip(reference, method, fit, cache, log)
        frame = sensitivity.measure(reference, taskset, bits=opts.bits,
                                    group_size=opts.group_size, paths=linears,
                                    round_trip=weight)
        from runs.io import write_csv

        path.parent.mkdir(parents=True, exist_ok=True)
        write_csv(path, frame)
        if log:
            log(f"{method} sensitivity cached in {path}")
    return {(r.layer, int(r.bits)): float(r.kl_mean) for r in frame.itertuples()}
