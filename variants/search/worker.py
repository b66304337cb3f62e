"""Candidate evaluation in the executor shape: ``init_worker(payload) -> state`` once per
worker, ``evaluate_candidate(state, spec) -> result`` per candidate, both module-level and
importable (a process or Ray executor pickles only the payload, the spec and the result, all
plain dicts / numpy arrays).

A worker loads what it needs itself from paths and settings: the checkpoint, the data splits
and the search split (:mod:`variants.search.split`), the reference's fitted head and its outputs
on both search parts (``results/.cache``; the driver computes them first, so a worker only
reads). A candidate is built with the quant family's own builder (simulated mode, as the
sweep's quality pass), run on the whole search-calibration part, then on the search-eval part
chunk by chunk, stopping when :func:`variants.search.sequential.settled_failures` finds a
clause failing whatever the unseen rows hold.
"""

import time

import numpy as np

from runs.npz_readers import OUTPUT_FIELDS
from variants.search.split import PARTS


def _fields(out):
    return {k: np.asarray(getattr(out, k)) for k in OUTPUT_FIELDS}


def concat(parts):
    """Concatenate the row-wise fields of several outputs dicts (in order)."""
    return {k: np.concatenate([p[k] for p in parts]) for k in OUTPUT_FIELDS}


def chunks(n, size):
    """Row ranges ``[(0, size), (size, 2 size), ...]`` covering ``n`` rows."""
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def init_worker(payload):
    """The worker's state from ``payload`` (plain data: ``sweep`` = SweepConfig keyword
    arguments, ``n_search``, ``chunk_size``, ``group_size``, ``search_margin``): :func:`load` then
    :func:`prepare_reference`."""
    return prepare_reference(load(payload), payload)


def load(payload):
    """Inputs only, nothing written: the validated SweepConfig, contract, checkpoint, the
    data splits and the search parts (:func:`variants.search.split.search_tasksets`), the
    judge's settings. Raises SweepError / ValueError on bad input."""
    from runs.settings import resolve_settings
    from variants.runtime import device
    from variants.search.margin import tighten
    from variants.search.split import search_tasksets
    from variants.sweep.config import SweepConfig
    from variants.sweep.inputs import load_inputs

    cfg = SweepConfig(**payload["sweep"]).validate()
    device.use(cfg.device or device.requested(), cfg.dtype)
    contract, checkpoint, tasksets = load_inputs(cfg)
    from variants.models.head_output import require_softmax

    require_softmax(cfg.resolve_model(), "variants search orders layers and candidates by "
                    "per-layer sensitivity, the KL between softmaxes of the raw logits "
                    "(variants/search/sensitivity.py)",
                    "sweep fixed settings instead (variants sweep --family quant --bits 8, or "
                    "lowrank, prune, w8a8), each judged by the head's own contract")
    contract = tighten(contract, payload.get("search_margin", 0.0))  # the search split's
    if payload.get("select", "value") == "bound":
        from variants.search.bounds import bounded

        contract = bounded(contract)
    source = cfg.resolve_model()
    parts = search_tasksets(cfg, source, payload["n_search"])
    settings = resolve_settings(contract, near_tie_margin=cfg.near_tie_margin)
    return {"cfg": cfg, "contract": contract, "settings": settings, "source": source,
            "checkpoint": checkpoint, "tasksets": tasksets, "parts": parts,
            "group_size": payload["group_size"],
            "quantize_embeddings": payload.get("quantize_embeddings", False),
            "quantize_head": payload.get("quantize_head", False),
            "scale_dtype": payload.get("scale_dtype", "float32"),
            "embedding_texts": payload.get("embedding_texts", "")}


def prepare_reference(state, payload):
    """Add the fitted reference (head cache), the chunked search-eval sets and their prepared
    batches, and the reference's outputs on both search parts (computed or read from
    ``results/.cache/reference/<model>-search-*-<key>.npz``) to ``state``; returns it."""
    from pathlib import Path

    from runs.outputs import DecisionOutputs
    from variants.models.decision import prepared_digest
    from variants.models import fitted_reference, fitted_state
    from variants.sweep.inputs import cache_parts

    cfg, parts, checkpoint = state["cfg"], state["parts"], state["checkpoint"]
    cache = Path(cfg.results_dir) / ".cache"
    reference, _ = fitted_reference(state["source"], checkpoint, state["tasksets"], cache,
                                    log=lambda m: None, extra_key=cache_parts(cfg))
    fitted_state.check_same_head(reference, payload.get("reference_sha256"), "search")
    ev = parts["search-eval"]
    spans = chunks(len(ev), payload["chunk_size"])
    sets = {"search-calibration": [parts["search-calibration"]],
            "search-eval": [ev.subset(np.arange(a, b)) for a, b in spans]}
    batches = {k: [reference.prepare(ts, cfg.batch_size)[0] for ts in v] for k, v in sets.items()}
    ref = {}
    for part in PARTS:
        key = reference.cache_key(checkpoint.sha256, cfg.dtype, parts[part].fingerprint(),
                                  [prepared_digest(b) for b in batches[part]],
                                  payload["chunk_size"], *cache_parts(cfg))
        path = cache / "reference" / f"{cfg.model}-{part}-{key}.npz"
        if path.exists():
            ref[part] = _fields(DecisionOutputs.load(path, "reference outputs cache file"))
        else:
            outs = [_fields(reference.outputs(ts, b)) for ts, b in zip(sets[part], batches[part])]
            ref[part] = concat(outs)
            path.parent.mkdir(parents=True, exist_ok=True)
            DecisionOutputs(**ref[part]).save(path)
    state.update(reference=reference, sets=sets, batches=batches, ref=ref)
    state["noise"] = search_noise(state, payload, cache)
    # the numerical-tie stratum of every judgement (runs.settings: a sweep reads it in run.json)
    state["settings"] = dict(state["settings"], numerical_noise=state["noise"]["max_abs_logit_diff"])
    return state


def search_noise(state, payload, cache):
    """The reference's numerical noise on the search-eval part (as a sweep's,
    :mod:`variants.sweep.noise`): its logits against the same model on the plain MLX path,
    computed once and cached like the reference's outputs (the key names the path)."""
    from variants.models.decision import prepared_digest
    from variants.runtime import plain
    from variants.sweep.inputs import cache_parts
    from variants.sweep.noise import noise_record

    cfg, parts, checkpoint = state["cfg"], state["parts"], state["checkpoint"]
    reference, part = state["reference"], "search-eval"
    with plain.plain():
        key = reference.cache_key(checkpoint.sha256, cfg.dtype, parts[part].fingerprint(),
                                  [prepared_digest(b) for b in state["batches"][part]],
                                  payload["chunk_size"], *cache_parts(cfg))
        path = cache / "reference" / f"{cfg.model}-{part}-plain-{key}.npz"
        if path.exists():
            with np.load(path) as d:
                logits = d["logits"]
        else:
            logits = np.concatenate([np.asarray(reference.raw_logits(ts, b), np.float32)
                                     for ts, b in zip(state["sets"][part],
                                                      state["batches"][part])])
            from runs.io import write_npz

            write_npz(path, {"logits": logits})
    ref = state["ref"][part]
    return noise_record(ref["logits"], logits, ref["option_mask"])


def build_variant(state, spec):
    """The candidate's DecisionModel (simulated quant; W8A8 units native, in the sweep's speed
    mode) and the builder's info dict; a spec
    with ``config`` (a composed cross-family config) is built by
    :func:`variants.search.composed.build` (info: its :func:`~variants.search.composed.summary`)
    on the sweep's calibration and fit splits."""
    from variants.families.quant.family import QuantConfig, build

    if "config" in spec:
        from pathlib import Path

        from variants.families.family import BuildInputs
        from variants.search import composed

        ts = state["tasksets"]
        inputs = BuildInputs(calibration=ts["calibration"], fit=ts.get("fit"),
                             cache_dir=Path(state["cfg"].results_dir) / ".cache")
        # W8A8 pieces are judged on the model that runs, as the composed family's sweep
        # judges them (variants.families.family.judged_mode): the whole recipe then native
        speed = getattr(state["cfg"], "speed_mode", "native")
        mode = speed if "w8a8" in spec["config"] else "simulated"
        model, infos = composed.build(state["reference"], spec["config"], inputs, mode=mode,
                                      group_size=state["group_size"], int8_mode=speed)
        return model, composed.summary(infos)
    qcfg = QuantConfig(bits=spec["default_bits"], group_size=state["group_size"],
                       bits_map=spec["bits_map"],
                       quantize_embeddings=state.get("quantize_embeddings", False),
                       quantize_head=state.get("quantize_head", False),
                       method=spec.get("method", "rtn"), int8=spec.get("int8", ""),
                       scale_dtype=state.get("scale_dtype", "float32"),
                       embedding_texts=state.get("embedding_texts", ""))
    if qcfg.method == "rtn" and not qcfg.int8:
        from variants.families.family import BuildInputs

        # the fit split's texts tell a word table's used rows (an @unseen entry)
        return build(state["reference"], qcfg, BuildInputs(fit=state["tasksets"].get("fit")),
                     mode="simulated")
    from pathlib import Path

    from variants.families.family import BuildInputs

    # a learned quantizer reads the fit split the head was fitted on (never a search part)
    inputs = BuildInputs(fit=state["tasksets"].get("fit"),
                         cache_dir=Path(state["cfg"].results_dir) / ".cache")
    # W8A8 units are judged on the model that runs, as the sweep judges the winner
    # (variants.families.family.judged_mode): their codes round on the path that computes them
    mode = getattr(state["cfg"], "speed_mode", "native") if qcfg.int8 else "simulated"
    return build(state["reference"], qcfg, inputs, mode=mode)


def evaluate_candidate(state, spec):
    """Evaluate one candidate.

    Parameters
    ----------
    state : dict
        From :func:`init_worker`.
    spec : dict
        ``id``, ``default_bits`` (int), ``bits_map`` (a ``--bits-map`` string), ``stop``
        (bool: sequential stopping on); optionally ``method`` (``--quant-method``) and ``int8``
        (an ``--int8-layers`` regex).

    Returns
    -------
    dict
        ``id``; ``cal`` and ``eval`` (output-field dicts: all search-calibration rows, the
        search-eval rows run, a prefix); ``n_used`` / ``n_total`` (search-eval rows run /
        available); ``settled`` (clause ids settled failing, [] when run to the end);
        ``wall_s``; ``chunk_s`` (seconds of each eval chunk run).
    """
    from variants.search.sequential import settled_failures

    t0 = time.perf_counter()
    model, info = build_variant(state, spec)
    ref, sets, batches = state["ref"], state["sets"], state["batches"]
    cal = _fields(model.outputs(sets["search-calibration"][0], batches["search-calibration"][0]))
    seen, settled, chunk_s = [], [], []
    for ts, b in zip(sets["search-eval"], batches["search-eval"]):
        t = time.perf_counter()
        seen.append(_fields(model.outputs(ts, b)))
        chunk_s.append(time.perf_counter() - t)
        if spec.get("stop", True):
            part = concat(seen)
            settled = settled_failures(ref["search-calibration"], ref["search-eval"], cal, part,
                                       state["contract"], state["settings"])
            if settled:
                break
    part = concat(seen)
    return {"id": spec["id"], "cal": cal, "eval": part, "n_used": len(part["ids"]),
            "n_total": len(ref["search-eval"]["ids"]), "settled": settled,
            "wall_s": time.perf_counter() - t0, "chunk_s": chunk_s,
            **({"build": info} if "config" in spec else {})}


def given_state(state):
    """``init`` of the local executor: the driver's own state (loaded once, by the driver)."""
    return state
