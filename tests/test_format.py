"""How numbers are written for a reader (``reportgen/format.py``, the pages' Jinja filters in
``report/render.py``, the view-model values of ``report/rows.py``): worked examples, each string
written out by hand, so a wrong unit, a lost sign or a dropped separator fails here."""

from __future__ import annotations

import pytest

from reportgen.report import render
from reportgen.report.rows import error_stats, gib_value, verdict_fields
from reportgen.format import demand_note, gib, money, pct, rate, seconds

GIB = 2**30


def test_terminal_and_calculator_units():
    """GiB are 2^30 bytes (24 GB marketed = 22.35 GiB), rates get thousands separators from 100 on,
    fractions are percent, times below a second are milliseconds."""
    assert gib(24_000_000_000) == "22.35" and gib(3 * GIB, digits=1) == "3.0" and gib(None) == "-"
    assert rate(12_345.6) == "12,346" and rate(99.94) == "99.9" and rate(None) == "-"
    assert pct(0.4567) == "45.7%" and pct(None) == "-"
    assert seconds(0.777) == "777 ms" and seconds(1.5) == "1.50 s" and seconds(None) == "-"
    assert money(1234.5) == "$1,234.50" and money(None) == "-"
    assert demand_note({"cache_released": 5, "optimizer_paged": 0}) == "with the cached blocks it would release"
    assert demand_note({}) == ""


def test_page_filters():
    """The pages' number cells: integers with separators, one decimal otherwise; GiB of 2^30 bytes with
    separators; signed percentages keep their sign."""
    assert render._num(8_030_261_248) == "8,030,261,248" and render._num(1234.56) == "1,234.6"
    assert render._num(None) == "-"
    assert render._gib(1_198_863_793_389) == "1,116.53" and render._gib(None) == "-"
    assert render._signed_pct(0.0041) == "+0.4%" and render._signed_pct(-0.258) == "-25.8%"
    assert render._signed_pct(None) == "-"


def test_view_model_values():
    """CSV cells in GiB to three decimals; errors relative to the measurement, the worst kept with its
    sign; a stored estimate's verdict cell with its margin."""
    assert gib_value(16_179_530_825) == 15.068 and gib_value(None) is None
    stats = error_stats([(110.0, 100.0), (95.0, 100.0), (100.0, 100.0)])
    assert stats["n"] == 3 and stats["median_abs_rel"] == pytest.approx(0.05)
    assert stats["worst_rel"] == pytest.approx(0.10)
    tight = verdict_fields({"verdict": "tight", "demand": int(23.2 * GIB), "capacity": 24 * GIB,
                            "memory": {"device_total": int(23.2 * GIB)}}, "rtx-4090")
    assert tight["fits"] is False and tight["margin"] == 24 * GIB - int(23.2 * GIB)
    assert tight["verdict_label"] == "tight (+0.8 GiB)"
    no = verdict_fields({"verdict": "does not fit", "demand": 33 * GIB, "capacity": 24 * GIB,
                         "memory": {"device_total": 33 * GIB}}, "rtx-4090")
    assert no["fits"] is False and no["verdict_label"] == "no (-9.0 GiB)"
    assert no["verdict_text"] == "does not fit: needs 33.0 of 24.0 GiB, short by 9.0 GiB"
    fits = verdict_fields({"verdict": "fits", "demand": 17 * GIB, "capacity": 24 * GIB,
                           "memory": {"device_total": 17 * GIB}}, "rtx-4090")
    assert fits["fits"] is True and fits["verdict_label"] == "fits"
