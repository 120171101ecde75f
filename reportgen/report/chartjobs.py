"""Charts are drawn after the pages are planned: a chart function of ``charts`` returns a ``ChartJob``
(its name and arguments), and ``render`` draws every job once, through a cache and in parallel.

Drawing dominates a render (matplotlib lays out every tick and label: about 0.3-0.5 s a chart), and
most renders redraw charts whose inputs did not change. So:

* **Cache by content.** A job's key hashes the chart function's name, its arguments and the code
  that draws it (``charts.py``, the palettes, the matplotlib version). An SVG drawn for the same key
  is read back from ``<cache>/charts/<key>.svg`` (``$REPORTGEN_CACHE``, else ``~/.cache/reportgen``);
  the bytes are the ones drawing would give, because drawing is deterministic (fixed hash salt, no
  dates). ``REPORTGEN_CHART_CACHE=0`` turns the cache off.
* **Draw the rest in parallel**, one process per core (fork, on Linux; elsewhere one by one), each
  job a pure function of its arguments, so the output does not depend on which process drew what.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

#: the files whose source decides how a chart looks
_CODE = ("reportgen/report/charts.py", "reportgen/report/rows.py", "reportgen/format.py")
#: cache entries not used for this long are removed
KEEP_S = 30 * 86400


@dataclass(frozen=True, eq=False)
class ChartJob:
    """One chart to draw: ``charts.<name>(*args, **kwargs)`` -> SVG text."""
    name: str
    args: tuple
    kwargs: tuple  # sorted (key, value) pairs

    def draw(self) -> str:
        return _DRAWERS[self.name](*self.args, **dict(self.kwargs))

    @cached_property
    def key(self) -> str:
        """Same chart function, arguments and drawing code -> same key -> same SVG bytes."""
        h = hashlib.sha256(_code_hash().encode())
        h.update(repr((self.name, self.args, self.kwargs)).encode())
        return h.hexdigest()[:32]


#: chart name -> the function that draws it, filled by ``job`` as ``charts.py`` is imported: a job
#: exists only once its function was decorated, in this process or the one it was forked from
_DRAWERS: dict[str, Callable[..., str]] = {}


def job(fn: Callable[..., str]) -> Callable[..., ChartJob]:
    """Decorator: calling the chart function plans it (a ``ChartJob``); ``render`` draws it."""
    _DRAWERS[fn.__name__] = fn

    def plan(*args, **kwargs) -> ChartJob:
        return ChartJob(fn.__name__, args, tuple(sorted(kwargs.items())))

    plan.__wrapped__ = fn
    plan.__name__ = fn.__name__
    plan.__doc__ = fn.__doc__
    return plan


@lru_cache(maxsize=1)
def _code_hash() -> str:
    import matplotlib

    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256(matplotlib.__version__.encode())
    for rel in _CODE:
        h.update((root / rel).read_bytes())
    return h.hexdigest()


def cache_dir() -> Path | None:
    if os.environ.get("REPORTGEN_CHART_CACHE", "1") == "0":
        return None
    from reportgen.report.pyodide import cache_dir as root

    return root() / "charts"


def _read(cache: Path | None, key: str) -> str | None:
    if cache is None:
        return None
    path = cache / f"{key}.svg"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    os.utime(path)  # still in use: keep it
    return text


def _write(cache: Path | None, key: str, svg: str) -> None:
    if cache is None:
        return
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(svg, encoding="utf-8")
        tmp.replace(cache / f"{key}.svg")
    except OSError:
        pass  # a read-only or full cache only costs speed


def _prune(cache: Path | None) -> None:
    if cache is None or not cache.is_dir():
        return
    old = time.time() - KEEP_S
    for path in cache.glob("*.svg"):
        try:
            if path.stat().st_mtime < old:
                path.unlink()
        except OSError:
            pass


def _draw(item: ChartJob) -> str:
    return item.draw()


def _workers(n_jobs: int) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, n_jobs))


def draw_all(jobs: list[ChartJob]) -> Iterator[tuple[str, str]]:
    """``(key, svg)`` for every distinct job: cached ones first, then the drawn ones as they finish
    (in parallel where there are several cores and several charts to draw)."""
    cache = cache_dir()
    todo: dict[str, ChartJob] = {}
    for item in jobs:
        if item.key in todo:
            continue
        svg = _read(cache, item.key)
        if svg is None:
            todo[item.key] = item
        else:
            yield item.key, svg
    n = _workers(len(todo))
    if n > 1 and sys.platform.startswith("linux"):  # fork: the workers share the parent's imports
        # a worker ends on the pool's SIGTERM as the default action does, not through the CLI's handler
        # (``cli.Terminated``) that it inherited with the fork, which would print a traceback
        with multiprocessing.get_context("fork").Pool(n, initializer=signal.signal,
                                                      initargs=(signal.SIGTERM, signal.SIG_DFL)) as pool:
            for key, svg in zip(todo, pool.imap(_draw, list(todo.values()))):
                _write(cache, key, svg)
                yield key, svg
    else:
        for key, item in todo.items():
            svg = item.draw()
            _write(cache, key, svg)
            yield key, svg
    _prune(cache)
