"""Command line: the ``variants`` entry point, routing each verb to its own module lazily.

``VERBS`` maps a verb to the ``module:function`` that adds its subparser; only the verb being
run is configured (the others get a bare placeholder), so ``variants check``, ``plot``,
``selftest`` and ``list`` never import MLX or the model side. Each subcommand has --help.
"""

import argparse
import importlib
import contextlib
import sys

from metrics._checks import printable
import warnings
import zipfile

import variants  # noqa: F401  (OpenBLAS before mlx)
from variants.commands import EXIT_FAILURE, EXIT_OK, EXIT_USER_ERROR  # noqa: F401

#: verb -> "module:function(subparsers)" adding its parser (imported only when the verb runs)
VERBS = {
    "sweep": "variants.commands.sweep:configure",
    "check": "runs.commands.check:configure_check",
    "selftest": "runs.commands.check:configure_selftest",
    "plot": "runs.commands.plot:configure_parser",
    "compare": "runs.commands.compare:configure",
    "list": "variants.commands.listing:configure",
    "sensitivity": "variants.commands.sensitivity:configure",
    "search": "variants.commands.search:configure",
    "export": "variants.commands.export:configure",
    "verify": "variants.commands.export:configure_verify",
    "judge": "runs.commands.judge:configure",
}


def _configure(verb, sub):
    module, function = VERBS[verb].split(":")
    return getattr(importlib.import_module(module), function)(sub)


def build_parser(argv=None):
    """The ``variants`` parser. With ``argv`` naming a verb (its first word not starting with
    ``-``), only that verb's module is imported and its parser built; otherwise (``--help``, no
    or an unknown verb) every verb's is, so the help and the error list them all."""
    from runs.commands.args import Parser

    parser = Parser(
        prog="variants",
        description="mlx-variants: build approximate variants of an MLX decision model and judge "
                    "each against a written contract, next to measured speed.")
    sub = parser.add_subparsers(dest="command", required=True)
    verb = next((a for a in (argv or []) if not a.startswith("-")), None)
    parser.verb = verb
    for name in VERBS:
        if verb in VERBS and name != verb:
            sub.add_parser(name)  # a placeholder: never parsed, never shown
        else:
            _configure(name, sub)
    return parser


def _loaded(module, name):
    """(``module.name``,) when ``module`` is already imported, else (): an exception class of a
    module this command never imported cannot have been raised."""
    m = sys.modules.get(module)
    return (getattr(m, name),) if m is not None else ()


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"variants: warning: {' '.join(str(message).split())}", file=file or sys.stderr)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a scheduler's stop), raised where the process is so that a sweep
    records it as it records Ctrl-C (run.json "incomplete") before the process ends."""


def _on_sigterm(signum, frame):
    raise Terminated("terminated by SIGTERM")


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM raises :class:`Terminated` in the main thread for the ``with`` block."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def main(argv=None):
    """Entry point of the ``variants`` console script. Returns the exit code (130 after Ctrl-C,
    143 after SIGTERM)."""
    from contracts.checker import ContractError
    from runs.io import RunIncomplete, WriteError

    args = build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    if variants.BLAS_INFO.get("error"):  # a BLAS the user named explicitly: never run without it
        print(f"variants: error: {variants.BLAS_INFO['error']}", file=sys.stderr)
        return EXIT_USER_ERROR
    from variants.runtime import env

    bad_env = env.problem()  # VARIANTS_QKERNEL=banana is refused, not read as on
    if bad_env:
        print(f"variants: error: {bad_env}", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        with warnings.catch_warnings(), _sigterm_raises():
            warnings.showwarning = _one_line_warning  # a warning is one line, as errors are
            return args.func(args)
    except WriteError as e:  # disk full, permissions: a runtime failure, not bad input
        print(f"variants: error: {e}; free space or fix permissions, then rerun the same "
              "command to finish", file=sys.stderr)
        return EXIT_FAILURE
    except RunIncomplete as e:
        print(f"variants: error: {printable(e)}", file=sys.stderr)
        return EXIT_FAILURE
    except (ValueError, FileNotFoundError, ContractError, *_loaded("variants.checkpoints.load",
                                                                   "CheckpointError"),
            *_loaded("variants.executors.local", "ExecutorError")) as e:
        print(f"variants: error: {printable(e)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except (OSError, zipfile.BadZipFile) as e:  # unreadable, unwritable or corrupt files
        from metrics._checks import short_path

        where = f" ({short_path(e.filename)})" if getattr(e, "filename", None) else ""
        why = getattr(e, "strerror", None) or e  # str(e) repeats the (maybe huge) path
        print(f"variants: error: {type(e).__name__}{where}: {why}; check the path and its "
              "permissions, or delete the corrupt file and rerun", file=sys.stderr)
        return EXIT_USER_ERROR
    except Terminated:
        print("variants: terminated (SIGTERM); rerun the same command to resume", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("variants: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
