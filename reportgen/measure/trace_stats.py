"""Per-step figures from a PyTorch profiler trace (no torch: pure functions over its events).

The trace is the Chrome trace JSON that ``torch.profiler.profile.export_chrome_trace`` writes
(Kineto's format): ``{"traceEvents": [{"ph": "X", "cat", "name", "ts", "dur", "pid", "tid",
"args"}, ...]}``, times in microseconds. The categories used (Kineto ``ActivityType.cpp``):
``cpu_op`` (an operator the dispatcher recorded, nested ops included, autograd nodes too),
``user_annotation`` (a ``record_function`` range), ``cuda_runtime``/``cuda_driver`` (host API calls:
``cudaLaunchKernel``, ``cuLaunchKernel``, ...), and the device's own activity: ``kernel``,
``gpu_memcpy``, ``gpu_memset``. A device event carries ``args.correlation``, the id of the host
call that launched it.

Steps are the ``record_function`` ranges ``reportgen_step#<k>`` the harness opens around each
profiled step (``profiling.py``; the step is synchronized at its end, so its device work lies
inside its range). For each step (``step_figures``):

* ``wall_s``: the range's duration;
* ``gpu_busy_s``: the union of the step's device intervals (kernels, copies, sets), so kernels
  overlapping on several streams count once: the time the device had work, as Holistic Trace
  Analysis' temporal breakdown counts it (idle = no kernel running); ``gpu_busy_s / wall_s`` is the
  share of the step the GPU worked;
* ``kernels``: device kernel events; ``memcpys``, ``memsets``: device copies and sets;
* ``launches``: host kernel-launch calls (``cudaLaunchKernel*``, ``cuLaunchKernel*``,
  ``cudaLaunchCooperativeKernel*``; a ``cudaGraphLaunch`` counts once and launches many kernels);
* ``cpu_ops``: ``cpu_op`` events in the range (every recorded operator, nested ones and autograd
  nodes included); ``aten_ops``: those named ``aten::*``; ``aten_ops_top``: the ``aten::`` ops not
  inside another ``aten::`` op of the same thread (what Python and autograd called directly).

A device event belongs to the step whose range holds the host call that launched it; one whose
launch is not in the trace, to the step whose range holds its own start. Without device events
(a CPU run) the device figures are null, never 0.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

STEP_PREFIX = "reportgen_step#"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_API_CATS = ("cuda_runtime", "cuda_driver")
_LAUNCH = re.compile(r"^(cudaLaunchKernel|cuLaunchKernel|cudaLaunchCooperativeKernel|cudaGraphLaunch|cuGraphLaunch)")
US = 1e-6


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by ``(start, end)`` intervals, overlaps counted once: sort by start,
    merge each interval into the running one while it starts before that one ends. Worked example:
    ``(0, 4), (2, 6), (8, 9)`` -> ``[0, 6] + [8, 9]`` = 7 (their sum would be 9)."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def step_windows(events: list[dict], prefix: str = STEP_PREFIX) -> list[tuple[int, float, float]]:
    """``(k, start, end)`` (microseconds) of every ``prefix<k>`` range on the host, in step order."""
    out = []
    for e in events:
        name = e.get("name") or ""
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and name.startswith(prefix):
            try:
                k = int(name[len(prefix):])
            except ValueError:
                continue
            out.append((k, float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0.0)))
    return sorted(out)


def _which(ts: float, windows: list[tuple[int, float, float]]) -> int | None:
    for i, (_, start, end) in enumerate(windows):
        if start <= ts <= end:
            return i
    return None


def top_level(ops: list[dict]) -> list[dict]:
    """The ops not inside another op of the same thread (``pid``, ``tid``): on each thread, in order
    of start (the longer first on a tie), an op that starts before the last top-level op ends is
    nested in it."""
    out = []
    by_thread: dict[tuple, list[dict]] = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for thread_ops in by_thread.values():
        end = None
        for e in sorted(thread_ops, key=lambda e: (float(e["ts"]), -float(e.get("dur") or 0.0))):
            ts = float(e["ts"])
            if end is None or ts >= end:
                out.append(e)
                end = ts + float(e.get("dur") or 0.0)
    return out


def step_figures(events: list[dict]) -> list[dict]:
    """The figures of each profiled step (module docstring), in step order."""
    windows = step_windows(events)
    if not windows:
        return []
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e]
    launch_step: dict = {}  # correlation id -> step index, of host API calls
    launches = [0] * len(windows)
    cpu_ops: list[list[dict]] = [[] for _ in windows]
    device: list[list[dict]] = [[] for _ in windows]
    any_device = False
    for e in complete:
        cat = e.get("cat")
        if cat in HOST_API_CATS:
            i = _which(float(e["ts"]), windows)
            if i is None:
                continue
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launch_step[corr] = i
            if _LAUNCH.match(e.get("name") or ""):
                launches[i] += 1
        elif cat == "cpu_op":
            i = _which(float(e["ts"]), windows)
            if i is not None:
                cpu_ops[i].append(e)
    for e in complete:
        if e.get("cat") not in DEVICE_CATS:
            continue
        any_device = True
        corr = (e.get("args") or {}).get("correlation")
        i = launch_step.get(corr) if corr is not None else None
        if i is None:
            i = _which(float(e["ts"]), windows)
        if i is not None:
            device[i].append(e)
    out = []
    for i, (k, start, end) in enumerate(windows):
        aten = [e for e in cpu_ops[i] if (e.get("name") or "").startswith("aten::")]
        figures = {"step": k, "wall_s": (end - start) * US, "cpu_ops": len(cpu_ops[i]), "aten_ops": len(aten),
                   "aten_ops_top": len(top_level(aten))}
        if any_device:
            dev = device[i]
            figures.update(
                gpu_busy_s=union_length([(float(e["ts"]), float(e["ts"]) + float(e.get("dur") or 0.0)) for e in dev])
                * US,
                kernels=sum(e.get("cat") == "kernel" for e in dev), memcpys=sum(e.get("cat") == "gpu_memcpy" for e in dev),
                memsets=sum(e.get("cat") == "gpu_memset" for e in dev), launches=launches[i])
        else:
            figures.update(gpu_busy_s=None, kernels=None, memcpys=None, memsets=None, launches=None)
        out.append(figures)
    return out


def read_trace(path: str | Path) -> list[dict]:
    """The events of a Chrome trace JSON file, plain or gzipped (``.gz``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data.get("traceEvents", []) if isinstance(data, dict) else data
