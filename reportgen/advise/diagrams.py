"""The decision tree as one small Mermaid flowchart per stage, for the site.

The whole tree in one flowchart (``tree.mermaid``, ``reportgen advise --mermaid``) is about 2,500 px
wide: a page shrinks it to its column and the text ends up 5-6 px high. Cut per stage, each chart is
a few boxes wide and shows at Mermaid's own text size. An edge to another stage ends in a
"continue at" box naming that stage; the result stage carries the options beyond one card. The
defaults (a chain of three) and the result (one end fans out into five options) run left to right.
"""

from __future__ import annotations

from reportgen.advise import tree as T


def _node(n) -> str:
    label = T._mermaid_text(n.label)
    if isinstance(n, T.Check):
        return f'{n.id}{{"{label}"}}'
    if isinstance(n, T.End):
        return f'{n.id}(["{label}"])'
    return f'{n.id}["{label}"]'


def _edges(n) -> list[tuple[str, str | None]]:
    """``(target, label)`` of a node's edges."""
    if isinstance(n, T.Action):
        return [(n.next, None)]
    if isinstance(n, T.Check):
        return list((target, outcome) for outcome, target in n.edges.items())
    return []


def stage_diagram(stage: str) -> str:
    members = [n for n in T.NODES if n.stage == stage]
    ids = {n.id for n in members}
    lines = ["flowchart LR" if stage in ("defaults", "result") else "flowchart TD"]
    lines += [f"    {_node(n)}" for n in members]
    exits: dict[str, str] = {}
    for n in members:
        for target, outcome in _edges(n):
            if target not in ids:
                other = T.BY_ID[target].stage
                exits.setdefault(other, f"to_{other}")
                target = exits[other]
            arrow = f" -- {outcome} --> " if outcome else " --> "
            lines.append(f"    {n.id}{arrow}{target}")
    for other, node_id in exits.items():
        lines.append(f'    {node_id}>"continue at {T._mermaid_text(T.STAGES[other])}"]')
    ends = [n for n in members if isinstance(n, T.End) and n.options]
    if ends:
        for o in T.OPTIONS:
            lines.append(f'    {T.option_node_id(o.id)}["{T._mermaid_text(o.label)}"]')
        for n in ends:
            lines += [f"    {n.id} -.-> {T.option_node_id(oid)}" for oid in n.options]
    lines.append("    classDef check fill:#fff8e1,stroke:#f9a825")
    lines.append("    classDef done fill:#e8f5e9,stroke:#2e7d32")
    lines.append("    classDef stop fill:#ffebee,stroke:#c62828")
    lines.append("    classDef exit fill:#eeeeee,stroke:#757575")
    for cls, pick in (("check", lambda n: isinstance(n, T.Check)),
                      ("done", lambda n: isinstance(n, T.End) and n.verdict == "fits"),
                      ("stop", lambda n: isinstance(n, T.End) and n.verdict != "fits")):
        chosen = [n.id for n in members if pick(n)]
        if chosen:
            lines.append(f"    class {','.join(chosen)} {cls}")
    if exits:
        lines.append(f"    class {','.join(exits.values())} exit")
    return "\n".join(lines)


def stage_diagrams() -> list[dict]:
    """``[{"stage", "title", "mermaid"}]`` in the tree's order, options with the result."""
    return [{"stage": s, "title": title, "mermaid": stage_diagram(s)}
            for s, title in T.STAGES.items() if any(n.stage == s for n in T.NODES)]
