"""Fit the bundled models' reference heads and temperatures in the default commands'
configuration and write them as package data: ``variants/models/fitted/<model>-<key>.npz`` and
``variants/models/fitted/index.json`` (:mod:`variants.search.default_fits`).

Run it from the repository root when ``tests/models/test_reference_fit.py`` says a default
configuration no longer finds its shipped state (a change of a model TOML, the bundled data,
the default split sizes, the tokenizer settings or the checkpoint)::

    PYTHONPATH=. .venv/bin/python scripts/fit_bundled_heads.py [MODEL ...]

(no MODEL: every registered model). Each model takes ~10-20 s on 2 cores (its reference runs
on the 2000 fit rows and the 800 calibration rows). Commit the new files and say in the commit
that the reference moved: every judged number of a default run moves with it.
"""

import sys

import variants  # noqa: F401  (OpenBLAS before mlx)
from variants.models import MODELS
from variants.search.default_fits import write_shipped


def main(argv):
    models = argv or list(MODELS)
    bad = [m for m in models if m not in MODELS]
    if bad:
        print(f"error: unknown model {bad[0]!r}; choose from {', '.join(MODELS)}",
              file=sys.stderr)
        return 2
    write_shipped(models)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
