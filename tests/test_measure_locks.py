"""Issue 29, class 3: nothing measured is lost, and two runs never measure the same case at once.
The measuring worker is stubbed (answers at once); what is under test is the sweep loop's order:
where the results go is checked before anything is measured, a second run of the same shard is
refused naming the first, and a case another run holds is skipped and never measured twice."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from reportgen import locks
from reportgen.cli import main
from reportgen.measure.runner import DEVICE_ENV
from reportgen.store import measurement_files
from tests.measure_helpers import tiny_sweep
from tests.test_measure_sweep import _stub_worker

pytestmark = pytest.mark.skipif(locks.fcntl is None, reason="no flock on this platform")


@pytest.fixture()
def sweep_file(tmp_path, monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    return tiny_sweep(tmp_path, "tiny-measure")


def _sweep(path, out, *extra) -> int:
    return main(["sweep", str(path), "--measure", "--no-render", "--results", str(out), *extra])


def test_a_results_folder_that_cannot_take_a_measurement_is_refused_before_measuring(
        sweep_file, tmp_path, monkeypatch, capsys):
    calls = _stub_worker(monkeypatch)
    out = tmp_path / "results"
    (out / "tiny-measure").mkdir(parents=True)
    (out / "tiny-measure" / "measured").write_text("a file where the folder belongs")
    assert _sweep(sweep_file, out) == 2
    err = capsys.readouterr().err
    assert "measured is not a folder" in err and "mv " in err
    assert calls == []  # nothing was measured, so nothing was lost


def _hold(path: str, ready, release) -> None:
    with locks.hold(__import__("pathlib").Path(path)):
        ready.set()
        release.wait(30)


@pytest.fixture()
def other_process():
    """Run ``_hold`` on a lock file in another process; yields a function that starts it."""
    ctx = multiprocessing.get_context("fork")
    started = []

    def start(path):
        ready, release = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_hold, args=(str(path), ready, release))
        proc.start()
        assert ready.wait(30)
        started.append((proc, release))
        return proc

    yield start
    for proc, release in started:
        release.set()
        proc.join(30)


def test_a_second_run_of_the_same_shard_is_refused_naming_the_first(sweep_file, tmp_path, monkeypatch, capsys,
                                                                    other_process):
    calls = _stub_worker(monkeypatch)
    out = tmp_path / "results"
    holder = other_process(locks.run_lock_path(out / "tiny-measure", "0/1"))
    assert _sweep(sweep_file, out) == 2
    err = capsys.readouterr().err
    assert f"pid {holder.pid}" in err and "another run is measuring shard 0/1" in err and ".lock" in err
    assert calls == [] and measurement_files(out / "tiny-measure") == []
    assert _sweep(sweep_file, out, "--shard", "1/2") == 0  # another shard may run beside it (a Slurm array)


def test_a_case_another_run_is_measuring_is_skipped_not_measured_twice(sweep_file, tmp_path, monkeypatch, capsys,
                                                                       other_process):
    from reportgen.sweep import load_sweep

    calls = _stub_worker(monkeypatch)
    out = tmp_path / "results"
    first, second = sorted(c.id for c in load_sweep(sweep_file).cases)
    holder = other_process(locks.case_lock_path(out / "tiny-measure", first))
    assert _sweep(sweep_file, out) == 0
    captured = capsys.readouterr()
    err = " ".join((captured.out + captured.err).split())  # rich wraps long lines
    assert f"skip {first}: another run is measuring it (pid {holder.pid}" in err
    assert [p.name.split(".20")[0] for p in measurement_files(out / "tiny-measure")] == [second]
    assert len(calls) == 1


def test_a_lock_is_released_when_its_holder_dies(tmp_path):
    path = tmp_path / "x.lock"
    pid = os.fork()
    if pid == 0:  # the child takes the lock and dies holding it
        with locks.hold(path):
            os._exit(0)
    os.waitpid(pid, 0)
    with locks.hold(path):  # no stale lock: the kernel released it
        pass
