"""The committed H100 measurements (``results/validation/measured/``, issue 22) as the site, ``reportgen
show``, ``reportgen validation`` and the README present them.

The fixture estimates ``sweeps/validation.yaml`` with this code into a temporary results directory
beside a copy of the 52 committed measurement files (and a second copy of the OOM case's estimate in a
``consumer`` folder, as the consumer sweep stores it), then renders the data pages, the methodology,
technique and guide pages. Every figure checked here is read from the measurement file itself and
from the stored estimate, never typed in: after an estimator change the expected errors change with
the pages."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from reportgen.advise.store import write_advice

from reportgen.cli import main
from reportgen.provenance import provenance_of
from reportgen.results import current_id
from reportgen.report import render
from reportgen.report.rows import site_rows
from reportgen.runner import run_estimates
from reportgen.sweep import load_sweep
from reportgen.report.render import case_id_cell

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "results" / "validation" / "measured"
GIB = 2**30


def now(legacy: str) -> str:
    """The current (12-digit) id of the case a committed measurement file names by its 8-digit id:
    the files keep their names, the pages and estimates use the id recomputed from the stored case."""
    (path,) = MEASURED.glob(f"{legacy}.*.json")
    return current_id(json.loads(path.read_text()))


OOM = now("llama-3.1-8b.rtx-4090.lora.453de8e9")  # out of memory on purpose, on the H100 capped to 24 GiB
CAPPED = tuple(map(now, ("llama-3.1-8b.rtx-4090.lora.1b40c065", "llama-3.1-8b.rtx-4090.qlora.0ab15373")))
#: a sample of measured cases: full, LoRA (the fp32 outlier), QLoRA, paged optimizer, offload, capped
SAMPLE = tuple(map(now, ("tinyllama-1.1b.h100-sxm.full.ba7ba527", "llama-3.2-1b.h100-sxm.lora.afb26703",
                         "llama-3.1-8b.h100-sxm.qlora.79a036be", "llama-3.2-1b.h100-sxm.full.a800cfa8",
                         "qwen2.5-7b.h100-sxm.qlora.03156dff"))) + CAPPED
#: the tab of each quantity, and the field of the measurement file it compares with
QUANTITIES = {"peak allocated": "peak_allocated", "peak reserved": "peak_reserved", "device total": "device_used",
              "step time": "step_s"}
#: wording that says nothing was measured: wrong wherever measurements exist
NOTHING_MEASURED = ("No measurements yet", "no measurement", "No case has been measured", "none has been measured",
                    "nothing is measured", "has been measured yet", "no GPU has been lent",
                    "No CUDA measurement has been made")


def all_measurement_files() -> list[Path]:
    return sorted(MEASURED.glob("*.json"))


def measurement_files() -> list[Path]:
    """The latest file of each case (a case measured again counts its latest run, ``store``)."""
    latest: dict[str, tuple[str, Path]] = {}
    for p in all_measurement_files():
        doc = json.loads(p.read_text())
        cid = current_id(doc)
        if cid not in latest or doc["measured_at"] > latest[cid][0]:
            latest[cid] = (doc["measured_at"], p)
    return sorted(p for _, p in latest.values())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    results = tmp_path_factory.mktemp("measured") / "results"
    shutil.copytree(MEASURED, results / "validation" / "measured")
    sweep = load_sweep(ROOT / "sweeps" / "validation.yaml")
    run_estimates(sweep, results)
    write_advice(sweep, results)  # the guides' walks, whose steps show the measured cases
    # the consumer sweep stores the OOM case too, without a measurement (views.site_rows must keep
    # the copy whose measurement counts, not the first sweep's)
    doc = json.loads((results / "validation" / f"{OOM}.json").read_text())
    (results / "consumer").mkdir()
    (results / "consumer" / f"{OOM}.json").write_text(json.dumps({**doc, "sweep": "consumer"}))
    docs = results.parent / "docs"
    providers = render.DATA_PROVIDERS + ("reportgen.report.methodology:methodology_pages",
                                         "reportgen.report.techniques:technique_pages",
                                         "reportgen.report.guides:guide_pages")
    render.render_all(results, docs, published=None, commit=None, providers=providers)
    return results, docs


def stored(results: Path, cid: str) -> tuple[dict, dict]:
    """(the latest measurement file's document, the stored estimate) of one case."""
    (path,) = [p for p in measurement_files() if current_id(json.loads(p.read_text())) == cid]
    return json.loads(path.read_text()), json.loads((results / "validation" / f"{cid}.json").read_text())["estimate"]


def section(text: str, start: str, end: str | None = None) -> str:
    i = text.index(start)
    j = text.index(end, i + len(start)) if end else len(text)
    return text[i:j]


def tab(text: str, label: str) -> str:
    """The content of one ``=== "label"`` tab (up to the next tab or the end of the indented block)."""
    i = text.index(f'=== "{label}"')
    rest = text[i + 1:]
    ends = [k for k in (rest.find('\n=== "'), rest.find("\n<div"), rest.find("\n## "), rest.find("\nRuns that"))
            if k >= 0]
    return rest[:min(ends)] if ends else rest


def tabs(text: str, label: str) -> str:
    """Every ``=== "label"`` tab of ``text`` (one per environment section), joined."""
    out, start = [], 0
    while (i := text.find(f'=== "{label}"', start)) >= 0:
        out.append(tab(text[i:], label))
        start = i + 1
    return "\n".join(out)


def row_cells(block: str, cid: str) -> list[str] | None:
    """The cells of the table row of case ``cid`` in ``block``, or None."""
    for line in block.splitlines():
        if case_id_cell(cid) in line and line.strip().startswith("|"):
            return [c.strip() for c in line.strip().strip("|").split("|")]
    return None


def expected(doc: dict, est: dict, field: str) -> tuple[str, str, str] | None:
    """(estimate, measurement, signed error) as the tables print them, from the files; None where the
    provenance rule does not let the quantity count for the case's card."""
    gpu = doc["case"]["gpu"]
    valid = provenance_of(doc).valid_quantities(gpu)
    if field == "step_s":
        if "tokens_per_s" not in valid:
            return None
        e, m = est["time"]["step_s"], doc["measurement"]["step_s"]
        return f"{e:.3f}", f"{m:.3f}", f"{100 * (e - m) / m:+.1f}%"
    quantity = "device_total" if field == "device_used" else field
    if quantity not in valid:
        return None
    e, m = est["memory"][quantity], doc["measurement"][field]
    return f"{e / GIB:.2f}", f"{m / GIB:.2f}", f"{100 * (e - m) / m:+.1f}%"


def check_tabs(block: str, results: Path, cids) -> int:
    """Every sampled case's row in every quantity tab of ``block`` shows the stored estimate, the
    stored measurement and their signed error; a quantity that does not count has no row. Returns
    the rows checked."""
    checked = 0
    for cid in cids:
        doc, est = stored(results, cid)
        for label, field in QUANTITIES.items():
            want, cells = expected(doc, est, field), row_cells(tabs(block, label), cid)
            if want is None:
                assert cells is None, (cid, label, "shown although the provenance rule forbids it")
                continue
            assert cells is not None, (cid, label)
            est_cell, meas_cell, err_cell = cells[2], cells[3], cells[4] if field == "step_s" else cells[5]
            assert (est_cell, meas_cell.split(" ")[0], err_cell) == want, (cid, label, cells)
            checked += 1
    return checked


# ----- the validation page -----------------------------------------------------------------------
def test_the_committed_files_are_52_cases_and_one_is_the_oom_on_purpose():
    docs = [json.loads(p.read_text()) for p in measurement_files()]
    assert len(docs) == 52 and len(all_measurement_files()) == 84  # 32 cases measured again on 2026-11-27
    assert [current_id(d) for d in docs if d["status"] != "ok"] == [OOM]


def test_validation_page_shows_each_stored_figure_and_its_signed_error(site):
    results, docs = site
    text = (docs / "validation.md").read_text()
    env = section(text, "## Measured cases, by environment", "## Runs that did not finish")
    assert check_tabs(env, results, SAMPLE) == 5 * 4 + 2 * 3


def test_one_environment_section_per_stack_of_the_latest_files(site):
    text = (site[1] / "validation.md").read_text()
    headings = re.findall(r"^### (.+) \{ #(env-[0-9a-f]+) \}$", text, flags=re.M)
    docs = [json.loads(p.read_text()) for p in measurement_files()]
    commits = sorted({d["environment"]["git_commit"][:7] for d in docs})
    # one card, driver, CUDA and torch; the sections differ in the commit that measured, and say so
    assert sorted(t for t, _ in headings) == sorted(
        f"NVIDIA H100 80GB HBM3 · driver 580.159.04 · CUDA 13.0 · torch 2.11.0+cu130 · commit {c}" for c in commits)
    counts = [int(n) for n in re.findall(r"(\d+) measurements?: ", text)]
    assert sum(counts) == len(docs) == 52
    # the per-run fields that differ are summarised, not one section each
    assert "`gpu_uuid` differs" in text and "`utc` differs" in text
    gpu_page = (site[1] / "gpus" / "h100-sxm.md").read_text()
    assert all(f"](../validation.md#{anchor})" in gpu_page for _, anchor in headings)


def test_headline_is_computed_from_the_stored_files(site):
    """Median |error|, signed median, worst case and count of each quantity, recomputed here from the
    measurement files and the stored estimates, are what the page opens with."""
    results, docs = site
    text = (docs / "validation.md").read_text()
    head = section(text, "## At a glance", "### Error per technique")
    for label, field in QUANTITIES.items():
        errs = {}
        for p in measurement_files():
            doc = json.loads(p.read_text())
            if doc["status"] != "ok":
                continue
            want = expected(doc, stored(results, current_id(doc))[1], field)
            if want:
                est = stored(results, current_id(doc))[1]
                e = est["time"]["step_s"] if field == "step_s" else \
                    est["memory"]["device_total" if field == "device_used" else field]
                errs[current_id(doc)] = (e - doc["measurement"][field]) / doc["measurement"][field]
        worst = max(errs, key=lambda k: abs(errs[k]))
        cells = next(row for row in (line.strip().strip("|").split("|") for line in head.splitlines()
                                     if line.startswith(f"| {label} |")))
        cells = [c.strip() for c in cells]
        assert cells[1] == str(len(errs))
        assert cells[2] == f"{100 * statistics.median(abs(x) for x in errs.values()):.2f}%"
        assert cells[3] == f"{100 * statistics.median(errs.values()):+.2f}%"
        assert cells[4].startswith(f"{100 * errs[worst]:+.1f}%") and f"`{worst}`" in cells[4]
    five = sum(1 for p in measurement_files() for d in [json.loads(p.read_text())]
               if d["status"] == "ok" and d["settings"].get("max_steps") is None
               and "tokens_per_s" in provenance_of(d).valid_quantities(d["case"]["gpu"]))
    assert f"{five} of them are medians of only 5 timed steps" in head  # the runs before the stopping rule
    assert "in-sample" in head and "methodology.md#calibration-constants" in head


def test_capped_cases_show_no_speed_comparison(site):
    results, docs = site
    for page, start in ((docs / "validation.md", "## Measured cases, by environment"),
                        (docs / "gpus" / "rtx-4090.md", "## Measured on this card")):
        block = section(page.read_text(), start)
        step = tabs(block, "step time")
        for cid in CAPPED:
            assert row_cells(step, cid) is None, (page, cid)
            assert f"`{cid}` (measured on NVIDIA H100 80GB HBM3 capped to the memory of rtx-4090: memory only" in step
            assert row_cells(tabs(block, "device total"), cid) is not None  # memory counts
    assert check_tabs(section((docs / "gpus" / "rtx-4090.md").read_text(), "## Measured on this card",
                              "## Memory per setup"), results, CAPPED) == 2 * 3
    # nowhere is a capped run's tokens/s shown as the RTX 4090's
    rtx = (docs / "gpus" / "rtx-4090.md").read_text()
    for cid in CAPPED:
        tps = stored(results, cid)[0]["measurement"]["tokens_per_s"]
        assert f"{tps:,.0f}" not in rtx


def test_the_oom_shows_as_an_expected_oom_on_the_validation_and_rtx_4090_pages(site):
    results, docs = site
    doc, est = stored(results, OOM)
    assert est["verdict"] == "does not fit"  # what makes it expected
    at = f"{doc['measurement']['peak_allocated_at_failure'] / GIB:.2f} GiB allocated when it failed"
    val = section((docs / "validation.md").read_text(), "## Runs that did not finish")
    rtx = section((docs / "gpus" / "rtx-4090.md").read_text(), "## Measured on this card", "## Memory per setup")
    for block in (val, rtx):
        cells = row_cells(block, OOM)
        assert cells is not None
        assert "OOM" in " ".join(cells) and "yes: an expected OOM" in cells and at in " ".join(cells)
    # the page's rows keep the measured copy of a case that two sweeps store (the bug of issue 22)
    site_data = render.load_site(results, warn=lambda _: None)
    (row,) = [r for r in site_rows(site_data) if r["id"] == OOM]
    assert row["sweep"] == "validation" and row["measured_status"] == "oom"


def test_home_and_model_pages_show_measured_beside_estimated(site):
    results, docs = site
    home = (docs / "index.md").read_text()
    assert "## Measured on a GPU" in home and "| peak allocated | 51 |" in home
    model = section((docs / "models" / "llama-3.1-8b.md").read_text(), "## Measured on a GPU")
    ids = [now(p.name.split(".2026")[0]) for p in measurement_files() if p.name.startswith("llama-3.1-8b.")]
    assert check_tabs(model, results, [i for i in ids if i != OOM]) > 0
    assert row_cells(model, OOM) is not None
    gpu = section((docs / "gpus" / "h100-sxm.md").read_text(), "## Measured on this card", "## Memory per setup")
    assert check_tabs(gpu, results, [c for c in SAMPLE if c not in CAPPED]) == 5 * 4


def test_no_page_says_nothing_is_measured(site):
    for page in sorted(site[1].rglob("*.md")):
        text = page.read_text()
        for phrase in NOTHING_MEASURED:
            assert phrase not in text, (page.name, phrase)


# ----- show, the CLI and the README ----------------------------------------------------------------
def test_show_prints_measured_beside_estimated(site, capsys):
    results, _ = site
    for cid in SAMPLE + (OOM,):
        main(["show", cid, "--results", str(results)])
        out = capsys.readouterr().out
        if "measurement [shown on the site]" in out:  # measured again: the latest run, after the earlier ones
            assert "measurement [earlier attempt]" in out
            out = out[out.index("measurement [shown on the site]"):]
        doc, est = stored(results, cid)
        if cid == OOM:
            assert "out of memory: expected, the estimate foresaw it" in out
            continue
        for label, field in QUANTITIES.items():
            want = expected(doc, est, field)
            line = next((x for x in out.splitlines() if re.match(rf"\s+{label}\s+est ", x)), None)
            if want is None:
                assert line is None, (cid, label)
                continue
            assert line is not None and want[2] in line, (cid, label, line)
        if cid in CAPPED:
            assert "step time and tokens/s: not compared" in out
        elif doc["settings"].get("max_steps") is None:
            assert "median of 5 timed steps (a fixed count" in out
        else:
            assert f"median of {doc['measurement']['steps_run']} timed steps (stopped: " in out


def test_readme_headline_is_what_reportgen_validation_prints(capsys):
    assert main(["validation", "--results", str(ROOT / "results"), "--format", "markdown"]) == 0
    printed = capsys.readouterr().out.strip()
    readme = (ROOT / "README.md").read_text()
    begin, end = "<!-- reportgen validation --format markdown: begin -->", "<!-- reportgen validation --format markdown: end -->"
    block = readme[readme.index(begin) + len(begin):readme.index(end)].strip()
    assert block == printed, ("the README's measured headline is stale: paste what "
                              "`reportgen validation --format markdown` prints between its markers")
    for phrase in NOTHING_MEASURED:
        assert phrase not in readme, phrase


def test_guide_steps_show_the_measurement_with_the_error_of_the_estimate_beside_it(site):
    """A guide step on a measured case shows the measured device total and tokens/s, each with the
    estimate's signed error, (est. - meas.) / meas., of the numbers in the same row."""
    _, docs = site
    cells = 0
    for line in (docs / "guides" / "h100-sxm.md").read_text().splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cols) != 8 or " GiB (est. " not in cols[6]:
            continue
        gib_est, tok_est = float(cols[3]), float(cols[5].replace(",", ""))
        gib, gib_err = re.search(r"([\d.]+) GiB \(est\. ([+-][\d.]+)%\)", cols[6]).groups()
        assert float(gib_err) == pytest.approx(100 * (gib_est - float(gib)) / float(gib), abs=0.6), line
        tok = re.search(r"([\d,]+) tok/s \(est\. ([+-][\d.]+)%\)", cols[6])
        if tok:
            meas = float(tok.group(1).replace(",", ""))
            assert float(tok.group(2)) == pytest.approx(100 * (tok_est - meas) / meas, abs=0.1), line
        cells += 1
    assert cells >= 3
