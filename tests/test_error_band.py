"""The error band (reportgen/estimate/band.py, scripts/error_band.py) and the three-way verdict."""

import subprocess
import sys
from pathlib import Path

import pytest

from reportgen import catalog
from reportgen.estimate import estimate
from reportgen.estimate.band import Band, band_for, verdict
from reportgen.setup import TrainingSetup

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "error_band.py"


def test_verdict_worked_example():
    """An estimate of 20 GiB on a 24 GiB card with a band of -5% to +30%: the real device total is
    expected between 19 and 26 GiB, so the card's 24 GiB lies inside: tight. With +15% at most
    (23 GiB) it fits; at 26 GiB estimated even the low end (24.7 GiB) does not."""
    gib = 2**30
    wide, narrow = Band(lo=-0.05, hi=0.30, n=10, basis="test"), Band(lo=-0.05, hi=0.15, n=10, basis="test")
    assert wide.range(20 * gib) == pytest.approx((19 * gib, 26 * gib))
    assert verdict(20 * gib, 24 * gib, wide) == "tight"
    assert verdict(20 * gib, 24 * gib, narrow) == "fits"
    assert verdict(26 * gib, 24 * gib, wide) == "does not fit"
    assert verdict(23 * gib, 24 * gib, None) == "fits" and verdict(25 * gib, 24 * gib, None) == "does not fit"


def test_stored_band_is_what_the_current_code_computes():
    """The band is derived data: a change to the estimator (or to the comparisons) must come with a
    rerun of scripts/error_band.py, or this fails."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_estimate_carries_its_band_and_verdict():
    est = estimate(catalog.load_model("llama-3.1-8b"), catalog.load_gpu("rtx-4090"),
                   TrainingSetup(method="qlora", grad_ckpt=True), reverse=False)
    d = est.as_dict()
    assert d["verdict"] in ("fits", "tight", "does not fit") and d["capacity"] == catalog.load_gpu("rtx-4090").memory_bytes
    b = band_for("device_total", "qlora")
    assert b is not None and d["band"]["n"] == b.n and d["band"]["quantity"] == "device_total"
    lo, hi = d["band"]["demand_range"]  # the band is applied to what the step asks of the card
    demand = est.memory.card_demand
    assert d["demand"] == demand and d["margin"] == d["capacity"] - demand
    assert lo == int(demand * (1 + b.lo)) and hi == int(demand * (1 + b.hi))
    assert d["verdict"] == verdict(demand, d["capacity"], b) and d["fits"] == (d["verdict"] == "fits")
    assert d["verdict_text"].startswith(d["verdict"] + ":")


def test_a_technique_with_few_comparisons_borrows_the_measure_band(monkeypatch):
    from reportgen.estimate import band as B

    def group(n, lo):
        return {"lo": lo, "hi": 0.1, "n": n, "basis": f"{n} rows", "coverage": None}

    table = {"bands": {"allocated": {"all": group(20, -0.02), "full": group(B.MIN_ROWS - 1, -0.5),
                                     "lora": group(B.MIN_ROWS, -0.01)}}}
    monkeypatch.setattr(B, "band_table", lambda: table)
    assert band_for("allocated", "full") == band_for("allocated", "all")  # too few for their own band
    assert band_for("allocated", "lora").lo == -0.01
