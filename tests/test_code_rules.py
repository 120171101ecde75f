"""The developers' guide's code rules that a machine can check: no function over 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 80
#: functions allowed past the limit, each with why: splitting ``run_trace`` changes a trace source, which makes every
#: committed trace stale (``fingerprint.TRACE_SOURCES``); it is split when the tracer next changes for a reason
ALLOWED = {("reportgen/trace/step.py", "run_trace")}


def long_functions(root: Path = ROOT) -> list[tuple[str, str, int]]:
    out = []
    for path in sorted([*root.joinpath("reportgen").rglob("*.py"), *root.joinpath("scripts").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    out.append((path.relative_to(root).as_posix(), node.name, lines))
    return out


def test_no_function_is_longer_than_80_lines():
    over = [f for f in long_functions() if f[:2] not in ALLOWED]
    assert not over, f"functions over {MAX_LINES} lines (split them at their seams): {over}"


def test_the_check_sees_a_long_function(tmp_path):
    (tmp_path / "reportgen").mkdir()
    (tmp_path / "scripts").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "reportgen" / "m.py").write_text(f"def f():\n{body}\n")
    assert long_functions(tmp_path) == [("reportgen/m.py", "f", MAX_LINES + 1)]
