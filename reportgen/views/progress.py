"""Progress bars for the long commands (``sweep``, ``render``): one bar per stage, each stage's time
printed at the end, and the times adding up to the total.

``Stages`` wraps one ``rich.progress.Progress``. ``track(name, items)`` wraps a loop;
``render_progress()`` is the ``progress(stage, done, total)`` callback of ``render.render_all``. The
total counts from the start of the process (Linux: its start time in ``/proc``; elsewhere: from this
module's import), so the imports before the first stage are shown as "start-up".
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

_IMPORTED = time.perf_counter()
#: the names of render's stages on the bars
RENDER_STAGES = {"pages": "rendering pages", "charts": "drawing charts", "writing": "writing files"}


def _process_age_s() -> float | None:
    """Seconds since this process started (Linux), or None."""
    try:
        fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Stages:
    def __init__(self, console: Console):
        self.console = console
        age = _process_age_s()
        self.start = time.perf_counter() - age if age is not None else _IMPORTED
        self.times: list[tuple[str, float]] = []
        self.mark = self.start
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console, transient=not console.is_terminal)
        self._tasks: dict[str, int] = {}

    def __enter__(self) -> Stages:
        self.lap("start-up")
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def lap(self, name: str) -> float:
        """Close the stage ``name``: the time since the last lap is its time."""
        now = time.perf_counter()
        self.times.append((name, now - self.mark))
        self.mark = now
        return self.times[-1][1]

    def track(self, name: str, items: Iterable, total: int | None = None) -> Iterator:
        items = list(items) if total is None else items
        task = self.bar.add_task(name, total=len(items) if total is None else total)
        for item in items:
            yield item
            self.bar.advance(task)

    def render_progress(self):
        def progress(stage: str, done: int, total: int) -> None:
            name = RENDER_STAGES.get(stage, stage)
            if name not in self._tasks:
                if self._tasks:  # the previous render stage ends where this one starts
                    self.lap(list(self._tasks)[-1])
                self._tasks[name] = self.bar.add_task(name, total=total)
            self.bar.update(self._tasks[name], completed=done, total=total)
        return progress

    def finish_render(self) -> None:
        if self._tasks:
            self.lap(list(self._tasks)[-1])

    def summary(self) -> str:
        """``start-up 0.6 s + estimating 0.9 s + ... = 6.1 s``. Each part is the difference of the
        rounded running totals, so the printed parts add up to the printed total exactly."""
        self.lap("the rest")
        parts, done, shown = [], 0.0, 0.0
        for name, t in self.times:
            done += t
            parts.append(f"{name} {round(done, 1) - shown:.1f} s")
            shown = round(done, 1)
        return f"{' + '.join(parts)} = {shown:.1f} s"
