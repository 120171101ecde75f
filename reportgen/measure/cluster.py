"""A sweep's measurements as a Slurm job array, through submitit: ``reportgen sweep FILE --measure
--executor slurm [--partition P --gpus-per-task N --time-limit T --slurm-array-parallelism K
--account A --qos Q --tasks N --no-wait]``.

No scheduler of our own: submitit's ``AutoExecutor.map_array`` submits one ``sbatch --array``,
each array task runs ``measure_shard``, which is ``measure_sweep`` (``runner.py``) on one shard
(``--shard I/N``) of the sweep, into the same results directory. Each task writes only measurement
files, under names no other file has (``store.add_measurement``: ``write_json_new`` links a temp
file to a new name, never overwriting), so tasks running at once on a shared filesystem cannot
clash; the estimate files are written once, by the submitting command, before anything is
submitted (tasks only read them). What a task measured is simply there afterwards: the sweep's
resume rule (a case settled by an ``ok`` or ``oom`` attempt is skipped) and its merge (all
attempt files of a case, joined by ``store.load_results``) are the ones a local run uses.

Shards: ``--tasks N`` (default: one per case) splits the sweep's cases (sorted by id) into N
shards as ``--shard I/N`` does; only shards that still hold a case to measure are submitted (a
rerun submits what is missing, nothing when nothing is). The cases of every array are recorded in
``_slurm/<array id>.cases.json``; a rerun asks Slurm (``sacct``, through submitit) about them and
does not submit again a case whose task is still pending or running. Each task checks that the
sweep file still has the content it had at submission.

Parameters, under submitit's names: ``--partition`` -> ``slurm_partition``, ``--gpus-per-task`` ->
``slurm_gpus_per_task`` (default: the most GPUs a case to measure needs), ``--time-limit`` ->
``timeout_min`` (default: each of the task's cases at its sweep timeout plus a minute),
``--slurm-array-parallelism`` -> ``slurm_array_parallelism``, ``--account`` -> ``slurm_account``,
``--qos`` -> ``slurm_qos``, ``--slurm-additional KEY=VALUE`` -> ``slurm_additional_parameters``
(any other ``#SBATCH`` option, e.g. ``constraint=h100``). Logs and submitit's pickles go to
``<results>/<sweep>/_slurm/`` (``--slurm-folder``), which must be on a filesystem the compute
nodes share, like the results directory and the Python environment.

The command waits (a progress line whenever a task changes state) and reports each task's counts,
or with ``--no-wait`` prints the job ids on stdout and how to resume.

``REPORTGEN_SUBMITIT_CLUSTER=local`` (tests, or a machine without Slurm) runs the same array
through submitit's local executor, one subprocess per task on this machine.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import reportgen
from reportgen import store
from reportgen.errors import UserError

EXTRA = "cluster"
CLUSTER_ENV = "REPORTGEN_SUBMITIT_CLUSTER"
POLL_ENV = "REPORTGEN_SUBMITIT_POLL_S"
DEFAULT_POLL_S = 30.0
SLURM_DIR = "_slurm"
#: beyond its cases' own timeouts: the task's start, imports, the sweep's loading
TASK_OVERHEAD_MIN = 1


@dataclass
class SlurmOptions:
    partition: str | None = None
    gpus_per_task: int | None = None
    time_limit: str | None = None
    array_parallelism: int | None = None
    account: str | None = None
    qos: str | None = None
    tasks: int | None = None
    additional: list[str] = field(default_factory=list)
    folder: Path | None = None
    wait: bool = True


def require_submitit():
    try:
        import submitit
    except ImportError:
        raise UserError("--executor slurm submits through submitit, which is not installed",
                        hint=f"pip install -e \".[{EXTRA}]\" (or pip install submitit)") from None
    return submitit


def parse_time_limit(text: str) -> int:
    """Minutes (rounded up) of a Slurm time limit: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", str(text).strip())
    if not m:
        raise UserError(f"--time-limit {text!r}: expected minutes or a Slurm time (MM, HH:MM:SS, D-HH:MM)")
    days, a, b, c = (int(x) if x is not None else None for x in m.groups())
    if days is not None:  # D-H, D-H:M, D-H:M:S
        seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # H:M:S
        seconds = a * 3600 + b * 60 + c
    elif b is not None:  # M:S
        seconds = a * 60 + b
    else:  # M
        seconds = a * 60
    if seconds <= 0:
        raise UserError(f"--time-limit {text!r}: must be more than 0")
    return math.ceil(seconds / 60)


def parse_additional(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--slurm-additional {item!r}: expected KEY=VALUE, e.g. constraint=h100")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


@dataclass
class Shard:
    shard: str  # "I/N"
    cases: list  # the sweep's Case objects of this shard still to measure


#: Slurm job states of a task that has not ended (sacct)
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING",
                 "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT")


def active_cases(folder: Path, cluster: str, case_ids: set[str]) -> dict[str, str]:
    """``{case id: job id}`` of the given cases whose array task is still pending or running
    (Slurm only: submitit's local jobs end with the command that waits for them)."""
    if cluster != "slurm" or not folder.is_dir():
        return {}
    import json

    import submitit

    out = {}
    for path in sorted(folder.glob("*.cases.json")):
        try:
            tasks = json.loads(path.read_text())["tasks"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for job_id, ids in tasks.items():
            mine = case_ids.intersection(ids)
            if not mine:
                continue
            try:
                state = str(submitit.SlurmJob(folder, job_id).state).split()[0].upper()
            except Exception:  # noqa: BLE001 - no sacct answer: cannot tell, so it does not block
                continue
            if state in ACTIVE_STATES:
                out.update({cid: job_id for cid in mine})
    return out


def plan(sweep, results_dir: Path, device: str, force: bool, tasks: int | None,
         busy: dict[str, str] | None = None) -> list[Shard]:
    """The shards to submit: those holding a case that is neither settled, nor hopeless, nor in a
    task still pending or running (``busy``: ``{case id: job id}``)."""
    from reportgen.measure.runner import stored_estimate, settled, hopeless, settings_for

    settings = settings_for(sweep, device)
    measured = store.load_measurements(Path(results_dir) / sweep.name)
    busy = busy or {}
    n = tasks or len(sweep.cases)
    out = []
    for i in range(n):
        todo = [c for j, c in enumerate(sweep.cases) if j % n == i and c.id not in busy
                and not settled(measured.get(c.id, []), settings, force)
                and hopeless(c, stored_estimate(sweep, c, results_dir)) is None]
        if todo:
            out.append(Shard(f"{i}/{n}", todo))
    return out


def measure_shard(sweep_file: str, results_dir: str, shard: str, force: bool, device: str,
                  content_hash: str) -> dict:
    """One array task: ``measure_sweep`` on one shard (runs on the compute node)."""
    from reportgen.measure.runner import measure_sweep
    from reportgen.sweep import load_sweep

    sweep = load_sweep(Path(sweep_file))
    if sweep.content_hash != content_hash:
        raise RuntimeError(f"{sweep_file} changed since the array was submitted: its shards no longer name the "
                           "same cases; rerun `reportgen sweep ... --executor slurm` to submit again")
    stats = measure_sweep(sweep, Path(results_dir), shard=shard, force=force, device=device)
    return {"shard": shard, "measured": stats.measured, "skipped": stats.skipped, "by_status": stats.by_status,
            "hopeless": stats.hopeless, "deferred": stats.deferred}


@contextmanager
def _this_reportgen_on_path():
    """Tasks import the reportgen that submits them (sbatch and submitit's local executor pass
    this process's environment on), whether it is installed or run from a checkout."""
    root = str(Path(reportgen.__file__).resolve().parents[1])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = root + (os.pathsep + old if old else "")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def cluster_name() -> str:
    return os.environ.get(CLUSTER_ENV) or "slurm"


def folder_for(sweep, results_dir: Path, options: SlurmOptions) -> Path:
    return Path(options.folder or Path(results_dir) / sweep.name / SLURM_DIR).resolve()


def check_cluster() -> None:
    """Refuse early (before the estimate pass) where there is no Slurm to submit to."""
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None] if cluster_name() == "slurm" else []
    if missing:
        raise UserError(f"--executor slurm: {' and '.join(missing)} not on PATH; run this on a Slurm login node",
                        hint="--executor local (the default) measures on this machine")


def executor_for(sweep, results_dir: Path, options: SlurmOptions, shards: list[Shard], device: str):
    submitit = require_submitit()
    cluster = cluster_name()
    check_cluster()
    folder = folder_for(sweep, results_dir, options)
    try:
        executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    except (RuntimeError, ValueError) as exc:  # submitit's own checks of the cluster
        raise UserError(f"--executor slurm: submitit cannot use this machine ({exc})") from None
    per_task = max(len(s.cases) for s in shards)
    minutes = (parse_time_limit(options.time_limit) if options.time_limit else
               per_task * math.ceil(sweep.spec.measure.timeout_s / 60 + TASK_OVERHEAD_MIN))
    need = max(c.setup.gpus for s in shards for c in s.cases)
    gpus = options.gpus_per_task or (need if device == "cuda" else None)
    if device == "cuda" and gpus < need:
        case = next(c for s in shards for c in s.cases if c.setup.gpus == need)
        raise UserError(f"--gpus-per-task {gpus}: case {case.id} needs {need} GPUs",
                        hint=f"--gpus-per-task {need} (or leave it out: it defaults to what the cases need)")
    params = {"name": f"reportgen-{sweep.name}", "timeout_min": minutes, "slurm_partition": options.partition,
              "slurm_gpus_per_task": gpus, "slurm_array_parallelism": options.array_parallelism,
              "slurm_account": options.account, "slurm_qos": options.qos,
              "slurm_additional_parameters": parse_additional(options.additional) or None}
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor, folder, minutes, gpus


def submit(sweep, results_dir: Path, options: SlurmOptions, force: bool, console) -> int:
    """Submit the shards still to measure, then wait for them (or not); the command's exit status."""
    from reportgen.measure.runner import DEVICE_ENV

    require_submitit()
    device = os.environ.get(DEVICE_ENV, "cuda")
    results_dir = Path(results_dir).resolve()
    busy = active_cases(folder_for(sweep, results_dir, options), cluster_name(), {c.id for c in sweep.cases})
    if busy:
        jobs = sorted(set(busy.values()))
        console.print(f"{sweep.name}: {len(busy)} case(s) still pending or running in {' '.join(jobs[:10])}"
                      f"{' ...' if len(jobs) > 10 else ''}: not submitted again", highlight=False)
    shards = plan(sweep, results_dir, device, force, options.tasks, busy)
    if not shards:
        console.print(f"{sweep.name}: nothing to submit: every case is measured (ok or oom), hopeless or still in a "
                      "task; --force measures the measured ones again", highlight=False)
        return 0
    executor, folder, minutes, gpus = executor_for(sweep, results_dir, options, shards, device)
    n = len(shards)
    args = ([str(Path(sweep.path).resolve())] * n, [str(results_dir)] * n, [s.shard for s in shards], [force] * n,
            [device] * n, [sweep.content_hash] * n)
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    with _this_reportgen_on_path():
        try:
            jobs = executor.map_array(measure_shard, *args)
        except (FailedSubmissionError, FailedJobError, OSError) as exc:  # sbatch refused it (its stderr)
            raise UserError(f"--executor slurm: the job array was not accepted: {str(exc).strip()[:2000]}") from None
    cases = sum(len(s.cases) for s in shards)
    array = _array_id(jobs)
    from reportgen.results import write_json_atomic

    write_json_atomic(folder / f"{array.split()[0]}.cases.json",
                      {"sweep": sweep.name, "cluster": executor.cluster,
                       "tasks": {job.job_id: [c.id for c in s.cases] for job, s in zip(jobs, shards)}})
    what = f"Slurm job array {array}" if executor.cluster == "slurm" else f"{executor.cluster} submitit jobs {array}"
    console.print(f"{sweep.name}: submitted {n} task(s) for {cases} case(s) as {what} ({minutes} min each"
                  + (f", {gpus} GPU(s) per task" if gpus else "") + f"); logs in {folder}", highlight=False)
    resume = (f"when the tasks have ended, `reportgen sweep {sweep.path} --results {results_dir}` renders what they "
              f"measured into the site; rerunning this command submits only the cases still missing (not those whose "
              f"task is still pending or running)")
    if not options.wait:
        for job in jobs:
            print(job.job_id)
        follow = f"squeue -j {array} / sacct -j {array}" if executor.cluster == "slurm" else f"the logs in {folder}"
        console.print(f"not waiting (--no-wait): each task writes {results_dir / sweep.name / store.MEASURED_DIR}"
                      f"/<case-id>.<utc>.json as its cases end; follow with {follow}; {resume}", highlight=False)
        return 0
    try:
        outcomes = wait(jobs, results_dir / sweep.name, console)
    except KeyboardInterrupt:
        cancel = f"scancel {array}" if executor.cluster == "slurm" else "kill their processes"
        console.print(f"interrupted: the tasks keep running ({' '.join(j.job_id for j in jobs)}); to stop them, "
                      f"{cancel}; {resume}", highlight=False)
        raise
    return report(sweep, jobs, outcomes, console, resume)


def _array_id(jobs) -> str:
    ids = [j.job_id for j in jobs]
    heads = {i.split("_", 1)[0] for i in ids}
    return heads.pop() if len(heads) == 1 else " ".join(ids)


def wait(jobs, sweep_dir: Path, console) -> list:
    """Wait for every task, printing a line whenever the counts change; ``[(job, result or exception)]``."""
    poll = float(os.environ.get(POLL_ENV) or DEFAULT_POLL_S)
    before = len(store.measurement_files(sweep_dir))
    t0 = time.monotonic()
    last = None
    while True:
        done = [job.done() for job in jobs]
        states: dict[str, int] = {}
        for job, finished in zip(jobs, done):
            if not finished:
                state = str(job.state).split()[0].lower()
                states[state] = states.get(state, 0) + 1
        written = len(store.measurement_files(sweep_dir)) - before
        line = (f"{sum(done)}/{len(jobs)} tasks ended"
                + "".join(f", {k} {v}" for k, v in sorted(states.items()))
                + f"; {written} measurement file(s) written")
        if line != last:
            console.print(f"  [{time.monotonic() - t0:5.0f} s] {line}", highlight=False)
            last = line
        if all(done):
            break
        time.sleep(poll)
    outcomes = []
    for job in jobs:
        try:
            outcomes.append((job, job.result()))
        except Exception as exc:  # noqa: BLE001 - submitit's FailedJobError / UncompletedJobError: a task failed
            outcomes.append((job, exc))
    return outcomes


def report(sweep, jobs, outcomes, console, resume: str) -> int:
    measured, by_status, failed, deferred = 0, {}, [], []
    for job, out in outcomes:
        if isinstance(out, BaseException):
            lines = [ln for ln in str(out).strip().splitlines() if ln.strip()]
            failed.append(f"  task {job.job_id}: {lines[-1][:300] if lines else type(out).__name__} "
                          f"(log: {job.paths.stderr})")
            continue
        measured += out["measured"]
        deferred += out.get("deferred") or []
        for status, count in (out.get("by_status") or {}).items():
            by_status[status] = by_status.get(status, 0) + count
    counts = ", ".join(f"{v} {k}" for k, v in sorted(by_status.items())) or "none"
    console.print(f"{sweep.name}: {len(jobs) - len(failed)}/{len(jobs)} task(s) completed, {measured} case(s) "
                  f"measured ({counts})", highlight=False)
    if deferred:
        console.print(f"deferred by the deadline ({len(deferred)}): {' '.join(deferred)}", highlight=False)
    if failed:
        console.print(f"{len(failed)} task(s) failed:\n" + "\n".join(failed) + f"\n{resume}", highlight=False)
        return 1
    return 0
