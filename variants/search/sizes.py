"""Split sizes that fit the user's data: with ``--data`` and no ``--n-fit`` / ``--n-search``, the
search's defaults come from the fit-split rows the file holds, and a model with nothing to fit
takes no fit rows at all.

The bundled data keeps its sizes (:data:`BUNDLED`: 2000 fit rows for the head, 1600 search rows,
from VADER's 5,000-odd fit-split rows). With a data file of F fit-split rows:

- a model that fits something on the fit split (a ``linear-head`` head, a ``marker`` scorer with
  ``scorer = "fit"``, a factory's model: it may) gets half of them for the search split, at least
  :data:`MIN_SEARCH`, and the rest (at least :data:`MIN_FIT`) for the fit;
- a model with nothing to fit (``classifier``, ``cosine``, a ``marker`` reading its scorer from
  the checkpoint) gets every fit-split row for the search split (``n_fit = 0``), unless a
  learned ``--quant-method`` (AWQ, GPTQ, DWQ) is searched: those learn from the fit rows, so the
  file is halved as for a fitted head.

The choice is said in one line. Too few rows: one line naming the count and a command that
works on this file (a sweep needs no search split). No MLX.
"""

from variants import defaults as D
from variants.sweep.config import SweepError

BUNDLED = {"n_fit": D.N_FIT, "n_search": 1600}
MIN_SEARCH = 40  # two parts of 20: the search-calibration part needs 1/alpha rows at alpha 0.05
MIN_FIT = 10


def fits_on_fit_split(source):
    """Whether the model of ``source`` (a ModelSource) fits anything on the fit split."""
    cfg = source.config
    if source.factory is not None or cfg is None:
        return True
    if cfg.logits == "linear-head":
        return True
    return cfg.logits == "marker" and cfg.marker_scorer == "fit"


def fit_rows(data, source):
    """Number of fit-split rows of data file ``data`` (read and checked as the sweep does)."""
    from variants.datasets import own as own_data

    options, scores, actions = source.fixed_options() or (None, None, None)
    frame = own_data.read_data(data, options=options, scores=scores, actions=actions)
    return len(own_data.split_rows(frame, "fit"))


def resolve(opts, source, log=print):
    """Fill ``opts.n_fit`` / ``opts.n_search`` (None = from the data) in place; returns the line
    said about them ("" when nothing was chosen here). Raises SweepError when the file has too
    few fit-split rows for a search."""
    if opts.n_fit is not None and opts.n_search is not None:
        return ""
    if opts.data is None:
        chosen = {k: BUNDLED[k] for k in BUNDLED if getattr(opts, k) is None}
        for k, v in chosen.items():
            setattr(opts, k, v)
        return ""
    n = fit_rows(opts.data, source)
    head = fits_on_fit_split(source)
    learned = any(m != "rtn" for m in getattr(opts, "quant_methods", ("rtn",)))
    fits = head or learned
    if not fits:
        n_fit = 0 if opts.n_fit is None else opts.n_fit
        n_search = n - n_fit if opts.n_search is None else opts.n_search
    elif opts.n_search is None:
        n_fit = opts.n_fit
        n_search = max(MIN_SEARCH, n // 2) if n_fit is None else n - n_fit
        n_fit = n - n_search if n_fit is None else n_fit
    else:
        n_search, n_fit = opts.n_search, n - opts.n_search
    if n_search < MIN_SEARCH or n_search > n - n_fit or (fits and n_fit < MIN_FIT):
        need = MIN_SEARCH + (MIN_FIT if fits else 0)
        raise SweepError(
            f"data file {opts.data} has {n} fit-split rows; the search needs {need} or more "
            f"({MIN_SEARCH} for its split" + (f", {MIN_FIT} for the fit" if fits else "")
            + f"); add rows with split = \"fit\", or judge fixed variants on it with: variants "
            f"sweep --data {opts.data}" + (f" --model-config {opts.model_config}"
                                          if opts.model_config else ""))
    opts.n_fit, opts.n_search = n_fit, n_search
    line = (f"sizes from {opts.data}: {n} fit-split rows -> --n-search {n_search}"
            + (f", --n-fit {n_fit} for " + " and ".join(
                ["the head"] * head + ["the learned quantizers"] * learned) if fits else
               " (the model fits nothing: no fit rows)"))
    log(line)
    return line
