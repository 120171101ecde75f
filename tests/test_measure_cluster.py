"""`reportgen sweep FILE --measure --executor slurm`: the sweep's cases as a job array through
submitit. On CI there is no Slurm: the array runs through submitit's local executor (one subprocess
per task, the same submission path), and a fake sbatch/srun/sacct checks what would reach Slurm."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from reportgen.cli import main
from reportgen.measure.cluster import CLUSTER_ENV, POLL_ENV, SLURM_DIR, parse_time_limit
from reportgen.measure.runner import DEADLINE_ENV, DEVICE_ENV
from reportgen.store import load_results, measurement_files
from tests.measure_helpers import tiny_sweep

submitit = pytest.importorskip("submitit")

SWEEP = "tiny-slurm"


@pytest.fixture()
def sweep_file(tmp_path, monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    monkeypatch.setenv(POLL_ENV, "0.5")
    return tiny_sweep(tmp_path, SWEEP)


def sweep(path, results_dir, *extra):
    return main(["sweep", str(path), "--measure", "--no-render", "--results", str(results_dir), "--executor", "slurm",
                 *extra])


def files(results_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in measurement_files(results_dir / SWEEP)}


def test_a_sweep_measured_as_a_job_array_on_submitits_local_executor(sweep_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CLUSTER_ENV, "local")
    out = tmp_path / "results"
    assert sweep(sweep_file, out) == 0
    err = capsys.readouterr().err
    assert "submitted 2 task(s) for 2 case(s)" in err and "2/2 task(s) completed, 2 case(s) measured (2 ok)" in err
    results = {r["id"]: r for r in load_results(out / SWEEP)}
    assert len(results) == 2 and all(r["measurement"]["status"] == "ok" for r in results.values())
    assert all(r["measurement"]["environment"]["device"] == "cpu" for r in results.values())
    logs = sorted(p.name for p in (out / SWEEP / SLURM_DIR).iterdir())
    assert any(n.endswith("_log.err") for n in logs) and any(n.endswith(".cases.json") for n in logs)

    # a rerun submits nothing and changes no measurement file
    before = files(out)
    assert sweep(sweep_file, out) == 0
    assert "nothing to submit" in capsys.readouterr().err
    assert files(out) == before


def test_no_wait_returns_the_job_ids(sweep_file, tmp_path, monkeypatch, capsys):
    """--no-wait prints one job id per task and returns; the tasks go on without the command
    (here they find the deadline passed and measure nothing, so the test waits only seconds)."""
    monkeypatch.setenv(CLUSTER_ENV, "local")
    monkeypatch.setenv(DEADLINE_ENV, str(time.time() + 1))
    out = tmp_path / "results"
    assert sweep(sweep_file, out, "--no-wait") == 0
    captured = capsys.readouterr()
    ids = captured.out.split()
    assert len(ids) == 2 and all(i.isdigit() for i in ids)
    assert "not waiting (--no-wait)" in captured.err and "rerunning this command submits only" in captured.err
    folder = out / SWEEP / SLURM_DIR
    deadline = time.time() + 120
    while not all(any(folder.glob(f"{i}_*result.pkl")) for i in ids) and time.time() < deadline:
        time.sleep(0.5)
    assert all(any(folder.glob(f"{i}_*result.pkl")) for i in ids)
    assert files(out) == {}  # deferred by the deadline: nothing written


@pytest.fixture()
def fake_slurm(tmp_path, monkeypatch):
    """sbatch, srun and sacct stand-ins: sbatch accepts everything as job 777, sacct says task 0
    is still pending."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho \"Submitted batch job 777\"\n")
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sacct").write_text("#!/bin/sh\nprintf 'JobID|State|NodeList\\n777_0|PENDING|None\\n"
                                   "777_1|FAILED|node1\\n'\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    return bin_dir


def test_what_reaches_slurm(sweep_file, tmp_path, fake_slurm, capsys):
    out = tmp_path / "results"
    assert sweep(sweep_file, out, "--no-wait", "--partition", "gpu", "--gpus-per-task", "2", "--time-limit",
                 "1:30:00", "--slurm-array-parallelism", "1", "--account", "acct", "--qos", "high",
                 "--slurm-additional", "constraint=h100") == 0
    assert capsys.readouterr().out.split() == ["777_0", "777_1"]
    script = (out / SWEEP / SLURM_DIR / "777_submission.sh").read_text()
    for line in ("--array=0-1%1", "--partition=gpu", "--gpus-per-task=2", "--time=90", "--account=acct",
                 "--qos=high", "--constraint=h100", "--job-name=reportgen-tiny-slurm"):
        assert f"#SBATCH {line}\n" in script, line
    recorded = json.loads((out / SWEEP / SLURM_DIR / "777.cases.json").read_text())
    assert sorted(recorded["tasks"]) == ["777_0", "777_1"]

    # a rerun does not submit again the case whose task is still pending; the failed one goes again
    assert sweep(sweep_file, out, "--no-wait") == 0
    captured = capsys.readouterr()
    assert "1 case(s) still pending or running in 777_0: not submitted again" in captured.err
    assert "submitted 1 task(s) for 1 case(s)" in captured.err


def test_no_slurm_here_is_a_user_error(sweep_file, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no srun
    assert sweep(sweep_file, tmp_path / "results") == 2
    assert "sbatch and srun not on PATH" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()  # refused before the estimates


def test_missing_submitit_names_the_extra(sweep_file, tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit raises ImportError
    assert sweep(sweep_file, tmp_path / "results") == 2
    err = capsys.readouterr().err
    assert "submitit" in err and ".[cluster]" in err


@pytest.mark.parametrize("args,needle", [
    (["--measure", "--partition", "gpu"], "--partition only applies with --executor slurm"),
    (["--measure", "--no-wait"], "--no-wait only applies with --executor slurm"),
    (["--executor", "slurm"], "add --measure"),
    (["--measure", "--executor", "slurm", "--shard", "0/2"], "--tasks"),
    (["--measure", "--executor", "slurm", "--time-limit", "soon"], "--time-limit"),
    (["--measure", "--executor", "slurm", "--slurm-additional", "constraint"], "KEY=VALUE"),
])
def test_bad_flags_exit_2_before_anything_runs(sweep_file, tmp_path, capsys, args, needle):
    out = tmp_path / "results"
    assert main(["sweep", str(sweep_file), "--no-render", "--results", str(out), *args]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()  # refused before the estimates


@pytest.mark.parametrize("text,minutes", [("90", 90), ("1:30", 2), ("1:30:00", 90), ("2-0", 2880),
                                          ("1-02:03", 1563), ("0-00:00:01", 1)])
def test_time_limits_as_slurm_writes_them(text, minutes):
    assert parse_time_limit(text) == minutes
