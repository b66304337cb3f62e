"""The ``VARIANTS_*`` environment variables that take one of a closed set of values, read in one
place (no MLX): an unknown value is refused in one line naming the variable and the values it
takes, never read as the default.

``variants`` checks them all before a command starts (:func:`problem`, exit 2); every reader
goes through :func:`choice` (or :func:`switch_on`), so a library caller gets the same refusal
(:class:`EnvError`, a ValueError). Values are compared stripped and case-insensitively; an unset
or empty variable is its default. The open-ended ones are checked where they are read:
``VARIANTS_STREAMS`` (a whole number >= 1, :mod:`variants.runtime.parallel`), ``VARIANTS_BLAS``
(a library path, or none, :mod:`variants.runtime.blas`); ``VARIANTS_KERNEL_CACHE`` (a writable
folder) and the upper bound of ``VARIANTS_STREAMS`` are checked here too, before a command starts.
"""

import os

#: an on/off switch: on by default
SWITCH_ON, SWITCH_OFF = ("on", "1", "true", "yes"), ("off", "0", "false", "no")

#: variable -> (allowed values, the default used when it is unset or empty)
CLOSED = {
    "VARIANTS_QKERNEL": (SWITCH_ON + SWITCH_OFF, "on"),
    "VARIANTS_FUSED_LAYER": (SWITCH_ON + SWITCH_OFF, "on"),
    "VARIANTS_KERNEL_ISA": (("auto", "baseline"), "auto"),
    "VARIANTS_FUSED_THREADS": (("auto", "1", "2"), "auto"),
    "VARIANTS_MODERNBERT_ATTENTION": (("auto", "windowed", "masked"), "auto"),
    "VARIANTS_DEVICE": (("cpu", "gpu"), "cpu"),
}


class EnvError(ValueError):
    """A ``VARIANTS_*`` variable set to a value outside its closed set (one line, the fix)."""


def _allowed(name):
    values, _ = CLOSED[name]
    if values == SWITCH_ON + SWITCH_OFF:
        return "on or off (also 1/0, true/false, yes/no)"
    return ", ".join(values)


def choice(name, environ=None):
    """The value of closed-set variable ``name`` (one of ``CLOSED[name]``'s values, lower case;
    its default when unset or empty).

    Raises
    ------
    EnvError
        The variable holds any other value (the message names it and the allowed values).
    KeyError
        ``name`` is not a closed-set variable.
    """
    from metrics._checks import short_repr

    values, default = CLOSED[name]
    raw = (os.environ if environ is None else environ).get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value not in values:
        raise EnvError(f"{name}={short_repr(raw)} is not one of: {_allowed(name)}; set one of "
                       "them, or unset it for the default")
    return value


def switch_on(name, environ=None):
    """Whether on/off variable ``name`` is on (the default). Raises EnvError as :func:`choice`."""
    return choice(name, environ) not in SWITCH_OFF


#: the most MLX CPU streams VARIANTS_STREAMS may ask for (each is a thread; 1,000,000 of them
#: ended in "Resource temporarily unavailable" after 21 s)
MAX_STREAMS = 64


def _writable(folder):
    """Whether a folder can be made in ``folder`` (tried and removed: ``os.access`` says yes
    to root everywhere, /proc included)."""
    import tempfile

    if not os.path.isdir(folder):
        return False
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".variants-probe-", dir=folder))
    except OSError:
        return False
    return True


def _open_ended(environ):
    """The first problem of ``VARIANTS_KERNEL_CACHE`` (a folder that exists or can be made,
    writable) or ``VARIANTS_STREAMS`` (a whole number in [1, MAX_STREAMS]); None when fine."""
    from metrics._checks import short_repr

    cache = environ.get("VARIANTS_KERNEL_CACHE", "")
    if cache.strip():
        path = os.path.abspath(cache)
        probe = path
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)  # the nearest part that exists
        if os.path.exists(path) and not os.path.isdir(path) or not _writable(probe):
            return (f"VARIANTS_KERNEL_CACHE={short_repr(cache)} is not a folder this process can "
                    "write (the compiled kernels go there); point it at a writable folder, or "
                    "unset it for ~/.cache/mlx-variants/qkernel")
    streams = environ.get("VARIANTS_STREAMS", "").strip()
    if streams and streams.isdigit() and int(streams) > MAX_STREAMS:
        return (f"VARIANTS_STREAMS={streams} is more than {MAX_STREAMS} streams; pass a whole "
                f"number from 1 to {MAX_STREAMS} (2 is the default on 2 or more cores), or unset it")
    return None


def problem(environ=None):
    """The first closed-set variable holding an unknown value, or open-ended one holding an
    unusable one (:func:`_open_ended`), as a one-line message; None when all are fine."""
    environ = os.environ if environ is None else environ
    for name in CLOSED:
        try:
            choice(name, environ)
        except EnvError as e:
            return str(e)
    return _open_ended(environ)


def check():
    """Raise EnvError for the first closed-set variable holding an unknown value."""
    message = problem()
    if message:
        raise EnvError(message)
