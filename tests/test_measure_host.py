"""Host memory in every measurement (issue 32, item 2): the worker's peak resident set size and its
size after load (measure/host.py, harness.py), read on the CPU today; the shape check takes them, the
consistency check refuses an impossible one, and `show` prints them (a file from before prints as
it did)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from reportgen.measure import host
from tests.measure_helpers import measure_json, tiny_config

ROOT = Path(__file__).resolve().parents[1]
REAL = sorted((ROOT / "results" / "validation" / "measured").glob("llama-3.2-1b.h100-sxm.lora.*.json"))[0]
HOST_KEYS = ("host_rss_after_load", "host_peak_rss_load", "host_peak_rss_warmup", "host_peak_rss",
             "host_peak_rss_children")
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="getrusage's KiB and /proc are Linux's")


@linux
def test_a_cpu_measurement_records_the_host_memory_of_its_worker(capsys, tmp_path):
    """A fresh worker process (the isolated path, as every real measurement): positive byte counts,
    the whole run's peak at least the peak to the end of the warm-up, that at least the peak to the
    end of loading (ru_maxrss only grows), and the whole run's peak at least the size after load."""
    rc, d = measure_json(capsys, "--model", str(tiny_config(tmp_path)), "--gpu", "h100-sxm", "--device", "cpu",
                         "--method", "lora", "--seq", "16", "--warmup", "1", "--steps", "1", "--max-steps", "1")
    assert rc == 0 and d["status"] == "ok", d["error"]
    m = d["measurement"]
    assert all(type(m[k]) is int for k in HOST_KEYS), {k: m.get(k) for k in HOST_KEYS}
    assert all(m[k] > 0 for k in HOST_KEYS if k != "host_peak_rss_children") and m["host_peak_rss_children"] >= 0
    assert m["host_peak_rss"] >= m["host_peak_rss_warmup"] >= m["host_peak_rss_load"]
    assert m["host_peak_rss"] >= m["host_rss_after_load"]
    assert m["host_rss_after_load"] > 50 * 2**20  # python with torch imported and a model: no unit slip (KiB)
    assert "host_peak_rss_at_failure" not in m


@linux
def test_a_failed_run_records_the_peak_up_to_its_failure(monkeypatch, tmp_path):
    """An injected OOM in the warm-up (in this process): the load's figures and the peak up to the
    failure, never a whole run's peak the run did not reach."""
    from reportgen.measure import harness
    from reportgen.measure.protocol import MeasureRequest
    from reportgen.setup import TrainingSetup

    monkeypatch.setenv(harness.FAULT_ENV, "oom")
    setup = TrainingSetup(method="lora", batch=1, seq=16).model_dump(mode="json")
    req = MeasureRequest(model=str(tiny_config(tmp_path)), gpu="h100-sxm", setup=setup, device="cpu", warmup=1)
    m = harness.run(req, environment={"device": "cpu"})["measurement"]
    assert m["failed_in"] == "warmup"
    assert m["host_peak_rss_at_failure"] >= m["host_peak_rss_load"] > 0 and m["host_rss_after_load"] > 0
    assert "host_peak_rss" not in m and "host_peak_rss_warmup" not in m


def test_rss_now_reads_vmrss_in_bytes_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr(host, "_linux", lambda: True)
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  900 kB\nVmRSS:\t  123456 kB\nRssAnon:\t 1 kB\n")
    assert host.rss_now(status) == 123456 * 1024
    status.write_text("Name:\tpython\nVmHWM:\t  900 kB\n")  # a kernel thread has no VmRSS
    assert host.rss_now(status) is None
    status.write_text("VmRSS:\t  12 MB\n")  # a unit it does not know: no figure
    assert host.rss_now(status) is None
    assert host.rss_now(tmp_path / "absent") is None
    monkeypatch.setattr(host, "_linux", lambda: False)  # macOS's ru_maxrss is bytes: not guessed
    assert host.peak_rss() is None and host.peak_rss_children() is None and host.rss_now(status) is None


def _real(**figures) -> dict:
    doc = json.loads(REAL.read_text())
    doc["measurement"].update(figures)
    return doc


@pytest.mark.parametrize("figure, value", [("host_peak_rss", -1), ("host_rss_after_load", -4096),
                                           ("host_peak_rss_children", float("inf")),
                                           ("host_peak_rss_load", float("nan")), ("host_peak_rss", "lots")])
def test_an_impossible_host_figure_sets_the_file_aside(figure, value):
    """As a GPU figure: a negative or non-finite host figure makes the whole run count for nothing,
    with the reason (provenance.inconsistency)."""
    from reportgen.provenance import QUANTITIES, provenance_of

    assert "host_peak_rss" not in json.loads(REAL.read_text())["measurement"]  # a file from before issue 32
    good = _real(host_rss_after_load=3 * 2**30, host_peak_rss=5 * 2**30, host_peak_rss_children=0)
    assert provenance_of(good).valid_quantities("h100-sxm") == QUANTITIES
    prov = provenance_of(_real(**{figure: value}))
    assert prov.valid_quantities("h100-sxm") == ()
    assert f"its {figure} ({value!r}) is not a size, time or rate" in prov.mismatch


def test_the_shape_check_takes_host_figures_as_whole_bytes():
    """A negative count is well-formed (the consistency check refuses it, above); a count that is no
    whole number is not."""
    from reportgen.result_schema import check_measurement
    from reportgen.results import UnreadableResult

    check_measurement(_real(host_peak_rss=5 * 2**30, host_rss_after_load=-1), REAL)
    for value in ("lots", 1.5, True):
        with pytest.raises(UnreadableResult, match="measurement.host_peak_rss"):
            check_measurement(_real(host_peak_rss=value), REAL)


def _shown(doc: dict) -> str:
    from reportgen.views.measurement import print_measurement

    console = Console(record=True, width=200)
    print_measurement(doc, None, console=console)
    return console.export_text()


def test_show_prints_host_ram_and_a_file_from_before_as_it_was():
    old = json.loads(REAL.read_text())
    before = _shown(old)
    assert "host RAM" not in before
    new = _shown(_real(host_rss_after_load=3 * 2**30, host_peak_rss=int(5.5 * 2**30), host_peak_rss_children=2**30))
    added = [line for line in new.splitlines() if line not in before.splitlines()]
    assert added == ["host RAM: peak 5.50 GiB (after load 3.00 GiB)"]
    failed = _shown(_real(host_rss_after_load=3 * 2**30, host_peak_rss_at_failure=4 * 2**30))
    assert "host RAM: peak 4.00 GiB up to the failure (after load 3.00 GiB)" in failed


def test_a_multi_gpu_merge_keeps_each_ranks_host_memory_and_the_largest():
    """Each rank is a process of its own: the merged figure is the largest rank's (one process's,
    as the GPU figures are one GPU's), and each rank keeps its own."""
    from reportgen.measure.protocol import MeasureRequest, answer, empty_measurement
    from reportgen.measure.ranks import merge

    request = MeasureRequest(model="llama-3.1-8b", gpu="h100-sxm", setup={"method": "lora", "gpus": 2,
                                                                           "sharding": "ddp"}, device="cpu")

    def rank(r: int, peak: int) -> dict:
        env = {"device": "cpu", "rank": r, "local_rank": r, "world_size": 2, "backend": "gloo", "launcher": "torchrun"}
        m = dict(empty_measurement(), step_times_s=[0.1, 0.2], step_s=0.15, real_tokens_per_step=64,
                 host_rss_after_load=peak // 2, host_peak_rss_load=peak // 2, host_peak_rss_warmup=peak,
                 host_peak_rss=peak, host_peak_rss_children=0)
        return answer(request, "ok", measurement=m, environment=env)

    m = merge(request, {0: rank(0, 3 * 2**30), 1: rank(1, 4 * 2**30)})["measurement"]
    assert m["host_peak_rss"] == 4 * 2**30 and m["host_rss_after_load"] == 2 * 2**30
    assert [r["host_peak_rss"] for r in m["ranks"]] == [3 * 2**30, 4 * 2**30]
