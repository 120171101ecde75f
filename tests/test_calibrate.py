"""scripts/calibrate.py recovers constants from measurements (synthetic files made in the test)."""

import json
import subprocess
import sys
from pathlib import Path

from reportgen import catalog
from reportgen.estimate import estimate
from reportgen.setup import TrainingSetup

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "calibrate.py"


def fake_result(path: Path, i: int, context_mib: int) -> None:
    """A made-up measurement (test data only): reserved = estimate, device_used = reserved + context."""
    setup = TrainingSetup(method="lora", batch=1 + i, seq=1024)
    est = estimate(catalog.load_model("llama-3.2-1b"), catalog.load_gpu("h100-sxm"), setup, reverse=False)
    meas = {"peak_allocated": est.memory.peak_allocated, "peak_reserved": est.memory.peak_reserved,
            "device_used": est.memory.peak_reserved + context_mib * 2**20, "tokens_per_s": None}
    data = {"case": {"model": "llama-3.2-1b", "gpu": "h100-sxm", "setup": setup.model_dump(mode="json")},
            "measurement": {"status": "ok", "measurement": meas, "environment": {"device": "cuda"}}}
    path.write_text(json.dumps(data))


def test_fits_context_with_zero_held_out_error(tmp_path):
    for i in range(4):
        fake_result(tmp_path / f"c{i}.json", i, 612)
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("CUDA_CONTEXT_BYTES"))
    assert "fit 612 from 4 cases" in line and "median 0.0%" in line


def test_no_measurements_says_so(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert "nothing to fit" in out
