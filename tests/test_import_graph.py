"""The import graph of ``reportgen`` (ARCHITECTURE.md): no module imports, directly or through others,
a module that imports it back, counting the imports inside functions too (a lazy import is still a
dependency). Read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "reportgen"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) for p in files}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    g = graph()
    assert "reportgen.report.charts" in g["reportgen.report.chartjobs"] or \
        "reportgen.report.chartjobs" in g["reportgen.report.charts"]
    assert "reportgen.estimate.time" in g["reportgen.estimate"]  # the package face hands names on


#: cycles known today, each with the move that removes it (keep this shrinking)
KNOWN_CYCLES = {
    # trace/spec.py takes the install hint from trace/cli.py inside a function; it is errors.MEASURE_EXTRA
    # now, but editing spec.py changes the trace hash and so needs a re-trace of the committed traced
    # files (about 45 min on two cores): import it from reportgen.errors with the next re-trace
    ("reportgen.trace.cli", "reportgen.trace.result", "reportgen.trace.spec"),
}


def test_no_import_cycle():
    found = [c for c in cycles(graph()) if tuple(c) not in KNOWN_CYCLES]
    assert not found, "modules that import each other (ARCHITECTURE.md): " + "; ".join(" <-> ".join(c) for c in found)


#: ARCHITECTURE.md's layers: the first prefix a module starts with names its layer
LAYERS = [
    (6, ("reportgen.cli", "reportgen.__main__", "reportgen.measure.cli", "reportgen.trace.cli", "reportgen.advise.cli",
         "reportgen.published.cli", "reportgen.report.cli", "reportgen.report.show", "reportgen.browser")),
    (5, ("reportgen.report", "reportgen.advise.pages")),
    (4, ("reportgen.runner", "reportgen.measure.runner", "reportgen.measure.cluster", "reportgen.measure.worker",
         "reportgen.trace.runner", "reportgen.advise.store")),
    (3, ("reportgen.store", "reportgen.traced_results", "reportgen.measured", "reportgen.sweep")),
    (2, ("reportgen.trace", "reportgen.measure", "reportgen.advise", "reportgen.published")),
    (1, ("reportgen.estimate",)),
    (0, ("reportgen.errors", "reportgen.setup", "reportgen.model", "reportgen.config_check", "reportgen.hardware",
         "reportgen.catalog", "reportgen.results", "reportgen.provenance", "reportgen.fingerprint", "reportgen.views",
         "reportgen.configs", "reportgen.flags", "reportgen")),
]

#: imports that run up today, each with the move that removes it (issue 18): keep this list shrinking
KNOWN_UP = {
    ("reportgen.trace.spec", "reportgen.trace.cli"): "the install hint: see KNOWN_CYCLES",
}


def layer_of(module: str) -> int:
    for layer, prefixes in LAYERS:
        if any(module == p or (p != "reportgen" and module.startswith(p + ".")) for p in prefixes):
            return layer
    raise AssertionError(f"{module} is in no layer of ARCHITECTURE.md: add it there and to LAYERS")


def test_every_module_has_a_layer():
    for module in graph():
        layer_of(module)


def test_imports_run_down_or_across_only():
    up = {(m, i) for m, imports in graph().items() for i in imports if layer_of(i) > layer_of(m)}
    new = sorted(up - set(KNOWN_UP))
    assert not new, "imports that run up a layer (ARCHITECTURE.md): " + "; ".join(f"{a} -> {b}" for a, b in new)
    gone = sorted(set(KNOWN_UP) - up)
    assert not gone, f"no longer imported, remove from KNOWN_UP: {gone}"


def test_nothing_imports_the_cli_but_its_two_front_ends():
    """``reportgen.cli`` is imported by ``__main__`` and by the calculator's ``browser`` (which runs the
    CLI's own ``estimate`` command in Pyodide) only; the commands' shared flags live in ``flags``."""
    users = sorted(m for m, imports in graph().items() if "reportgen.cli" in imports)
    assert users == ["reportgen.__main__", "reportgen.browser"], users
