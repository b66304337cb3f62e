"""The tiny judged sweep the export tests share: :data:`TINY` (minilm-sentiment's splits cut to
40 / 40 / 30 rows, one timed batch size, no cold start, the lenient contract) and
:func:`sweep_and_export` (one sweep through the CLI, then ``variants export`` of one of its
variants)."""

from variants.cli import main

TINY = ["--n-fit", "40", "--n-calibration", "40", "--n-eval", "30", "--timing-rounds", "1",
        "--timing-warmup", "0", "--timing-budget-s", "0.5", "--cold-start", "none",
        "--timing-batch-sizes", "1", "--no-progress", "--contract", "lenient"]


def sweep_and_export(root, run, args, variant=None, tiny=TINY):
    """``(run folder, variant name, exported folder)``: ``variants sweep`` of ``args`` (the
    family's flags, a ``--model-config``, ...) into ``root/run`` with ``tiny``, then
    ``variants export --allow-fail`` of ``variant`` (None: the run's only variant) into
    ``root/<run>-out``; each asserted to exit 0."""
    assert main(["sweep", *tiny, "--results-dir", str(root), "--run", run, *args]) == 0
    folder = root / run
    if variant is None:
        (variant,) = [p.name for p in folder.iterdir() if (p / "build.json").exists()]
    out = root / f"{run}-out"
    assert main(["export", str(folder), "--variant", variant, "--out", str(out),
                 "--allow-fail"]) == 0
    return folder, variant, out
