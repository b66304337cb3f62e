"""The README's quick start runs as written: every command it shows is a real verb whose
``--help`` works and lists every flag the command uses, so a renamed or dropped flag breaks the
build, not the reader. The quick start reaches its verdict before line 120."""

import re
import shlex
from pathlib import Path

import pytest

from variants.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def quick_start(text):
    """(first line number, the quick start section's text): from its ``## Quick start``
    heading to the next ``## `` heading."""
    m = re.search(r"^## Quick start.*?(?=^## )", text, re.S | re.M)
    assert m, "the README has no '## Quick start' section"
    return text[:m.start()].count("\n") + 1, m.group(0)


def commands(section):
    """The ``variants`` commands of the section's ``bash`` blocks as argument lists (without the
    program), continuation lines joined and comments dropped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0].endswith("variants"):
                out.append(words[1:])
    return out


def test_the_parser_reads_a_planted_quick_start():
    text = ("# t\n\n## Quick start\n\n```bash\n.venv/bin/variants sweep --a 1 \\\n    --b 2  # c\n"
            "echo no\n```\n\n## Next\n")
    first, section = quick_start(text)
    assert first == 3
    assert commands(section) == [["sweep", "--a", "1", "--b", "2"]]


def test_the_quick_start_shows_sweep_search_and_check_and_ends_before_line_120():
    first, section = quick_start(README.read_text())
    verbs = [c[0] for c in commands(section)]
    assert {"sweep", "search", "check"} <= set(verbs), verbs
    assert "--fail-on-violation" in section  # the CI gate
    assert first + section.count("\n") <= 120, "the quick start must end before line 120"


@pytest.mark.parametrize("args", commands(quick_start(README.read_text())[1]),
                         ids=lambda a: " ".join(a)[:60])
def test_each_quick_start_command_has_its_flags(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args + ["--help"])
    assert e.value.code == 0
    help_text = capsys.readouterr().out
    flags = [w.split("=")[0] for w in args if w.startswith("--")]
    missing = [f for f in flags if not re.search(re.escape(f) + r"\b", help_text)]
    assert missing == [], f"variants {args[0]} --help does not know {missing}"
    for path in (w for w in args if w.startswith(("examples/", "contracts/"))):
        assert (ROOT / path).exists(), path
