"""Exit codes shared by the commands (``variants sweep/check/selftest/plot``).

``EXIT_OK`` (0): done (and, with ``--fail-on-violation``, every variant passed);
``EXIT_VIOLATION`` (1): a contract was violated (only with ``--fail-on-violation``) or the
planted-fault selftest failed, or an output could not be written; ``EXIT_USER_ERROR`` (2): bad input (one line naming the problem
and the fix, nothing half-written).
"""

EXIT_OK, EXIT_VIOLATION, EXIT_USER_ERROR = 0, 1, 2
