"""Toy ``init`` / ``fn`` for tests/test_executors.py (module-level, so worker processes and Ray
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
    return {"id": spec["id"], "x": x, "sum": float(x.sum()), "pid": os.getpid()}


def broken_init(marker_dir, scale):
    raise RuntimeError("cannot load the checkpoint")
