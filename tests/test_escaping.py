"""Anything a user typed reaches a page as text (issue 20): model paths, config fields and measurement
errors full of HTML, Markdown links and attribute lists go through a real sweep, render and
``mkdocs build --strict``, and no built page holds them as markup."""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from reportgen import store
from reportgen.cli import main
from reportgen.report.render import _code, environment, markdown_text
from reportgen.results import read_result
from tests.fixtures.site_data import fake_block

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "reportgen" / "catalog" / "models" / "llama-3.2-1b.json"

#: the audit's model paths, and Markdown that would make a link or set an attribute
FOLDERS = ("<img src=x onerror=alert(4)>", "<script>alert(5)", "[x](javascript:alert(6))",
           "y { onclick=alert(7) #z", "q`<b>`|e*m*")


class Markup(HTMLParser):
    """What a page does with markup: event handlers, javascript: links, images, scripts' text, <b>."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._script = False

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("onerror", "onclick") or (name in ("href", "src") and (value or "").startswith("javascript:")):
                self.found.append(f"<{tag} {name}={value!r}>")
        if (tag == "img" and dict(attrs).get("src") == "x") or tag == "b":
            self.found.append(f"<{tag} {attrs}>")
        self._script = tag == "script"

    def handle_data(self, data):
        if self._script and "alert(" in data:
            self.found.append(f"<script>{data[:40]}")

    def handle_endtag(self, tag):
        self._script = False


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    from tests.test_render import build_site

    work = tmp_path_factory.mktemp("escaping")
    models = []
    for i, name in enumerate(FOLDERS):
        folder = work / "models" / name
        folder.mkdir(parents=True)
        config = json.loads(CONFIG.read_text())
        config["_name_or_path"] = f"<img src=x onerror=alert({i})>"
        (folder / "config.json").write_text(json.dumps(config))
        models.append(str(folder))
    sweep = work / "s.yaml"
    sweep.write_text("name: nasty\ndescription: '<script>alert(8)</script>'\ngrids:\n  - model: "
                     + json.dumps(models) + "\n    gpu: rtx-4090\n    method: [lora, qlora]\n")
    results = work / "results"
    assert main(["sweep", str(sweep), "--results", str(results), "--no-render"]) == 0
    # a measurement that failed with a message full of markup, and one whose environment has some
    cases = sorted((results / "nasty").glob("*.json"))
    failed, ok = read_result(cases[0]), read_result(cases[1])
    block = fake_block("rtx-4090", {"gpu_name": "<img src=x onerror=alert(9)>"}, status="error")
    block["error"] = "RuntimeError: <script>alert(10)</script> [x](javascript:alert(11))"
    store.add_measurement(results / "nasty", failed["id"], failed["case"], block)
    block = fake_block("rtx-4090", {"gpu_name": "<img src=x onerror=alert(12)>", "driver": "[d](javascript:x)"})
    mem = ok["estimate"]["memory"]
    block["measurement"] = {"peak_allocated": mem["peak_allocated"], "peak_reserved": mem["peak_reserved"],
                            "device_used": mem["device_total"], "tokens_per_s": 1000.0}
    store.add_measurement(results / "nasty", ok["id"], ok["case"], block)
    return build_site(results, work), work


def test_no_page_holds_markup_from_input(site):
    site_dir, _ = site
    pages = sorted(site_dir.rglob("*.html"))
    assert len(pages) > 40
    seen = 0
    for page in pages:
        html = page.read_text()
        parser = Markup()
        parser.feed(html)
        assert not parser.found, f"{page.relative_to(site_dir)}: {parser.found[:3]}"
        seen += "&lt;img src=x onerror=alert(4)&gt;" in html
    assert seen >= 3  # home, the GPU page, validation and the guide show the model, escaped


def test_the_model_reads_as_typed(site):
    """Escaped, not mangled: the GPU page shows each path as the user wrote it."""
    site_dir, work = site
    html = (site_dir / "gpus" / "rtx-4090" / "index.html").read_text()
    text = re.sub(r"<[^>]+>", "", html)
    import html as H

    text = H.unescape(text)
    for name in FOLDERS:
        assert str(work / "models" / name) in text, name


def test_a_model_given_by_path_links_to_no_missing_page(site):
    """A model page exists only for catalog models; ``build_site`` ran ``mkdocs build --strict``, which
    fails on a link to a page that was never generated (the audit's case)."""
    site_dir, _ = site
    assert (site_dir / "index.html").is_file() and not list((site_dir / "models").glob("*img*"))


@pytest.mark.parametrize("value", ["<img src=x>", "[a](javascript:x)", "a { onclick=x }", "`code`", "a|b", "a\\",
                                   "*em*", "line\nbreak", "&amp;"])
def test_markdown_text_leaves_no_markup(value):
    import markdown

    out = markdown.markdown("### x " + str(markdown_text(value)) + " y", extensions=["attr_list", "tables"])
    assert re.findall(r"<(\w+)", out) == ["h3"] and out.count("<") == out.count(">") == 2, out
    import html as H

    assert H.unescape(re.sub(r"<[^>]+>", "", out)).strip() == "x " + value.replace("\n", " ") + " y"
    assert "onclick=" not in re.search(r"<h3[^>]*>", out).group(0)


@pytest.mark.parametrize("value", ["plain", "a`b", "``x``", "<script>", "a|b"])
def test_code_spans_show_any_text(value):
    import markdown

    out = markdown.markdown("| c |\n|--|\n| " + _code(value) + " |", extensions=["tables"])
    import html as H

    assert "<script>" not in out and H.unescape(re.search(r"<code>(.*)</code>", out).group(1)) == value


def test_templates_escape_by_default():
    assert environment().autoescape is True or callable(environment().autoescape)
    page = environment().from_string("{{ x }} {{ y | cell }}").render(x="<b>[a](b)</b>", y="1|2")
    assert "<b>" not in page and "[a]" not in page and "1|2" not in page


def test_the_built_site_keeps_working_links(site):
    """``build_site`` already asserted ``mkdocs build --strict`` passed; the results dir holds nothing
    outside results/ (the model folders sit under the work dir, not next to any output)."""
    _, work = site
    for name in FOLDERS:
        assert sorted(p.name for p in (work / "models" / name).iterdir()) == ["config.json"]
    shutil.rmtree(work / "models")  # the site does not need them once built
