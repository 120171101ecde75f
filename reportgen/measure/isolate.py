"""Run one measurement in its own subprocess, with a time limit.

Each case gets a fresh Python process (``python -m reportgen.measure.worker``) so no CUDA state,
allocator cache or fragmentation carries over between cases, a crash (segfault, SIGKILL, a CUDA
error that poisons the context) ends only that case, and the caller never imports torch. The
worker runs in its own process group (``start_new_session``); on timeout the whole group is
killed (SIGKILL), so data-loader or compile helpers die with it.

A multi-GPU case (``gpus > 1``) runs ``torchrun`` instead of one worker (``ranks.py``): one worker
per GPU, each writing its own answer, merged here into one. torchrun starts every rank in a session
of its own, so on a timeout the parent kills torchrun's group and then each rank's group by the
pid the rank wrote (and each rank has asked Linux to kill it when torchrun dies,
``distributed.die_with_parent``). When one rank fails it exits at once and torchrun stops the
others, so a failure is reported within seconds, not at the time limit.

If this process itself ends (SIGTERM, SIGKILL), every worker, torchrun and rank ends with it and
the scratch folder is removed (``lifeline.py``): torchrun runs under a small guard process
(``worker.py --guard``) that holds the lifeline for it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import reportgen
from reportgen.measure import lifeline
from reportgen.measure.environment import light_environment
from reportgen.measure.protocol import FINAL_STATUSES, MeasureRequest, answer, empty_measurement, tail

#: environment of the worker: never reach the network (random weights need no hub), less noise, and
#: one Python hash seed, so a model whose construction iterates a set allocates in the same order on
#: every run (transformers 5.24's Gemma 3 builds its rotary tables over set(config.layer_types): the
#: traced peak_reserved moved by one 2 MiB block with the seed, and a CUDA run allocates in that order too)
WORKER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
              "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false", "PYTHONHASHSEED": "0"}


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(WORKER_ENV)
    root = str(Path(reportgen.__file__).resolve().parents[1])  # the same reportgen, installed or not
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


#: what the worker imports to measure anything (bitsandbytes, torchao, liger-kernel only for some setups)
REQUIRED_PACKAGES = ("torch", "transformers", "peft", "accelerate")


def require_measure_packages() -> None:
    """Raise a ``UserError`` naming the extra to install when the worker could not import what it
    needs (checked here, in the parent, without importing torch)."""
    import importlib.util

    from reportgen.errors import UserError

    missing = [name for name in REQUIRED_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"measuring needs {', '.join(REQUIRED_PACKAGES)}; not installed: {', '.join(missing)}",
                        hint="install torch for your CUDA (https://pytorch.org/get-started/locally/), then "
                             "pip install -e \".[measure]\" from the reportgen checkout")


def _run_logged(cmd: list[str], log_path: Path, timeout_s: float, on_abort=lambda: None, tmpdir: str | None = None):
    """Run ``cmd`` in its own session with its output in ``log_path`` and this process's lifeline
    (``lifeline.py``: it and its scratch folder, ``log_path``'s, go when this process does); on the
    timeout kill its process group, on any exception (Ctrl-C, SIGTERM) kill it, run ``on_abort``
    (torchrun's ranks live in their own sessions) and re-raise. ``tmpdir``: the child's ``TMPDIR``
    (torchrun's elastic agent makes a ``torchelastic_*`` folder there and leaves it behind).
    Returns (process, timed out, wall seconds)."""
    t0 = time.perf_counter()
    timed_out = False
    read_end, write_end = os.pipe()
    try:
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=lifeline.child_env({**_worker_env(), **({"TMPDIR": tmpdir} if tmpdir else {})},
                                                               read_end, log_path.parent),
                                        pass_fds=(read_end,), start_new_session=True)
            finally:
                os.close(read_end)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            except BaseException:
                _kill_group(proc)
                on_abort()
                raise
    finally:
        os.close(write_end)
    return proc, timed_out, time.perf_counter() - t0


def refusal(request: MeasureRequest) -> dict | None:
    """The answer to a setup the harness refuses whatever the machine (``harness.check_supported``
    short of counting GPUs): given here, in the parent, without starting a worker, or torchrun and
    one rank per GPU, to import torch only to refuse (about 10 s a process, more on a GPU node where
    each rank creates its CUDA context). None: the worker is started."""
    from reportgen.measure.harness import check_supported
    from reportgen.measure.optimizers import SetupNotSupported
    from reportgen.setup import TrainingSetup

    setup = TrainingSetup.model_validate(request.setup)
    try:
        check_supported(setup, request.device, setup.gpus, count_gpus=False)
    except SetupNotSupported as exc:
        measurement = dict(empty_measurement(), warmup=request.warmup, steps=request.steps,
                           tokens_per_step=setup.tokens_per_step, failed_in="setup")
        out = answer(request, "error", measurement=measurement, environment=light_environment(), error=str(exc))
        out["wall_s"] = 0.0
        return out
    return None


def run_case(request: MeasureRequest, timeout_s: float) -> dict:
    """The worker's answer (see ``protocol.py``) plus ``wall_s``; never raises for a failed case."""
    refused = refusal(request)
    if refused is not None:
        return refused
    if int(request.setup.get("gpus", 1)) > 1:
        return _run_ranks(request, timeout_s)
    with tempfile.TemporaryDirectory(prefix="reportgen-measure-") as tmp:
        req_path, ans_path, log_path = Path(tmp) / "request.json", Path(tmp) / "answer.json", Path(tmp) / "worker.log"
        req_path.write_text(request.to_json())
        proc, timed_out, wall = _run_logged(
            [sys.executable, "-m", "reportgen.measure.worker", str(req_path), str(ans_path)], log_path, timeout_s)
        result = _read(ans_path)
        log_tail = tail(log_path.read_text(errors="replace"), 2000)
    if result is not None and result.get("status") in FINAL_STATUSES:  # finished, even if just at the limit
        result["wall_s"] = wall
        return result
    environment = (result or {}).get("environment") or light_environment()
    if timed_out:
        out = answer(request, "timeout", measurement=empty_measurement(), environment=environment,
                     error=f"no result within {timeout_s:g} s: the worker was killed" +
                           (f"\n--- worker output ---\n{log_tail}" if log_tail else ""))
    else:
        rc = proc.returncode
        how = f"was killed by signal {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
        out = answer(request, "error", measurement=empty_measurement(), environment=environment,
                     error=f"the measuring worker {how} before it reported" +
                           (f"\n--- worker output ---\n{log_tail}" if log_tail else ""))
    out["wall_s"] = wall
    return out


def process_alive(pid: int) -> bool:
    """Whether a process runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_ranks(pids: dict[int, int], wait_s: float = 10.0) -> None:
    """SIGKILL each rank's process group (torchrun starts each rank in a session of its own), else
    the rank alone, and wait until they are gone."""
    for pid in pids.values():
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
                break
            except (ProcessLookupError, PermissionError):
                continue
    deadline = time.monotonic() + wait_s
    while any(process_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)


def _run_ranks(request: MeasureRequest, timeout_s: float) -> dict:
    """A multi-GPU case: torchrun with one worker per GPU, the ranks' answers merged (``ranks.py``)."""
    from reportgen.measure import ranks

    world = int(request.setup["gpus"])
    with tempfile.TemporaryDirectory(prefix="reportgen-measure-") as tmp:
        req_path, ans_path, log_path = Path(tmp) / "request.json", Path(tmp) / "answer.json", Path(tmp) / "torchrun.log"
        req_path.write_text(request.to_json())
        guarded = [sys.executable, "-m", "reportgen.measure.worker", lifeline.GUARD_FLAG, "--"]
        proc, timed_out, wall = _run_logged(
            guarded + ranks.torchrun_command(request, req_path, ans_path), log_path, timeout_s,
            on_abort=lambda: _kill_ranks(ranks.read_ranks(ans_path, world)[1]),
            tmpdir=tmp)  # torchelastic's own temp folder goes with ours (issue 29: one was left per run)
        answers, pids = ranks.read_ranks(ans_path, world)
        if timed_out:
            _kill_ranks(pids)
        log_text = log_path.read_text(errors="replace")
    out = ranks.merge(request, answers, log=log_text, timed_out=timed_out, timeout_s=timeout_s,
                      returncode=proc.returncode)
    out["wall_s"] = wall
    return out
