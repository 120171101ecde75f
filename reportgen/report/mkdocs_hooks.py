"""mkdocs hook (``hooks:`` in mkdocs.yml): the Guides section of the nav lists the guide pages the
renderer wrote.

A card gets a guide only when a sweep stored decision-tree walks for it (``report/guides.py``), so
which guides exist depends on the sweeps that ran: after `reportgen sweep sweeps/consumer.yaml` the
four consumer cards have one, the other cards are linked to the Calculator from the guides index.
mkdocs.yml lists every catalog card's guide in the order the nav shows them; this hook drops the
entries whose page was not rendered, before mkdocs reads the files, so `mkdocs build --strict` checks
every other nav entry as before. Only the Guides section is filtered; the GRPO guides (one per model and card
a sweep covers, ``report/grpo_guides.py``) are added to it as they were rendered.
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


#: the GRPO guides' folder under ``docs/`` (``report/grpo_guides.py``): one page per (model, GPU) a sweep covers
GRPO_DIR = "guides/grpo"


def grpo_guides(nav: list, docs_dir: Path) -> list:
    """``nav`` with a GRPO entry at the end of the Guides section: the GRPO guides' index and every page the
    renderer wrote under ``guides/grpo/`` (which exist depends on the sweeps, as for the cards' guides)."""
    folder = docs_dir / GRPO_DIR
    if not (folder / "index.md").is_file():
        return nav
    pages = [f"{GRPO_DIR}/index.md"] + [f"{GRPO_DIR}/{p.name}" for p in sorted(folder.glob("*.md"))
                                        if p.name != "index.md"]
    out = []
    for item in nav:
        if isinstance(item, dict) and SECTION in item and isinstance(item[SECTION], list):
            item = {SECTION: item[SECTION] + [{"GRPO": pages}]}
        out.append(item)
    return out


def on_config(config, **kwargs):
    if config.nav:
        config.nav = grpo_guides(rendered_guides(config.nav, Path(config.docs_dir)), Path(config.docs_dir))
    return config
