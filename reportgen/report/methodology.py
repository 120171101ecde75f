"""The methodology page: every formula with its source, the three memory numbers, the step
timeline, the time model, the calibration constants, validation and known limitations.

The formula and source lists are generated from the estimator's own docstrings and constant
comments, read from the source files with ``ast`` (nothing is imported that could need torch,
nothing is estimated), so the page cannot drift from the code. The rest is prose in
``templates/methodology.md.j2``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

from markupsafe import Markup

from reportgen.fingerprint import ESTIMATOR_SOURCES, estimator_hash
from reportgen.report.page import Page, SiteData
from reportgen.report.rows import environment_of, measured_results, site_rows
from reportgen.format import TERM_LABELS

PATH = "methodology.md"

#: estimator modules in the order the page explains them
MODULES = (
    "reportgen.model",
    "reportgen.estimate.dtypes",
    "reportgen.estimate.params",
    "reportgen.estimate.activations",
    "reportgen.estimate.logits",
    "reportgen.estimate.recipes",
    "reportgen.estimate.memory",
    "reportgen.estimate.time",
    "reportgen.estimate.work",
    "reportgen.estimate.search",
)
CONSTANT_MODULES = ("reportgen.estimate.constants", "reportgen.estimate.params")
#: the docstring that says how a measurement is made
HARNESS = "reportgen.measure.harness"


# ----- reading code metadata ---------------------------------------------------------------------
@lru_cache(maxsize=None)
def _source(module: str) -> tuple[str, str]:
    """(source text, path relative to the repository) of a module, without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise ImportError(module)
    path = Path(spec.origin)
    rel = path.as_posix()
    if "/reportgen/" in rel:
        rel = "reportgen/" + rel.rsplit("/reportgen/", 1)[1]
    return path.read_text(), rel


def rst_to_md(text: str) -> Markup:
    """A docstring as Markdown: ``code`` -> `code`, and a blank line before a list that follows
    a paragraph line (Python-Markdown needs it)."""
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    out: list[str] = []
    for line in text.splitlines():
        item = re.match(r"^(\* |- |\d+\. )", line)
        if item and out and out[-1].strip() and not re.match(r"^\s*(\* |- |\d+\. )", out[-1]) \
                and not out[-1].startswith("  "):
            out.append("")
        out.append(line)
    return Markup("\n".join(out).strip())  # Markdown of our own docstrings: printed as it is


def _find(tree: ast.AST, qualname: str):
    node = tree
    for part in qualname.split("."):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and child.name == part:
                node = child
                break
        else:
            return None
    return node


def function_doc(ref: str) -> dict:
    """``"module:qualname"`` -> ``{name, module, path, line, doc}`` (doc as Markdown, "" if none);
    a bare ``"module"`` gives the module's docstring."""
    module, _, qualname = ref.partition(":")
    text, rel = _source(module)
    if not qualname:
        return {"name": "(module)", "module": module.rsplit(".", 1)[-1], "path": rel, "line": 1, "ref": ref,
                "doc": rst_to_md(ast.get_docstring(ast.parse(text)) or "")}
    node = _find(ast.parse(text), qualname)
    if node is None:
        raise LookupError(f"{ref}: no such function or class")
    doc = ast.get_docstring(node) or ""
    return {"name": qualname, "module": module.rsplit(".", 1)[-1], "path": rel, "line": node.lineno,
            "ref": ref, "doc": rst_to_md(doc)}


def module_doc(module: str) -> dict:
    """A module's docstring and every function (and method) in it that has one, in source order."""
    text, rel = _source(module)
    tree = ast.parse(text)
    functions = []

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(child)
                if doc:
                    functions.append({"name": prefix + child.name, "line": child.lineno, "doc": rst_to_md(doc),
                                      "ref": f"{module}:{prefix}{child.name}"})
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(tree, "")
    return {"module": module, "short": module.replace("reportgen.", ""), "path": rel,
            "doc": rst_to_md(ast.get_docstring(tree) or ""), "functions": functions}


def _format_value(value) -> str:
    mib = 2**20
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) and value >= mib and value % (mib // 16) == 0:
        return f"{value / mib:g} MiB ({value:,} bytes)"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_format_value(v)}" for k, v in value.items())
    return repr(value)


def constants(module: str) -> list[dict]:
    """Module-level constants with a ``#:`` comment (consecutive assignments share the comment above
    them): name, value, status (ASSUMED or from a source), the comment."""
    text, rel = _source(module)
    lines = text.splitlines()
    mod = importlib.import_module(module)
    out = []
    previous_end, previous_comment = -2, ""
    for node in ast.parse(text).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            previous_end = -2
            continue
        name = node.targets[0].id
        comment: list[str] = []
        i = node.lineno - 2
        while i >= 0 and lines[i].lstrip().startswith("#:"):
            comment.insert(0, lines[i].lstrip()[2:].strip())
            i -= 1
        text_comment = " ".join(comment)
        if not text_comment and node.lineno - 1 == previous_end:
            text_comment = previous_comment
        previous_end, previous_comment = node.end_lineno, text_comment
        if not text_comment or not name.isupper():
            continue
        status = "ASSUMED" if "ASSUMED" in text_comment else ("fitted" if "fitted to" in text_comment.lower()
                                                              else "from source")
        out.append({"name": name, "value": _format_value(getattr(mod, name)), "status": status,
                    "comment": rst_to_md(text_comment), "path": rel, "line": node.lineno})
    return out


# ----- the page ----------------------------------------------------------------------------------
def methodology_pages(site: SiteData) -> list[Page]:
    from reportgen.report.pages import measured_overview

    results = site.all_results()
    measured = measured_results(site)
    rows = site_rows(site)
    overview = measured_overview(site, rows, PATH)
    consts = constants(CONSTANT_MODULES[0])
    try:
        harness = module_doc(HARNESS)
    except (ImportError, OSError):
        harness = None
    modules = [module_doc(m) for m in MODULES]
    by_name = {d["module"]: d for d in modules}
    context = {
        "root": "",
        "timeline": by_name["reportgen.estimate.memory"],
        "time_model": by_name["reportgen.estimate.time"],
        "work": by_name["reportgen.estimate.work"],
        "estimator_hash": estimator_hash(),
        "estimator_sources": list(ESTIMATOR_SOURCES),
        "modules": modules,
        "calibration": consts,
        "library_constants": constants(CONSTANT_MODULES[1]),
        "assumed": sum(1 for c in consts if c["status"] == "ASSUMED"),
        "fitted": sum(1 for c in consts if c["status"] == "fitted"),
        "constants_doc": module_doc(CONSTANT_MODULES[0])["doc"],
        "terms": [{"key": k, "label": v} for k, v in TERM_LABELS.items()],
        "harness": harness,
        "n_results": len(results),
        "n_measured": len(measured),
        "measured_gpus": sorted({(environment_of(r) or {}).get("gpu_name") or "?" for r in measured} - {"?"}),
        "sweeps": sorted(site.results),
        "guides": "guides/index.md",
        "techniques": "techniques/index.md",
        "validation": "validation.md",
        "measured_quant": _measured_quant(results),
        "overview": overview,
        "n_cases": len(rows),
        "n_compared": sum(1 for r in rows if r["compare"]),
        "step_basis": next((h for h in overview["headline"] if h["quantity"] == "step_s"), None),
        "offload_note": _offload_note(rows),
    }
    return [Page(path=PATH, template="methodology.md.j2", context=context)]


def _measured_quant(results: list[dict]) -> str | None:
    """The measured QLoRA/LoRA ratio the time model's limitations cite (``reportgen.measured``)."""
    from reportgen.measured import cases_from_results, qlora_pairs, ratio_text

    return ratio_text(qlora_pairs(cases_from_results(results)))


def _offload_note(rows: list[dict]) -> str | None:
    """How the measured CPU-offload step times compare with their estimates (the time model's assumed
    host optimizer rate), from the stored files; None where none was measured."""
    ratios = sorted(c["est"] / c["meas"] for r in rows if r["compare"] and r["offload"] != "none"
                    and (c := r["compare"]["quantities"].get("step_s")))
    if not ratios:
        return None
    span = f"{ratios[0]:.1f}" if len(ratios) == 1 else f"{ratios[0]:.1f} to {ratios[-1]:.1f}"
    many = len(ratios) > 1
    return (f"our {len(ratios) if many else 'one'} measured offload step{'s' if many else ''} "
            f"ran {span} times faster than estimated")
