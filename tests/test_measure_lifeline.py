"""A measuring sweep killed by SIGTERM or SIGKILL takes its worker with it and leaves no scratch folder
(issue 20: the worker went on measuring, up to its timeout, on the GPU the resumed sweep measured
on). Run on the CPU with the harness's fault injection: ``REPORTGEN_FAULT=hang`` parks the worker in
its model build, as a hung CUDA call would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reportgen.measure.isolate import process_alive
from tests.measure_helpers import tiny_sweep

ROOT = Path(__file__).resolve().parents[1]


def workers(marker: str) -> list[int]:
    """Processes whose command line names ``marker`` (the scratch folder: the worker's arguments)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and int(proc.name) != os.getpid() and process_alive(int(proc.name)):
            out.append(int(proc.name))
    return out


def wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc to find the worker")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_killed_sweep_leaves_no_worker_and_no_scratch_folder(tmp_path, sig):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sweep = tiny_sweep(tmp_path, "lifeline")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "REPORTGEN_FAULT": "hang", "REPORTGEN_MEASURE_DEVICE": "cpu",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    parent = subprocess.Popen([sys.executable, "-m", "reportgen", "sweep", str(sweep), "--measure", "--no-render",
                               "--results", str(tmp_path / "results")], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # the worker is up once its interim answer (status "running") is in its scratch folder
        started = wait_for(lambda: any('"running"' in p.read_text(errors="replace")
                                       for p in scratch.glob("reportgen-measure-*/answer.json")), 120)
        assert started, parent.stderr.read() if parent.poll() is not None else "no worker answer within 120 s"
        assert workers(str(scratch)), "the worker is not running"
        parent.send_signal(sig)
        rc = parent.wait(timeout=60)
        assert rc == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
        assert wait_for(lambda: not workers(str(scratch)), 15), f"worker still alive: {workers(str(scratch))}"
        assert wait_for(lambda: not list(scratch.iterdir()), 15), sorted(p.name for p in scratch.iterdir())
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in workers(str(scratch)):
            os.kill(pid, signal.SIGKILL)
