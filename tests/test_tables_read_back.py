"""Issue 31, "tests that read the pages": every labelled cell of the GPU pages' setup tables and every
column of the CSV exports is read back and compared with the stored result its row names (by case
id), not with the code that wrote it. A table that shows peak reserved under "Memory", a column
shifted by one, or a CSV whose values are in another order than its header fails here."""

from __future__ import annotations

import csv
import io
import re

import pytest

from reportgen import store
from reportgen.format import GIB
from tests.test_render import docs, results  # noqa: F401 - the fixtures

_TAG = re.compile(r"<[^>]+>")
_CASE_ID = re.compile(r'<code class="rg-id">(.*?)</code>')


def _tables(md: str) -> list[list[dict[str, str]]]:
    """Every Markdown table of a page (indented ones in tabs too) as rows of ``{heading: cell}``, each
    cell's first line (``<br>`` splits the estimate from a measurement) kept, and ``"case id"``: the id
    a row's setup cell names (``render._case_id``), or None."""
    out, lines = [], md.splitlines()
    i = 0
    while i < len(lines) - 1:
        head, rule = lines[i].strip(), lines[i + 1].strip()
        if head.startswith("|") and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", rule):
            names = [_text(c) for c in head.strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                cells = re.split(r"(?<!\\)\|", lines[i].strip().strip("|"))
                row = dict(zip(names, (c.split("<br>")[0] for c in cells)))
                ids = [_TAG.sub("", m) for c in cells for m in _CASE_ID.findall(c)]
                rows.append({**row, "case id": ids[0] if ids else None})
                i += 1
            out.append(rows)
        else:
            i += 1
    return out


def _text(cell: str) -> str:
    return " ".join(_TAG.sub("", cell).replace("`", "").replace("est.", "").split())


def _number(cell: str) -> float | None:
    m = re.search(r"-?[0-9][0-9,]*(?:\.[0-9]+)?", _TAG.sub("", cell))
    return None if m is None else float(m.group().replace(",", ""))


@pytest.fixture(scope="module")
def stored(results) -> dict[str, dict]:  # noqa: F811
    out = {}
    for sweep_dir in sorted(p for p in results[0].iterdir() if p.is_dir()):
        for r in store.load_results(sweep_dir, warn=lambda m: None):
            out.setdefault(r["id"], r)
    return out


def test_every_gpu_setup_table_cell_is_its_cases_value(docs, stored):  # noqa: F811
    checked = 0
    for page in sorted((docs / "gpus").glob("*.md")):
        for table in _tables(page.read_text()):
            if not table or not {"Memory GiB", "Max batch"} <= set(table[0]):
                continue
            for row in table:
                r = stored[row["case id"]]
                if r["status"] != "ok":
                    continue
                est, setup = r["estimate"], r["case"]["setup"]
                assert _number(row["Batch"]) == setup["batch"], (page.name, row)
                assert _number(row["Memory GiB"]) == pytest.approx(est["memory"]["device_total"] / GIB, abs=0.051)
                for heading, value in (("Max batch", est.get("max_batch")), ("Max seq", est.get("max_seq"))):
                    assert _number(row[heading]) == value, (page.name, heading, row)
                tokens = est["time"]["tokens_per_s"]
                assert _number(row["Tokens/s"]) == pytest.approx(tokens, rel=0.006, abs=0.06), (page.name, row)
                checked += 1
    assert checked >= 20


CSV_CHECKS = {  # column -> (the stored result's value, tolerance of the CSV's rounding)
    "model": (lambda r: r["case"]["model"], None),
    "gpu": (lambda r: r["case"]["gpu"], None),
    "batch": (lambda r: r["case"]["setup"]["batch"], 0),
    "seq_tokens": (lambda r: r["case"]["setup"]["seq"], 0),
    # GiB to 3 decimals; times and rates to 6 significant digits
    "est_peak_allocated_gib": (lambda r: r["estimate"]["memory"]["peak_allocated"] / GIB, 0.0006),
    "est_peak_reserved_gib": (lambda r: r["estimate"]["memory"]["peak_reserved"] / GIB, 0.0006),
    "est_device_total_gib": (lambda r: r["estimate"]["memory"]["device_total"] / GIB, 0.0006),
    "est_step_s": (lambda r: r["estimate"]["time"]["step_s"], 1e-6),
    "est_tokens_per_s": (lambda r: r["estimate"]["time"]["tokens_per_s"], 1e-6),
}


def test_every_csv_column_is_the_value_its_header_names(docs, stored):  # noqa: F811
    files = sorted((docs / "data").rglob("*.csv"))
    assert files
    checked = 0
    for path in files:
        for row in csv.DictReader(io.StringIO(path.read_text())):
            r = stored.get(row["case_id"])
            if r is None or r["status"] != "ok":
                continue
            for column, (value, tol) in CSV_CHECKS.items():
                want = value(r)
                if tol is None:
                    assert row[column] == want, (path.name, column)
                else:
                    assert float(row[column]) == pytest.approx(want, rel=1e-5, abs=tol), (path.name, column)
            checked += 1
    assert checked >= 20
