"""The search's folder: its settings (``search_settings.json``) and one file per evaluated
candidate (``candidates/<id>.json``), each written atomically (:mod:`runs.io`), so a killed
search resumes where it stopped and a finished one reruns without evaluating anything.
Resuming with other settings is refused, naming the first differing setting. No MLX.
"""

import hashlib
import json
from pathlib import Path

from metrics._checks import short_repr
from runs.io import write_json

SCHEMA_VERSION = 1


def candidate_id(layer_bits, method="rtn"):
    """12 hex digits over the sorted ``{layer: bits}`` map (bits an int, or ``"int8"`` for a
    W8A8 Linear) and the quantizer ``method`` (the same map and method, the same id; an
    round-to-nearest map keeps the id it had before methods were a dimension)."""
    text = json.dumps(sorted((p, b if isinstance(b, str) else int(b))
                             for p, b in layer_bits.items()))
    text += "" if method == "rtn" else f"|{method}"
    return hashlib.sha1(text.encode()).hexdigest()[:12]


class Store:
    """``out/search_settings.json`` and ``out/candidates/``."""

    def __init__(self, out):
        self.out = Path(out)
        self.dir = self.out / "candidates"

    def check_settings(self, settings, plain=None):
        """Raise ValueError naming the first setting that differs from an earlier search in
        this folder (none there: fine). ``plain``: {setting: value} an absent setting stands
        for (said as that value). Writes nothing."""
        path = self.out / "search_settings.json"
        if not path.exists():
            return
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path} is unreadable ({e}); delete it or pass another --out") \
                from None
        plain = plain or {}
        for k in sorted(set(old) | set(settings)):
            if old.get(k) != settings.get(k):
                was, now = (d[k] if k in d else plain.get(k) for d in (old, settings))
                raise ValueError(f"--out {self.out} holds a search with {k}="
                                 f"{short_repr(was)}, not {short_repr(now)}; "
                                 "rerun with the same settings to resume, or pass another --out")

    def write_settings(self, settings):
        write_json(self.out / "search_settings.json", settings)

    def get(self, cid):
        """The stored record of candidate ``cid``, or None (absent or unreadable: it is
        evaluated again)."""
        path = self.dir / f"{cid}.json"
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return rec if rec.get("schema_version") == SCHEMA_VERSION and rec.get("id") == cid \
            else None

    def put(self, record):
        write_json(self.dir / f"{record['id']}.json", dict(record, schema_version=SCHEMA_VERSION))
