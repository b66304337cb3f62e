"""The reference's fitted state (the head's arrays and the temperatures): one file format, one
hash, and the states shipped with the package for the bundled models' default configurations.

File format (``.cache/heads/*.npz``, ``variants/models/fitted/*.npz``, a run's
``reference/fitted.npz``, an export's ``judged/reference_fitted.npz``): ``head_<name>`` arrays
(the model's ``head_state()``; none for a model without a fitted head), ``t_keys`` (M,) int64
option counts, ``t_values`` (M,) float64 temperatures, ``t_status`` (M,) str fit statuses.

The hash (:func:`state_sha256`) is over the arrays, not the file's bytes (a zip archive holds
timestamps): SHA-256 of, for each of the ``head_*`` arrays, ``t_keys`` and ``t_values`` in
sorted name order, a line ``name dtype shape`` (dtype little-endian, e.g. ``<f4``) and the
array's C-order little-endian bytes. ``t_status`` (words about the fit) is left out.

Shipped states: ``variants/models/fitted/<model>-<key>.npz`` with ``index.json`` (per file: the
model, the key, the hash, the inputs and where it was fitted). The key (:func:`shipped_key`) is
machine-independent: the checkpoint's sha256, the fit and calibration TaskSets' fingerprints,
the token ids they encode to, the tokenizer's settings, the model's configuration, the dtype and
the sweep's extra identity (a model TOML, a data file); not the BLAS, ISA, device or versions
that move float32 embeddings in their last bits. ``scripts/fit_bundled_heads.py`` writes them
(:mod:`variants.search.default_fits`: the default commands' configurations).
"""

import hashlib
import json
from pathlib import Path

import numpy as np

from runs.io import digest

FITTED_DIR = Path(__file__).with_name("fitted")
INDEX = FITTED_DIR / "index.json"
#: what regenerates the shipped states (named by errors and by the test that checks them)
SCRIPT = "scripts/fit_bundled_heads.py"
#: where a run keeps its reference's state (run-folder relative), and an export (folder relative)
RUN_FILE = "reference/fitted.npz"
EXPORT_FILE = "judged/reference_fitted.npz"
SOURCES = ("shipped", "cache", "fitted")
_HASHED = ("t_keys", "t_values")


class ShippedStateError(ValueError):
    """A shipped state file whose arrays do not hash to what index.json lists (exit 2)."""


def state_of(model):
    """The fitted state of ``model`` (a DecisionModel, fitted): {name: ndarray} (module
    docstring)."""
    state = {f"head_{k}": np.asarray(v) for k, v in model.head_state().items()} \
        if hasattr(model, "head_state") else {}
    temps = model.temperatures
    state["t_keys"] = np.array(list(temps), np.int64)
    state["t_values"] = np.array(list(temps.values()), np.float64)
    state["t_status"] = np.array([model.temperature_fits.get(k, {}).get("status", "unknown")
                                  for k in temps], dtype=str)
    return state


def apply_state(model, state):
    """Load ``state`` (as :func:`state_of` gives, or a file's arrays) into ``model`` in place:
    its head (``load_head_state``), temperatures and, when the state has ``t_status``, the fit
    statuses."""
    if hasattr(model, "load_head_state"):
        model.load_head_state({k[5:]: v for k, v in state.items() if k.startswith("head_")})
    keys, values = state["t_keys"].tolist(), state["t_values"].tolist()
    model.temperatures = dict(zip(keys, values))
    if "t_status" in state:  # caches written before the statuses were kept lack them
        model.temperature_fits = {k: {"temperature": t, "status": str(s)}
                                  for k, t, s in zip(keys, values, state["t_status"])}


def state_sha256(state):
    """Hex SHA-256 of ``state``'s head arrays and temperatures (module docstring: the canonical
    byte order). Raises KeyError when ``t_keys`` or ``t_values`` is missing."""
    h = hashlib.sha256()
    for name in sorted([k for k in state if k.startswith("head_")] + list(_HASHED)):
        a = np.asarray(state[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        h.update(f"{name} {a.dtype.str} {list(a.shape)}\n".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def read_state(path, model=None):
    """The state arrays of file ``path``, checked (:func:`runs.npz_readers.read_head_cache`;
    with ``model``, its head arrays are required at the model's shapes). Raises
    CorruptFileError."""
    from runs.npz_readers import read_head_cache

    shapes = ({k: np.shape(v) for k, v in model.head_state().items()}
              if model is not None and hasattr(model, "head_state") else None)
    return read_head_cache(path, shapes)


def record(source, state, origin):
    """run.json's ``reference_fit``: ``{"source", "sha256", "from"}``; ``origin`` names the file
    it was read from or cached to (relative: ``variants/models/fitted/...`` or
    ``.cache/heads/...``)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    return {"source": source, "sha256": state_sha256(state), "from": origin}


def _token_digest(model, tasksets):
    """16 hex digits over the token ids (and token types) the fit and calibration rows encode
    to, and each split's distinct option texts: what the model reads, whatever the tokenizers
    version or its serialisation."""
    h = hashlib.sha256()
    for split in ("fit", "calibration"):
        ts = tasksets[split]
        texts, pairs = model.model_inputs(ts)
        encs, _ = (model.tokenizer.encode(texts) if pairs is None
                   else model.tokenizer.encode(texts, pairs))
        options = sorted(set(np.asarray(ts.option_texts)[np.asarray(ts.option_mask)].tolist()))
        encs = list(encs) + (list(model.tokenizer.encode(options)[0]) if options else [])
        h.update(f"{split} {len(encs)}\n".encode())
        for e in encs:
            h.update(np.asarray(e.ids, "<i8").tobytes() + b"|"
                     + np.asarray(e.type_ids, "<i8").tobytes() + b"\n")
    return h.hexdigest()[:16]


def shipped_key(model, checkpoint_sha256, tasksets, extra_key=()):
    """16 hex digits naming a shipped state (module docstring: what it covers and what not).

    Parameters
    ----------
    model : DecisionModel
        Unfitted (its ``config()`` holds no temperatures yet), on the device and dtype in use.
    checkpoint_sha256 : str
    tasksets : dict {"fit": TaskSet, "calibration": TaskSet, ...}
    extra_key : tuple
        The sweep's model TOML and data file identity (:func:`variants.sweep.inputs.cache_parts`).
    """
    from variants.runtime import device

    tok = getattr(model.tokenizer, "settings", None)
    tok = {k: v for k, v in tok().items() if k not in ("fingerprint", "decided")} \
        if callable(tok) else type(model.tokenizer).__qualname__
    return digest(checkpoint_sha256, tasksets["fit"].fingerprint(),
                  tasksets["calibration"].fingerprint(), *extra_key,
                  {"model": model.config(), "tokens": _token_digest(model, tasksets),
                   "tokenizer": tok, "dtype": device.key_part()["dtype"]})


def read_index():
    """index.json's {file name: entry} ({} when there is none)."""
    return json.loads(INDEX.read_text()) if INDEX.exists() else {}


def shipped(name, model, checkpoint_sha256, tasksets, extra_key=()):
    """``(path, state)`` of the shipped state of model ``name`` for these inputs, or None.

    The key is only computed (it encodes the fit and calibration rows, ~0.3 s for 2800 rows)
    when some state of ``name`` is shipped at all.

    Raises
    ------
    ShippedStateError
        The file's arrays do not hash to index.json's ``sha256`` (or it is not listed).
    ShippedStateError
        Also when the file is not a readable state of this model (a shipped file is package
        data: the fix is to reinstall or regenerate it, not to delete it).
    """
    from runs.readers import CorruptFileError

    if not any(FITTED_DIR.glob(f"{name}-*.npz")):
        return None
    path = FITTED_DIR / f"{name}-{shipped_key(model, checkpoint_sha256, tasksets, extra_key)}.npz"
    if not path.exists():
        return None
    try:
        state = read_state(path, model)
    except CorruptFileError as e:
        raise ShippedStateError(f"{path}: the shipped head and temperatures do not read back "
                                f"({str(e).split(': ', 1)[-1].split(';')[0]}); reinstall "
                                f"mlx-variants, or in a checkout run python {SCRIPT}") from None
    want = read_index().get(path.name, {}).get("sha256")
    got = state_sha256(state)
    if got != want:
        raise ShippedStateError(f"{path}: its arrays hash {got[:16]}…, index.json lists "
                                f"{str(want)[:16]}…; reinstall mlx-variants, or in a checkout "
                                f"run python {SCRIPT}")
    return path, state


def check_same_head(reference, expected, what):
    """Raise RuntimeError when a worker's reference head and temperatures (``fitted_record``
    sha256) are not the driver's ``expected`` (None: not checked): a Ray node without the
    driver's ``results/.cache/heads`` fits its own, and on another CPU that can differ in the
    last bits; its candidates would be judged against another reference."""
    mine = (getattr(reference, "fitted_record", None) or {}).get("sha256")
    if expected is not None and mine != expected:
        raise RuntimeError(
            f"a {what} worker's reference head (sha256 {str(mine)[:12]}) is not the driver's "
            f"({str(expected)[:12]}): give every node a copy of the driver's --results-dir "
            ".cache (docs/search.md, 'On a Ray cluster')")
