"""A measuring process dies with the sweep that started it, and leaves no scratch folder behind.

The parent (``isolate.py``) runs each case in a process of its own session, so a timeout can kill
the whole group. Killed itself (SIGKILL, or SIGTERM: the CLI turns SIGTERM into an interrupt, but a
SIGKILL cannot be caught), it could otherwise leave that worker measuring for up to its timeout,
on the GPU a resumed sweep is measuring on, and its temp folder on disk. So:

* the parent keeps the write end of a pipe (the **lifeline**) and passes the read end to the child
  (``LIFELINE_ENV`` names the descriptor, ``SCRATCH_ENV`` the scratch folder). The kernel closes the
  write end whatever way the parent ends, so a read in the child returns end-of-file exactly then;
* the child (``watch``) reads it in a daemon thread and also asks Linux for SIGTERM when its parent
  dies (``prctl(PR_SET_PDEATHSIG)``, through ctypes, as ``distributed.die_with_parent``). Either way
  it starts a detached cleaner that removes the scratch folder once the group is gone, then
  SIGKILLs its own process group: itself and every helper it started (data-loader workers, torchrun
  and, through their own death signal, its ranks).

``guard_main`` wraps a command that is not ours (``torchrun``): it runs it in its own group under the
same lifeline and exits with its status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

LIFELINE_ENV = "REPORTGEN_LIFELINE_FD"
SCRATCH_ENV = "REPORTGEN_SCRATCH_DIR"
GUARD_FLAG = "--guard"


def child_env(env: dict[str, str], fd: int, scratch: Path | None) -> dict[str, str]:
    """``env`` with the lifeline's descriptor and the scratch folder to remove."""
    out = dict(env)
    out[LIFELINE_ENV] = str(fd)
    if scratch is not None:
        out[SCRATCH_ENV] = str(scratch)
    return out


def _clean_later(scratch: str | None) -> None:
    """Remove ``scratch`` from a process outside this group (it outlives the group's SIGKILL), after
    the group is gone (a dying writer cannot recreate a file in it)."""
    if not scratch:
        return
    code = ("import shutil, sys, time\n"
            "for _ in range(20):\n"
            "    time.sleep(0.25)\n"
            "    shutil.rmtree(sys.argv[1], ignore_errors=True)\n"
            "    if not __import__('os').path.exists(sys.argv[1]): break\n")
    try:
        subprocess.Popen([sys.executable, "-c", code, scratch], start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    except OSError:
        pass


def _die(scratch: str | None) -> None:
    _clean_later(scratch)
    try:
        os.killpg(os.getpgrp(), signal.SIGKILL)
    finally:
        os._exit(137)


def _death_signal(sig: int) -> None:
    """``prctl(PR_SET_PDEATHSIG, sig)`` on Linux; elsewhere the lifeline alone watches the parent."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def watch() -> bool:
    """In the child: end this process group when the parent ends (see the module docstring). Returns
    whether a lifeline was given (a worker started by hand runs without one)."""
    fd_text = os.environ.pop(LIFELINE_ENV, None)
    scratch = os.environ.pop(SCRATCH_ENV, None)
    if fd_text is None:
        return False
    fd = int(fd_text)
    parent = os.getppid()

    def on_term(signum, frame):
        _die(scratch)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
    _death_signal(signal.SIGTERM)

    def read() -> None:
        try:
            while os.read(fd, 1024):
                pass
        except OSError:
            pass
        _die(scratch)

    threading.Thread(target=read, name="reportgen-lifeline", daemon=True).start()
    if os.getppid() != parent:  # the parent died before the death signal was asked for
        _die(scratch)
    return True


def guard_main(argv: list[str]) -> int:
    """``python -m reportgen.measure.worker --guard -- CMD...``: run CMD under this process's lifeline
    (in this process group) and exit with its status (a signal that killed it kills this process too)."""
    cmd = argv[argv.index("--") + 1:] if "--" in argv else argv
    watch()
    proc = subprocess.Popen(cmd)
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.kill()
        rc = proc.wait()
    if rc < 0:
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
    return rc
