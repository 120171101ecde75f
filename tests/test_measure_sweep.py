"""`reportgen sweep FILE --measure` on CPU: measurements merge into the result files next to the
untouched estimates; shards split the cases; a rerun skips what is measured; --force remeasures."""

import json

import pytest

from reportgen.cli import main
from reportgen.measure.runner import DEVICE_ENV
from reportgen.results import read_result
from tests.torch_saved import TINY


@pytest.fixture()
def sweep_file(tmp_path, monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    model = tmp_path / "tiny-llama.json"
    model.write_text(json.dumps(TINY["llama"]))
    path = tmp_path / "tiny.yaml"
    path.write_text(f"""
name: tiny-measure
grids:
  - model: {model}
    gpu: h100-sxm
    method: [full, lora]
    seq: 16
measure: {{warmup: 1, steps: 1, timeout_s: 120}}
""")
    return path


def results(results_dir):
    return {p.stem: read_result(p) for p in sorted((results_dir / "tiny-measure").glob("*.json"))}


def sweep(path, results_dir, *extra):
    return main(["sweep", str(path), "--measure", "--no-render", "--results", str(results_dir), *extra])


def test_measure_shard_resume_force(sweep_file, tmp_path):
    out = tmp_path / "results"
    assert sweep(sweep_file, out, "--shard", "0/2") == 0
    r = results(out)
    assert len(r) == 2
    first, second = sorted(r)  # cases are indexed in id order
    assert r[first]["measurement"] is not None and r[second]["measurement"] is None
    block = r[first]["measurement"]
    assert block["status"] == "ok"
    assert block["settings"] == {"device": "cpu", "warmup": 1, "steps": 1, "timeout_s": 120, "cap_to_gpu": False}
    assert block["measurement"]["step_s"] > 0 and block["measurement"]["peak_allocated"] is None
    assert block["environment"]["device"] == "cpu" and block["measured_at"]
    assert "case" not in block  # the result file has it
    estimate = r[first]["estimate"]
    assert estimate["memory"]["peak_allocated"] > 0 and r[first]["status"] == "ok"

    # the other shard measures the other case and leaves the first file alone
    assert sweep(sweep_file, out, "--shard", "1/2") == 0
    r2 = results(out)
    assert r2[first] == r[first]
    assert r2[second]["measurement"]["status"] == "ok"

    # a rerun measures nothing: both files unchanged
    assert sweep(sweep_file, out) == 0
    assert results(out) == r2

    # --force remeasures (here only shard 0's case), the estimate stays as it was
    assert sweep(sweep_file, out, "--force", "--shard", "0/2") == 0
    r3 = results(out)
    assert r3[first]["measurement"]["measurement"]["step_times_s"] != r2[first]["measurement"]["measurement"][
        "step_times_s"]
    assert r3[first]["estimate"] == r2[first]["estimate"]
    assert r3[second] == r2[second]


def test_failed_measurements_are_retried_ok_and_oom_are_not(sweep_file, tmp_path, monkeypatch):
    """The resume rule, with the worker replaced by a stub that answers a given status."""
    from reportgen.measure import runner
    from reportgen.measure.protocol import answer, empty_measurement

    calls = []

    def stub(status):
        def run_case(request, timeout_s):
            calls.append(request.setup["method"])
            return answer(request, status, measurement=empty_measurement(), environment={"device": "cpu"},
                          error=None if status == "ok" else f"stub {status}")
        return run_case

    out = tmp_path / "results"
    for status, expect in (("timeout", 2), ("error", 2), ("oom", 2), ("ok", 0)):
        calls.clear()
        monkeypatch.setattr(runner, "run_case", stub(status))
        assert sweep(sweep_file, out) == 0
        assert len(calls) == expect, status  # timeout/error: retried; after an oom nothing is rerun
        assert {r["measurement"]["status"] for r in results(out).values()} == {"oom" if status == "ok" else status}
    calls.clear()
    monkeypatch.setattr(runner, "run_case", stub("ok"))
    assert sweep(sweep_file, out, "--force") == 0
    assert len(calls) == 2 and {r["measurement"]["status"] for r in results(out).values()} == {"ok"}


def test_no_gpu_no_cuda_sweep(sweep_file, tmp_path, monkeypatch, capsys):
    from reportgen.measure import nvml

    monkeypatch.delenv(DEVICE_ENV)
    monkeypatch.setattr(nvml, "nvidia_gpus_present", lambda: (False, "no driver"))
    assert sweep(sweep_file, tmp_path / "results") == 2
    assert "no usable NVIDIA GPU" in capsys.readouterr().err
