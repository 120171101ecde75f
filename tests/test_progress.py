"""The long commands print each stage's time, and the printed parts add up to the printed total."""

from __future__ import annotations

import re

from rich.console import Console

from reportgen.views.progress import Stages


def test_stage_times_add_up_to_the_total():
    console = Console(stderr=True, force_terminal=False)
    with Stages(console) as stages:
        for _ in stages.track("counting", range(3)):
            pass
        stages.lap("counting")
        progress = stages.render_progress()
        for stage in ("pages", "charts", "writing"):
            progress(stage, 0, 2)
            progress(stage, 2, 2)
        stages.finish_render()
    line = stages.summary()
    parts = [float(x) for x in re.findall(r"([\d.]+) s(?: \+| =)", line)]
    total = float(re.search(r"= ([\d.]+) s$", line).group(1))
    assert all(n in line for n in ("start-up", "counting", "rendering pages", "drawing charts", "writing files"))
    assert abs(sum(parts) - total) < 1e-6, line
