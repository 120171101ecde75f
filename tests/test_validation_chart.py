"""The validation page's scatter: every published row and every GPU measurement of this project
against its estimate, one marker shape per source, with the error band; a CPU run is never a point."""

from __future__ import annotations

import json

import pytest

from reportgen.report import pages, render
from reportgen.report.rows import site_rows
from tests.fixtures.site_data import PUBLISHED, build_results


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("results")
    ids = build_results(d)
    site = render.load_site(d, commit=None)
    return site, ids


def test_points_are_published_rows_and_gpu_measurements_only(built):
    site, ids = built
    rows = [r for r in site_rows(site) if r["measured"]]
    published = pages._published(PUBLISHED)
    scatter = pages._validation_scatter(rows, published)
    pub = [p for p in scatter["points"] if p["source"] != pages.OWN_SOURCE]
    assert len(pub) == len(json.loads(PUBLISHED.read_text())["rows"])
    assert {p["source"] for p in pub} == {"fake-source/project"}  # two tables of one project: one marker
    own = [p for p in scatter["points"] if p["source"] == pages.OWN_SOURCE]
    expected = [(r["measured"][q] / 1e9, r[q] / 1e9) for r in rows for q in ("peak_allocated", "peak_reserved")
                if r["measured"].get(q)]
    assert sorted((p["x"], p["y"]) for p in own) == sorted(expected) and expected
    plotted_ids = {r["id"] for r in rows}
    assert ids["cpu"] and not plotted_ids & set(ids["cpu"])  # CPU runs: timings of the CPU, no GPU point
    assert {b["measure"] for b in scatter["bands"]} == {"allocated", "reserved"}
    assert all(b["lo"] <= b["hi"] for b in scatter["bands"])


def test_the_page_shows_the_scatter_above_the_tables(tmp_path, built):
    results = tmp_path / "results"
    build_results(results, measured=False)
    render.render_all(results, tmp_path / "docs", published=PUBLISHED, commit=None, providers=render.DATA_PROVIDERS)
    text = (tmp_path / "docs" / "validation.md").read_text()
    svg = (tmp_path / "docs" / "charts" / "validation-published.svg").read_text()
    assert text.index("charts/validation-published.svg") < text.index("## Compared with published measurements")
    assert "???+ info \"All" in text  # the compared rows are the content: open, not folded
    assert "y = x" in svg and "error band, reserved" in svg and "log scale" in svg


def test_no_published_file_and_no_measurement_means_no_scatter(tmp_path):
    results = tmp_path / "results"
    build_results(results, measured=False)
    render.render_all(results, tmp_path / "docs", published=tmp_path / "absent.json", commit=None,
                      providers=render.DATA_PROVIDERS)
    assert not (tmp_path / "docs" / "charts" / "validation-published.svg").exists()
    assert "validation-published" not in (tmp_path / "docs" / "validation.md").read_text()
