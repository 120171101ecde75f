"""Host (CPU) memory of the measuring process, so that host RAM is validated as GPU memory is
(issue 32). Bytes; null where the operating system does not give the figure in a known unit.

* ``peak_rss``: ``getrusage(RUSAGE_SELF).ru_maxrss``, "the maximum resident set size used (in
  kilobytes)" (Linux getrusage(2); KiB, so x 1024): this process's peak since it started. It only
  grows, so read at the end of a phase it is the peak up to there. The worker is a fresh process
  per case, so its interpreter and the torch import are in it too.
* ``peak_rss_children``: ``getrusage(RUSAGE_CHILDREN).ru_maxrss``: "the resident set size of the
  largest child, not the maximum resident set size of the process tree" (getrusage(2)), of the
  children that ended and were waited for; 0 when there were none. A child started by fork (or
  vfork) and exec carries the high-water mark of the address space it left at exec, its parent's:
  ``git rev-parse`` run by a 800 MiB process reads 800 MiB here. So the figure is at least this
  process's resident set size when it last started a program (the worker starts ``git`` for its
  environment, ``environment.py``), and a child's own memory only where it is larger.
* ``rss_now``: ``VmRSS`` of ``/proc/self/status`` (proc(5), in kB): the resident set size now.

The two reach the kernel's count by two routes. Read at the same moment, ``ru_maxrss`` has been
seen a few hundred KiB below ``VmRSS`` (0.25 to 0.35 MiB, Linux 6.18, the tiny test model; likely
because the count is kept per CPU, which ``/proc`` sums exactly and ``getrusage`` may read without
the per-CPU remainders): compare a peak with a current figure to that precision, never expect
``peak >= now`` to the byte.

Off Linux every figure is null (macOS's ``ru_maxrss`` is in bytes, and it has no ``/proc``): never
a figure in a guessed unit.
"""

from __future__ import annotations

import sys
from pathlib import Path

KIB = 1024
STATUS = Path("/proc/self/status")


def _linux() -> bool:
    return sys.platform.startswith("linux")


def _maxrss(children: bool) -> int | None:
    if not _linux():
        return None
    import resource

    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return int(resource.getrusage(who).ru_maxrss) * KIB


def peak_rss() -> int | None:
    """This process's peak resident set size so far, in bytes."""
    return _maxrss(children=False)


def peak_rss_children() -> int | None:
    """The largest peak resident set size of this process's ended children, in bytes."""
    return _maxrss(children=True)


def rss_now(status: Path = STATUS) -> int | None:
    """This process's resident set size now, in bytes (null when ``status`` cannot say)."""
    if not _linux():
        return None
    try:
        lines = status.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, _, value = line.partition(":")
        parts = value.split()
        if name == "VmRSS" and len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            return int(parts[0]) * KIB
    return None
