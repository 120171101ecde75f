"""Measure a sweep's cases, one subprocess each, into the sweep's measurement files.

``reportgen sweep FILE --measure [--shard I/N] [--force]`` first writes the estimates
(``reportgen.runner``), then calls ``measure_sweep``. For each case it runs the worker
(``isolate.run_case``, timeout ``measure.timeout_s``) and stores the answer as a new measurement
file ``results/<sweep>/measured/<case-id>.<utc>.json`` as soon as the case ends
(``reportgen.store``): immutable, never overwritten, next to (not inside) the recomputable estimate.

The measurement block is the answer of ``reportgen measure --format json`` without ``case`` (the
document adds it with ``id`` and ``sweep``) plus the settings it was measured with::

    {"status": "ok" | "oom" | "error" | "timeout",
     "measurement": {"peak_allocated", "peak_reserved", "device_used", "memory_after_load",
                     "step_s", "step_s_min", "step_s_max", "step_times_s", "tokens_per_s", "mfu", ...},
     "error": str | null, "environment": {...}, "cap": null | {...},
     "settings": {"device", "warmup", "steps", "max_steps", "max_timed_s", "target_rel_ci", "timeout_s",
                  "cap_to_gpu", "profile", "profile_steps"}
                 (+ "world_size", "launcher", "backend" for a multi-GPU case: torchrun, one process per GPU;
                  files measured before the adaptive timed steps have only "device", "warmup", "steps",
                  "timeout_s", "cap_to_gpu": ``steps`` timed steps exactly),
     "measured_at": "2026-11-21T17:00:00+00:00", "wall_s": 41.2}

What a measurement may be compared with (the device that ran it, the cap) is decided by
``reportgen.provenance``, not here.

Rules:

* resume: a case with an attempt of status ``ok`` or ``oom`` (an OOM is a result: the case does
  not fit) with the same settings (``_same_settings``: device, warm-up, cap, the timed steps'
  stopping rule, and a profile if one is asked for) is skipped, so an interrupted sweep continues where it stopped;
  ``error`` and ``timeout`` are retried (the failed attempt's file stays); ``force`` measures
  again, as a new attempt.
* ``shard="I/N"``: only cases whose index in the sweep (cases sorted by id) is ``I`` modulo ``N``;
  several machines can split a sweep, and since each attempt is its own uniquely named file,
  merging their results is copying the files together.
* ``measure.profile``: each case also runs ``profile_steps`` steps under torch.profiler after its
  timed ones; the trace is ``results/<sweep>/profiles/<case-id>.<utc>.pt.trace.json.gz`` (not
  committed: large; the per-step figures are in the measurement file, ``profiling.py``).
* hopeless cases: a case whose estimated peak is over twice the memory of its ``gpu`` card is not
  run (no measurement is written, the summary lists it). Cases the estimate merely says will not
  fit are measured, to confirm the OOM. The case's ``gpu`` is the card measured, or emulated with
  ``cap_to_gpu``.
* ``REPORTGEN_MEASURE_DEVICE=cpu`` measures on the CPU (tests; memory figures are then null, and the
  provenance rule keeps the run off every GPU comparison).
* ``REPORTGEN_MEASURE_DEADLINE=<unix time>`` (``scripts/validate_on_gpu.sh`` sets it from its
  budget): a case is started only if it can be expected to end before the deadline (``expected_s``;
  a smaller case further on may still be started), and its worker's timeout never reaches past it;
  a case cut by the deadline writes nothing (it is no timeout of the case) and the sweep stops
  there. The cases left are listed ("deferred by the deadline") for a later call.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from reportgen import catalog, locks, store
from reportgen.errors import UserError
from reportgen.measure import timing
from reportgen.measure.isolate import require_measure_packages, run_case
from reportgen.measure.profiling import TRACE_SUFFIX
from reportgen.measure.protocol import MeasureRequest
from reportgen.measure.timing import timing_note
from reportgen.results import UnreadableResult, result_path
from reportgen.store import DONE_STATUSES
from reportgen.sweep import Case, Sweep

DEVICE_ENV = "REPORTGEN_MEASURE_DEVICE"
DEADLINE_ENV = "REPORTGEN_MEASURE_DEADLINE"
#: a worker's start, imports, CUDA context and model build (an 8B model: a few seconds on an H100)
CASE_OVERHEAD_S = 30.0
#: the estimated step time is a roofline, real steps are slower (first steps: cuBLAS/Triton warm-up)
STEP_TIME_MARGIN = 3.0
#: estimated peak over this many times the card's memory: not worth a run
HOPELESS_FACTOR = 2.0
#: planning guesses for a profiled case, not measurements (no GPU run has timed the profiler yet;
#: each profile block records its own ``total_s``, to replace these): the profiler's start (CUPTI,
#: about a second), the export, gzip and reading of a trace of tens of thousands of events (a second
#: or two); a recorded step's host side pays a few microseconds per operator and kernel launch
PROFILE_OVERHEAD_S = 3.0
PROFILE_SLOWDOWN = 1.5


@dataclass
class MeasureStats:
    measured: int = 0
    skipped: int = 0
    hopeless: list[str] = field(default_factory=list)
    by_status: dict[str, int] = field(default_factory=dict)
    #: cases not measured because the deadline came first (a later call measures them)
    deferred: list[str] = field(default_factory=list)


def parse_shard(shard: str | None) -> tuple[int, int]:
    if shard is None:
        return 0, 1
    try:
        i, n = (int(x) for x in str(shard).split("/"))
    except ValueError:
        raise UserError(f"--shard {shard!r}: expected I/N, e.g. 0/3") from None
    if n < 1 or not 0 <= i < n:
        raise UserError(f"--shard {shard!r}: needs N >= 1 and 0 <= I < N")
    return i, n


def settings_for(sweep: Sweep, device: str) -> dict:
    mc = sweep.spec.measure
    return {"device": device, "warmup": mc.warmup, "steps": mc.steps, "max_steps": mc.max_steps_or_default,
            "max_timed_s": mc.max_timed_s, "target_rel_ci": mc.target_rel_ci, "timeout_s": mc.timeout_s,
            "cap_to_gpu": mc.cap_to_gpu, "profile": mc.profile, "profile_steps": mc.profile_steps}


def _same_settings(old: dict, new: dict) -> bool:
    """Whether an attempt measured with ``old`` settings is current for ``new`` ones: the same device,
    warm-up, cap and stopping rule of the timed steps (an older attempt without ``max_steps`` ran
    exactly ``steps``: ``timing.rule_from_settings``), and a profile when ``new`` asks for one."""
    if any(old.get(k) != new.get(k) for k in ("device", "warmup", "cap_to_gpu")):
        return False
    if timing.rule_from_settings(old).key() != timing.rule_from_settings(new).key():
        return False
    if new.get("profile") and not (old.get("profile") and old.get("profile_steps") == new.get("profile_steps")):
        return False
    return True


def stored_estimate(sweep: Sweep, case: Case, results_dir: Path) -> dict:
    """The case's stored estimate document (``run_estimates`` wrote it before), or one computed in
    memory when it is missing or unreadable; never written here."""
    path = result_path(results_dir, sweep.name, case.id)
    try:
        return store.read_estimate(path)[0]
    except (UnreadableResult, FileNotFoundError):
        from reportgen.runner import compute_result

        return compute_result(sweep, case)


def settled(attempts: list[dict], settings: dict, force: bool) -> bool:
    """Whether an attempt with these settings already settled the case (ok or oom)."""
    return not force and any(a.get("status") in DONE_STATUSES and _same_settings(a.get("settings") or {}, settings)
                             for a in attempts)


def hopeless(case: Case, result: dict) -> str | None:
    """Why the case is not worth running, or None."""
    try:
        peak = result["estimate"]["memory"]["peak_allocated"]
    except (KeyError, TypeError):
        return None
    card = catalog.load_gpu(case.gpu).memory_bytes
    if peak > HOPELESS_FACTOR * card:
        return (f"estimated peak {peak / 2**30:.1f} GiB is over {HOPELESS_FACTOR:g}x the "
                f"{card / 2**30:.1f} GiB of {case.gpu}")
    return None


def parse_deadline(value: str | None) -> float | None:
    if value is None or not str(value).strip():
        return None
    try:
        return float(value)
    except ValueError:
        raise UserError(f"{DEADLINE_ENV}={value!r}: expected a unix time in seconds") from None


def expected_s(result: dict, settings: dict) -> float:
    """Seconds one case is expected to take: the worker's fixed cost, its warm-up steps at the
    estimated step time with a margin, its timed steps at most (``timing.planned_timed_s``: the
    minimum, then up to the time cap or ``max_steps``), and its profiled steps when asked for
    (``PROFILE_SLOWDOWN`` and ``PROFILE_OVERHEAD_S``). No estimate: the fixed cost twice."""
    try:
        step = STEP_TIME_MARGIN * float(result["estimate"]["time"]["step_s"])
    except (KeyError, TypeError, ValueError):
        return 2 * CASE_OVERHEAD_S
    total = CASE_OVERHEAD_S + step * settings["warmup"] + timing.planned_timed_s(step, timing.rule_from_settings(settings))
    if settings.get("profile"):
        from reportgen.measure.profiling import PROFILE_WARMUP

        total += PROFILE_OVERHEAD_S + PROFILE_SLOWDOWN * step * (PROFILE_WARMUP + settings.get("profile_steps", 0))
    return total


def measure_sweep(sweep: Sweep, results_dir: Path, shard: str | None = None, force: bool = False,
                  console=None, device: str | None = None) -> MeasureStats:
    """Measure this shard's cases (module docstring); ``device``: ``cuda`` or ``cpu`` (default: the
    ``REPORTGEN_MEASURE_DEVICE`` environment variable, else ``cuda``)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console(stderr=True)
    index, count = parse_shard(shard)
    require_measure_packages()
    device = device or os.environ.get(DEVICE_ENV, "cuda")
    if device not in ("cuda", "cpu"):
        raise UserError(f"{DEVICE_ENV}={device}: measures on cuda or cpu", hint=f"unset it, or {DEVICE_ENV}=cpu")
    if device == "cuda":
        from reportgen.measure.nvml import nvidia_gpus_present

        present, why = nvidia_gpus_present()
        if present is False:
            raise UserError(f"--measure: this machine has no usable NVIDIA GPU ({why})",
                            hint=f"measure on a GPU machine, or set {DEVICE_ENV}=cpu for a CPU run (timings only)")
    settings = settings_for(sweep, device)
    deadline = parse_deadline(os.environ.get(DEADLINE_ENV))
    mine = [case for i, case in enumerate(sweep.cases) if i % count == index]
    stats = MeasureStats()
    t0 = time.perf_counter()
    sweep_dir = Path(results_dir) / sweep.name
    store.ready_for_measurements(sweep_dir)  # before a GPU minute is spent on a case it could not store
    with locks.measuring_run(sweep_dir, f"{index}/{count}"), \
            Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     TextColumn("{task.fields[case]}"), console=console, transient=not console.is_terminal) as bar:
        task = bar.add_task(f"measuring {sweep.name}" + (f" shard {index}/{count}" if count > 1 else ""),
                            total=len(mine), case="")
        measured = store.load_measurements(sweep_dir)
        for n, case in enumerate(mine):
            bar.update(task, case=f"{case.model} {case.setup.short()}")
            try:
                with locks.hold(locks.case_lock_path(sweep_dir, case.id)):
                    go_on = _measure_one(sweep, case, settings, force, deadline, results_dir, stats, console,
                                         [c for c in mine[n + 1:]], measured)
            except locks.Held as exc:  # a run of an overlapping shard is measuring it now
                stats.skipped += 1
                console.print(f"  skip {case.id}: another run is measuring it ({exc.holder})", highlight=False)
                go_on = True
            if not go_on:
                break
            bar.advance(task)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(stats.by_status.items())) or "none run"
    console.print(f"{sweep.name}: measured {stats.measured} ({counts}), {stats.skipped} already measured, "
                  f"{len(stats.hopeless)} hopeless, in {time.perf_counter() - t0:.0f} s -> {results_dir / sweep.name}")
    if stats.deferred:
        console.print(f"deferred by the deadline ({len(stats.deferred)}): {' '.join(stats.deferred)}", highlight=False)
    return stats


def _measure_one(sweep: Sweep, case: Case, settings: dict, force: bool, deadline: float | None, results_dir: Path,
                 stats: MeasureStats, console, later: list[Case], measured: dict[str, list[dict]]) -> bool:
    """One case of ``measure_sweep``, under its case lock: skipped when settled (re-read now: a run of
    an overlapping shard may have stored it since this run started), hopeless or beyond the deadline,
    else measured and stored. False when the deadline cut it (the loop stops)."""
    sweep_dir = Path(results_dir) / sweep.name
    measured[case.id] = store.load_case_measurements(sweep_dir, case.id)
    if settled(measured[case.id], settings, force):
        stats.skipped += 1
        return True
    result = stored_estimate(sweep, case, results_dir)
    why = hopeless(case, result)
    if why:
        stats.hopeless.append(case.id)
        console.print(f"  skip {case.id}: {why}", highlight=False)
        return True
    timeout = sweep.spec.measure.timeout_s
    if deadline is not None:
        left = deadline - time.time()
        need = expected_s(result, settings)
        if left < need:  # a smaller case further on may still fit
            stats.deferred.append(case.id)
            console.print(f"  defer {case.id}: {max(left, 0):.0f} s left before the deadline, it needs about "
                          f"{need:.0f} s", highlight=False)
            return True
        timeout = min(timeout, left)
    block = measure_case(case, settings, timeout, sweep_dir)
    if block["status"] == "timeout" and timeout < sweep.spec.measure.timeout_s:
        # cut by the deadline, not by the case's own limit: no result, a later call measures it
        rest = [c.id for c in later if not settled(measured.get(c.id, []), settings, force)
                and hopeless(c, stored_estimate(sweep, c, results_dir)) is None]
        stats.deferred += [case.id] + rest
        console.print(f"  stop: the deadline came during {case.id} ({block.get('wall_s', 0):.0f} s): nothing "
                      "written for it", highlight=False)
        return False
    store.add_measurement(sweep_dir, case.id, case.as_dict(), block)
    stats.measured += 1
    stats.by_status[block["status"]] = stats.by_status.get(block["status"], 0) + 1
    console.print(f"  {block['status']:>7}  {case.id}  {_summary(block)}", highlight=False)
    return True


def measure_case(case: Case, settings: dict, timeout_s: float, sweep_dir: Path | None = None) -> dict:
    """One case in a worker subprocess -> the ``measurement`` block of its result file. With
    ``settings["profile"]`` its trace goes to ``<sweep_dir>/profiles/<case-id>.<utc>.pt.trace.json.gz``
    and the block records that path relative to ``sweep_dir``."""
    trace = None
    if settings.get("profile") and sweep_dir is not None:
        trace = Path(sweep_dir).resolve() / store.PROFILES_DIR / f"{case.id}.{store._stamp()}{TRACE_SUFFIX}"
    request = MeasureRequest(model=case.model, gpu=case.gpu, setup=case.setup.model_dump(mode="json"),
                             device=settings["device"], warmup=settings["warmup"], steps=settings["steps"],
                             max_steps=settings.get("max_steps"), max_timed_s=settings.get("max_timed_s"),
                             target_rel_ci=settings.get("target_rel_ci"),
                             cap_to_gpu=settings["cap_to_gpu"] and settings["device"] == "cuda",
                             profile=str(trace) if trace else None, profile_steps=settings.get("profile_steps", 2))
    answer = run_case(request, timeout_s)
    answer.pop("case", None)
    _relative_traces(answer.get("measurement"), sweep_dir)
    answer["settings"] = dict(settings)
    if case.setup.gpus > 1:  # never mistaken for a single-GPU run
        from reportgen.measure.distributed import LAUNCHER, backend_for

        answer["settings"].update(world_size=case.setup.gpus, launcher=LAUNCHER, backend=backend_for(settings["device"]))
    answer["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return answer


def _relative_traces(measurement: dict | None, sweep_dir: Path | None) -> None:
    """Trace paths under the sweep directory, stored relative to it (the results move between machines)."""
    if not measurement or sweep_dir is None:
        return
    root = Path(sweep_dir).resolve()
    for block in [measurement.get("profile")] + [r.get("profile") for r in measurement.get("ranks") or []]:
        if isinstance(block, dict) and block.get("trace"):
            try:
                block["trace"] = Path(block["trace"]).resolve().relative_to(root).as_posix()
            except ValueError:
                pass


def _summary(block: dict) -> str:
    m = block.get("measurement") or {}
    if block["status"] != "ok":
        first = (block.get("error") or "").strip().splitlines()
        return first[0][:160] if first else ""
    parts = []
    if m.get("peak_allocated") is not None:
        parts.append(f"peak {m['peak_allocated'] / 2**30:.2f} GiB")
    if m.get("step_s") is not None:
        parts.append(f"step {m['step_s']:.3f} s" + (f" ({timing_note(m)})" if timing_note(m) else ""))
    if m.get("tokens_per_s") is not None:
        parts.append(f"{m['tokens_per_s']:,.0f} tok/s")
    return ", ".join(parts)
