"""The profiler's per-step figures: the interval union and the counting on synthetic Kineto events
(no torch), then ``reportgen measure --profile`` end to end on the CPU with a tiny Llama (GPU
figures null, CPU operators counted, a trace file that is valid Chrome trace JSON), and what the
terminal prints of it."""

import gzip
import json

import pytest

from reportgen.measure.trace_stats import read_trace, step_figures, top_level, union_length
from tests.measure_helpers import measure_json, tiny_config


# ----- pure functions over events -------------------------------------------------------------------
def test_union_counts_overlaps_once():
    assert union_length([(0, 4), (2, 6), (8, 9)]) == 7  # the docstring's worked example; the sum is 9
    assert union_length([(8, 9), (0, 4), (2, 6)]) == 7  # order does not matter
    assert union_length([(0, 10), (1, 2), (3, 4)]) == 10  # nested
    assert union_length([(0, 1), (1, 2)]) == 2  # touching
    assert union_length([(0, 0), (5, 3)]) == 0 and union_length([]) == 0


def _x(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def _kernel(name, ts, dur, corr, stream=7):
    e = _x("kernel", name, ts, dur, correlation=corr, stream=stream)
    e.update(pid=0, tid=stream)
    return e


def synthetic_trace() -> list[dict]:
    """Two profiled steps. Step 1 (100-200 us): two ops, one nested in the other, an autograd node,
    three launches; two of its kernels overlap on two streams; a memcpy. Step 2 (300-350 us): one op,
    one launch whose kernel starts after the step's range on the host clock (it still belongs to
    step 2 by its launch), and a graph launch."""
    return [
        _x("user_annotation", "ProfilerStep#1", 99, 102),
        _x("user_annotation", "reportgen_step#1", 100, 100),
        _x("user_annotation", "reportgen_step#2", 300, 50),
        _x("cpu_op", "aten::linear", 105, 30),
        _x("cpu_op", "aten::addmm", 110, 20),  # inside aten::linear
        _x("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 140, 10),
        dict(_x("cpu_op", "aten::mm", 142, 5), tid=2),  # the autograd thread: top-level there
        _x("cuda_runtime", "cudaLaunchKernel", 112, 3, correlation=11),
        _x("cuda_runtime", "cudaLaunchKernel", 120, 3, correlation=12),
        _x("cuda_driver", "cuLaunchKernel", 143, 2, correlation=13),
        _x("cuda_runtime", "cudaMemcpyAsync", 150, 2, correlation=14),
        _x("cuda_runtime", "cudaStreamSynchronize", 190, 9),
        _kernel("gemm", 130, 40, 11),  # 130-170
        _kernel("elementwise", 150, 30, 12, stream=8),  # 150-180: overlaps gemm
        _kernel("triton_kernel", 185, 5, 13),  # 185-190
        dict(_x("gpu_memcpy", "Memcpy HtoD", 192, 4, correlation=14), pid=0, tid=7),
        _x("gpu_user_annotation", "reportgen_step#1", 130, 70),  # not device work
        _x("cpu_op", "aten::add_", 305, 10),
        _x("cuda_runtime", "cudaLaunchKernel", 310, 2, correlation=21),
        _x("cuda_runtime", "cudaGraphLaunch", 320, 2, correlation=22),
        _kernel("add", 351, 4, 21),  # after the host range: belongs by its launch
        _kernel("graph_kernel", 330, 5, 22),
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "ts": 112, "id": 11},
    ]


def test_step_figures_from_synthetic_events():
    first, second = step_figures(synthetic_trace())
    assert first["step"] == 1 and first["wall_s"] == pytest.approx(100e-6)
    # kernels 130-180 (overlapping, counted once) + 185-190 + memcpy 192-196 = 50 + 5 + 4 us
    assert first["gpu_busy_s"] == pytest.approx(59e-6)
    assert (first["kernels"], first["memcpys"], first["memsets"], first["launches"]) == (3, 1, 0, 3)
    assert (first["cpu_ops"], first["aten_ops"], first["aten_ops_top"]) == (4, 3, 2)
    assert second["gpu_busy_s"] == pytest.approx(9e-6)
    assert (second["kernels"], second["launches"], second["aten_ops_top"]) == (2, 2, 1)


def test_cpu_only_trace_has_null_device_figures():
    events = [e for e in synthetic_trace() if e["cat"] in ("user_annotation", "cpu_op")]
    first, _ = step_figures(events)
    assert all(first[k] is None for k in ("gpu_busy_s", "kernels", "launches", "memcpys", "memsets"))
    assert first["cpu_ops"] == 4
    assert step_figures([_x("cpu_op", "aten::mm", 0, 1)]) == []  # no step ranges: no steps


def test_top_level_per_thread():
    ops = [_x("cpu_op", "aten::a", 0, 10), _x("cpu_op", "aten::b", 0, 5), _x("cpu_op", "aten::c", 10, 2),
           dict(_x("cpu_op", "aten::d", 1, 1), tid=9)]
    assert sorted(e["name"] for e in top_level(ops)) == ["aten::a", "aten::c", "aten::d"]


def test_read_trace_plain_and_gzipped(tmp_path):
    doc = {"traceEvents": synthetic_trace()}
    (tmp_path / "t.json").write_text(json.dumps(doc))
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        json.dump(doc, f)
    assert read_trace(tmp_path / "t.json") == read_trace(tmp_path / "t.json.gz") == doc["traceEvents"]


# ----- end to end on the CPU ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(tiny_config(tmp_path_factory.mktemp("cfg")))


def test_profile_on_cpu_end_to_end(capsys, tiny, tmp_path):
    rc, d = measure_json(capsys, "--model", tiny, "--gpu", "h100-sxm", "--device", "cpu", "--batch", "2", "--seq",
                         "32", "--warmup", "1", "--steps", "2", "--max-steps", "2", "--method", "lora",
                         "--profile", str(tmp_path / "traces"), "--profile-steps", "2")
    assert rc == 0, d["error"]
    m = d["measurement"]
    assert len(m["step_times_s"]) == 2 and m["steps_run"] == 2 and m["stop_reason"] == "max_steps"
    assert m["step_times_cuda_s"] is None and m["step_s_cuda"] is None  # no CUDA events on the CPU
    p = m["profile"]
    assert p["error"] is None and p["activities"] == ["cpu"] and p["warmup_steps"] == 1
    assert p["trace"].startswith(str(tmp_path / "traces")) and p["trace"].endswith(".pt.trace.json.gz")
    events = read_trace(p["trace"])  # valid Chrome trace JSON: what Perfetto and chrome://tracing open
    assert {e["name"] for e in events if e.get("cat") == "user_annotation"} >= {"reportgen_step#1", "reportgen_step#2"}
    assert [s["step"] for s in p["steps"]] == [1, 2]  # the profiler's warm-up step is not in the trace
    for s in p["steps"]:
        assert s["gpu_busy_s"] is None and s["kernels"] is None and s["launches"] is None
        assert s["wall_s"] > 0 and s["aten_ops"] >= s["aten_ops_top"] > 10 and s["cpu_ops"] > s["aten_ops"]
    assert p["steps"] == step_figures(events)
    assert p["total_s"] > sum(s["wall_s"] for s in p["steps"])

    from rich.console import Console

    from reportgen.views.measurement import print_measurement

    console = Console(record=True, width=200)
    print_measurement(d, None, console=console)
    text = console.export_text()
    assert "timing: 2 timed steps, stopped: max_steps" in text
    assert "profile: 2 step(s) under torch.profiler" in text and p["trace"] in text
    assert "top-level ATen ops" in text and "GPU busy" not in text


def test_a_failed_profile_leaves_the_measurement_ok(monkeypatch):
    """The profile runs after every timed figure is read: its failure is recorded, never the case's."""
    from reportgen.measure import harness, profiling
    from reportgen.measure.protocol import MeasureRequest

    def broken(*args, **kwargs):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(profiling, "profile_steps", broken)
    block = harness._profile(MeasureRequest(model="m", gpu="g", setup={}, profile="/tmp/x.pt.trace.json.gz"),
                             step=None, before=None, cuda=True)
    assert block["trace"] is None and block["steps"] == [] and "CUPTI_ERROR_NOT_INITIALIZED" in block["error"]


def test_profile_in_a_sweep_stores_the_trace_beside_the_measurements(tmp_path, monkeypatch, capsys):
    """measure.profile: the trace lands in results/<sweep>/profiles/, the measurement file names it
    relative to the sweep directory; `show` prints the timing, the trace and the command that
    remeasures with the same settings; a rerun with profile asked for keeps it (same settings)."""
    from reportgen.cli import main
    from reportgen.measure.runner import DEVICE_ENV
    from reportgen.store import load_results

    monkeypatch.setenv(DEVICE_ENV, "cpu")
    spec = tmp_path / "p.yaml"
    spec.write_text(f"""
name: prof
grids:
  - model: {tiny_config(tmp_path)}
    gpu: h100-sxm
    method: lora
    seq: 16
measure: {{warmup: 1, steps: 2, max_steps: 3, max_timed_s: 30, timeout_s: 120, profile: true, profile_steps: 1}}
""")
    out = tmp_path / "results"
    assert main(["sweep", str(spec), "--measure", "--no-render", "--results", str(out)]) == 0
    (r,) = load_results(out / "prof")
    block = r["measurement"]
    assert block["settings"]["profile"] is True and block["settings"]["profile_steps"] == 1
    profile = block["measurement"]["profile"]
    assert profile["trace"].startswith("profiles/") and (out / "prof" / profile["trace"]).is_file()
    assert len(profile["steps"]) == 1 and profile["steps"][0]["cpu_ops"] > 0
    capsys.readouterr()
    assert main(["show", r["id"], "--results", str(out)]) == 0
    text = capsys.readouterr().out
    assert "  timing: " in text and "timed steps, stopped: " in text and "of the median" in text
    assert f"trace {out / 'prof' / 'profiles'}" in text and "open at https://ui.perfetto.dev" in text
    assert "--warmup 1 --steps 2 --max-steps 3 --max-timed-s 30 --target-rel-ci 0.02 --profile --profile-steps 1" in text
    assert main(["sweep", str(spec), "--measure", "--no-render", "--results", str(out)]) == 0
    assert len(load_results(out / "prof")[0]["measurements"]) == 1  # settled: not measured again
