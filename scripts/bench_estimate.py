#!/usr/bin/env python3
"""Print how many cases per second the estimator handles (no torch, one process).

    python scripts/bench_estimate.py [sweeps/consumer.yaml]

Reports four figures: the wall time of one `reportgen estimate` command (a new Python process,
imports included; median of 5), a bare estimate (memory + time), an estimate with both reverse
searches (largest batch, longest sequence), and the whole `reportgen sweep` pipeline without
rendering (which caches the searches across cases and writes one JSON file per case). The machine's
load average is printed first: the figures are wall-clock and drop on a loaded machine. Then issue
31's targets, each with its figure and whether it is met: one `reportgen estimate` (its table) at most
0.15 s, at least 30,000 bare estimates/s, `reportgen sweep sweeps/consumer.yaml` with its render at most
8 s cold (a fresh results and docs folder; the charts' cache and the calculator's runtime as they are on
this machine) and at most 2 s when nothing changed. Under each target it prints what the time goes to: the
command for a case without stored measurements, the Python calls one estimate makes, and the cold sweep's
own account of its stages.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import subprocess
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


#: the case the estimate command is timed on (it has stored measurements, which it reads and checks), and
#: one no sweep measured (nothing to read): the difference is the measurements' schema check (pydantic)
MEASURED_CASE = ("--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--method", "qlora", "--grad-ckpt")
UNMEASURED_CASE = ("--model", "qwen2.5-14b", "--gpu", "rtx-3060", "--method", "qlora", "--grad-ckpt")


def cli_seconds(case: tuple[str, ...] = MEASURED_CASE, runs: int = 5) -> float:
    """Median wall time of one ``python -m reportgen estimate`` process (imports included)."""
    cmd = [sys.executable, "-m", "reportgen", "estimate", *case]
    root = Path(__file__).resolve().parent.parent
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=root, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sweep_seconds(sweep: str) -> tuple[float, float, str]:
    """Wall seconds of ``reportgen sweep SWEEP`` with its render into fresh folders, then of the same
    command again with nothing changed, and the cold run's own account of its time (its ``time:`` line)."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "reportgen", "sweep", sweep, "--results", f"{tmp}/results", "--docs",
               f"{tmp}/docs"]
        out, lines = [], []
        for _ in range(2):
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True)
            out.append(time.perf_counter() - t0)
            lines += [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("time:")]
    return out[0], out[1], lines[0] if lines else "time: (not printed)"


def calls_per_estimate(cases) -> float:
    """Python function calls one bare estimate makes (cProfile's count over a sample of cases)."""
    sample = cases[:: max(1, len(cases) // 100)]
    prof = cProfile.Profile()
    prof.runcall(lambda: [estimate(m, g, s, reverse=False) for m, g, s in sample])
    return sum(row[1] for row in pstats.Stats(prof).stats.values()) / len(sample)


def target(label: str, value: float, bound: float, unit: str, most: bool = True) -> None:
    met = value <= bound if most else value >= bound
    verdict = "met" if met else f"missed by {abs(value / bound - 1):.0%}"
    print(f"  {label:<44} {value:>9,.3g} {unit:<10} target {'<=' if most else '>='} {bound:,g}: {verdict}")


def main() -> None:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    print(f"load average {load} on {os.cpu_count()} cores")
    one = cli_seconds()
    print(f"{'one reportgen estimate command (median of 5)':<42} {one:6.3f} s wall, imports included")
    sweep = load_sweep(sys.argv[1] if len(sys.argv) > 1 else "sweeps/consumer.yaml")
    cases = [(catalog.load_model(c.model), catalog.load_gpu(c.gpu), c.setup) for c in sweep.cases]
    t0 = time.perf_counter()
    for m, g, s in cases:
        estimate(m, g, s, reverse=False)
    bare = len(cases) / (time.perf_counter() - t0)
    rate("estimate (memory + time)", len(cases), len(cases) / bare)
    sample = cases[:: max(1, len(cases) // 300)]
    t0 = time.perf_counter()
    for m, g, s in sample:
        estimate(m, g, s, reverse=True)
    rate("estimate + largest batch + longest sequence", len(sample), time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_estimates(sweep, Path(tmp))
        rate(f"sweep pipeline ({sweep.name}, writes JSON)", len(sweep.cases), time.perf_counter() - t0)
    cold, again, account = sweep_seconds(str(sweep.path))
    bare_unmeasured = cli_seconds(UNMEASURED_CASE)
    calls = calls_per_estimate(cases)
    print("issue 31's targets:")
    target("one reportgen estimate command", one, 0.15, "s")
    print(f"    why: the same command for a case no sweep measured takes {bare_unmeasured:.3f} s (starting Python and "
          "importing the estimator,\n    the catalogs and rich); reading and checking this case's stored measurements "
          f"adds {one - bare_unmeasured:.3f} s (result_schema: importing pydantic, building its models)")
    target("bare estimates per second", bare, 30_000, "cases/s", most=False)
    print(f"    why: one estimate makes {calls:,.0f} Python function calls (the step's kernels one by one, the memory "
          f"timeline);\n    30,000/s leaves {1e6 / 30_000:.0f} us a case, the time of about "
          f"{calls * bare / 30_000:,.0f} of them on this machine")
    target(f"reportgen sweep {sweep.path} + render, cold", cold, 8, "s")
    print(f"    why, as the sweep accounts for it: {account.removeprefix('time: ')}")
    target("the same again, nothing changed", again, 2, "s")


if __name__ == "__main__":
    main()
