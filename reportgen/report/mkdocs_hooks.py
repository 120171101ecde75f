"""mkdocs hook (``hooks:`` in mkdocs.yml): the Guides section of the nav lists the guide pages the
renderer wrote.

A card gets a guide only when a sweep stored decision-tree walks for it (``report/guides.py``), so
which guides exist depends on the sweeps that ran: after `reportgen sweep sweeps/consumer.yaml` the
four consumer cards have one, the other cards are linked to the Calculator from the guides index.
mkdocs.yml lists every catalog card's guide in the order the nav shows them; this hook drops the
entries whose page was not rendered, before mkdocs reads the files, so `mkdocs build --strict` checks
every other nav entry as before. Only the Guides section is filtered.
"""

from __future__ import annotations

from pathlib import Path

SECTION = "Guides"


def _page(entry) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and len(entry) == 1:
        value = next(iter(entry.values()))
        return value if isinstance(value, str) else None
    return None


def rendered_guides(nav: list, docs_dir: Path) -> list:
    """``nav`` with the Guides section's entries whose file is missing under ``docs_dir`` removed."""
    out = []
    for item in nav:
        if isinstance(item, dict) and SECTION in item and isinstance(item[SECTION], list):
            kept = [e for e in item[SECTION] if _page(e) is None or (docs_dir / _page(e)).is_file()]
            item = {SECTION: kept}
        out.append(item)
    return out


def on_config(config, **kwargs):
    if config.nav:
        config.nav = rendered_guides(config.nav, Path(config.docs_dir))
    return config
