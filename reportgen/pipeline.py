"""What ``reportgen sweep`` runs: every case of a sweep through the producers into the store, stage
by stage (estimates, decision-tree walks, then, when asked, traces and measurements, locally or as a
Slurm job array). The CLI parses the flags, calls ``run_sweep`` and renders the site from the store
afterwards; nothing here renders.

Each stage is resumable on its own (a current stored document is skipped unless ``force``) and
reports through the ``stages`` object the CLI passes in (``views/progress.Stages``: ``track`` wraps a
stage's cases in a progress bar, ``lap`` closes the stage's clock) and one summary line per stage
on the CLI's ``console``, printed as soon as the stage ends."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reportgen.store import Warn
from reportgen.sweep import Sweep


@dataclass
class SweepRun:
    """How each stage of one sweep ended."""

    estimates: object  # runner.RunStats
    walks: object  # advise.store's stats
    traced_failed: int = 0
    submitted: int = 0  # Slurm tasks left running (--no-wait): the sweep is not done
    #: measured cases that ended in error or timeout (an out-of-memory run is an answer, not a failure)
    measured_failed: int = 0

    @property
    def failed(self) -> bool:
        return bool(self.estimates.failed or self.submitted or self.traced_failed or self.measured_failed)


def run_sweep(sweep: Sweep, results: Path, *, stages, warn: Warn, console,
              force: bool = False, trace: bool = False, measure: bool = False, shard: str | None = None,
              slurm=None) -> SweepRun:
    """Estimate and walk every case, then trace (``trace``), submit to Slurm (``slurm``, options
    checked by the CLI) or measure here (``measure``, this ``shard``). ``console`` (rich) takes the
    summary lines and the measuring stages' own bar, which names the case being measured."""
    from reportgen.advise.store import write_advice
    from reportgen.runner import run_estimates

    stats = run_estimates(sweep, results, force=force, warn=warn,
                          progress=lambda cases: stages.track(f"estimating {sweep.name}", cases))
    t_est = stages.lap("estimates")
    walks = write_advice(sweep, results, force=force, progress=lambda keys: stages.track("decision-tree walks", keys))
    t_walks = stages.lap("walks")
    orphans = f" (+{stats.orphans} measured cases the sweep no longer lists)" if stats.orphans else ""
    console.print(f"{sweep.name}: {len(sweep.cases)} cases{orphans}, {stats.written} written, "
                  f"{stats.skipped} unchanged, {stats.failed} failed, {stats.removed} stale removed in "
                  f"{t_est:.1f} s -> {results / sweep.name}")
    console.print(f"decision-tree walks: {walks.written} written, {walks.skipped} unchanged in {t_walks:.1f} s")
    run = SweepRun(estimates=stats, walks=walks)
    if trace:
        run.traced_failed = _trace(sweep, results, force, stages, console, warn)
    if slurm is not None:  # the estimates above are written once, here, before any task starts
        from reportgen.measure.cluster import submit

        run.submitted = submit(sweep, results, slurm, force=force, console=console)
        stages.lap("submitting")
    elif measure:
        from reportgen.measure.runner import measure_sweep

        measured = measure_sweep(sweep, results, shard=shard, force=force, console=console)
        run.measured_failed = sum(n for status, n in measured.by_status.items() if status not in ("ok", "oom"))
        stages.lap("measuring")
    return run


def _trace(sweep: Sweep, results: Path, force: bool, stages, console, warn: Warn) -> int:
    """The tracing stage, with a progress bar; the number of cases that failed."""
    from reportgen.trace.runner import trace_sweep

    stats = trace_sweep(sweep, results, force=force, warn=warn,
                        progress=lambda cases: stages.track(f"tracing {sweep.name}", cases))
    t = stages.lap("tracing")
    console.print(f"traced {sweep.name}: {stats.written} written, {stats.skipped} current, {stats.untraceable} not "
                  f"traceable, {len(stats.failed)} failed in {t:.1f} s -> {results / sweep.name / 'traced'}")
    return len(stats.failed)
