"""The sweep's time accounting: wall time by category (:class:`SweepClock`), printed at the end of
a sweep (:func:`format_breakdown`) and written to run.json (``sweep_time``)."""

import time
from contextlib import contextmanager

#: Target share of a sweep's wall time spent outside model forwards.
OUTSIDE_FORWARD_TARGET = 0.15


class SweepClock:
    """Wall time of a sweep by category (seconds), and counts of what it ran.

    Categories (``CATEGORIES``): ``setup`` (contract, checkpoint, data, tokenisation),
    ``reference_forward`` (reference head fit, temperatures and outputs, or loading them from the
    cache), ``variant_build``, ``variant_forward`` (variant outputs on calibration and eval),
    ``timing`` (alternated timing), ``cold_start`` (fresh-process measurements),
    ``metrics_contract_report`` (metrics, verdicts, reports, summary), ``plots``; ``other`` is
    the wall time none of them covers. ``FORWARD`` are the model-forward categories.
    """

    CATEGORIES = ("setup", "reference_forward", "variant_build", "variant_forward", "timing",
                  "cold_start", "metrics_contract_report", "plots")
    FORWARD = ("reference_forward", "variant_forward", "timing")

    def __init__(self):
        self.start = time.perf_counter()
        self.seconds = dict.fromkeys(self.CATEGORIES, 0.0)
        self.counts = {"reference_output_batches": 0, "variant_output_batches": 0,
                       "variants_built": 0, "variants_reused": 0, "cold_starts": 0}
        self._open = None

    @contextmanager
    def __call__(self, category):
        """Add the block's wall time to ``category``. Raises ValueError on an unknown name or a
        nested block (a second would count the same seconds twice)."""
        if category not in self.seconds:
            raise ValueError(f"unknown sweep-time category {category!r}")
        if self._open is not None:
            raise ValueError(f"sweep clock: {category!r} nested inside {self._open!r}")
        self._open = category
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[category] += time.perf_counter() - t0
            self._open = None

    def breakdown(self):
        """{"wall_s", "seconds": {category: s, ..., "other": s}, "share": {...},
        "model_forward_s", "outside_forward_share", "target_outside_share", "counts"}."""
        wall = time.perf_counter() - self.start
        sec = dict(self.seconds)
        sec["other"] = max(0.0, wall - sum(sec.values()))
        fwd = sum(sec[c] for c in self.FORWARD)
        return {"wall_s": wall, "seconds": sec,
                "share": {k: (v / wall if wall > 0 else 0.0) for k, v in sec.items()},
                "model_forward_s": fwd,
                "outside_forward_share": (1.0 - fwd / wall) if wall > 0 else 0.0,
                "target_outside_share": OUTSIDE_FORWARD_TARGET,
                "forward_categories": list(self.FORWARD), "counts": dict(self.counts)}


def format_breakdown(b):
    """Lines of text for a :meth:`SweepClock.breakdown` (printed at the end of a sweep)."""
    lines = [f"sweep wall time {b['wall_s']:.1f} s:"]
    for k, v in b["seconds"].items():
        lines.append(f"  {k:<24} {v:8.1f} s  {b['share'][k]:6.1%}")
    share = b["outside_forward_share"]
    lines.append(f"  outside model forwards ({' + '.join(b['forward_categories'])} excluded): "
                 f"{share:.1%} (target <= {b['target_outside_share']:.0%})"
                 + ("" if share <= b["target_outside_share"] else " - above target"))
    c = b["counts"]
    lines.append(f"  reference output batches run: {c['reference_output_batches']}; variants "
                 f"built {c['variants_built']}, reused {c['variants_reused']}; cold starts "
                 f"{c['cold_starts']}")
    return lines
