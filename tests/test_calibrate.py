"""scripts/calibrate.py recovers constants from measurement files, uses only what the provenance rule
lets count, refuses thin fits, and takes every step overhead out once (synthetic FAKE measurements
made in the test from the estimator's own numbers)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from reportgen import catalog, store
from reportgen.estimate import estimate
from reportgen.runner import run_estimates
from reportgen.sweep import load_sweep

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "calibrate.py"


def make_sweep(tmp_path: Path, batches: list[int]) -> Path:
    spec = tmp_path / "cal.yaml"
    spec.write_text(f"""
name: cal
grids:
  - model: llama-3.2-1b
    gpu: h100-sxm
    method: full
    seq: 2048
    batch: {batches}
""")
    out = tmp_path / "results"
    run_estimates(load_sweep(spec), out, warn=lambda m: None)
    return out


def add_fake(results: Path, device: str = "h100-sxm", capped: str | None = None, context_mib: int = 612,
             efficiency: float | None = None) -> None:
    """A made-up measurement (test data only) for every case: allocated = reserved = the estimate,
    device_used = reserved + context; with ``efficiency``, a step time made of the estimate's own
    non-compute terms plus the compute time at that matmul efficiency."""
    for r in store.load_sweep(results / "cal"):
        case = r["case"]
        from reportgen.setup import TrainingSetup

        setup = TrainingSetup.model_validate(case["setup"])
        e = estimate(catalog.load_model(case["model"]), catalog.load_gpu(case["gpu"]), setup, reverse=False)
        figures = {"peak_allocated": e.memory.peak_allocated, "peak_reserved": e.memory.peak_reserved,
                   "device_used": e.memory.peak_reserved + context_mib * 2**20, "step_s": None, "tokens_per_s": None}
        if efficiency is not None:
            p = e.time.parts
            peak = catalog.load_gpu(case["gpu"]).peak_flops(e.time.peak_dtype)
            compute = e.time.hardware_flops_per_token * setup.tokens_per_step / (peak * efficiency)
            figures["step_s"] = compute + p["dequant"] + p["optimizer"] + p["transfer"] + p["overhead"]
            figures["tokens_per_s"] = setup.tokens_per_step / figures["step_s"]
        env = {"device": "cpu"} if device == "cpu" else {"device": "cuda", "gpu_catalog_key": device}
        cap = {"applied": True, "emulated_gpu": capped} if capped else None
        store.add_measurement(results / "cal", r["id"], case, {
            "status": "ok", "fake": True, "measurement": figures, "environment": env, "cap": cap,
            "measured_at": "2026-01-01T00:00:00+00:00"})


def run(*dirs: Path) -> str:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, dirs)], capture_output=True, text=True,
                          check=True).stdout


def line(out: str, name: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith(name))


def test_fits_context_and_efficiency_with_zero_held_out_error(tmp_path):
    results = make_sweep(tmp_path, [1, 2, 4, 8])
    add_fake(results, efficiency=0.6)
    out = run(results / "cal")
    ctx = line(out, "CUDA_CONTEXT_BYTES")
    assert "fit 612 MiB from 4 cases" in ctx and "median 0.0%" in ctx
    # the synthetic step holds each overhead once: the fit recovers 0.6 exactly only if the script
    # takes each of them out once (twice would push the efficiency up, never would pull it down)
    eff = line(out, "MATMUL_EFFICIENCY[datacenter]")
    assert "fit 0.6 from 4 cases" in eff and "median 0.0%" in eff and "worst 0.0%" in eff


def test_refuses_a_fit_from_fewer_cases_than_parameters_plus_two(tmp_path):
    results = make_sweep(tmp_path, [1, 2])
    add_fake(results, efficiency=0.6)
    out = run(results / "cal")
    assert "CUDA_CONTEXT_BYTES: not fitted, 2 usable case(s)" in out and "at least 3" in out
    assert "MATMUL_EFFICIENCY[datacenter]: not fitted" in out


@pytest.mark.parametrize("device, capped, fits", [
    ("cpu", None, set()),  # a CPU run counts for nothing
    ("a100-80gb", None, set()),  # another card, no cap: neither memory nor speed of the H100 case
    ("h200", "h100-sxm", {"CUDA_CONTEXT_BYTES"}),  # capped to the H100's memory: memory only
])
def test_fits_only_what_the_provenance_rule_allows(tmp_path, device, capped, fits):
    results = make_sweep(tmp_path, [1, 2, 4])
    add_fake(results, device=device, capped=capped, efficiency=0.6)
    out = run(results / "cal")
    fitted = {name for name in ("CUDA_CONTEXT_BYTES", "MATMUL_EFFICIENCY[datacenter]")
              if any(ln.startswith(name + ": current") for ln in out.splitlines())}
    assert fitted == fits
    if not fits:
        assert "nothing to fit" in out


def test_no_measurements_says_so(tmp_path):
    assert "nothing to fit" in run(tmp_path)


def test_published_tokens_per_s_fit_per_gpu_class(tmp_path):
    """The published rows' tokens/s fit MATMUL_EFFICIENCY per GPU class with its leave-one-out error,
    from rows whose estimated step is mostly compute; a class with too few such rows is not fitted."""
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True,
                         cwd=SCRIPT.parent.parent, check=True).stdout
    assert "published rows with tokens/s read from data/published_measurements.csv" in out
    consumer = next(ln for ln in out.splitlines() if ln.startswith("published tokens/s: MATMUL_EFFICIENCY[consumer]"))
    assert "held-out |error| median" in consumer
    # the shipped constant is the fit the script prints (constants.py: FITTED)
    current, fit = re.search(r"current ([0-9.]+), fit ([0-9.]+)", consumer).groups()
    assert current == fit
    # data-center rows get a fit and its error printed; the constant stays ASSUMED (constants.py says why)
    assert "published tokens/s: MATMUL_EFFICIENCY[datacenter]: current 0.45" in out
    quiet = subprocess.run([sys.executable, str(SCRIPT), "--no-published", str(tmp_path)], capture_output=True,
                           text=True, cwd=SCRIPT.parent.parent, check=True).stdout
    assert "published rows" not in quiet and "nothing to fit" in quiet
