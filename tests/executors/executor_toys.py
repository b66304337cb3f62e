"""Toy ``init`` / ``fn`` for tests/executors/test_executors.py (module-level, so worker processes and Ray
actors import them by name)."""

import os
import uuid

import numpy as np


def init(marker_dir, scale):
    """Count itself (one file per call, named by pid) and return a small state."""
    with open(os.path.join(marker_dir, f"init-{os.getpid()}-{uuid.uuid4().hex}"), "w"):
        pass
    return {"scale": float(scale), "pid": os.getpid()}


def fn(state, spec):
    """A deterministic result from the spec; ``spec["die"]`` = "once" kills the worker on the
    first attempt (marker file), "always" on every attempt; ``spec["raise"]`` raises."""
    if spec.get("raise"):
        raise ValueError(f"unit {spec['id']} is broken")
    die = spec.get("die")
    if die == "always":
        os._exit(3)
    if die == "once":
        marker = os.path.join(spec["marker_dir"], f"died-{spec['id']}")
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(3)
    x = np.random.default_rng(spec["seed"]).normal(size=5) * state["scale"]
    return {"id": spec["id"], "x": x, "sum": float(x.sum()), "pid": os.getpid(),
            "streams": os.environ.get("VARIANTS_STREAMS")}


def broken_init(marker_dir, scale):
    raise RuntimeError("cannot load the checkpoint")


def mlx_init(seed):
    """A tiny random BERT encoder (the conftest ``enc`` shape), built from ``seed``."""
    import variants  # noqa: F401  (OpenBLAS before mlx)
    import mlx.core as mx

    from variants.arch.encoder import BertEncoder, ModelArgs

    mx.random.seed(seed)
    e = BertEncoder(ModelArgs(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=64,
                              max_position_embeddings=64))
    mx.eval(e.parameters())
    return e


def mlx_fn(enc, spec):
    """The encoder on a padded (8, 12) batch drawn from ``spec["seed"]`` (enough rows for the
    two-stream split and packing)."""
    import mlx.core as mx

    rng = np.random.default_rng(spec["seed"])
    ids = rng.integers(1, 50, size=(8, 12)).astype(np.int32)
    mask = (np.arange(12)[None, :] < rng.integers(3, 13, size=(8, 1))).astype(np.int32)
    out = enc(mx.array(ids), mx.array(mask))
    return {"hidden": np.array(out.last_hidden) * mask[:, :, None]}
