"""Names a user gives that become folder names or CSV keys (run names, model names, variant
names, output folders), checked in one place (no MLX).

A name is refused when it is empty or blank at an end, holds a control character (a newline
made a folder ``a\\nb``) or a path separator, starts with ``.``, is longer than a folder name
may be (255 bytes), or (:func:`name_problem` with ``csv=True``) is a text pandas reads as
missing: ``summary.csv``'s ``variant`` column is read with pandas' defaults, so a variant named
``null`` or ``NA`` would come back as NaN.
"""

#: texts ``pandas.read_csv`` reads as missing by default (its documented ``na_values``)
PANDAS_NA = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan",
                       "1.#IND", "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a",
                       "nan", "null"})


def _control(text):
    return next((c for c in text if ord(c) < 32 or 127 <= ord(c) < 160), None)


def control_problem(text):
    """Why ``text`` (a path) cannot be used: it holds a control character; None otherwise."""
    c = _control(str(text))
    return None if c is None else f"holds a control character ({c!r})"


def name_problem(name, csv=False):
    """Why ``name`` cannot be a plain folder name (or, with ``csv``, a CSV key); None when it
    can. The reason is a short phrase, e.g. ``"holds a control character ('\\n')"``."""
    name = str(name)
    if not name.strip():
        return "is empty"
    if name != name.strip():
        return "has a blank at either end"
    problem = control_problem(name)
    if problem:
        return problem
    if "/" in name or "\\" in name:
        return "holds a path separator ('/' or '\\')"
    if name.startswith("."):
        return "starts with '.'"
    if len(name.encode("utf-8", "surrogateescape")) > 255:
        return "is longer than a folder name may be (255 bytes)"
    if csv and name in PANDAS_NA:
        return "reads as a missing value (NaN) in a CSV file"
    return None
