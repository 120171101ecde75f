"""Charts are drawn once per content: a re-render with the same results reads every SVG back from
the cache (same bytes as drawing it), a changed input or drawing code draws again, and the parallel
drawing gives the bytes the serial one does."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from reportgen.report import chartjobs, charts, render
from tests.fixtures.site_data import PUBLISHED, build_results

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OWN = render.DATA_PROVIDERS


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("results")
    build_results(d)
    return d


def tree(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_rerender_draws_nothing_and_writes_the_same_bytes(results, tmp_path, monkeypatch):
    monkeypatch.setenv("REPORTGEN_CACHE", str(tmp_path / "cache"))
    render.render_all(results, tmp_path / "a", published=PUBLISHED, commit=COMMIT, providers=OWN)
    assert list((tmp_path / "cache" / "charts").glob("*.svg"))

    def no_drawing(self):
        raise AssertionError(f"{self.name} drawn again although nothing changed")

    monkeypatch.setattr(chartjobs.ChartJob, "draw", no_drawing)
    stages = []
    render.render_all(results, tmp_path / "b", published=PUBLISHED, commit=COMMIT, providers=OWN,
                      progress=lambda stage, done, total: stages.append((stage, done, total)))
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    _, done, total = [s for s in stages if s[0] == "charts"][-1]
    assert done == total > 0


def test_cached_bytes_equal_drawn_bytes(results, tmp_path, monkeypatch):
    monkeypatch.setenv("REPORTGEN_CACHE", str(tmp_path / "cache"))
    render.render_all(results, tmp_path / "cached", published=PUBLISHED, commit=COMMIT, providers=OWN)
    render.render_all(results, tmp_path / "cached", published=PUBLISHED, commit=COMMIT, providers=OWN)
    monkeypatch.setenv("REPORTGEN_CHART_CACHE", "0")
    monkeypatch.setattr(chartjobs, "_workers", lambda n: 1)  # serial drawing, no cache
    render.render_all(results, tmp_path / "drawn", published=PUBLISHED, commit=COMMIT, providers=OWN)
    assert tree(tmp_path / "cached") == tree(tmp_path / "drawn")


def test_a_changed_input_is_drawn_again(tmp_path, monkeypatch):
    monkeypatch.setenv("REPORTGEN_CACHE", str(tmp_path))
    cells = {("m", "g"): {"technique": "LoRA", "tokens_per_s": 1000.0, "batch": 1, "gpus": 1, "measured": False}}
    a = charts.fit_grid(["m"], [("g", "G")], cells, title="t")
    b = charts.fit_grid(["m"], [("g", "G")], {("m", "g"): {**cells[("m", "g")], "tokens_per_s": 2000.0}}, title="t")
    assert a.key != b.key
    assert a.key == charts.fit_grid(["m"], [("g", "G")], dict(cells), title="t").key
    svgs = dict(chartjobs.draw_all([a, b]))
    assert "1.0k tok/s" in svgs[a.key] and "2.0k tok/s" in svgs[b.key]
    assert svgs[a.key] == a.draw()


def test_parallel_drawing_under_the_cli_prints_no_traceback(tmp_path):
    """The CLI turns SIGTERM into ``cli.Terminated``; the pool that draws charts in parallel ends its
    forked workers with SIGTERM, which must end them quietly (the quick start's sweep printed a
    ``Terminated`` traceback per worker). Three charts, two workers, the cache off, in a subprocess so
    the workers' own stderr is read."""
    import os
    import subprocess
    import sys

    script = """
import os, signal
os.sched_setaffinity(0, {0, 1}) if hasattr(os, "sched_setaffinity") and os.cpu_count() > 1 else None
from reportgen import cli
from reportgen.report import chartjobs, charts
signal.signal(signal.SIGTERM, cli._terminated)
cells = {("m", "g"): {"technique": "LoRA", "tokens_per_s": 1000.0, "batch": 1, "gpus": 1, "measured": False}}
jobs = [charts.fit_grid(["m"], [("g", "G")], {("m", "g"): {**cells[("m", "g")], "tokens_per_s": 1000.0 * i}},
                        title="t") for i in (1, 2, 3)]
print(len(dict(chartjobs.draw_all(jobs))), chartjobs._workers(3))
"""
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])  # this checkout's code, whatever is installed
    env = {**os.environ, "REPORTGEN_CHART_CACHE": "0", "PYTHONPATH": root}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    drawn, workers = map(int, proc.stdout.split())
    assert drawn == 3
    if workers > 1:
        assert "Traceback" not in proc.stderr and "Terminated" not in proc.stderr, proc.stderr
