"""Issue 31: `reportgen show` prints a case once, whatever number of sweeps hold it: the result with
a measurement first (a case in two sweeps printed "measurement: none" above its measurement), the
other sweeps named, and its trace once."""

from __future__ import annotations

import json
import shutil

from tests.test_results_input import REAL, _run, pristine  # noqa: F401 - the fixture


def test_a_case_in_two_sweeps_is_shown_once_with_its_measurement(pristine, tmp_path, capsys):  # noqa: F811
    shutil.copytree(pristine / "results", tmp_path / "results")
    est = next((tmp_path / "results" / "t").glob("*.json"))
    (tmp_path / "results" / "a-first").mkdir()  # sorts before "t": the estimate-only copy came first
    doc = json.loads(est.read_text())
    (tmp_path / "results" / "a-first" / est.name).write_text(json.dumps({**doc, "sweep": "a-first"}))
    capsys.readouterr()
    assert _run("show", json.loads(REAL.read_text())["id"], "--results", str(tmp_path / "results")) == 0
    out = capsys.readouterr().out
    assert out.count("\ncase ") + out.startswith("case ") == 1
    assert "(sweep t; also in a-first" in out
    assert "measurement: status ok" in out and "measurement: none" not in out
