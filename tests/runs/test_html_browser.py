"""report.html in a real browser: headless Chromium opens it once with the network off; no
console message, no request leaves the file, the screenshot is not blank and shows the verdict
banner, the DOM after its script ran holds every section and one row per clause.

Skipped without Chromium (one line says how to install it); with VARIANTS_REQUIRE_BROWSER=1
(.ci/run) a missing Chromium fails instead."""

import json
import os

import numpy as np
import pytest

from browser import INSTALL_HINT, SECTIONS, ReportDom, find_chromium, load

pytestmark = pytest.mark.html

#: Banner colours of report.css (RGB) per verdict.
BANNER_RGB = {"fail": (0xcf, 0x22, 0x2e), "pass": (0x1a, 0x7f, 0x37)}


@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if path is None:
        if os.environ.get("VARIANTS_REQUIRE_BROWSER"):
            pytest.fail(INSTALL_HINT)
        pytest.skip(INSTALL_HINT)
    return path


@pytest.fixture(scope="module")
def loaded(chromium, html_sweep_small, tmp_path_factory):
    return load(html_sweep_small / "report.html", tmp_path_factory.mktemp("chromium"),
                chromium=chromium)


def test_no_console_message_and_no_request(loaded):
    assert loaded.console == []
    assert loaded.requests == []


def test_screenshot_not_blank_and_shows_the_banner(loaded, html_sweep_small):
    from PIL import Image

    img = np.asarray(Image.open(loaded.screenshot).convert("RGB")).astype(int)
    assert img.shape == (1600, 1280, 3)
    assert (img.min(axis=2) < 200).mean() > 0.03  # ink, not a blank page
    top = img[:700]
    data = json.loads((html_sweep_small / "report.json").read_text())
    for verdict in {v["verdict"] for v in data["variants"]}:
        near = (np.abs(top - BANNER_RGB[verdict]).max(axis=2) <= 6).sum()
        assert near > 5000, (verdict, near)  # each banner is ~200 x 150 px of its colour


def test_dom_holds_every_section_and_one_row_per_clause(loaded, html_sweep_small):
    dom = ReportDom()
    dom.feed(loaded.dom)
    data = json.loads((html_sweep_small / "report.json").read_text())
    assert dom.sections == SECTIONS
    assert dom.banners == [(v["name"], v["verdict"]) for v in data["variants"]]
    assert {k: len(v) for k, v in dom.clauses.items()} == {
        v["name"]: len(v["clauses"]) for v in data["variants"]}
    assert json.loads(dom.data) == data
    n_tables = sum(1 for v in data["variants"] if v["flipped"])
    assert dom.sortable_headers == 11 * n_tables > 0  # the sort script ran


def test_the_checks_catch_a_bad_page(chromium, tmp_path):
    """The same load on a page that logs an error and fetches a remote image: both are seen."""
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><title>x</title><img src="https://example.org/a.png">'
                    '<script>console.error("boom"); missingFunction();</script>')
    got = load(page, tmp_path / "run", chromium=chromium, width=200, height=100)
    assert [m for _, m in got.console][:2] == [
        '"boom", source: ' + page.resolve().as_uri() + " (1)",
        '"Uncaught ReferenceError: missingFunction is not defined", source: '
        + page.resolve().as_uri() + " (1)"]
    assert got.requests == ["https://example.org/a.png"]
