"""The provenance rule (reportgen/provenance.py), each combination pinned, and the places that ask it:
the site's rows, the validation page, the built HTML, `reportgen show`."""

from __future__ import annotations

import re

import pytest

from reportgen.provenance import MEMORY_QUANTITIES, QUANTITIES, SPEED_QUANTITIES, provenance_of
from reportgen.report import rows
from reportgen.report.render import case_id_cell


#: the names CUDA reports for the cards these blocks claim (provenance.inconsistency checks name against key)
CUDA_NAMES = {"h100-sxm": "NVIDIA H100 80GB HBM3", "a100-80gb": "NVIDIA A100-SXM4-80GB", "rtx-4090": "NVIDIA GeForce RTX 4090",
              "t4": "Tesla T4", None: "NVIDIA GB200"}


def block(device="cuda", key="h100-sxm", cap=None, applied=True, env=True, status="ok"):
    environment = {"device": device, "gpu_catalog_key": key if device == "cuda" else None,
                   "gpu_name": CUDA_NAMES[key], "gpu_total_bytes": 80 * 2**30 if key == "a100-80gb" else None}
    return {"status": status, "environment": environment if env else None,
            "cap": {"emulated_gpu": cap, "applied": applied} if cap else None,
            "measurement": {"peak_allocated": 10, "peak_reserved": 11, "device_used": 12, "tokens_per_s": 100.0,
                            "step_s": 1.0}}


# (what, block, case gpu, quantities that count)
COMBINATIONS = [
    ("run on the case's card", block(), "h100-sxm", QUANTITIES),
    ("run on another card, no cap", block(key="a100-80gb"), "h100-sxm", ()),
    ("larger card capped to the case's card", block(cap="rtx-4090"), "rtx-4090", MEMORY_QUANTITIES),
    ("the cap counts only for the card it emulated", block(cap="rtx-4090"), "rtx-3090", ()),
    ("a capped run still counts fully for the card that ran it", block(cap="rtx-4090"), "h100-sxm", QUANTITIES),
    ("cap asked but not applied (the device is the card)", block(key="rtx-4090", cap="rtx-4090", applied=False),
     "rtx-4090", QUANTITIES),
    ("cap asked but not applied on a smaller card", block(key="t4", cap="rtx-4090", applied=False), "rtx-4090", ()),
    ("a CPU run", block(device="cpu"), "h100-sxm", ()),
    ("no environment recorded", block(env=False), "h100-sxm", ()),
    ("unknown device kind", block(device="rocm"), "h100-sxm", ()),
    ("a CUDA card the catalog does not know", block(key=None), "h100-sxm", ()),
    ("an unknown card capped to a catalog card", block(key=None, cap="rtx-4090"), "rtx-4090", MEMORY_QUANTITIES),
]


@pytest.mark.parametrize("what, b, gpu, valid", COMBINATIONS, ids=[c[0] for c in COMBINATIONS])
def test_rule(what, b, gpu, valid):
    p = provenance_of(b)
    assert set(p.valid_quantities(gpu)) == set(valid)
    assert p.memory_counts_for(gpu) == bool(set(valid) & set(MEMORY_QUANTITIES))
    assert p.speed_counts_for(gpu) == bool(set(valid) & set(SPEED_QUANTITIES))
    result = {"id": "x", "case": {"gpu": gpu}, "measurement": b}
    assert set(rows.measured_values(result)) == set(valid)
    assert (rows.other_run(result) is None) == bool(valid)  # either it counts, or it is labelled apart


def test_labels_say_what_the_run_is():
    assert provenance_of(block(device="cpu")).label("h100-sxm").startswith("CPU run")
    capped = provenance_of(block(cap="rtx-4090")).label("rtx-4090")
    assert "capped to the memory of rtx-4090" in capped and "memory only" in capped
    assert provenance_of(block()).label("h100-sxm") == "measured on NVIDIA H100 80GB HBM3"
    assert "not comparable" in provenance_of(block(key="a100-80gb")).label("h100-sxm")


def test_an_oom_counts_as_a_verdict_only_where_memory_counts():
    oom = {"id": "x", "case": {"gpu": "rtx-4090"}}
    assert rows.measured_verdict({**oom, "measurement": block(cap="rtx-4090", status="oom")}) == "oom"
    assert rows.measured_verdict({**oom, "measurement": block(device="cpu", status="oom")}) is None
    assert rows.measured_verdict({**oom, "measurement": block(status="oom")}) is None  # H100, uncapped


# ----- on the site ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def site(fixture_site_built):
    """The fixture sweeps with FAKE measurements (tests/fixtures/fake_measurements.json): runs on
    the case's card, one CPU run and one H100 run capped to the RTX 4090, built into HTML
    (``fixture_site_built`` in tests/conftest.py)."""
    return fixture_site_built


def row_html(html: str, cid: str) -> str:
    shown = f"<code>{cid}</code>"
    i = html.index(shown) if shown in html else html.index(case_id_cell(cid))
    return html[html.rindex("<tr>", 0, i):html.index("</tr>", i)]


def test_cpu_run_is_never_shown_as_a_gpu_measurement(site):
    site_dir, ids = site
    cid = ids["cpu"][0]
    gpu_html = (site_dir / "gpus" / "rtx-4090" / "index.html").read_text()
    row = row_html(gpu_html, cid)
    assert "rg-meas" not in row and "CPU run, not compared" in row
    validation = (site_dir / "validation" / "index.html").read_text()
    errors = validation.split('id="runs-that-are-not-gpu-measurements"')[0]
    assert cid not in errors  # in no error table, no environment list, no chart
    listed = validation.split('id="runs-that-are-not-gpu-measurements"')[1]
    assert cid in listed and "timings of the CPU, not a GPU measurement" in listed
    home = (site_dir / "index.html").read_text()
    assert cid not in home


def test_capped_run_counts_for_memory_only(site):
    site_dir, ids = site
    cid = ids["capped"][0]
    html = (site_dir / "gpus" / "rtx-4090" / "index.html").read_text()
    row = row_html(html.split('id="all-setups-by-model"')[1], cid)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    memory, tokens = cells[2], cells[6]
    assert "fake capped" in memory and "capped to the memory of rtx-4090" in memory  # a fixture: never "meas."
    assert "rg-meas" not in tokens  # the H100's speed is not the 4090's
    md = (site_dir.parent / "docs" / "validation.md").read_text()
    tabs = dict(re.findall(r'^=== "([^"]+)"\n(.*?)(?=^=== |^<div)', md, re.S | re.M))
    assert case_id_cell(cid) in tabs["peak allocated"] and case_id_cell(cid) in tabs["device total"]
    assert case_id_cell(cid) not in tabs["step time"] and "**No speed comparison** for 1 case" in tabs["step time"]


def test_show_prints_what_each_run_counts_for(site, capsys):
    from reportgen.cli import main

    site_dir, ids = site
    results = site_dir.parent / "results"
    main(["show", ids["cpu"][0], "--results", str(results)])
    out = capsys.readouterr().out
    assert "CPU run" in out and "compares with the estimate: nothing" in out
    main(["show", ids["capped"][0], "--results", str(results)])
    out = capsys.readouterr().out
    assert "compares with the estimate: peak_allocated, peak_reserved, device_total" in out
    assert "tokens_per_s" not in out.split("compares with the estimate:")[1].splitlines()[0]


# ----- multi-GPU runs: every rank is judged ---------------------------------------------------------
def ranked(keys=("h100-sxm", "h100-sxm"), gpus=None, world=None, caps=None):
    """A measurement block of a torchrun run, one environment per rank (``measure/ranks.py``)."""
    b = block(key=keys[0])
    b["environment"]["world_size"] = len(keys) if world is None else world
    b["measurement"]["ranks"] = [{"rank": r, "environment": {"device": "cuda", "gpu_catalog_key": k},
                                  "cap": (caps or {}).get(r)} for r, k in enumerate(keys)]
    b["case"] = {"gpu": "h100-sxm", "setup": {"gpus": len(keys) if gpus is None else gpus}}
    return b


@pytest.mark.parametrize("what, b, valid", [
    ("every rank on the case's card", ranked(), QUANTITIES),
    ("one rank on another card", ranked(keys=("h100-sxm", "a100-80gb")), ()),
    ("a 2-process run for a 4-GPU case", ranked(gpus=4), ()),
    ("a single-process run for a 2-GPU case", dict(block(), case={"gpu": "h100-sxm", "setup": {"gpus": 2}}), ()),
    ("world size without per-rank records", dict(ranked(), measurement={"peak_allocated": 1}), ()),
])
def test_multi_gpu_runs_count_only_when_every_rank_ran_on_the_card(what, b, valid):
    p = provenance_of(b)
    assert set(p.valid_quantities("h100-sxm")) == set(valid), what
    if not valid:
        assert "not comparable" in p.label("h100-sxm")


def test_a_multi_gpu_label_says_how_many():
    assert provenance_of(ranked()).label("h100-sxm") == "measured on 2x NVIDIA H100 80GB HBM3"
    assert "different cards" in provenance_of(ranked(keys=("h100-sxm", "a100-80gb"))).label("h100-sxm")


def test_a_multi_gpu_cap_counts_only_when_every_rank_applied_it():
    both = {0: {"applied": True, "emulated_gpu": "rtx-4090"}, 1: {"applied": True, "emulated_gpu": "rtx-4090"}}
    b = ranked(caps=both)
    b["cap"] = both[0]
    assert provenance_of(b).memory_counts_for("rtx-4090")
    b = ranked(caps={0: both[0], 1: {"applied": False, "emulated_gpu": "rtx-4090"}})
    b["cap"] = both[0]
    assert not provenance_of(b).memory_counts_for("rtx-4090")


# ----- issue 29: a measurement file that cannot be what it says is set aside, never published ----------------
REAL = sorted((__import__("pathlib").Path(__file__).resolve().parents[1] / "results" / "validation" / "measured")
              .glob("llama-3.2-1b.h100-sxm.lora.*.json"))[0]


def _real() -> dict:
    import json

    return json.loads(REAL.read_text())


def _forge(path: str, value) -> dict:
    doc = _real()
    where = doc
    *parents, last = path.split(".")
    for p in parents:
        where = where[p]
    where[last] = value
    return doc


@pytest.mark.parametrize("path, value, reason", [
    ("settings.device", "cpu", "its settings say it ran on the CPU"),
    ("environment.gpu_name", "Tesla T4", "its GPU name 'Tesla T4' is not the card it claims (h100-sxm)"),
    ("measurement.peak_allocated", 1024, "below the weights it had to hold"),
    ("measurement.peak_allocated", -5, "its peak_allocated (-5) is not a size, time or rate"),
    ("measurement.peak_reserved", float("nan"), "its peak_reserved (nan) is not a size, time or rate"),
    ("measurement.peak_reserved", "lots", "its peak_reserved ('lots') is not a size, time or rate"),
    ("measurement.peak_reserved", 1, "its peak reserved is below its peak allocated"),
    ("measurement.device_used", 2**30, "its device total is below its peak reserved"),
    ("measurement.mfu", 50.0, "its MFU (50.0) is beyond what the card can do"),
    ("measurement.step_s", 0, "its step time is zero"),
    ("environment.gpu_total_bytes", 2**30, "is more than its GPU holds"),
    ("cap", {"applied": True, "emulated_gpu": "rtx-4090", "emulated_memory_bytes": 2**30},
     "is more than its cap allowed"),
    ("measurement.step_s", float("inf"), "its step_s (inf) is not a size, time or rate"),
])
def test_a_forged_or_damaged_measurement_compares_with_nothing_and_says_why(path, value, reason):
    assert provenance_of(_real()).valid_quantities("h100-sxm") == QUANTITIES  # the real file counts in full
    prov = provenance_of(_forge(path, value))
    assert prov.valid_quantities("h100-sxm") == () and reason in (prov.mismatch or "")
    assert reason in prov.label("h100-sxm") and "not comparable" in prov.label("h100-sxm")


def test_a_cuda_run_whose_environment_does_not_say_so_counts_for_nothing():
    """The settings say where a run was asked to run, the environment where it ran (found by the
    damaged-file property test: environment.device removed, settings cuda, and it still counted)."""
    prov = provenance_of(_forge("environment.device", None))
    assert prov.valid_quantities("h100-sxm") == () and "unrecorded device" in prov.label("h100-sxm")
    cpu = _forge("environment.device", None)
    cpu["settings"]["device"] = "cpu"
    assert provenance_of(cpu).device == "cpu"


def test_every_committed_measurement_passes_the_check():
    from pathlib import Path

    import json

    files = sorted((Path(__file__).resolve().parents[1] / "results").glob("*/measured/*.json"))
    assert len(files) >= 52
    assert [f.name for f in files if provenance_of(json.loads(f.read_text())).mismatch] == []


def test_damaged_figures_never_count_and_never_raise():
    """Property: whatever a file's figures are (any JSON value), provenance_of answers (no exception),
    and a figure that is no finite, non-negative number, or an order that cannot be, makes the run
    count for nothing."""
    import math

    from hypothesis import given, settings
    from hypothesis import strategies as st

    values = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**62, max_value=2**62),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=5),
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))
    keys = ("peak_allocated", "peak_reserved", "device_used", "step_s", "tokens_per_s", "mfu", "host_peak_rss",
            "host_rss_after_load")

    @settings(max_examples=300, deadline=None)
    @given(st.dictionaries(st.sampled_from(keys), values, min_size=1))
    def check(figures):
        doc = _real()
        doc["measurement"].update(figures)
        valid = provenance_of(doc).valid_quantities("h100-sxm")
        m = doc["measurement"]
        nums = {k: m.get(k) for k in keys}
        bad = any(v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                                     or v < 0) for v in nums.values())
        a, r, u = nums["peak_allocated"], nums["peak_reserved"], nums["device_used"]
        if not bad:
            bad = (a is not None and r is not None and r < a) or (r is not None and u is not None and u < r) \
                or (nums["mfu"] is not None and nums["mfu"] > 1) or nums["step_s"] == 0 \
                or (a is not None and a < 0.5 * 1_235_814_400)
        if bad:
            assert valid == ()

    check()
