"""Open a local HTML file in headless Chromium once, offline: its DOM after scripts ran, a
screenshot, every console message and every network request the page made (Chromium's net
log). A helper of tests/runs/test_html_browser.py; no pytest in here."""

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

#: Executable names tried, in order.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: What to do without one (the skip line).
INSTALL_HINT = ("headless Chromium not found: install it with `sudo apt-get install -y chromium` "
                "(Debian/Ubuntu; scripts/setup.sh does this where it can) to run the browser "
                "tests of report.html")
#: Section ids of report.html, in the order the page must show them.
SECTIONS = ["verdicts", "clauses", "pareto", "reliability", "near-ties", "flipped", "timing",
            "sweep-time", "provenance"]
#: A console line of Chromium's stderr log (--enable-logging=stderr).
CONSOLE = re.compile(r":(INFO|WARNING|ERROR|VERBOSE\d*):CONSOLE[:(]\d*\)?\] (.*)$")


class ReportDom(HTMLParser):
    """Section ids in order, clause rows per variant table, every src/href, the data block."""

    def __init__(self):
        super().__init__()
        self.sections, self.links, self.clauses = [], [], {}
        self.sortable_headers, self.banners = 0, []
        self._table, self._data, self.data = None, False, ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "th" and "sortable" in (a.get("class") or "").split():
            self.sortable_headers += 1  # the class the page's script adds
        if tag == "div" and "banner" in (a.get("class") or "").split():
            self.banners.append((a.get("data-variant"), a["class"].split()[1]))
        if tag == "section":
            self.sections.append(a.get("id"))
        if tag == "table" and "clauses" in (a.get("class") or ""):
            self._table = a["data-variant"]
            self.clauses[self._table] = []
        if tag == "tr" and "data-clause" in a and self._table:
            self.clauses[self._table].append(a["data-clause"])
        for k in ("src", "href", "xlink:href", "action", "poster"):
            if k in a:
                self.links.append(a[k])
        self._data = tag == "script" and a.get("id") == "report-data"

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        if tag == "script":
            self._data = False

    def handle_data(self, data):
        if self._data:
            self.data += data



def find_chromium():
    """Path of a Chromium/Chrome executable, or None."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageLoad:
    dom: str
    screenshot: Path
    console: list = field(default_factory=list)  # (level, message)
    requests: list = field(default_factory=list)  # URLs the page asked for (not file:)
    stderr: str = ""


def _page_requests(net_log):
    """URLs of the requests the page started (its network isolation key is the file:// page),
    leaving out the browser's own background traffic (updates, accounts, dictionaries)."""
    d = json.loads(Path(net_log).read_text(encoding="utf-8", errors="replace") or "{}")
    types = {v: k for k, v in d.get("constants", {}).get("logEventTypes", {}).items()}
    out = []
    for e in d.get("events", []):
        p = e.get("params") or {}
        if types.get(e.get("type")) == "URL_REQUEST_START_JOB" and \
                "file://" in str(p.get("network_isolation_key", "")) + str(p.get("initiator")):
            if not p.get("url", "").startswith(("file:", "data:", "blob:")):
                out.append(p.get("url"))
    return out


def load(html_path, workdir, *, chromium=None, width=1280, height=1600, timeout=60):
    """Load ``html_path`` in one headless Chromium run with the network off: no proxy reachable
    (127.0.0.1:9), every host name unresolvable.

    Returns
    -------
    PageLoad
        ``dom`` (the serialized DOM after load), ``screenshot`` (PNG of the first
        ``width`` × ``height`` pixels), ``console`` ((level, text) of every console message,
        uncaught errors included), ``requests`` (URLs the page requested over the network).

    Raises
    ------
    subprocess.CalledProcessError, subprocess.TimeoutExpired
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    shot, net = workdir / "screenshot.png", workdir / "net.json"
    args = [chromium or find_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-extensions", f"--user-data-dir={workdir / 'profile'}",
            "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
            "--host-resolver-rules=MAP * ~NOTFOUND", f"--log-net-log={net}",
            "--enable-logging=stderr", "--v=0", "--hide-scrollbars",
            f"--window-size={width},{height}", f"--screenshot={shot}", "--dump-dom",
            Path(html_path).resolve().as_uri()]
    env = dict(os.environ, DBUS_SESSION_BUS_ADDRESS="disabled:")
    run = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=True,
                         env=env, cwd=workdir)
    console = [(m.group(1), m.group(2)) for line in run.stderr.splitlines()
               if (m := CONSOLE.search(line))]
    return PageLoad(dom=run.stdout, screenshot=shot, console=console,
                    requests=_page_requests(net) if net.exists() else [], stderr=run.stderr)
