"""The option -> action map behind a run's saved reference outputs (no MLX, no data files).

A run folder keeps each row's option probabilities ``probs`` (N, K) and action probabilities
``action_probs`` (N, A) = ``probs @ M_i`` for the row's map ``M_i`` (K, A)
(:func:`runs.outputs.finish_outputs`), but not the map itself. Outputs judged from logits made
elsewhere (:mod:`runs.judge_file`) need it to turn their logits into action probabilities
exactly as the sweep does. :func:`recover_action_map` recovers it:

1. per group of rows sharing a task and an option count, by least squares when the group's
   option probabilities have full column rank (the map is then unique; any real-valued map);
2. otherwise per row, as the task files define maps (:func:`variants.datasets.tasks.build_taskset`:
   each option goes to exactly one action): every 0/1 assignment whose sums reproduce the row's
   action probabilities within :data:`TOLERANCE`, found by depth-first search with pruning;
   a row with several such assignments (options of equal probability that go to different
   actions) takes the one every row of its group shares, when exactly one is shared.

A row whose map is not recovered this way raises ValueError naming it; nothing is guessed.
"""

import numpy as np

#: largest |probs @ M - action_probs| accepted: both are float32 roundings of float64 sums
#: (each within 6e-8 of it), so the true map reproduces them within about (K + 1) * 6e-8
TOLERANCE = 2e-6
#: most assignments listed per row in step 2 (beyond, the row alone cannot decide)
MAX_SOLUTIONS = 64


def _group_lstsq(p, y):
    """The (k, A) map of a full-rank group, or None when it does not reproduce ``y``."""
    if np.linalg.matrix_rank(p) < p.shape[1]:
        return None
    m, *_ = np.linalg.lstsq(p, y, rcond=None)
    rounded = np.round(m)
    m = np.where(np.abs(m - rounded) < 1e-6, rounded, m)
    return m if np.abs(p @ m - y).max() <= TOLERANCE else None


def _assignments(p, y, most=MAX_SOLUTIONS):
    """Every 0/1 map (tuple: option j -> action) with ``|sums - y| <= TOLERANCE``, up to
    ``most + 1`` of them (depth-first, largest probabilities first)."""
    order = np.argsort(-p, kind="stable")
    k, a = p.size, y.size
    remaining = y.astype(np.float64).copy()  # each action's probability still unexplained
    choice = [0] * k
    found = []

    def place(d):
        if len(found) > most:
            return
        if d == k:
            if np.abs(remaining).max() <= TOLERANCE:
                out = [0] * k
                for pos, j in enumerate(order):
                    out[j] = choice[pos]
                found.append(tuple(out))
            return
        pj = p[order[d]]
        for act in range(a):
            if remaining[act] - pj < -TOLERANCE:
                continue
            remaining[act] -= pj
            choice[d] = act
            place(d + 1)
            remaining[act] += pj

    place(0)
    return found


def _one_hot(assignment, n_actions):
    m = np.zeros((len(assignment), n_actions))
    m[np.arange(len(assignment)), assignment] = 1.0
    return m


def recover_action_map(out):
    """The (N, K, A) option -> action map behind saved outputs (see the module docstring).

    Parameters
    ----------
    out : mapping of str -> ndarray
        ``probs`` (N, K), ``action_probs`` (N, A), ``option_mask`` (N, K) bool and ``task``
        (N,) str of the reference (e.g. both of its splits concatenated: more rows, more rank).

    Returns
    -------
    ndarray of shape (N, K, A), float64
        Zero at invalid options; ``probs[i] @ map[i]`` reproduces ``action_probs[i]`` within
        :data:`TOLERANCE` on every row.

    Raises
    ------
    ValueError
        A row whose action probabilities no map reproduces, or whose map is ambiguous (named by
        id where ``out`` has ``ids``).
    """
    probs = np.asarray(out["probs"], dtype=np.float64)
    actions = np.asarray(out["action_probs"], dtype=np.float64)
    mask = np.asarray(out["option_mask"], bool)
    ids = np.asarray(out.get("ids", np.arange(len(probs)))).astype(str)
    n, k = probs.shape
    a = actions.shape[1]
    result = np.zeros((n, k, a))
    keys = [f"{t}|{m}" for t, m in zip(np.asarray(out["task"]).astype(str), mask.sum(axis=1))]
    unmapped, ambiguous = [], []
    for key in dict.fromkeys(keys):
        rows = np.flatnonzero(np.array([x == key for x in keys]))
        valid = mask[rows[0]]
        p, y = probs[rows][:, valid], actions[rows]
        m = _group_lstsq(p, y)
        if m is not None:
            result[np.ix_(rows, np.flatnonzero(valid))] = m
            continue
        per_row = [_assignments(p[r], y[r]) for r in range(len(rows))]
        shared = None
        for sols in per_row:
            if sols and len(sols) <= MAX_SOLUTIONS:
                shared = set(sols) if shared is None else shared & set(sols)
        for r, sols in enumerate(per_row):
            if len(sols) == 1:
                pick = sols[0]
            elif not sols:
                unmapped.append(ids[rows[r]])
                continue
            elif shared is not None and len(shared) == 1:
                pick = next(iter(shared))
                if np.abs(p[r] @ _one_hot(pick, a) - y[r]).max() > TOLERANCE:
                    ambiguous.append(ids[rows[r]])
                    continue
            else:
                ambiguous.append(ids[rows[r]])
                continue
            result[rows[r], np.flatnonzero(valid)] = _one_hot(pick, a)
    if unmapped:
        raise ValueError(f"the reference's action probabilities of {len(unmapped)} rows (ids "
                         f"{', '.join(unmapped[:5])}{', …' if len(unmapped) > 5 else ''}) are "
                         "not a map of their option probabilities: the saved reference outputs "
                         "are inconsistent; rerun the sweep into a new run folder")
    if ambiguous:
        raise ValueError(f"the option -> action map of {len(ambiguous)} rows (ids "
                         f"{', '.join(ambiguous[:5])}{', …' if len(ambiguous) > 5 else ''}) "
                         "cannot be told from the reference's saved outputs (options of equal "
                         "probability go to different actions); judge these outputs with "
                         "`variants sweep` instead")
    return result
