"""`reportgen sweep FILE --measure` on CPU: each attempt is its own measurement file next to the
untouched estimate file; shards split the cases; a rerun skips what is measured; --force measures
again as a new attempt, and no attempt is ever overwritten."""

import json

import pytest

from reportgen.cli import main
from reportgen.measure.runner import DEVICE_ENV
from reportgen.store import load_results, measurement_files
from tests.measure_helpers import tiny_sweep
from tests.torch_saved import TINY


@pytest.fixture()
def sweep_file(tmp_path, monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    return tiny_sweep(tmp_path, "tiny-measure")


def results(results_dir):
    return {r["id"]: r for r in load_results(results_dir / "tiny-measure")}


def snapshot(results_dir):
    """Every file of the sweep directory and its bytes."""
    return {p.relative_to(results_dir).as_posix(): p.read_bytes() for p in sorted(results_dir.rglob("*.json"))}


def sweep(path, results_dir, *extra):
    return main(["sweep", str(path), "--measure", "--no-render", "--results", str(results_dir), *extra])


def _stub_worker(monkeypatch) -> list[str]:
    """The measuring subprocess replaced by one that answers "ok" at once; the methods it was asked for."""
    from reportgen.measure import runner
    from reportgen.measure.protocol import answer, empty_measurement

    calls = []

    def run_case(request, timeout_s):
        calls.append(request.setup["method"])
        return answer(request, "ok", measurement=empty_measurement(), environment={"device": "cpu"})

    monkeypatch.setattr(runner, "run_case", run_case)
    return calls


def test_measure_shard_resume_force(sweep_file, tmp_path, monkeypatch):
    """Shard 0 measures its case for real (the worker subprocess on the CPU); the other shard, the
    rerun and --force run with the worker stubbed: which cases they measure and which files they
    leave alone is the sweep loop's, not the worker's."""
    out = tmp_path / "results"
    assert sweep(sweep_file, out, "--shard", "0/2") == 0
    r = results(out)
    assert len(r) == 2
    first, second = sorted(r)  # cases are indexed in id order
    assert r[first]["measurement"] is not None and r[second]["measurement"] is None
    block = r[first]["measurement"]
    assert block["status"] == "ok"
    assert block["settings"] == {"device": "cpu", "warmup": 1, "steps": 1, "max_steps": 1, "max_timed_s": 5.0,
                                 "target_rel_ci": 0.02, "timeout_s": 120, "cap_to_gpu": False, "profile": False,
                                 "profile_steps": 2}
    assert block["measurement"]["steps_run"] == 1 and block["measurement"]["stop_reason"] == "max_steps"
    assert block["measurement"]["step_s"] > 0 and block["measurement"]["peak_allocated"] is None
    assert block["environment"]["device"] == "cpu" and block["measured_at"]
    assert block["case"] == r[first]["case"] and block["id"] == first and block["schema_version"] == 1
    estimate_file = (out / "tiny-measure" / f"{first}.json").read_text()
    assert '"measurement"' not in estimate_file  # the estimate file never holds a measurement
    estimate = r[first]["estimate"]
    assert estimate["memory"]["peak_allocated"] > 0 and r[first]["status"] == "ok"

    # the other shard measures the other case and leaves every existing file alone
    calls = _stub_worker(monkeypatch)
    before = snapshot(out)
    assert sweep(sweep_file, out, "--shard", "1/2") == 0
    assert calls == [r[second]["case"]["setup"]["method"]]
    after = snapshot(out)
    assert {k: v for k, v in after.items() if k in before and "_advice" not in k} == {
        k: v for k, v in before.items() if "_advice" not in k}
    r2 = results(out)
    assert r2[second]["measurement"]["status"] == "ok"

    # a rerun measures nothing: no file changes
    calls.clear()
    assert sweep(sweep_file, out) == 0
    assert snapshot(out) == after and calls == []

    # --force measures again (here only shard 0's case) as a NEW attempt: the first one is kept
    assert sweep(sweep_file, out, "--force", "--shard", "0/2") == 0
    assert calls == [r[first]["case"]["setup"]["method"]]
    r3 = results(out)
    assert len(r3[first]["measurements"]) == 2 and len(r3[second]["measurements"]) == 1
    assert r3[first]["measurement"] is r3[first]["measurements"][-1]  # the newest is shown
    assert r3[first]["measurements"][0]["measurement"] == r2[first]["measurement"]["measurement"]
    assert all(snapshot(out)[k] == v for k, v in after.items() if "/measured/" in k)
    assert r3[first]["estimate"] == r2[first]["estimate"]


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
        # a case that ended in error or timeout fails the sweep (exit 1: rerun it to retry); an oom is an answer
        assert sweep(sweep_file, out) == (1 if status in ("timeout", "error") else 0), status
        assert len(calls) == expect, status  # timeout/error: retried; after an oom nothing is rerun
        assert {r["measurement"]["status"] for r in results(out).values()} == {"oom" if status == "ok" else status}
    calls.clear()
    monkeypatch.setattr(runner, "run_case", stub("ok"))
    assert sweep(sweep_file, out, "--force") == 0
    assert len(calls) == 2 and {r["measurement"]["status"] for r in results(out).values()} == {"ok"}
    # every attempt is still there: timeout, error, oom, then ok, for both cases
    assert [a["status"] for a in results(out)[sorted(results(out))[0]]["measurements"]] == [
        "timeout", "error", "oom", "ok"]
    assert len(measurement_files(out / "tiny-measure")) == 8


def test_a_measuring_device_other_than_cuda_or_cpu_is_refused(sweep_file, tmp_path, monkeypatch, capsys):
    """REPORTGEN_MEASURE_DEVICE=gpu stored a worker's traceback for every case, and the sweep exited 0."""
    monkeypatch.setenv(DEVICE_ENV, "gpu")
    assert sweep(sweep_file, tmp_path / "results") == 2
    assert f"{DEVICE_ENV}=gpu: measures on cuda or cpu" in capsys.readouterr().err


def test_no_gpu_no_cuda_sweep(sweep_file, tmp_path, monkeypatch, capsys):
    from reportgen.measure import nvml

    monkeypatch.delenv(DEVICE_ENV)
    monkeypatch.setattr(nvml, "nvidia_gpus_present", lambda: (False, "no driver"))
    assert sweep(sweep_file, tmp_path / "results") == 2
    assert "no usable NVIDIA GPU" in capsys.readouterr().err


def test_deadline_defers_cases_and_a_cut_case_writes_nothing(sweep_file, tmp_path, monkeypatch, capsys):
    """REPORTGEN_MEASURE_DEADLINE: no case starts that cannot end before it; a worker still running
    at the deadline is killed and leaves no result (a later call measures it, it is no timeout)."""
    import time

    from reportgen.measure import runner
    from reportgen.measure.protocol import answer, empty_measurement

    seen = []

    def run_case(request, timeout_s):
        seen.append(timeout_s)
        status = "timeout" if timeout_s < 120 else "ok"
        return answer(request, status, measurement=empty_measurement(), environment={"device": "cpu"})

    monkeypatch.setattr(runner, "run_case", run_case)
    out = tmp_path / "results"

    monkeypatch.setenv(runner.DEADLINE_ENV, str(time.time() + 5))  # less than any case's expected time
    assert sweep(sweep_file, out) == 0
    assert seen == [] and all(r["measurement"] is None for r in results(out).values())
    assert "deferred by the deadline (2)" in capsys.readouterr().err

    monkeypatch.setenv(runner.DEADLINE_ENV, str(time.time() + 100))  # starts, but is cut at the deadline
    assert sweep(sweep_file, out) == 0
    assert len(seen) == 1 and 90 < seen[0] <= 100  # the worker's timeout stops at the deadline
    assert all(r["measurement"] is None for r in results(out).values())
    err = capsys.readouterr().err
    assert "nothing written" in err and "deferred by the deadline (2)" in err

    monkeypatch.setenv(runner.DEADLINE_ENV, str(time.time() + 3600))  # far away: the sweep's own limit
    seen.clear()
    assert sweep(sweep_file, out) == 0
    assert seen == [120, 120] and {r["measurement"]["status"] for r in results(out).values()} == {"ok"}

    monkeypatch.setenv(runner.DEADLINE_ENV, "soon")
    assert sweep(sweep_file, out, "--force") == 2


def test_expected_time_of_a_case():
    from reportgen.measure.runner import CASE_OVERHEAD_S, expected_s

    settings = {"warmup": 2, "steps": 5}
    assert expected_s({"estimate": None}, settings) == 2 * CASE_OVERHEAD_S
    slow = expected_s({"estimate": {"time": {"step_s": 4.0}}}, settings)
    assert slow > expected_s({"estimate": {"time": {"step_s": 0.1}}}, settings) > CASE_OVERHEAD_S


def test_validate_on_gpu_script(tmp_path):
    """scripts/validate_on_gpu.sh end to end on the CPU: one case fails, the next is still measured,
    the archive holds only measured files under <sweep>/, the log and the exit status are there."""
    import os
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    good = tmp_path / "tiny-llama.json"
    good.write_text(json.dumps(TINY["llama"]))
    bad = tmp_path / "bad-llama.json"
    # a padding index past the vocabulary: nothing to the estimator, a failed build to torch.nn.Embedding
    bad.write_text(json.dumps(dict(TINY["llama"], pad_token_id=TINY["llama"]["vocab_size"])))
    spec = tmp_path / "script.yaml"
    spec.write_text(f"""
name: script-check
grids:
  - model: [{bad}, {good}]
    gpu: h100-sxm
    method: lora
    seq: 16
measure: {{warmup: 0, steps: 1, max_steps: 1, timeout_s: 120, profile: true, profile_steps: 1}}
""")
    out = tmp_path / "out"
    env = dict(os.environ, SWEEP=str(spec), WHEELS=str(tmp_path / "no-wheels"), OUT=str(out),
               SITE=str(tmp_path / "site"), REPORTGEN_MEASURE_DEVICE="cpu", REPORTGEN_GIT_COMMIT="0" * 40,
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run(["bash", str(root / "scripts" / "validate_on_gpu.sh"), "0/1", "300"], env=env,
                          capture_output=True, text=True, timeout=600)
    log = (out / "validate.log").read_text()
    # the sweep's status: 1, since a case ended in error; both cases' files are packed all the same
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "== packed 2 measured result files" in log and "exit status 1" in log
    with tarfile.open(out / "validation-results.tgz") as tar:
        names = sorted(tar.getnames())
        blocks = {Path(n).name.split(".")[0]: json.load(tar.extractfile(n)) for n in names}
    assert all(n.startswith("script-check/measured/") and n.endswith(".json") for n in names) and len(names) == 2
    assert blocks["bad-llama"]["status"] == "error" and blocks["tiny-llama"]["status"] == "ok"
    assert blocks["tiny-llama"]["environment"]["device"] == "cpu" and blocks["tiny-llama"]["settings"]["steps"] == 1
    # a config the estimator reads and torch cannot build: the error with its traceback, from the worker
    bad = blocks["bad-llama"]
    assert "Traceback" in bad["error"] and "Padding_idx must be within num_embeddings" in bad["error"]
    assert bad["measurement"]["failed_in"] == "build" and bad["environment"]["source"] == "worker"
    assert {"device", "gpu_name", "driver_version", "cuda_version", "versions", "git_commit", "utc"} <= set(bad["environment"])
    # the profiled case's trace, packed beside the measurements, named in its measurement file
    profile = blocks["tiny-llama"]["measurement"]["profile"]
    assert profile["error"] is None and profile["trace"].startswith("profiles/tiny-llama.")
    with tarfile.open(out / "validation-profiles.tar") as tar:
        assert tar.getnames() == ["script-check/" + profile["trace"]]
    assert "== packed 1 profiler traces" in (out / "validate.log").read_text()
