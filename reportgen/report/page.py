"""The contract between page providers and the renderer.

A provider is a function ``provider(site: SiteData) -> list[Page]``. It turns stored results and
catalog data into view models (plain dicts/lists of str/int/float/bool/None); it never estimates
or measures. ``reportgen.report.render.render_all`` calls every provider, renders each page's
template with Jinja2 (StrictUndefined) and writes it, plus any extra files, under ``docs/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Page:
    path: str  # relative to the docs directory, POSIX, e.g. "guides/rtx-4090.md"
    template: str  # template name under reportgen/report/templates/, e.g. "guide.md.j2"
    context: dict  # the view model the template sees
    #: extra files (relative path -> content): text, or bytes for binary assets (the calculator's runtime)
    files: dict[str, str | bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class SiteData:
    results: dict[str, list[dict]]  # sweep name -> result dicts sorted by case id
    reportgen_version: str
    git_commit: str | None  # of the code that renders (results carry their own)
    #: sweep name -> decision-tree walks stored at sweep time (``reportgen.advise.store``)
    advice: dict[str, list[dict]] = field(default_factory=dict)
    #: case id -> its current traced document (``reportgen.traced_results``), every sweep's; the
    #: results of the same case carry it as ``traced``
    traced: dict[str, dict] = field(default_factory=dict)

    def all_results(self) -> list[dict]:
        return [r for name in sorted(self.results) for r in self.results[name]]
