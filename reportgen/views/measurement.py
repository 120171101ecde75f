"""Terminal summary of one measurement, next to the estimate of the same case."""

from __future__ import annotations

import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from reportgen.measure.timing import timing_note
from reportgen.format import gib, pct, rate, seconds

STATUS_STYLE = {"ok": "green", "oom": "yellow", "error": "red", "timeout": "red"}


def print_measurement(result: dict, est=None, console: Console | None = None) -> None:
    console = console or Console()
    case, m, env = result["case"], result.get("measurement") or {}, result.get("environment") or {}
    status = result["status"]
    from reportgen.setup import TrainingSetup

    from reportgen.provenance import provenance_of

    label = TrainingSetup.model_validate(case["setup"]).short()
    console.print(f"[bold]{case['model']}[/] on [bold]{env.get('gpu_name') or env.get('device') or '?'}[/] "
                  f"(case for {case['gpu']}): {label}", highlight=False)
    prov = provenance_of(result)
    valid = prov.valid_quantities(case["gpu"])
    if m.get("failed_in") != "setup":
        console.print(f"[dim]{prov.label(case['gpu'])}; compares with the estimate: "
                      f"{', '.join(valid) if valid else 'nothing'}[/]", highlight=False)
    console.print(f"status: [{STATUS_STYLE.get(status, 'red')}]{status}[/]"
                  + (f" (in {m['failed_in']})" if m.get("failed_in") else ""), highlight=False)
    if m.get("failed_in") == "setup":  # refused before a model was built: nothing was measured, no table
        _print_error(result, console)
        _print_environment(env, console)
        return
    console.print(_table(m, case, est, valid))
    host = host_line(m)
    if host:
        console.print(host, highlight=False)
    if m.get("step_times_s"):
        console.print("step times: " + _times(m["step_times_s"]) + f" after {m.get('warmup')} warm-up steps",
                      highlight=False)
        console.print(f"timing: {timing_note(m)}", highlight=False)
    for line in profile_lines(m.get("profile")):
        console.print(line, highlight=False)
    if m.get("ranks"):
        env_line = f"{m.get('world_size')} ranks ({env.get('launcher')}, {env.get('backend')}); " \
                   "memory is the largest rank's, a step ends with its slowest rank"
        console.print(env_line, highlight=False)
        for r in m["ranks"]:
            renv = r.get("environment") or {}
            console.print(f"  rank {r['rank']}: {r.get('status')}"
                          f" on {renv.get('gpu_name') or renv.get('device') or '?'}"
                          f", peak allocated {gib(r.get('peak_allocated'))} GiB"
                          f", steps {_times(r.get('step_times_s') or []) or '-'}", highlight=False)
    if result.get("cap"):
        cap = result["cap"]
        if cap.get("applied"):
            console.print(f"capped to {cap['emulated_gpu']}: allocator limit {gib(cap['limit_bytes'])} GiB of "
                          f"{gib(cap['device_total_bytes'])} GiB (fraction {cap['fraction']:.4f})", highlight=False)
        else:
            console.print(f"cap to {cap['emulated_gpu']} not applied: {cap.get('note')}", highlight=False)
    for note in m.get("notes") or []:
        console.print(f"[dim]note:[/] {note}", highlight=False)
    if m.get("snapshot"):
        console.print(f"memory snapshot: {m['snapshot']} (open at https://pytorch.org/memory_viz)", highlight=False)
    _print_error(result, console)
    _print_environment(env, console)


def _print_error(result: dict, console: Console) -> None:
    if result.get("error"):
        status = result["status"]
        console.print(f"[{STATUS_STYLE.get(status, 'red')}]{status}:[/] {result['error']}", highlight=False,
                      markup=True)


def _print_environment(env: dict, console: Console) -> None:
    """The run's environment in one dim line: driver, CUDA, the packages' versions, commit, host, time."""
    versions = env.get("versions") or {}
    parts = [f"{k} {v}" for k, v in versions.items() if v]
    console.print("[dim]" + "; ".join(filter(None, [
        f"driver {env['driver_version']}" if env.get("driver_version") else None,
        f"CUDA {env['cuda_version']}" if env.get("cuda_version") else None,
        f"python {env.get('python')}", *parts,
        f"reportgen {env.get('reportgen')} @ {(env.get('git_commit') or 'unknown')[:10]}",
        env.get("hostname"), env.get("utc")])) + "[/]", highlight=False)


def _table(m: dict, case: dict, est, valid) -> Table:
    """Each measured quantity beside its estimate (``-`` where the run does not compare with it)."""
    table = Table(show_header=True)
    table.add_column("quantity")
    table.add_column("measured", justify="right")
    table.add_column(f"estimated ({case['gpu']}; - where the run does not compare)", justify="right")
    em = est.memory if est is not None and "peak_allocated" in valid else None
    et = est.time if est is not None and "tokens_per_s" in valid else None
    table.add_row("memory after load (GiB)", gib(m.get("memory_after_load")), "-")
    table.add_row("peak allocated (GiB)", gib(m.get("peak_allocated")), gib(em.peak_allocated) if em else "-")
    table.add_row("peak reserved (GiB)", gib(m.get("peak_reserved")), gib(em.peak_reserved) if em else "-")
    table.add_row("device used, nvidia-smi (GiB)", gib(m.get("device_used")), gib(em.device_total) if em else "-")
    spread = ""
    if m.get("step_s_min") is not None:
        spread = f" ({seconds(m['step_s_min'])} to {seconds(m['step_s_max'])})"
    table.add_row("step time, median" + (" (min to max)" if spread else ""), seconds(m.get("step_s")) + spread,
                  seconds(et.step_s) if et else "-")
    if m.get("step_s_cuda") is not None:
        table.add_row("step time, CUDA events, median", seconds(m["step_s_cuda"]), "-")
    table.add_row("tokens/s", rate(m.get("tokens_per_s")), rate(et.tokens_per_s) if et else "-")
    basis = m.get("mfu_basis") or {}
    mfu_label = "MFU" + (f" (vs {basis['gpu']} {basis['dtype']} peak)" if basis.get("gpu") else "")
    table.add_row(mfu_label, pct(m.get("mfu")), pct(et.mfu) if et else "-")
    return table


def host_line(m: dict) -> str | None:
    """Host RAM of the measuring process (``measure/harness.py``: peak resident set size, and once the
    model was loaded); None for a measurement made before the harness recorded it (issue 32)."""
    failed = m.get("host_peak_rss") is None and m.get("host_peak_rss_at_failure") is not None
    peak = m.get("host_peak_rss_at_failure") if failed else m.get("host_peak_rss")
    after = m.get("host_rss_after_load")
    if peak is None and after is None:
        return None
    return f"host RAM: peak {gib(peak)} GiB" + (" up to the failure" if failed else "") + \
        f" (after load {gib(after)} GiB)"


#: step times listed in full up to this many; beyond, the first ones and a count
SHOWN_TIMES = 12


def _times(times: list[float]) -> str:
    shown = ", ".join(seconds(t) for t in times[:SHOWN_TIMES])
    return shown + (f", ... ({len(times)} in all)" if len(times) > SHOWN_TIMES else "")


def profile_lines(profile: dict | None, root: Path | None = None) -> list[str]:
    """The profile block in words: where the trace is (a path relative to a sweep directory is
    joined to ``root``), and the median over the profiled steps of each figure
    (``reportgen.measure.profiling``)."""
    if not profile:
        return []
    if profile.get("error"):
        return [f"profile failed (the timed figures stand): {profile['error']}"]
    steps = profile.get("steps") or []
    trace = Path(profile["trace"]) if profile.get("trace") else None
    if trace is not None and not trace.is_absolute() and root is not None:
        trace = root / trace
    where = "-" if trace is None else f"{trace} (open at https://ui.perfetto.dev)" if trace.exists() else \
        f"{trace} (not on this machine: traces are not committed)"
    lines = [f"profile: {len(steps)} step(s) under torch.profiler after the timed ones (with its overhead); "
             f"trace {where}"]
    if not steps:
        return lines

    def med(key):
        values = [s[key] for s in steps if s.get(key) is not None]
        return statistics.median(values) if values else None

    wall, busy = med("wall_s"), med("gpu_busy_s")
    parts = [f"wall {seconds(wall)}"]
    if busy is not None:
        parts.append(f"GPU busy {seconds(busy)}" + (f" ({100 * busy / wall:.0f}% of the step)" if wall else ""))
    for key, label in (("kernels", "kernels"), ("launches", "launches"), ("cpu_ops", "CPU ops"),
                       ("aten_ops", "ATen ops"), ("aten_ops_top", "top-level ATen ops")):
        if med(key) is not None:
            parts.append(f"{med(key):,.0f} {label}")
    lines.append("  per profiled step (median): " + ", ".join(parts))
    return lines
