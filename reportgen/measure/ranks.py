"""The parent's side of a multi-GPU measurement: the torchrun command, and one answer from the
answers of all ranks (no torch import here).

Each rank writes its own answer (``worker.rank_main``): the single-GPU shape, with its environment
(``world_size``, ``rank``, ``local_rank``, ``backend``, ``launcher`` added). ``merge`` makes the
answer of the case, still the shape of ``protocol.py``::

    {"status": "ok", "error": null, "cap": <rank 0's cap, applied only if every rank applied it>,
     "environment": {<rank 0's environment without rank/local_rank>, "world_size": 2,
                     "backend": "nccl", "launcher": "torchrun"},
     "measurement": {
        "peak_allocated", "peak_reserved", "device_used", "memory_after_load":  the max over ranks
                                                 (the per-GPU memory the estimator predicts);
        "host_peak_rss", "host_rss_after_load", ... (harness.py): the max over ranks too, one
                       process's host memory (the node holds world_size of them; torchrun's own
                       process is in none);
        "step_times_s": per timed step, the slowest rank's time; "step_s": their median, and the
                       timing summary of timing.py over them (min, max, quartiles, interval);
        "step_times_cuda_s": likewise from the ranks' CUDA-event times; "stop_reason": rank 0's
                       (every rank stops at the same step, distributed.Rank.agree_stop);
        "real_tokens_per_step": the sum over ranks; "tokens_per_s": that / step_s;
        "mfu": model FLOPs x tokens/s / (world_size x the device's peak);
        "world_size": 2,
        "ranks": [{"rank", "local_rank", "status", "phase", "peak_allocated", "peak_reserved",
                   "device_used", "memory_after_load", "step_times_s", "step_s", "step_times_cuda_s",
                   "real_tokens_per_step", "final_loss", "profile", "error", "environment", "cap"}, ...],
        <everything else: rank 0's (build_s, dtypes, notes, params_trainable, ...)>}}

On the CPU (gloo) every memory figure is null, as in the single-process CPU run.

A failure names its rank. The cause is, in order: the rank torchrun saw fail first when it died
without reporting (a SIGKILL, the host's OOM killer: torchrun's failure summary gives its exit code
or signal), else the earliest failure a rank reported itself (an OOM or an error of its own, not a
collective that broke because another rank went away, ``peer_lost``; a failing rank exits at once,
so torchrun sees it first), else another rank that died, else the earliest broken collective. The status is the cause's (``oom``,
``error``); a rank that died is ``error``; the parent's time limit is ``timeout``, with the phase
each rank had reached. The other ranks are listed after the cause.
"""

from __future__ import annotations

import json
import re
import signal
import statistics
import sys
from pathlib import Path

from reportgen.measure.distributed import LAUNCHER, TORCHRUN_FLAG, rank_paths
from reportgen.measure.protocol import FINAL_STATUSES, MeasureRequest, answer, empty_measurement, tail
from reportgen.measure.timing import summary

#: host memory figures of each rank's process (harness.py, host.py)
HOST_KEYS = ("host_rss_after_load", "host_peak_rss_load", "host_peak_rss_warmup", "host_peak_rss",
             "host_peak_rss_children", "host_peak_rss_at_failure")
#: memory figures: max over ranks
MAX_KEYS = ("peak_allocated", "peak_reserved", "device_used", "memory_after_load", "memory_after_load_reserved",
            "peak_allocated_at_failure", *HOST_KEYS)
#: what each rank's entry keeps of its own measurement
RANK_KEYS = ("phase", "failed_in", "peak_allocated", "peak_reserved", "device_used", "device_used_source",
             "memory_after_load", "memory_after_load_reserved", "peak_allocated_at_failure", "step_times_s", "step_s",
             "step_times_cuda_s", "stop_reason", "real_tokens_per_step", "final_loss", "loss_finite", "build_s",
             "fault_injected", "peer_lost", "profile", *HOST_KEYS)
#: per-rank figures that the merged measurement recomputes (never rank 0's alone)
PER_RANK = ("step_times_s", "step_s", "step_s_min", "step_s_max", "tokens_per_s", "real_tokens_per_step", "mfu",
            "final_loss", "loss_finite", "device_used_source", "phase", "pid", "failed_at", "peer_lost",
            "step_times_cuda_s", "step_s_cuda", "step_s_q1", "step_s_q3", "step_s_iqr_rel", "step_s_ci",
            "step_s_ci_rel", "steps_run", "timed_s")


def torchrun_command(request: MeasureRequest, request_path: Path, answer_path: Path) -> list[str]:
    """``torchrun`` through this interpreter: one node, a free local port (``--standalone``), one
    process per GPU, no restarts (a failed case is a result, not something to retry)."""
    n = int(request.setup["gpus"])
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", str(n),
            "--max-restarts", "0", "-m", "reportgen.measure.worker", str(request_path), str(answer_path),
            TORCHRUN_FLAG]


def read_ranks(answer_path: Path, world_size: int) -> tuple[dict[int, dict | None], dict[int, int]]:
    """``({rank: its answer file or None}, {rank: pid})`` of a launch."""
    answers: dict[int, dict | None] = {}
    pids: dict[int, int] = {}
    for r in range(world_size):
        out, pid = rank_paths(answer_path, r)
        try:
            answers[r] = json.loads(out.read_text())
        except (OSError, ValueError):
            answers[r] = None
        try:
            pids[r] = int(pid.read_text().strip())
        except (OSError, ValueError):
            pass
    return answers, pids


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def torchrun_failures(log: str) -> tuple[dict[int, int], int | None]:
    """``({rank: exit code}, root cause rank)`` from torchrun's failure summary
    (``ChildFailedError``): the ranks that ended with a non-zero status (negative: a signal; the
    SIGTERM of the ranks torchrun itself stopped is among them) and the one torchrun saw fail first."""
    exits = {int(r): int(code) for r, code in _FAILURE.findall(log)}
    _, found, rest = log.rpartition("Root Cause")
    root = _FAILURE.search(rest) if found else None
    return exits, int(root.group(1)) if root else None


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _max(values: list) -> int | None:
    """The largest figure, or null when any rank could not give it (the CPU gives none)."""
    return None if not values or any(v is None for v in values) else max(values)


def _rank_entry(r: int, ans: dict | None, exits: dict[int, int], timed_out: bool) -> dict:
    m = (ans or {}).get("measurement") or {}
    status = (ans or {}).get("status")
    entry = {"rank": r, **{k: m.get(k) for k in RANK_KEYS if k in m}}
    env = (ans or {}).get("environment")
    entry["local_rank"] = (env or {}).get("local_rank")
    if status not in FINAL_STATUSES:  # no answer of its own: it died, or was stopped
        phase = m.get("phase") or "start"
        entry.update(phase=phase, pid=m.get("pid"))
        if r in exits and exits[r] == -signal.SIGTERM:  # torchrun's own stop
            status, entry["error"] = "stopped", f"rank {r} was stopped by torchrun in {phase} (SIGTERM)"
        elif r in exits:
            status, entry["error"] = "died", f"rank {r} {_exit_text(exits[r])} in {phase} before it reported"
        elif timed_out:
            status = "killed"
            entry["error"] = f"rank {r} was still in {phase} at the time limit"
        else:
            status = "stopped"
            entry["error"] = f"rank {r} was stopped in {phase} (another rank failed)"
    else:
        entry["error"] = ans.get("error")
    entry["status"] = status
    entry["environment"] = env
    entry["cap"] = (ans or {}).get("cap")
    entry.setdefault("failed_at", m.get("failed_at"))
    return entry


def _cause(entries: list[dict], root: int | None = None) -> dict | None:
    died_first = next((e for e in entries if e["rank"] == root and e["status"] == "died"), None)
    if died_first is not None:  # e.g. the host's OOM killer: whatever the others then reported came after
        return died_first
    own = [e for e in entries if e["status"] in ("oom", "error") and not e.get("peer_lost")]
    if own:
        return min(own, key=lambda e: (e.get("failed_at") or float("inf"), e["rank"]))
    died = [e for e in entries if e["status"] == "died"]
    if died:  # torchrun's root cause first; a SIGTERM is how torchrun stops the others
        return min(died, key=lambda e: (e["rank"] != root, "SIGTERM" in (e.get("error") or ""), e["rank"]))
    lost = [e for e in entries if e["status"] in ("oom", "error")]
    if lost:
        return min(lost, key=lambda e: (e.get("failed_at") or float("inf"), e["rank"]))
    return next((e for e in entries if e["rank"] == root), None)  # e.g. a SIGTERM from outside


def _environment(entries: list[dict], world_size: int) -> dict:
    from reportgen.measure.environment import light_environment

    env = next((e["environment"] for e in entries if e.get("environment")), None) or light_environment()
    env = {k: v for k, v in env.items() if k not in ("rank", "local_rank")}
    env.update(world_size=world_size, launcher=LAUNCHER)
    env.setdefault("backend", None)
    return env


def _cap(entries: list[dict]) -> dict | None:
    caps = [e.get("cap") for e in entries]
    first = caps[0] if caps else None
    if not first:
        return None
    every = all(c and c.get("applied") and c.get("emulated_gpu") == first.get("emulated_gpu") for c in caps)
    if first.get("applied") and not every:
        return {**first, "applied": False, "note": "the cap was not applied on every rank (see measurement.ranks)"}
    return first


def merge(request: MeasureRequest, answers: dict[int, dict | None], *, log: str = "", timed_out: bool = False,
          timeout_s: float | None = None, returncode: int | None = None) -> dict:
    """One answer from the ranks' answers (module docstring)."""
    world = int(request.setup["gpus"])
    exits, root = ({}, None) if timed_out else torchrun_failures(log)
    entries = [_rank_entry(r, answers.get(r), exits, timed_out) for r in range(world)]
    first = next((a for a in (answers.get(r) for r in range(world)) if a and a.get("measurement")), None)
    base = {k: v for k, v in ((first or {}).get("measurement") or {}).items() if k not in PER_RANK}
    measurement = dict(empty_measurement(), **base)
    measurement["world_size"] = world
    for key in MAX_KEYS:
        if any(key in ((answers.get(r) or {}).get("measurement") or {}) for r in range(world)):
            measurement[key] = _max([e.get(key) for e in entries])
    environment = _environment(entries, world)
    cap = _cap(entries)
    if all(e["status"] == "ok" for e in entries):
        _merge_times(measurement, entries, world)
        measurement["ranks"] = [_strip(e) for e in entries]
        return answer(request, "ok", measurement=measurement, environment=environment, cap=cap)

    measurement["ranks"] = [_strip(e) for e in entries]
    for key in ("peak_allocated", "peak_reserved", "device_used"):
        measurement[key] = None  # no steady-state peak: the run did not finish
    log_tail = tail(log, 2000)
    if timed_out:
        def where(e: dict) -> str:
            if e["status"] == "killed":
                return f"in {e['phase']}"
            return "done" if e["status"] == "ok" else f"{e['status']} in {e.get('failed_in')}"

        error = (f"no result within {timeout_s:g} s: torchrun and all {world} ranks were killed ("
                 + ", ".join(f"rank {e['rank']} {where(e)}" for e in entries) + ")")
        status = "timeout"
        measurement["failed_in"] = next((e["phase"] for e in entries if e["status"] == "killed"), None)
    else:
        cause = _cause(entries, root)
        if cause is None:  # nothing failed by itself and nothing died: torchrun itself failed
            how = _exit_text(returncode) if returncode is not None else "ended"
            status, error = "error", f"torchrun {how} before every rank reported"
        else:
            status = "oom" if cause["status"] == "oom" else "error"
            failed_in = cause.get("failed_in") or cause.get("phase")
            error = f"rank {cause['rank']} of {world} failed ({cause['status']} in {failed_in}): {cause['error']}"
            measurement.update(failed_rank=cause["rank"], failed_in=failed_in)
            others = [e for e in entries if e is not cause and e["status"] != "ok"]
            if others:
                error += "\n--- other ranks ---\n" + "\n".join(
                    f"rank {e['rank']}: {e['status']} in {e.get('failed_in') or e.get('phase')}: "
                    f"{_first_line(e.get('error'))}" for e in others)
    if log_tail and status != "oom":
        error += f"\n--- torchrun output ---\n{log_tail}"
    return answer(request, status, measurement=measurement, environment=environment, cap=cap, error=error)


def _first_line(text: str | None) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _strip(entry: dict) -> dict:
    """A rank's entry without the bookkeeping of a run that did not fail."""
    return {k: v for k, v in entry.items() if k not in ("failed_at", "peer_lost") or v}


def _merge_times(measurement: dict, entries: list[dict], world: int) -> None:
    runs = [e.get("step_times_s") or [] for e in entries]
    steps = min(len(t) for t in runs) if runs else 0
    times = [max(t[i] for t in runs) for i in range(steps)]  # a step ends when its slowest rank does
    if not times:
        return
    stats = summary(times)
    median = stats["step_s"]
    real = sum(e.get("real_tokens_per_step") or 0 for e in entries)
    measurement.update(stats, step_times_s=times, real_tokens_per_step=real, tokens_per_s=real / median,
                       timed_s=sum(times))
    cuda_runs = [e.get("step_times_cuda_s") for e in entries]
    if cuda_runs and all(cuda_runs):
        cuda_times = [max(t[i] for t in cuda_runs) for i in range(min(len(t) for t in cuda_runs))]
        measurement.update(step_times_cuda_s=cuda_times, step_s_cuda=statistics.median(cuda_times))
    else:  # the CPU (gloo) has no CUDA events
        measurement.update(step_times_cuda_s=None, step_s_cuda=None)
    losses = [e.get("final_loss") for e in entries]
    measurement["final_loss"] = losses[0]
    measurement["loss_finite"] = all(e.get("loss_finite") for e in entries)
    basis = dict(measurement.get("mfu_basis") or {})
    keys = {(e.get("environment") or {}).get("gpu_catalog_key") for e in entries}
    basis["gpus"] = world
    mfu = None
    if basis.get("peak_flops") and len(keys) == 1 and None not in keys:
        mfu = basis["model_flops_per_token"] * measurement["tokens_per_s"] / (world * basis["peak_flops"])
    measurement.update(mfu=mfu, mfu_basis=basis)
