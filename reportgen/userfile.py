"""Reading a file a user named, bounded: never more than a limit, whatever the path is.

A size check on ``stat`` holds only for a regular file. ``/dev/zero``, a FIFO or a ``/dev/fd/N`` fed
by a program report no size and may never end, and reading them whole ran until memory ran out
(``reportgen sweep /dev/zero`` and ``estimate --model /dev/zero``: a MemoryError traceback, or the
kernel's OOM killer; ``compare-published --csv /dev/zero``: a hang). ``read_bytes`` reads at most one
byte past the limit instead, so a file that never ends is refused as too large. (A FIFO that no
program writes to blocks in ``open``, as it does for ``cat``.)
Torch-free and dependency-free (the calculator runs it under Pyodide).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class TooLarge(Exception):
    """More than ``limit`` bytes; ``size`` is the file's size when it is a regular file, else None."""

    def __init__(self, path: Path, limit: int, size: int | None):
        self.path, self.limit, self.size = Path(path), limit, size
        super().__init__(f"{path}: {self.amount()}")

    def amount(self) -> str:
        """"1,234,567 bytes", or "more than 1,000,000 bytes" for what has no size (a device, a pipe)."""
        return f"{self.size:,} bytes" if self.size is not None else f"more than {self.limit:,} bytes"


def read_bytes(path: Path | str, limit: int) -> bytes:
    """The file's bytes; ``TooLarge`` when it holds more than ``limit`` (at most ``limit + 1`` are
    read); ``OSError`` as ``open`` raises it (missing, a directory, no permission)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        regular = stat.S_ISREG(st.st_mode)
        if regular and st.st_size > limit:
            raise TooLarge(Path(path), limit, st.st_size)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(Path(path), limit, st.st_size if regular else None)
    return data


def try_writing(folder: Path | str, keep: bool = True) -> None:
    """Make ``folder`` (with its parents) and write and remove a file in it, so that a folder nothing
    can be written to (read-only, ``/proc``, a file in the way) fails before the work whose results
    go there, not after it. ``keep=False`` removes again the folders it made. ``OSError`` as the
    system raises it (``FileExistsError`` when a file stands where a folder is to be made)."""
    folder = Path(folder)
    made = [p for p in (folder.absolute(), *folder.absolute().parents) if not p.exists()]  # deepest first
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-test-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()
    if not keep:
        for p in made:
            p.rmdir()
