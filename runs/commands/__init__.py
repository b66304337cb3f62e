"""The commands that only read and write results folders: ``check``, ``selftest``, ``plot``,
``compare``, ``judge``.

Each module adds its subcommand to an argparse subparsers object (``configure_*``) and holds its
handler; none imports MLX. Exit codes (shared by every ``variants`` command): 0 done, 1 a
contract violation with ``--fail-on-violation`` (or an output that could not be written), 2 bad
input (one line naming the problem and the fix).
"""

from contracts.exit_codes import EXIT_OK, EXIT_USER_ERROR, EXIT_VIOLATION  # noqa: F401
