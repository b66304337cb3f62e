"""Which contract judges which model outputs: a softmax over options (every logits kind, and
single-label classifier heads), per-label sigmoids (multi-label heads) or an output value
(regression heads; :mod:`variants.models.head_output` reads which from config.json).

Each metric of :mod:`metrics.registry` names the outputs it measures (``MetricSpec.outputs``); a
contract that judges a model may name only those (and ``nonfinite_rows``, which measures any):
a softmax clause on a regression head would be 1 / 0 / 0 by construction, a verdict that means
nothing. Without ``--contract`` a model gets the packaged contract of its outputs
(:data:`contracts.contract.PACKAGED_FOR`: ``default``, ``multi_label``, ``regression``).
"""

from metrics.registry import OUTPUT_KINDS, SOFTMAX, metrics_for, spec
from metrics.strata import TASK_STRATUM_PREFIX

from contracts.contract import PACKAGED_FOR, ContractError

#: what each kind of output is, in messages
DESCRIBED = {"softmax": "a softmax over options", "multi_label": "one sigmoid per label "
             "(multi_label_classification)", "regression": "one output value (regression)"}


def default_contract(outputs):
    """The packaged contract name judging ``outputs`` by default (``'default'`` for a softmax).

    Raises
    ------
    ValueError
        ``outputs`` is not one of ``OUTPUT_KINDS``.
    """
    if outputs not in OUTPUT_KINDS:
        raise ValueError(f"unknown outputs {outputs!r}; use one of {', '.join(OUTPUT_KINDS)}")
    return PACKAGED_FOR[outputs][0]


def contract_for(outputs, contract=None):
    """What to load: ``contract`` (a path or packaged name) when given, else
    :func:`default_contract` of ``outputs`` (None for a softmax: the packaged default, as
    before)."""
    if contract is not None:
        return contract
    return None if outputs == SOFTMAX else default_contract(outputs)


#: the strata a clause may restrict a head's rows to, per kind of output (None: every stratum of
#: :mod:`metrics.strata`). The others are defined by the softmax (near_tie, not_near_tie,
#: margin:<lo>-<hi>, numerical_tie, decided: the reference's top-2 margin; certified,
#: uncertified, certified_conformal, epsilon_held: its certificate; human_near_tie: raters'
#: shares per option), so on these heads they hold every row or none, and a clause on them
#: would pass by construction. Labels are read for a multi-label head's rows (one option per
#: row) but refused for a regression head's; a classifier head's options are its classes, the
#: same on every row, so ``options:<K>`` holds every row or none.
STRATA_FOR = {SOFTMAX: None, "multi_label": ("all", "labeled", "task:<task name>"),
              "regression": ("all", "task:<task name>")}


def _stratum_fits(stratum, outputs):
    allowed = STRATA_FOR.get(outputs)
    if allowed is None:
        return True
    return stratum in allowed or (stratum.startswith(TASK_STRATUM_PREFIX)
                                  and "task:<task name>" in allowed)


def _chosen_by(stratum):
    """What picks the rows of ``stratum`` (a stratum not in :data:`STRATA_FOR` of a head)."""
    if stratum == "labeled":
        return "their label (a regression head reads none)"
    if stratum.startswith("options:"):
        return "their number of options (a head's classes, the same on every row)"
    if stratum == "human_near_tie":
        return "raters' shares per option"
    if stratum in ("certified", "uncertified", "certified_conformal", "epsilon_held"):
        return "the softmax's certificate"
    return "the softmax's top-2 margin"


def check_outputs(contract, outputs, where="the model"):
    """Raise :class:`ContractError` (one line) unless every clause of ``contract`` measures
    ``outputs`` (:func:`metrics.registry.metrics_for`) on a stratum defined for them
    (:data:`STRATA_FOR`).

    ``where`` names the model in the message (e.g. the checkpoint's config.json)."""
    fits = set(metrics_for(outputs))
    for c in contract.clauses:
        if c.metric not in fits:
            theirs = spec(c.metric).outputs
            raise ContractError(
                f"contract {contract.name!r}: clause {c.id!r} measures {c.metric!r}, a metric of "
                f"{DESCRIBED.get(theirs, theirs)}, but {where} outputs {DESCRIBED[outputs]}; use "
                f"--contract {' or '.join(PACKAGED_FOR[outputs])}, or clauses on "
                f"{', '.join(m for m in metrics_for(outputs) if m != 'nonfinite_rows')}")
    for c in contract.clauses:  # the metrics fit: now the rows they are restricted to
        if not _stratum_fits(c.stratum, outputs):
            raise ContractError(
                f"contract {contract.name!r}: clause {c.id!r} restricts {c.metric!r} to stratum "
                f"{c.stratum!r}, rows chosen by {_chosen_by(c.stratum)}, but {where} outputs "
                f"{DESCRIBED[outputs]}, where that stratum holds every row or none; use stratum "
                f"{' or '.join(STRATA_FOR[outputs])}")
