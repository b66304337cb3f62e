"""``--executor`` / ``--workers`` / ``--ray-address`` of ``variants sensitivity`` and ``variants
sweep`` (``variants search`` words its own): the flags and their check, which is
:func:`variants.executors.factory.make_executor`'s, before any work."""


def add(p, units, note=""):
    """Add the three flags to parser ``p``; ``units`` names what runs on the workers."""
    p.add_argument("--executor", default="local", metavar="local|process|ray",
                   help=f"where {units} run: local (this process, one at a time), process "
                        "(--workers spawned processes) or ray (--workers Ray actors; needs the "
                        "ray extra). Results are the same whichever is chosen" + note)
    p.add_argument("--workers", type=int, default=1,
                   help=f"how many of the {units} run at once (process / ray; local runs "
                        "one)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="a running Ray cluster (host:port, ray://host:10001 or auto); None = "
                        "RAY_ADDRESS, else a local Ray with --workers CPUs")


def make(args, log=None):
    """The executor of parsed ``args`` (not started, but a Ray address is probed: the command
    refuses before it loads or writes anything). Raises ValueError (one line naming the flag) or
    ExecutorError (Ray missing, a Ray address that does not answer)."""
    from variants.executors.factory import make_executor

    kw = {} if log is None else {"log": log}
    executor = make_executor(args.executor, workers=args.workers, ray_address=args.ray_address,
                             **kw)
    executor.check()
    return executor
