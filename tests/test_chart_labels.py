"""The model pages' memory chart labels every GPU capacity; close capacities (80 and 94 GiB, 45 and
48, 22.5 and 24) printed over each other (issue 19). The labels are now spread apart."""

from __future__ import annotations

import re

import pytest

from reportgen.report import charts
from reportgen.report.pages import _capacities


def test_spread_labels_keeps_order_and_distance():
    ys, heights = [0.10, 0.11, 0.12, 0.50, 0.97, 0.98], [0.04] * 6
    out = charts.spread_labels(ys, heights)
    assert out == sorted(out) and all(b - a >= 0.04 - 1e-9 for a, b in zip(out, out[1:]))
    assert out[3] == pytest.approx(0.50) and out[0] == pytest.approx(0.10)  # only the crowded ones move
    assert out[-1] <= 1.0 - 0.02 + 1e-9  # none leaves the axes at the top


def _label_lines(svg: str) -> list[tuple[float, float, str]]:
    """(x, y, text) of every text line in the SVG (matplotlib writes x/y attributes or a translate)."""
    out = []
    for m in re.finditer(r"<text ([^>]*)>([^<]*)</text>", svg):
        attrs, text = m.groups()
        xy = re.search(r'x="([\d.]+)" y="([\d.]+)"', attrs) or re.search(r"translate\(([\d.]+) ([\d.]+)\)", attrs)
        if xy:
            out.append((float(xy.group(1)), float(xy.group(2)), text))
    return out


def test_no_two_capacity_labels_overlap_on_the_model_chart():
    series = [{"label": "LoRA", "technique": "LoRA", "multi_gpu": False,
               "points": [(512, 10 * 2**30), (8192, 150 * 2**30)], "measured": []}]
    svg = charts.memory_by_seq.__wrapped__(series, _capacities(), title="t")
    lines = _label_lines(svg)
    first = [ln for ln in lines if re.match(r"\d+ GiB: ", ln[2])]
    assert len(first) == len(_capacities())
    x = first[0][0]
    ys = sorted(y for lx, y, _ in lines if abs(lx - x) < 0.5)  # every line of every capacity label
    assert min(b - a for a, b in zip(ys, ys[1:])) >= charts.MIN_FONT, ys


def test_each_capacity_line_names_a_card_of_that_capacity_preferring_the_pages_own():
    """A capacity line is drawn at the memory of the card its label names (not 94 GiB for a 96 GiB card),
    and that card is one the page's rows use where the group has one."""
    from reportgen import catalog
    from reportgen.report.rows import gpu_label

    names = {gpu_label(k): catalog.load_gpu(k).memory_bytes for k in catalog.gpu_names()}
    for shown in (frozenset(), frozenset({"rtx-4090", "rtx-pro-6000"})):
        caps = _capacities(shown)
        for b, label in caps:
            name = label.split(" +")[0]
            assert names[name] == b, label
        labels = [label for _, label in caps]
        assert any(label.startswith("RTX 4090 +") for label in labels) == bool(shown)
        assert any(label.startswith("RTX PRO 6000") for label in labels) == bool(shown)
