"""What a family says about each variant in the run's report.md: ``<variant>/family.md``.

The sweep writes it at build time from the family's ``describe(build, timing)`` (build.json and
timing.json as dicts -> Markdown); the judge and ``variants check`` only read it
(:meth:`runs.folder.RunFolder.family_texts`), so judging never imports a builder. Runs written
before family.md existed keep their blocks in run.json's ``extras``, which is read instead.
"""

from runs.folder import FAMILY_TEXT, RunFolder
from runs.io import write_text
from runs.readers import CorruptFileError


def write_family_text(run_dir, name, family_name, describe):
    """Write ``<run_dir>/<name>/family.md`` from ``describe(build, timing)``; returns the text
    (None, and nothing written, when ``describe`` returns None: a family with nothing to say).

    Parameters
    ----------
    run_dir : path-like
    name : str
        Variant folder (holding build.json and timing.json).
    family_name : str
        For the error message.
    describe : callable(dict, dict) -> str or None
        The family's report block (Markdown).

    Raises
    ------
    runs.readers.CorruptFileError
        Naming build.json when ``describe`` misses a field it reads (KeyError, TypeError,
        IndexError), or when build.json / timing.json is not valid.
    """
    run = RunFolder(run_dir)
    try:
        text = describe(run.json(name, "build.json"), run.json(name, "timing.json"))
    except (KeyError, TypeError, IndexError) as e:  # a field the family wrote is absent
        raise CorruptFileError(run.path / name / "build.json", "build file",
                               f"{family_name} field missing or of the wrong type: "
                               f"{type(e).__name__} {e}") from None
    if text is None:
        return None
    write_text(run.path / name / FAMILY_TEXT, text)
    return text


def family_extras(run_dir, family_name, names, family=None):
    """{variant: Markdown} of the family's report blocks of ``names``.

    With ``family`` (an object with ``describe(build, timing)``; the sweep passes its family),
    each variant holding build.json and timing.json gets its ``family.md`` written first
    (:func:`write_family_text`); a family without ``describe``, or whose ``describe`` returns
    None (quant), writes and returns nothing. Without ``family`` the saved blocks are read
    (family.md, else run.json's ``extras``); no builder is imported either way.
    """
    run = RunFolder(run_dir)
    if family is not None:
        describe = getattr(family, "describe", None)
        if describe is None:
            return {}
        texts = {n: write_family_text(run.path, n, family_name, describe) for n in names
                 if run.has(n, "build.json") and run.has(n, "timing.json")}
        return {n: t for n, t in texts.items() if t is not None}
    return run.family_texts(names)
