"""``variants search``: the cheapest quant configuration (a per-layer bits map) that passes a
contract, judged honestly and stopped early where the verdict is already settled.

One idea per module: the search split carved from unused fit rows (``split``), the candidate
costs (``costs``), the exact sequential-stopping rule (``sequential``, no MLX), the worker pair
``init_worker`` / ``evaluate_candidate`` in the executor shape (``worker``), the strategies
(``strategies``), the resumable candidate store (``store``), search.json / search.md / the plot
(``report``) and the driver (``driver``); and the default sweep's and search's configuration, in
which the bundled models' reference is fitted once and shipped (``default_fits``).
"""
