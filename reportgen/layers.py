"""ARCHITECTURE.md's layers and the import graph of ``reportgen``, read from the source with ``ast``.

Nothing is imported: ``graph()`` parses every ``reportgen/**/*.py`` and lists the ``reportgen``
modules each one imports, the imports inside functions too (a lazy import is still a dependency).
``tests/test_import_graph.py`` holds the graph against the layer rule; ``report/calculator.py``
takes the calculator's file list from it (``closure``), so the bundle is the browser's entry and
the core and formulas it reaches, never a hand-written list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent

#: ARCHITECTURE.md's layers, highest first: the first prefix a module equals or starts with names its
#: layer (``reportgen`` itself, the package face, only by equality)
LAYERS = [
    (6, ("reportgen.cli", "reportgen.__main__", "reportgen.measure.cli", "reportgen.trace.cli", "reportgen.advise.cli",
         "reportgen.published.cli", "reportgen.report.cli", "reportgen.report.show", "reportgen.browser",
         "reportgen.views")),
    (5, ("reportgen.report",)),
    (4, ("reportgen.pipeline", "reportgen.runner", "reportgen.measure.runner", "reportgen.measure.cluster", "reportgen.measure.worker",
         "reportgen.trace.runner", "reportgen.advise.store")),
    (3, ("reportgen.store", "reportgen.result_schema", "reportgen.locks", "reportgen.artifacts",
        "reportgen.traced_results", "reportgen.measured", "reportgen.sweep")),
    (2, ("reportgen.trace", "reportgen.measure", "reportgen.advise", "reportgen.published")),
    (1, ("reportgen.estimate",)),
    (0, ("reportgen.errors", "reportgen.setup", "reportgen.model", "reportgen.config_check", "reportgen.hardware",
         "reportgen.catalog", "reportgen.results", "reportgen.provenance", "reportgen.fingerprint", "reportgen.format",
         "reportgen.configs", "reportgen.vision", "reportgen.gpu_profile", "reportgen.flags",
         "reportgen.layers", "reportgen.yamlfile", "reportgen.userfile", "reportgen.hub", "reportgen.datalengths",
         "reportgen")),
]


def layer_of(module: str) -> int:
    for layer, prefixes in LAYERS:
        if any(module == p or (p != "reportgen" and module.startswith(p + ".")) for p in prefixes):
            return layer
    raise LookupError(f"{module} is in no layer of ARCHITECTURE.md: add it there and to reportgen.layers.LAYERS")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(module: str) -> Path:
    """The file of a module: ``reportgen/x.py`` or, for a package, ``reportgen/x/__init__.py``."""
    base = ROOT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The ``reportgen`` modules a file imports (``from reportgen.x import y`` counts ``reportgen.x.y``
    when that is a module, else ``reportgen.x``); a package's ``__init__`` is not counted as the package's
    modules."""
    me = module_name(path)
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = me.split(".")[: len(me.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join(pkg + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out |= {n for n in names if n in modules and n != me}
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the ``reportgen`` modules it imports, for every module of the package."""
    return {m: set(i) for m, i in _graph().items()}


@lru_cache(maxsize=1)
def _graph() -> dict[str, frozenset[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in files}
    return {module_name(p): frozenset(imports_of(p, modules)) for p in files}


def closure(entries: Iterable[str], max_layer: int, g: dict[str, set[str]] | None = None) -> set[str]:
    """The modules the entries need: the entries, and every module imported by a module already in,
    except that an entry's imports above ``max_layer`` are not followed (the other commands of a
    front end). A non-entry module's imports are all followed, so a shipped module that imports a
    higher layer shows up in the result rather than being cut."""
    g = graph() if g is None else g
    entries = set(entries)
    out, todo = set(), list(entries)
    while todo:
        m = todo.pop()
        if m in out:
            continue
        out.add(m)
        todo += [i for i in g[m] if m not in entries or i in entries or layer_of(i) <= max_layer]
    return out
