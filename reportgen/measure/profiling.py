"""``reportgen measure --profile`` / sweep ``measure.profile``: a few extra steps under
``torch.profiler``, run AFTER the timed steps (so the profiler's overhead never enters ``step_s``)
and after the memory peaks are read.

``torch.profiler.profile(activities=[CPU, CUDA], schedule=schedule(wait=0, warmup=1,
active=N))`` (the PyTorch profiler recipe, and the reference notes' "Pytorch Profiling": a warm-up
step first, whose events are dropped, because the profiler's own start-up skews the first step):
each step runs inside ``record_function("reportgen_step#<k>")`` and ends with
``torch.cuda.synchronize()``, then ``prof.step()``. The trace of the ``N`` active steps is exported
with ``export_chrome_trace`` and gzipped; the file opens in Perfetto (https://ui.perfetto.dev) and
chrome://tracing, and its name ends in ``.pt.trace.json.gz`` as ``tensorboard_trace_handler`` names
its files. ``trace_stats.step_figures`` then reads the per-step figures from it. On the CPU only
the CPU activity is recorded: the device figures are null.

The measurement's ``profile`` block::

    {"trace": <path of the trace file>, "activities": ["cpu", "cuda"], "warmup_steps": 1,
     "total_s": <seconds the whole profile took: its steps, the export, gzip and reading>,
     "steps": [{"step", "wall_s", "gpu_busy_s", "kernels", "launches", "memcpys", "memsets",
                "cpu_ops", "aten_ops", "aten_ops_top"}, ...],
     "error": null | "<why the profile failed; the measurement stands>"}

``wall_s`` of a profiled step includes the profiler's overhead (it records every op and kernel), so
it is above ``step_s``; ``gpu_busy_s`` is the device's own time and is not inflated the same way.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from reportgen.measure.trace_stats import STEP_PREFIX, read_trace, step_figures

#: profiler warm-up steps before the recorded ones (their events are dropped)
PROFILE_WARMUP = 1
#: gzip level of the trace (the gzip tool's default; torch's own ``.gz`` export uses 9, slower)
GZIP_LEVEL = 6


#: the end of a trace file's name (``tensorboard_trace_handler``'s, gzipped)
TRACE_SUFFIX = ".pt.trace.json.gz"


def _split(path: Path) -> tuple[str, str]:
    name = path.name
    return (name[: -len(TRACE_SUFFIX)], TRACE_SUFFIX) if name.endswith(TRACE_SUFFIX) else (path.stem, path.suffix)


def rank_path(path: str | Path, rank: int) -> str:
    """The trace of one rank of a multi-GPU run: ``<name>.rank<R>`` before the suffix."""
    path = Path(path)
    base, suffix = _split(path)
    return str(path.with_name(f"{base}.rank{rank}{suffix}"))


def free_path(path: Path) -> Path:
    """``path``, or ``<name>-2...`` before the suffix when a file of that name exists (never overwrite)."""
    path = Path(path)
    if not path.exists():
        return path
    base, suffix = _split(path)
    n = 2
    while (candidate := path.with_name(f"{base}-{n}{suffix}")).exists():
        n += 1
    return candidate


def profile_steps(step: Callable[[], None], before: Callable[[int], None], steps: int, trace_path: str | Path,
                  cuda: bool) -> dict:
    """Run ``PROFILE_WARMUP + steps`` steps under the profiler (module docstring); ``before(i)``
    prepares step ``i`` (the next micro-batches) outside its range. Returns the ``profile`` block."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    t0 = time.perf_counter()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    target = free_path(Path(trace_path))
    target.parent.mkdir(parents=True, exist_ok=True)
    block: dict = {"trace": None, "activities": ["cpu", "cuda"] if cuda else ["cpu"],
                   "warmup_steps": PROFILE_WARMUP, "steps": [], "error": None}
    with tempfile.TemporaryDirectory(prefix="reportgen-profile-", dir=target.parent) as tmp:
        raw = Path(tmp) / "trace.json"
        with profile(activities=activities, schedule=schedule(wait=0, warmup=PROFILE_WARMUP, active=steps, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
            for i in range(PROFILE_WARMUP + steps):
                before(i)
                if cuda:
                    torch.cuda.synchronize()
                with record_function(f"{STEP_PREFIX}{i}"):
                    step()
                    if cuda:
                        torch.cuda.synchronize()
                prof.step()
        if not raw.exists():
            raise RuntimeError("the profiler wrote no trace")
        block["steps"] = step_figures(read_trace(raw))
        partial = Path(tmp) / "trace.json.gz"
        with open(raw, "rb") as src, gzip.open(partial, "wb", compresslevel=GZIP_LEVEL) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(partial, target)
    block["trace"] = str(target)
    block["total_s"] = time.perf_counter() - t0
    return block
