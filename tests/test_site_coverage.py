"""Coverage (issue 12): after the README's main command no page says that no sweep covers it, and
every link of the built site, the nav included, resolves (``mkdocs build --strict`` plus a check of
every relative href in the HTML)."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

import pytest

from reportgen.advise.store import advice_keys
from tests.fixtures.site_data import build_results
from tests.test_render import ROOT, build_site

README_COMMAND = "reportgen sweep sweeps/consumer.yaml"


def test_the_readme_runs_the_consumer_sweep():
    assert README_COMMAND in (ROOT / "README.md").read_text()


def _local_targets(html: str):
    for href in re.findall(r'href="([^"]+)"', html):
        parts = urlsplit(href)
        if parts.scheme or parts.netloc or not parts.path or href.startswith(("mailto:", "javascript:")):
            continue
        yield unquote(parts.path)


def test_site_after_the_readme_command_has_no_empty_guide_and_no_dead_link(tmp_path, consumer_walks):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    results = tmp_path / "results"
    build_results(results, measured=False)  # the data pages: the fixture sweeps' estimates
    consumer = consumer_walks.sweep
    # the guides: the walks the README's command stores (write_advice, once per run: conftest.py)
    assert consumer_walks.stats.failed == 0 and consumer_walks.stats.written == len(list(advice_keys(consumer)))
    consumer_walks.copy_into(results)
    site = build_site(results, tmp_path / "work")
    docs = tmp_path / "work" / "docs"

    walked = sorted({gpu for _, gpu, _ in advice_keys(consumer)})
    assert sorted(p.stem for p in (docs / "guides").glob("*.md") if p.stem != "index") == walked
    for page in sorted(docs.rglob("*.md")) + sorted(site.rglob("*.html")):
        assert "no sweep covers" not in page.read_text().lower(), page

    # the Guides nav lists exactly the guides that exist
    home = (site / "index.html").read_text()
    nav_guides = set(re.findall(r'href="guides/([a-z0-9.-]+)/"', home))
    assert nav_guides == set(walked)

    dead = []
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html":  # mkdocs writes its links from the site root, for any URL
            continue
        for target in _local_targets(page.read_text()):
            path = (page.parent / target).resolve()
            if not (path.is_file() or (path / "index.html").is_file()):
                dead.append(f"{page.relative_to(site)} -> {target}")
    assert not dead, dead[:20]
