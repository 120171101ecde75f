"""The import graph of ``reportgen`` (ARCHITECTURE.md): no module imports, directly or through others,
a module that imports it back, counting the imports inside functions too (a lazy import is still a
dependency), and every import runs down or across the layers of ``reportgen.layers.LAYERS``. Read
from the source with ``ast`` (``reportgen.layers.graph``); nothing is imported."""

from __future__ import annotations

from reportgen.layers import graph, layer_of


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
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def test_no_import_cycle():
    found = [c for c in cycles(graph()) if tuple(c) not in KNOWN_CYCLES]
    assert not found, "modules that import each other (ARCHITECTURE.md): " + "; ".join(" <-> ".join(c) for c in found)


#: imports that run up today, each with the move that removes it (issue 18): keep this list shrinking
KNOWN_UP: dict[tuple[str, str], str] = {}


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
