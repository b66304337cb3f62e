"""One reader of a run folder (``results/<run>``): run.json, the variant list, outputs, the
per-variant JSON files, summary.csv and the family's report block (no MLX).

Every file goes through its validating reader (:mod:`runs.readers`, :mod:`runs.npz_readers`)
once and is kept: the judge, the run-level report and the plots share one :class:`RunFolder`,
so a file is parsed and validated once per command. A corrupt file raises
``runs.readers.CorruptFileError`` (a ValueError naming the file and the fix); a missing outputs
file raises what :meth:`RunFolder.missing` makes (:class:`CheckError` here; the plots' subclass
makes a ``PlotError``).

Layout read (written by ``variants sweep``)::

    run.json  summary.csv  reference/{outputs,calibration_outputs}.npz
    <variant>/{outputs,calibration_outputs}.npz  build.json  timing.json  metrics.json
              verdict.json  family.md
"""

from pathlib import Path

from runs.npz_readers import read_outputs
from runs.readers import (read_build, read_metrics, read_run_json, read_summary, read_timing,
                          read_verdict)

#: Folder of the reference's outputs inside a run folder.
REFERENCE = "reference"
#: The two outputs files of every model folder: split -> file name.
OUTPUT_FILES = {"eval": "outputs.npz", "calibration": "calibration_outputs.npz"}
#: What a family wants to say about a variant in the run's report.md (Markdown), written by the
#: sweep at build time from the family's ``describe(build, timing)``.
FAMILY_TEXT = "family.md"
#: The validating reader of each per-variant JSON file :meth:`RunFolder.json` reads.
JSON_READERS = {"build.json": read_build, "metrics.json": read_metrics,
                "verdict.json": read_verdict, "timing.json": read_timing}


class CheckError(ValueError):
    """A run folder or a variant cannot be checked; the message names the fix."""


class RunFolder:
    """A run folder, read lazily; each file read and validated at most once.

    Parameters
    ----------
    path : path-like
        ``results/<run>``. Nothing is read until asked for.

    Attributes
    ----------
    path : Path
    """

    def __init__(self, path):
        self.path = Path(path)
        self._meta = None
        self._variants = None
        self._summary = None
        self._outputs = {}
        self._json = {}

    def __repr__(self):
        return f"{type(self).__name__}({str(self.path)!r})"

    # -- run level ---------------------------------------------------------------------------
    @property
    def meta(self):
        """run.json as a dict ({} when absent, e.g. a hand-made folder).

        Raises ``CorruptFileError`` when it is not a valid run file
        (:func:`runs.readers.read_run_json`)."""
        if self._meta is None:
            path = self.path / "run.json"
            self._meta = read_run_json(path) if path.exists() else {}
        return self._meta

    @property
    def config(self):
        """run.json's ``config`` ({} when absent)."""
        return self.meta.get("config", {})

    @property
    def summary(self):
        """summary.csv as a DataFrame (:func:`runs.readers.read_summary`); FileNotFoundError
        when absent, CorruptFileError when not valid."""
        if self._summary is None:
            self._summary = read_summary(self.path / "summary.csv")
        return self._summary

    def variants(self):
        """Names of the variant folders (those holding both outputs files), sorted.

        Raises
        ------
        CheckError
            If a variant folder has only one of the outputs files, or a build.json or
            verdict.json without them (a half-written variant: rerun or delete it).
        """
        if self._variants is None:
            names = []
            for p in sorted(self.path.iterdir()):
                if not p.is_dir() or p.name in (REFERENCE, "plots") or p.name.startswith("."):
                    continue
                have = [(p / f).exists() for f in OUTPUT_FILES.values()]
                if all(have):
                    names.append(p.name)
                elif any(have) or (p / "build.json").exists() or (p / "verdict.json").exists():
                    raise CheckError(f"variant folder {p} is incomplete (outputs.npz or "
                                     "calibration_outputs.npz missing); rerun the sweep to "
                                     "rebuild it, or delete the folder")
            self._variants = names
        return list(self._variants)

    # -- per model folder ----------------------------------------------------------------------
    def missing(self, path):
        """The exception raised for a missing outputs file ``path`` (subclasses change it)."""
        return CheckError(f"{path} not found; run `variants sweep` first or pass the run folder.")

    def outputs(self, name, split="eval"):
        """Arrays of ``<name>/outputs.npz`` (``split="eval"``) or ``calibration_outputs.npz``.

        Parameters
        ----------
        name : str
            A variant folder or ``"reference"``.
        split : {"eval", "calibration"}

        Returns
        -------
        dict of str -> ndarray
            The ``DecisionOutputs`` fields present (:func:`runs.npz_readers.read_outputs`:
            validated shapes and dtypes), ``exit_layer`` included when saved. Shared between
            callers: do not modify the arrays.

        Raises
        ------
        Exception from :meth:`missing`
            If the file does not exist.
        CorruptFileError
            If it is not a valid outputs file.
        """
        key = (name, split)
        if key not in self._outputs:
            path = self.path / name / OUTPUT_FILES[split]
            if not path.is_file():
                raise self.missing(path)
            self._outputs[key] = read_outputs(path)
        return self._outputs[key]

    def has(self, name, file):
        """True when ``<name>/<file>`` exists."""
        return (self.path / name / file).exists()

    def json(self, name, file):
        """``<name>/<file>`` (a key of ``JSON_READERS``, e.g. ``build.json``) as a dict, read and
        validated once; {} when absent. Raises CorruptFileError when it is not valid."""
        key = (name, file)
        if key not in self._json:
            path = self.path / name / file
            self._json[key] = JSON_READERS[file](path) if path.is_file() else {}
        return self._json[key]

    def family_text(self, name):
        """The family's Markdown block of variant ``name`` (``<name>/family.md``, written by the
        sweep from the family's ``describe``), or None when the folder has none."""
        path = self.path / name / FAMILY_TEXT
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def family_texts(self, names):
        """{variant: Markdown} of the report blocks of ``names``: ``<variant>/family.md`` where
        present, else run.json's ``extras`` (runs written before family.md); variants with
        neither are left out."""
        saved = self.meta.get("extras")
        saved = saved if isinstance(saved, dict) else {}
        out = {}
        for name in names:
            text = self.family_text(name)
            if text is None:
                text = saved.get(name)
            if text is not None:
                out[name] = text
        return out
