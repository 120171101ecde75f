"""The built site as a reader sees it: headless Chromium opens the home page, a GPU page, a guide
page and the validation page, and checks that nothing errs, every image loads, Mermaid diagrams
become SVG (from the vendored mermaid, no network) and search finds a model.

Needs Debian's ``chromium`` and ``chromium-driver`` (``apt-get install chromium chromium-driver``)
and selenium; skipped without them. Screenshots land in the test's tmp dir (printed with ``-s``)."""

from __future__ import annotations

import functools
import http.server
import threading
import time
from pathlib import Path

import pytest

from reportgen.advise.store import write_advice
from reportgen.sweep import load_sweep
from tests import chromium
from tests.fixtures.site_data import SWEEPS, build_results
from tests.test_render import build_site

pytestmark = [pytest.mark.browser, chromium.needs_chromium]

#: forces Material's closed shadow roots (Mermaid diagrams) open so the test can look inside
OPEN_SHADOW = ("const attach = Element.prototype.attachShadow;"
               "Element.prototype.attachShadow = function (init) { return attach.call(this, {...init, mode: 'open'}); };")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served_site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    work = tmp_path_factory.mktemp("browser-site")
    results = work / "results"
    build_results(results)
    write_advice(load_sweep(SWEEPS[0]), results)  # the walks behind the guides (a card without walks has no guide)
    site = build_site(results, work)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = chromium.start(tmp_path_factory.mktemp("chromium-profile"), logging={"browser": "ALL"})
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": OPEN_SHADOW})
    yield driver
    driver.quit()


def wait_for(fn, timeout: float = 20.0, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def open_page(driver, url: str, shots: Path, name: str) -> None:
    driver.get(url)
    wait_for(lambda: driver.execute_script("return document.readyState") == "complete", what=f"{url} to load")
    wait_for(lambda: driver.execute_script(
        "return Array.from(document.images).every(i => i.complete)"), what=f"images of {url}")
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"{url}: console errors {errors}"
    broken = driver.execute_script(
        "return Array.from(document.images).filter(i => !(i.naturalWidth > 0)).map(i => i.src)")
    assert not broken, f"{url}: images that did not load: {broken}"
    alts = driver.execute_script("return Array.from(document.querySelectorAll('article img')).map(i => i.alt)")
    assert all(a.strip() for a in alts), f"{url}: an image without alt text"
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1400, min(height, 8000))
    driver.save_screenshot(str(shots / f"{name}.png"))
    driver.execute_script("document.body.setAttribute('data-md-color-scheme', 'slate')")
    driver.save_screenshot(str(shots / f"{name}-dark.png"))
    driver.execute_script("document.body.setAttribute('data-md-color-scheme', 'default')")
    driver.set_window_size(1400, 1000)


def mermaid_svgs(driver) -> int:
    """Mermaid diagrams that Material turned into SVG (``pre.mermaid`` -> ``div.mermaid`` + shadow SVG)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('div.mermaid'))"
        ".filter(d => d.shadowRoot && d.shadowRoot.querySelector('svg')).length")


def test_pages_load_cleanly(served_site, browser, tmp_path):
    print(f"\nscreenshots: {tmp_path}")
    pages = {"home": "", "gpu": "gpus/rtx-4090/", "guide": "guides/rtx-4090/", "validation": "validation/",
             "model": "models/llama-3.1-8b/"}
    for name, path in pages.items():
        open_page(browser, served_site + path, tmp_path, name)
        n_code = browser.execute_script("return document.querySelectorAll('pre.mermaid').length")
        if name in ("home", "guide") or n_code:
            if name == "guide" and "Stub:" in browser.page_source:
                continue  # the guide provider is not there yet: its page is a stub without a diagram
            wait_for(lambda: mermaid_svgs(browser) > 0 and not browser.execute_script(
                "return document.querySelectorAll('pre.mermaid').length"), what=f"mermaid SVG on {name}")
    assert (tmp_path / "home.png").is_file()


def test_mermaid_comes_from_the_site_not_a_cdn(served_site, browser):
    browser.get(served_site)
    wait_for(lambda: mermaid_svgs(browser) > 0, what="mermaid SVG")
    sources = browser.execute_script("return Array.from(document.scripts).map(s => s.src).filter(Boolean)")
    assert any("javascripts/vendor/mermaid" in s for s in sources)
    assert all(s.startswith(served_site) for s in sources), sources


def test_search_finds_a_model(served_site, browser):
    browser.get(served_site + "gpus/")
    wait_for(lambda: browser.execute_script("return document.readyState") == "complete", what="page")
    from selenium.webdriver.common.by import By

    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    browser.execute_script("arguments[0].focus()", box)
    box.send_keys("tinyllama")
    items = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item"), timeout=30,
                     what="search results")
    text = " ".join(i.text for i in items).lower()
    assert "tinyllama" in text


#: displayed size (CSS px) of every label in the page's Mermaid diagrams: font size x the SVG's scale
MERMAID_TEXT_PX = """
const out = [];
for (const div of document.querySelectorAll('div.mermaid')) {
  const svg = div.shadowRoot && div.shadowRoot.querySelector('svg');
  if (!svg) continue;
  for (const el of svg.querySelectorAll('text, foreignObject span, foreignObject p')) {
    if (!el.textContent.trim() || !el.getBoundingClientRect().height) continue;
    const m = (el.closest('foreignObject') || el).getScreenCTM();
    out.push([parseFloat(getComputedStyle(el).fontSize) * Math.hypot(m.a, m.b), el.textContent.trim()]);
  }
}
return out;"""


@pytest.mark.parametrize("path", ["guides/rtx-4090/", "guides/"])
def test_decision_tree_text_is_readable_at_1400_px(served_site, browser, path):
    browser.set_window_size(1400, 1000)
    browser.get(served_site + path)
    n = wait_for(lambda: browser.execute_script("return document.querySelectorAll('div.mermaid').length"),
                 what="mermaid diagrams")
    wait_for(lambda: mermaid_svgs(browser) == n, what="every diagram drawn")
    sizes = browser.execute_script(MERMAID_TEXT_PX)
    assert len(sizes) > 20, sizes  # the whole tree is there: every box and edge label
    smallest = min(sizes)
    assert smallest[0] >= 12, f"{path}: diagram text {smallest[1]!r} shows at {smallest[0]:.1f} px"


#: ``[[displayed px, text, chart]]`` of every text of every chart on the page: the font size in the SVG's
#: units times the scale the page shows the chart at (its content box over the SVG's viewBox width)
CHART_TEXT_PX = """
const done = arguments[arguments.length - 1];
(async () => {
  const out = [];
  for (const img of document.querySelectorAll('article img.rg-chart')) {
    const doc = new DOMParser().parseFromString(await (await fetch(img.src)).text(), 'image/svg+xml');
    const style = getComputedStyle(img);
    const shown = img.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const scale = shown / doc.documentElement.viewBox.baseVal.width;
    for (const t of doc.querySelectorAll('text')) {
      const m = /([\\d.]+)px/.exec(t.getAttribute('style') || '');
      if (m && t.textContent.trim()) out.push([parseFloat(m[1]) * scale, t.textContent.trim(), img.src]);
    }
  }
  done(out);
})();"""

#: cells a reader cannot see whole: text wider than its cell, or a cell that sticks out of a box that
#: does not scroll (it is cut off, or runs off the page); sticking out of a box that scrolls is fine
CLIPPED_CELLS = """
const bad = [];
for (const td of document.querySelectorAll('article td, article th')) {
  const r = td.getBoundingClientRect();
  if (!r.width) continue;
  if (td.scrollWidth > td.clientWidth + 1) { bad.push(td.textContent.trim()); continue; }
  for (let a = td.parentElement; a && a !== document.documentElement; a = a.parentElement) {
    const box = a.getBoundingClientRect();
    if (r.right <= box.right + 1 && r.left >= box.left - 1) continue;
    const ox = getComputedStyle(a).overflowX;
    if (ox !== 'auto' && ox !== 'scroll') bad.push(td.textContent.trim());
    break;
  }
}
return bad;"""


@pytest.mark.parametrize("path", ["", "gpus/rtx-4090/", "models/llama-3.1-8b/", "validation/"])
def test_chart_text_is_at_least_11_px_as_shown(served_site, browser, path):
    browser.set_window_size(1400, 1000)
    browser.set_script_timeout(30)
    browser.get(served_site + path)
    wait_for(lambda: browser.execute_script(
        "return Array.from(document.images).every(i => i.complete)"), what="charts")
    browser.execute_script("document.querySelectorAll('.tabbed-set input').forEach(i => i.checked = true)")
    sizes = [s for s in browser.execute_async_script(CHART_TEXT_PX) if s[0] > 0]  # charts in hidden tabs: 0
    assert sizes, f"{path}: no chart text found"
    smallest = min(sizes)
    assert smallest[0] >= 11, f"{path}: {smallest[1]!r} in {smallest[2]} shows at {smallest[0]:.1f} px"


@pytest.mark.parametrize("path", ["gpus/rtx-4090/", "validation/", "guides/rtx-4090/", "models/llama-3.1-8b/"])
def test_wide_tables_clip_no_cell(served_site, browser, path):
    browser.set_window_size(1400, 1000)
    browser.get(served_site + path)
    wait_for(lambda: browser.execute_script("return document.readyState") == "complete", what="page")
    assert browser.execute_script("return document.querySelectorAll('article td').length") > 10
    clipped = browser.execute_script(CLIPPED_CELLS)
    assert not clipped, f"{path}: cells cut off: {clipped[:5]}"
    wide = browser.execute_script("return Array.from(document.querySelectorAll('.md-typeset__scrollwrap'))"
                                  ".filter(w => w.scrollWidth > w.clientWidth + 1).length")
    if wide:  # the check sees a cut: the same wide table in a box that hides its overflow
        browser.execute_script("document.querySelectorAll('.md-typeset__scrollwrap')"
                               ".forEach(w => w.style.overflowX = 'hidden')")
        assert browser.execute_script(CLIPPED_CELLS)
