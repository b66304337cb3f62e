"""Command-line parsing shared by every ``variants`` verb (no MLX): one-line usage errors and
bounded number types.

:class:`Parser` is the ``argparse.ArgumentParser`` of ``variants`` (its subparsers inherit the
class): a wrong type, an unknown choice, a missing verb or argument prints one line, ``variants:
error: <flag> <value> ...; see 'variants <verb> --help'``, naming the flag, the value and the
valid choices, and exits 2, instead of the whole usage. :func:`number` builds ``type=`` callables
that refuse NaN, infinities and values outside a stated range at parse time, so a verb never
starts (nor touches a folder) with a value it cannot use.
"""

import argparse
import math
import re

from contracts.exit_codes import EXIT_USER_ERROR

#: Most characters of a value echoed in an error (a 5 MB value is cut, with its length)
_ECHO = 80


def _cut(text):
    """A quoted value longer than ``_ECHO`` characters, cut (the message stays one short line)."""
    def cut(m):
        s = m.group(0)
        return s if len(s) <= _ECHO else f"{s[:_ECHO // 2]}...{s[-8:]} ({len(s) - 2} chars)"
    return re.sub(r"'[^']*'", cut, text.replace("\n", "\\n"))


def _unquote(choices):
    return ", ".join(c.strip().strip("'") for c in choices.split(","))


def usage_message(message, verbs=()):
    """argparse's error ``message`` as one line naming the flag, the value and the choices.

    ``verbs`` are the subcommands (for the top-level parser's "no/unknown command" errors)."""
    m = re.match(r"argument (\S+): invalid (int|float) value: (.*)$", message, re.S)
    if m:
        flag, kind, value = m.groups()
        return f"{flag} {value} is not {'an integer' if kind == 'int' else 'a number'}"
    m = re.match(r"argument (\S+): invalid choice: (.*) \(choose from (.*)\)$", message, re.S)
    if m:
        flag, value, choices = m.groups()
        if flag == "command":
            return f"unknown command {value}; choose one of: {_unquote(choices)}"
        return f"{flag} {value} is not one of: {_unquote(choices)}"
    if message == "the following arguments are required: command" and verbs:
        return f"no command given; choose one of: {', '.join(verbs)}"
    m = re.match(r"argument (\S+): (.*)$", message, re.S)
    if m:  # a type= callable's own message (ArgumentTypeError), "expected one argument", ...
        return f"{m.group(1)} {m.group(2)}"
    return message


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors are one line (exit 2), not the usage."""

    #: the verb being parsed, set by the top-level parser's builder: an argument no verb takes
    #: ("unrecognized arguments") is reported by the top-level parser, the help to see is the verb's
    verb = None

    def error(self, message):
        verbs = [c for a in self._actions if isinstance(a, argparse._SubParsersAction)
                 for c in a.choices]
        line = _cut(usage_message(message, verbs))
        prog = f"{self.prog} {self.verb}" if self.verb in verbs else self.prog
        self.exit(EXIT_USER_ERROR, f"variants: error: {line}; see '{prog} --help'\n")


def number(kind=float, *, low=None, high=None, low_open=False, high_open=False, example=None):
    """An argparse ``type=`` callable: ``kind`` (int or float), finite, within the bounds.

    ``low``/``high`` (None = unbounded) are inclusive unless ``low_open``/``high_open``;
    ``example`` is a value the message suggests. Raises ``argparse.ArgumentTypeError`` (argparse
    then names the flag) for text that is not a ``kind``, NaN, ±inf, or a value out of range.
    """
    lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
    hi = "" if high is None else f"{high:g}" + (")" if high_open else "]")
    if low is not None and high is not None:
        where = f"in {lo}, {hi}"
    elif low is not None:
        where = f"{'>' if low_open else '>='} {low:g}"
    elif high is not None:
        where = f"{'<' if high_open else '<='} {high:g}"
    else:
        where = "finite"
    what = "an integer" if kind is int else "a number"
    hint = f", e.g. {example}" if example is not None else ""

    def parse(text):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}{hint}") from None
        ok = math.isfinite(value) and not (
            (low is not None and (value < low or (low_open and value == low)))
            or (high is not None and (value > high or (high_open and value == high))))
        if not ok:
            raise argparse.ArgumentTypeError(f"{text!r} must be {what} {where}{hint}")
        return value

    parse.__name__ = kind.__name__
    return parse


def folder(text):
    """An argparse ``type=`` for a folder argument: refuses an empty or blank one (``Path("")``
    is the current folder, which ``check ''`` then read as the run) and one with a control
    character. Raises ``argparse.ArgumentTypeError``; returns ``text``."""
    from runs.names import control_problem

    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; pass a folder")
    if control_problem(text):
        raise argparse.ArgumentTypeError(f"{text!r} {control_problem(text)}; pass a plain path")
    return text
