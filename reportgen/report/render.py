"""Render the site: result files -> providers' pages -> Jinja2 (StrictUndefined) -> ``docs/``.

``render_all`` reads every sweep under the results directory (one subdirectory per sweep), asks
every provider for its pages, renders each page's template with its view model, writes the
pages and their extra files (SVG charts, CSV downloads; bytes for the calculator's runtime) under
``docs/``, and removes what an earlier render wrote that this one no longer does
(``docs/.reportgen-manifest.json``). Hand-written ``docs/stylesheets`` and ``docs/javascripts`` are
never touched. Nothing here estimates or measures.

Templates live in ``reportgen/report/templates/`` and may use these filters:
``gib`` (bytes -> "12.34", GiB = 2**30), ``rate`` (tokens/s), ``pct`` (0.123 -> "12.3%"), ``money``,
``num`` (thousands separators, "-" for None), ``signed_pct`` (relative error, "+12.3%"), ``cell``
(a Markdown table cell: escaped, newlines as spaces), ``code`` (a Markdown code span of any text), ``fenced``
(a fenced code block of any text);
and the macros of ``_macros.md.j2`` (``legend()``, ``reproduce(repro)``, ``est()``, ``meas()``).

**Escaping.** Every value a template prints reaches the page as the text it is: Jinja2's autoescape
is on, and ``markdown_text`` (the environment's ``finalize``) also writes the characters Markdown
gives a meaning to (links and images ``[ ]``, attribute lists ``{ }``, code spans, table cells,
backslash escapes, emphasis) as character references, so a model path such as
``<img src=x onerror=...>`` or ``[x](javascript:...)`` is shown, never run. Text that is meant as
Markdown or HTML (docstrings of our own code, the decision tree's diagrams, badges built in Python)
is marked ``markupsafe.Markup`` where it is made; a value printed inside a code span goes through
``code``, not between backticks.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import jinja2
from markupsafe import Markup, escape

from reportgen import __version__
from reportgen.report.page import Page, SiteData
from reportgen import store
from reportgen.format import money, rate
from reportgen.published import DEFAULT_OUT

TEMPLATES = Path(__file__).parent / "templates"
MANIFEST = ".reportgen-manifest.json"
#: hand-written parts of docs/ that a render never writes or removes
PROTECTED = ("stylesheets", "javascripts")
DEFAULT_PUBLISHED = DEFAULT_OUT

#: this package's providers, then the other providers, imported lazily: a missing one is skipped
#: with a warning (``module:function``, each ``fn(site) -> list[Page]``)
DATA_PROVIDERS = (
    "reportgen.report.pages:home_pages",
    "reportgen.report.pages:gpu_pages",
    "reportgen.report.pages:model_pages",
    "reportgen.report.pages:validation_pages",
)
PROVIDERS = DATA_PROVIDERS + (
    "reportgen.report.guides:guide_pages",
    "reportgen.report.grpo_guides:grpo_guide_pages",
    "reportgen.report.techniques:technique_pages",
    "reportgen.report.methodology:methodology_pages",
    "reportgen.report.calculator:calculator_pages",
    "reportgen.report.configs:config_pages",
)

_warned: set[str] = set()


# ----- input -------------------------------------------------------------------------------------
def git_commit() -> str | None:
    """Commit of the code that renders (results carry their own reportgen version)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def load_site(results_dir: Path, commit: str | None = None, warn: store.Warn = store.stderr_warn) -> SiteData:
    """Every sweep under ``results_dir`` (a subdirectory with estimate files), each case with its
    measurements joined in (``store.load_results``) and its current traced figure, from any sweep
    (``traced_results.load_traced``: stale ones are skipped), as ``traced``; sorted by id. Files it
    cannot read are skipped with a warning; it never writes."""
    from reportgen.traced_results import load_traced

    results: dict[str, list[dict]] = {}
    traced = load_traced(results_dir, warn)
    if results_dir.is_dir():
        for sweep_dir in sorted(p for p in results_dir.iterdir() if p.is_dir()):
            rs = store.load_results(sweep_dir, warn)
            if rs:
                results[sweep_dir.name] = [{**r, "traced": traced.get(r["id"])} for r in rs]
    from reportgen.advise.store import load_advice

    return SiteData(results=results, reportgen_version=__version__, git_commit=commit,
                    advice=load_advice(results_dir, warn), traced=traced)


def providers(published: Path | None = DEFAULT_PUBLISHED,
              specs: tuple[str, ...] | None = None) -> list[tuple[str, Callable[[SiteData], list[Page]]]]:
    """The importable providers of ``specs`` (default ``PROVIDERS``), each as ``(spec, fn)``."""
    out = []
    for spec in PROVIDERS if specs is None else specs:
        module, _, name = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            if spec not in _warned:
                _warned.add(spec)
                print(f"warning: page provider {spec} is not available ({exc}); its pages are skipped",
                      file=sys.stderr)
            continue
        if spec.endswith(":validation_pages"):
            fn = functools.partial(fn, published=published)
        out.append((spec, fn))
    return out


# ----- Jinja -------------------------------------------------------------------------------------
def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:,}" if isinstance(x, int) else f"{x:,.1f}"


def _gib(n, digits: int = 2) -> str:
    return "-" if n is None else f"{n / 2**30:,.{digits}f}"


def _signed_pct(x, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:+.{digits}f}%"


def _pct(x, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


#: characters with a meaning in Markdown (and its extensions here: attr_list's ``{: ...}``, tables),
#: written as numeric character references in text: they read the same and mean nothing
_MARKDOWN = {ord(c): f"&#{ord(c)};" for c in "[]{}`|\\*"}


def markdown_text(value):
    """Any value as Markdown text that reads as itself (the environment's ``finalize``): HTML-escaped,
    Markdown's markup characters as character references, newlines as spaces. ``Markup`` (macros,
    text marked as Markdown where it is made) and non-strings (numbers) pass as they are."""
    if hasattr(value, "__html__") or not isinstance(value, str):
        return value
    return Markup(str(escape(value)).translate(_MARKDOWN).replace("\r", " ").replace("\n", " "))


def _cell(text) -> Markup:
    """A Markdown table cell: escaped (``|`` too), on one line."""
    if hasattr(text, "__html__"):
        return Markup(str(text).replace("|", "\\|").replace("\n", " "))
    return Markup(markdown_text(str(text)))


def _code(text) -> Markup:
    """``text`` as a Markdown code span (Markdown escapes ``<`` and ``&`` inside it): fenced by more
    backticks than any run in it, on one line."""
    s = " ".join(str(text).splitlines()).strip()
    if not s:
        return Markup("")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return Markup(f"{fence}{pad}{s}{pad}{fence}")


def _note(text) -> Markup:
    """A note's sentence as Markdown that reads as itself, underscores too: notes name keys such as
    ``model._component_``, which Markdown would set in italics."""
    return Markup(str(_cell(text)).replace("_", "&#95;"))


def case_id_cell(text) -> Markup:
    """A case id in a table's setup cell (issue 31: as a last column it was cut off by wide tables, and it is
    the handle ``reportgen show`` takes): an HTML code span that may wrap before its hash, on two lines at
    most (``<wbr>`` adds no character, so a copied id is whole)."""
    head, dot, tail = str(text).rpartition(".")
    return Markup(f'<code class="rg-id"><span>{escape(head)}{dot}</span><wbr><span>{escape(tail)}</span></code>')


def _fenced(text, lang: str = "", indent: int = 0) -> Markup:
    """``text`` as a fenced code block (Markdown escapes ``<`` and ``&`` inside it), fenced by more
    backticks than any run in it; every line after the first indented by ``indent`` spaces (the
    template indents the first)."""
    s = str(text).rstrip("\n")
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", s)), default=0) + 1)
    pad = " " * indent
    body = "\n".join(pad + line if line else "" for line in s.splitlines())
    return Markup(f"{fence}{lang}\n{body}\n{pad}{fence}")


def _join(items: Iterable, sep: str = "") -> Markup:
    """Jinja's ``join``, each item escaped as ``markdown_text`` does (the separator is the template's)."""
    return Markup(sep).join(markdown_text(x if isinstance(x, str) else str(x)) for x in items)


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        autoescape=True,
        finalize=markdown_text,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(gib=_gib, rate=rate, pct=_pct, money=money, num=_num, signed_pct=_signed_pct, cell=_cell,
                       code=_code, case_id=case_id_cell, note=_note, fenced=_fenced, join=_join)
    return env


def render_page(page: Page) -> str:
    return environment().get_template(page.template).render(**page.context)


# ----- output ------------------------------------------------------------------------------------
def _check_path(rel: str, owner: str) -> str:
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"{owner}: output path {rel!r} must be relative to docs/ and inside it")
    if p.parts[0] in PROTECTED:
        raise ValueError(f"{owner}: {rel!r} is under docs/{p.parts[0]}/, which is hand-written")
    return p.as_posix()


#: ``progress(stage, done, total)``: a render's stages are "pages", "charts" and "writing"
Progress = Callable[[str, int, int], None]


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


def build_outputs(site: SiteData, published: Path | None = DEFAULT_PUBLISHED,
                  specs: tuple[str, ...] | None = None,
                  progress: Progress = _no_progress) -> tuple[dict[str, str | bytes], list[str]]:
    """``({relative path: text or bytes}, [page paths])`` of every provider; fails on two writers of one
    path. Charts the pages plan (``chartjobs.ChartJob``) are drawn here, after every page."""
    from reportgen.report.chartjobs import ChartJob, draw_all

    outputs: dict[str, str | bytes | ChartJob] = {}
    owners: dict[str, str] = {}
    pages: list[str] = []
    found = providers(published, specs)
    progress("pages", 0, len(found))
    for k, (spec, fn) in enumerate(found):
        for page in fn(site):
            items = [(page.path, render_page(page))] + sorted(page.files.items())
            for rel, text in items:
                rel = _check_path(rel, spec)
                if rel in outputs:
                    raise ValueError(f"{rel} is written by both {owners[rel]} and {spec}")
                outputs[rel], owners[rel] = text, spec
            pages.append(_check_path(page.path, spec))
        progress("pages", k + 1, len(found))
    jobs = [v for v in outputs.values() if isinstance(v, ChartJob)]
    total = len({j.key for j in jobs})
    progress("charts", 0, total)
    drawn: dict[str, str] = {}
    for key, svg in draw_all(jobs):
        drawn[key] = svg
        progress("charts", len(drawn), total)
    return {rel: drawn[v.key] if isinstance(v, ChartJob) else v for rel, v in outputs.items()}, pages


def read_manifest(docs_dir: Path) -> dict:
    """The last render's manifest (``{}`` when there is none or it cannot be read)."""
    try:
        data = json.loads((Path(docs_dir) / MANIFEST).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def write_outputs(docs_dir: Path, outputs: dict[str, str | bytes], pages: list[str] | None = None,
                  inputs: str | None = None) -> None:
    """Write what changed (unchanged files keep their mtime for ``mkdocs serve``), remove what the
    last render wrote and this one did not, and record the list in the manifest, with the pages and
    the key of the inputs they were made from (``unchanged.py``)."""
    docs_dir.mkdir(parents=True, exist_ok=True)
    manifest = docs_dir / MANIFEST
    old = read_manifest(docs_dir).get("files", [])
    old = old if isinstance(old, list) else []
    for rel in sorted(outputs):
        target = docs_dir / rel
        data = outputs[rel] if isinstance(outputs[rel], bytes) else outputs[rel].encode()
        if target.is_file() and target.read_bytes() == data:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
    for rel in sorted(set(old) - set(outputs)):
        try:
            rel = _check_path(rel, "manifest")
        except ValueError:
            continue
        target = docs_dir / rel
        target.unlink(missing_ok=True)
        parent = target.parent
        while parent != docs_dir and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    record = {"generated_by": "reportgen render", "files": sorted(outputs), "pages": pages, "inputs": inputs}
    manifest.write_text(json.dumps(record, indent=1) + "\n")


class Rendered(list):
    """The pages of a render; ``unchanged``: none was rewritten, the inputs being those of the last."""

    def __init__(self, pages, unchanged: bool = False):
        super().__init__(pages)
        self.unchanged = unchanged

    def said(self, docs_dir) -> str:
        if self.unchanged:
            return f"site unchanged: its {len(self)} pages in {docs_dir} were made from these same results and code"
        return f"rendered {len(self)} pages into {docs_dir}"


def render_all(results_dir: Path, docs_dir: Path, published: Path | None = DEFAULT_PUBLISHED,
               commit: str | None | bool = True, providers: tuple[str, ...] | None = None,
               progress: Progress = _no_progress) -> list[Path]:
    """Re-render every sweep under ``results_dir`` into ``docs_dir`` from the result files alone.

    ``published``: the comparison with published measurements (``reportgen compare-published``),
    shown on the validation page when the file exists. ``commit``: True looks up the git commit of
    this code; a string or None sets it. ``providers``: ``module:function`` specs (default
    ``PROVIDERS``: all of them). ``progress(stage, done, total)`` hears of each step. Returns the
    pages written."""
    from reportgen.report.unchanged import render_key, unchanged

    commit = git_commit() if commit is True else commit or None
    key = render_key(Path(results_dir), published, commit, providers)
    same = unchanged(Path(docs_dir), read_manifest(Path(docs_dir)), key)
    if same is not None:  # nothing a page reads changed, and the pages are where the last render left them
        return Rendered([Path(docs_dir) / p for p in same], unchanged=True)
    site = load_site(Path(results_dir), commit)
    outputs, pages = build_outputs(site, published, providers, progress)
    progress("writing", 0, 1)
    write_outputs(Path(docs_dir), outputs, pages=[str(p) for p in pages], inputs=key)
    progress("writing", 1, 1)
    return Rendered([Path(docs_dir) / p for p in pages])
