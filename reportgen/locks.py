"""File locks on a results folder, so two measuring runs never measure the same case at once.

Two ``reportgen sweep --measure`` runs on one results folder each measured every case, at the same
time, on the same GPU: each skewed the other's step times and both attempts were kept (issue 29). A
run now holds a lock for its shard of the sweep (a second run of the same shard is refused before it
measures anything, naming the holder's pid), and a lock for each case while it measures it (runs of
overlapping shards skip a case another run is measuring, and re-read what it stored before measuring).

The locks are ``flock`` locks on small files under ``results/<sweep>/measured/`` that hold the
holder's pid and command: the kernel releases them when the holder exits however it exits (Ctrl-C,
SIGKILL, a crash), so a lock is never left behind on a local disk. On a network file system that does
not carry ``flock`` a lock may outlive its holder; the message says which file to delete then.
Where ``fcntl`` does not exist (Windows), runs are not locked.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from reportgen.errors import UserError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class Held(Exception):
    """The lock is held by another process; ``holder`` is what its file says (pid and command)."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is held by {holder}")
        self.path, self.holder = path, holder


@contextlib.contextmanager
def hold(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the ``with`` block; ``Held`` at once,
    without waiting, when another process holds it."""
    if fcntl is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Held(path, _holder(fd)) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}: {' '.join(sys.argv)[:200]}\n".encode())
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 300, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "another process"


def run_lock_path(sweep_dir: Path, shard: str) -> Path:
    return Path(sweep_dir) / "measured" / f".run-{shard.replace('/', 'of')}.lock"


def case_lock_path(sweep_dir: Path, cid: str) -> Path:
    return Path(sweep_dir) / "measured" / f".{cid}.lock"


@contextlib.contextmanager
def measuring_run(sweep_dir: Path, shard: str) -> Iterator[None]:
    """The lock of one measuring run of a shard (``"0/1"`` for a whole sweep); a ``UserError`` (exit 2)
    naming the holder when another run of that shard is measuring into the same folder."""
    try:
        with hold(run_lock_path(sweep_dir, shard)):
            yield
    except Held as exc:
        raise UserError(f"another run is measuring shard {shard} into {sweep_dir} ({exc.holder})",
                        hint="wait for it to end: two runs on one GPU skew each other's step times. If no such "
                        f"process exists (a network file system that kept the lock), delete {exc.path}") from None
