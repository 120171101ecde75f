#!/usr/bin/env python3
"""Fit the estimator's calibration constants to measured results, with held-out error.

    python scripts/calibrate.py [results/validation ...]

Reads result files whose ``measurement.status`` is ``ok`` and were measured on CUDA, and fits:

* ``CUDA_CONTEXT_BYTES``: median of (NVML device_used - torch peak_reserved);
* ``FRAGMENTATION_OF_TRANSIENT``: median of (reserved - allocated - segments) / transient bytes;
* ``MATMUL_EFFICIENCY`` per GPU class: median over compute-bound cases of the efficiency that makes
  the predicted step time match the measured one.

Each fit is reported with its leave-one-out error (fit on all other cases, predict the held-out
one): the number to quote, since the in-sample error flatters. The script prints; it never edits
``constants.py``. A changed constant cites the commit of this script's output in its comment.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reportgen import catalog  # noqa: E402
from reportgen.estimate import constants as K  # noqa: E402
from reportgen.estimate import estimate  # noqa: E402
from reportgen.setup import TrainingSetup  # noqa: E402


def measured_results(dirs: list[Path]) -> list[dict]:
    out = []
    for d in dirs:
        for path in sorted(d.glob("*.json")):
            r = json.loads(path.read_text())
            m = r.get("measurement") or {}
            env = m.get("environment") or {}
            if m.get("status") == "ok" and m.get("measurement") and env.get("device", "cuda") != "cpu" \
                    and m["measurement"].get("peak_allocated") is not None:
                out.append(r)
    return out


def loo(values: list[float], predict) -> tuple[float, list[float]]:
    """Median fit and leave-one-out relative errors of ``predict(fit, i)``."""
    errors = []
    for i in range(len(values)):
        rest = values[:i] + values[i + 1:]
        if not rest:
            continue
        errors.append(predict(statistics.median(rest), i))
    return statistics.median(values), errors


def describe(name: str, current, fit, errors: list[float], unit: str = "") -> None:
    med = statistics.median(abs(e) for e in errors) if errors else float("nan")
    worst = max((abs(e) for e in errors), default=float("nan"))
    print(f"{name}: current {current}{unit}, fit {fit:.4g}{unit} from {max(1, len(errors))} cases; "
          f"held-out |error| median {100 * med:.1f}%, worst {100 * worst:.1f}%")


def main() -> int:
    dirs = [Path(a) for a in sys.argv[1:]] or sorted(p for p in Path("results").iterdir() if p.is_dir())
    rows = measured_results(dirs)
    if not rows:
        print(f"no CUDA measurements with status ok under {', '.join(map(str, dirs))}: nothing to fit")
        return 0
    ests, meas = [], []
    for r in rows:
        case = r["case"]
        setup = TrainingSetup.model_validate(case["setup"])
        ests.append(estimate(catalog.load_model(case["model"]), catalog.load_gpu(case["gpu"]), setup, reverse=False))
        meas.append(r["measurement"]["measurement"])

    ctx = [m["device_used"] - m["peak_reserved"] for m in meas if m.get("device_used") and m.get("peak_reserved")]
    if ctx:
        fit, errs = loo(ctx, lambda f, i: (f - ctx[i]) / ctx[i])
        describe("CUDA_CONTEXT_BYTES", f"{K.CUDA_CONTEXT_BYTES / 2**20:.0f} MiB", fit / 2**20, errs, "")

    frag, idx = [], []
    for i, (e, m) in enumerate(zip(ests, meas)):
        transient = e.memory.peak_allocated - e.memory.terms["weights"] - e.memory.terms["optimizer"]
        if m.get("peak_reserved") and transient > 0:
            frag.append((m["peak_reserved"] - m["peak_allocated"] - K.ALLOCATOR_SEGMENTS_BYTES) / transient)
            idx.append(i)
    if frag:
        def predict_frag(f, j):
            e, m = ests[idx[j]], meas[idx[j]]
            transient = e.memory.peak_allocated - e.memory.terms["weights"] - e.memory.terms["optimizer"]
            pred = m["peak_allocated"] + f * transient + K.ALLOCATOR_SEGMENTS_BYTES
            return (pred - m["peak_reserved"]) / m["peak_reserved"]
        fit, errs = loo(frag, predict_frag)
        describe("FRAGMENTATION_OF_TRANSIENT", K.FRAGMENTATION_OF_TRANSIENT, fit, errs)

    for cls in ("datacenter", "consumer"):
        effs, idx = [], []
        for i, (e, m) in enumerate(zip(ests, meas)):
            gpu = catalog.load_gpu(e.gpu)
            if (cls == "consumer") != gpu.is_consumer or e.time.bound != "compute" or not m.get("tokens_per_s"):
                continue
            peak = gpu.peak_flops(e.time.peak_dtype)
            effs.append(e.time.flops_per_token * m["tokens_per_s"] / (peak * e.setup.gpus))
            idx.append(i)
        if effs:
            def predict_eff(f, j):
                e, m = ests[idx[j]], meas[idx[j]]
                pred_tps = e.time.tokens_per_s * f / K.MATMUL_EFFICIENCY[cls]
                return (pred_tps - m["tokens_per_s"]) / m["tokens_per_s"]
            fit, errs = loo(effs, predict_eff)
            describe(f"MATMUL_EFFICIENCY[{cls}]", K.MATMUL_EFFICIENCY[cls], fit, errs)
    print(f"{len(rows)} measured cases read from {', '.join(map(str, dirs))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
