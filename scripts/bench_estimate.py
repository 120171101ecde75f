#!/usr/bin/env python3
"""Print how many cases per second the estimator handles (no torch, one process).

    python scripts/bench_estimate.py [sweeps/consumer.yaml]

Reports three figures: a bare estimate (memory + time), an estimate with both reverse searches
(largest batch, longest sequence), and the whole `reportgen sweep` pipeline without rendering
(which caches the searches across cases and writes one JSON file per case).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reportgen import catalog  # noqa: E402
from reportgen.estimate import estimate  # noqa: E402
from reportgen.runner import run_estimates  # noqa: E402
from reportgen.sweep import load_sweep  # noqa: E402


def rate(label: str, n: int, seconds: float) -> None:
    print(f"{label:<42} {n:>6} cases in {seconds:6.2f} s = {n / seconds:>9,.0f} cases/s")


def main() -> None:
    sweep = load_sweep(sys.argv[1] if len(sys.argv) > 1 else "sweeps/consumer.yaml")
    cases = [(catalog.load_model(c.model), catalog.load_gpu(c.gpu), c.setup) for c in sweep.cases]
    t0 = time.perf_counter()
    for m, g, s in cases:
        estimate(m, g, s, reverse=False)
    rate("estimate (memory + time)", len(cases), time.perf_counter() - t0)
    sample = cases[:: max(1, len(cases) // 300)]
    t0 = time.perf_counter()
    for m, g, s in sample:
        estimate(m, g, s, reverse=True)
    rate("estimate + largest batch + longest sequence", len(sample), time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_estimates(sweep, Path(tmp))
        rate(f"sweep pipeline ({sweep.name}, writes JSON)", len(sweep.cases), time.perf_counter() - t0)


if __name__ == "__main__":
    main()
