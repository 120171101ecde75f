"""Charts as deterministic SVG text (matplotlib, Agg).

One colour per technique across the whole site (``TECHNIQUE_COLORS``), one per memory term
(``TERM_COLORS``). Estimates are drawn filled/solid; measurements as black-edged diamonds. Charts
are drawn on a white card (the site's CSS keeps that card in dark mode too), with fonts left as SVG
text. Same input -> same bytes: fixed ``svg.hashsalt``, no date in the metadata, sorted inputs.

Each chart function is a ``chartjobs.job``: calling it plans the chart (a ``ChartJob`` that a page
puts in its ``files``) and ``render`` draws it, from the cache when nothing changed, in parallel
otherwise; ``fn.__wrapped__(...)`` draws at once and returns the SVG text.
"""

from __future__ import annotations

import io
import math
import textwrap
from functools import lru_cache

import matplotlib

matplotlib.use("Agg")

from matplotlib import pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator  # noqa: E402

from reportgen.report.chartjobs import job  # noqa: E402
from reportgen.report.rows import TECHNIQUE_COLORS  # noqa: E402
from reportgen.format import GIB, TERM_LABELS  # noqa: E402

TERM_COLORS = {
    "weights": "#4e79a7",
    "quant_constants": "#a0cbe8",
    "lora_adapters": "#59a14f",
    "gradients": "#f28e2b",
    "optimizer": "#e15759",
    "optimizer_paged": "#ff9d9a",
    "autocast_copies": "#b07aa1",
    "activations": "#edc948",
    "logits": "#9c755f",
    "transient": "#bab0ac",
    "fsdp_unsharded": "#76b7b2",
    "cublas_workspace": "#86bcb6",
    "cuda_context": "#555555",
}
#: a marker per technique (lines and points), so no chart leans on colour alone
TECHNIQUE_MARKERS = {"Full": "o", "Full + ckpt": "s", "LoRA": "^", "LoRA + ckpt": "v", "QLoRA": "P",
                     "QLoRA + ckpt": "X"}
#: the second, third, ... setup of one technique on one chart (LoRA r16 and r64, all-linear and qv, ...):
#: its own marker and a lighter or darker shade of the technique's colour, so no two lines look alike
VARIANT_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")
VARIANT_SHADES = (0.0, 0.35, -0.3, 0.55, -0.5)


def variant_style(technique: str, k: int) -> tuple[str, str]:
    """``(colour, marker)`` of the ``k``-th setup (0-based) of ``technique`` on a chart: the technique's
    own for the first, then shades of its colour (mixed with white for a positive shade, black for a
    negative one) and the next markers."""
    color, marker = TECHNIQUE_COLORS[technique], TECHNIQUE_MARKERS[technique]
    if k == 0:
        return color, marker
    shade = VARIANT_SHADES[k % len(VARIANT_SHADES)] or 0.7
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    target = 255 if shade > 0 else 0
    mixed = [round(c + (target - c) * abs(shade)) for c in rgb]
    others = [m for m in VARIANT_MARKERS if m != marker]
    return "#" + "".join(f"{c:02x}" for c in mixed), others[(k - 1) % len(others)]


#: "+ ckpt" cells and bars are hatched
CKPT_HATCH = "...."
#: the smallest text on a chart, in points. Charts are at most ``MAX_WIDTH_IN`` wide, so a page column
#: of 868 px (Material at a 1400 px window) shows them unshrunk, 96 px to 72 pt: 8.5 pt is 11.3 px.
MIN_FONT = 8.5
MAX_WIDTH_IN = 8.9
TEXT = "#222222"
GRID = "#d0d0d0"
CAPACITY = "#d62728"
MEASURED = dict(marker="D", markersize=6, markerfacecolor="#ffffff", markeredgecolor="#000000",
                markeredgewidth=1.4, linestyle="none")


@lru_cache(maxsize=1)
def _style() -> None:
    """Set matplotlib's style once per process (font lookups are the slow part)."""
    plt.rcParams.update({
        "svg.hashsalt": "reportgen",
        "svg.fonttype": "none",
        "font.family": "DejaVu Sans",
        "font.size": 9.5,
        "text.color": TEXT,
        "axes.labelcolor": TEXT,
        "axes.edgecolor": "#888888",
        "axes.titlesize": 11,
        "axes.titleweight": "bold",
        "xtick.color": TEXT,
        "ytick.color": TEXT,
        "grid.color": GRID,
        "grid.linewidth": 0.6,
        "figure.facecolor": "#ffffff",
        "axes.facecolor": "#ffffff",
        "savefig.facecolor": "#ffffff",
        "legend.frameon": False,
        "legend.fontsize": 9,
        "xtick.labelsize": 9,
        "ytick.labelsize": 9,
        "hatch.color": "#ffffff",
        "hatch.linewidth": 0.8,
        "path.simplify": False,
    })


def _svg(fig, tight: bool = True) -> str:
    """SVG text of a figure. ``tight`` crops to the drawn content (one extra draw: slower)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight" if tight else None, pad_inches=0.08,
                metadata={"Date": None, "Creator": "reportgen"})
    plt.close(fig)
    return buf.getvalue()


def _text_color(hex_color: str) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "#ffffff"


def _tps(x: float | None) -> str:
    if x is None:  # no datasheet peak for this card: speed not estimated
        return "?"
    if x >= 10_000:
        return f"{x / 1000:.0f}k"
    if x >= 1000:
        return f"{x / 1000:.1f}k"
    return f"{x:.0f}" if x >= 10 else f"{x:.1f}"


def _hatch(technique: str) -> str | None:
    return CKPT_HATCH if technique.endswith("ckpt") else None


def technique_legend(techniques: list[str], markers: bool = False) -> list:
    """Legend entries: a (hatched for "+ ckpt") patch per technique, or its line with its marker."""
    if markers:
        return [Line2D([], [], color=TECHNIQUE_COLORS[t], marker=TECHNIQUE_MARKERS[t], markersize=6, label=t)
                for t in techniques]
    return [Patch(facecolor=TECHNIQUE_COLORS[t], edgecolor="none", hatch=_hatch(t), label=t) for t in techniques]


# ----- home: best setup per model and GPU --------------------------------------------------------
@job
def fit_grid(models: list[str], gpus: list[tuple[str, str]], cells: dict, title: str) -> str:
    """Rows = models, columns = GPUs ``(key, label)``. ``cells[(model, gpu)]`` is None (nothing
    fits), absent (not in any sweep) or ``{"technique", "tokens_per_s", "batch", "gpus", "measured"}``;
    with ``"unswept": True`` no swept setup fits but the guide's walk found ``technique`` fitting."""
    _style()
    ncol, nrow = len(gpus), len(models)
    fig, ax = plt.subplots(figsize=(1.9 + 1.25 * ncol, 0.9 + 0.5 * nrow))
    ax.set_xlim(0, ncol)
    ax.set_ylim(nrow, 0)
    for i, model in enumerate(models):
        for j, (gpu, _) in enumerate(gpus):
            key = (model, gpu)
            if key not in cells:
                ax.add_patch(Rectangle((j + 0.03, i + 0.05), 0.94, 0.9, facecolor="#ffffff", edgecolor=GRID,
                                       linewidth=0.6))
                ax.text(j + 0.5, i + 0.5, "not swept", ha="center", va="center", fontsize=MIN_FONT, color="#777777")
                continue
            cell = cells[key]
            if cell is None:
                ax.add_patch(Rectangle((j + 0.03, i + 0.05), 0.94, 0.9, facecolor="#eeeeee", edgecolor="#bbbbbb",
                                       linewidth=0.6, hatch="////"))
                ax.text(j + 0.5, i + 0.5, "nothing fits", ha="center", va="center", fontsize=MIN_FONT, color="#444444",
                        bbox=dict(facecolor="#eeeeee", edgecolor="none", pad=0.6))
                continue
            color = TECHNIQUE_COLORS[cell["technique"]]
            if cell.get("unswept"):  # no swept setup fits; the decision-tree walk's setup does (not swept)
                ax.add_patch(Rectangle((j + 0.05, i + 0.07), 0.9, 0.86, facecolor="#ffffff", edgecolor=color,
                                       linewidth=2.0))
                name = cell["technique"].replace(" + ckpt", "+ckpt")
                ax.text(j + 0.5, i + 0.32, name, ha="center", va="center", fontsize=9, color="#222222",
                        fontweight="bold")
                ax.text(j + 0.5, i + 0.71, "guide · not swept", ha="center", va="center", fontsize=MIN_FONT,
                        color="#444444")
                continue
            fg = _text_color(color)
            ax.add_patch(Rectangle((j + 0.03, i + 0.05), 0.94, 0.9, facecolor=color, edgecolor="none",
                                   hatch=_hatch(cell["technique"])))
            name = cell["technique"].replace(" + ckpt", "+ckpt")
            if cell["gpus"] > 1:
                name = f"{cell['gpus']}× {name}"
            box = dict(facecolor=color, edgecolor="none", pad=0.5)  # text stays legible on the hatch
            ax.text(j + 0.5, i + 0.32, name, ha="center", va="center", fontsize=9, color=fg, fontweight="bold",
                    bbox=box)
            mark = " ◆" if cell.get("measured") else ""
            speed = ("speed n/a" if cell["tokens_per_s"] is None  # no datasheet peak for this card
                     else f"{_tps(cell['tokens_per_s'])} tok/s")
            ax.text(j + 0.5, i + 0.71, speed + mark, ha="center", va="center", fontsize=MIN_FONT, color=fg, bbox=box)
    ax.set_xticks([j + 0.5 for j in range(ncol)], [label for _, label in gpus], fontsize=9)
    ax.xaxis.tick_top()
    ax.tick_params(axis="x", length=0, rotation=0)
    if ncol > 4:
        for lab in ax.get_xticklabels():
            lab.set_rotation(25)
            lab.set_ha("left")
    ax.set_yticks([i + 0.5 for i in range(nrow)], models, fontsize=9)
    ax.tick_params(axis="y", length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    handles = technique_legend(list(TECHNIQUE_COLORS))
    handles.append(Patch(facecolor="#eeeeee", edgecolor="#bbbbbb", hatch="////", label="nothing fits"))
    if any(c and c.get("unswept") for c in cells.values()):
        handles.append(Patch(facecolor="#ffffff", edgecolor="#555555", linewidth=1.5,
                             label="fits only with the guide's setup (not swept)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=4, fontsize=9,
              handlelength=1.6, handleheight=1.1, columnspacing=1.2)
    ax.set_title(title, loc="left", pad=44 if ncol > 4 else 26, fontsize=10.5)
    return _svg(fig)


# ----- GPU page: memory terms per setup ----------------------------------------------------------
def _bars(ax, spans: list[tuple[float, float, float]], color: str, height: float) -> None:
    """Horizontal bars ``(y, left, width)`` as ONE collection (thousands of ``barh`` patches are slow)."""
    if not spans:
        return
    h = height / 2
    verts = [[(x, y - h), (x + w, y - h), (x + w, y + h), (x, y + h)] for y, x, w in spans]
    ax.add_collection(PolyCollection(verts, facecolors=color, edgecolors="none", linewidths=0), autolim=False)


def _segments(points: list[tuple[float, float, float]]) -> tuple[list[float], list[float]]:
    """Vertical ticks ``(x, y0, y1)`` as one polyline broken by NaNs."""
    xs: list[float] = []
    ys: list[float] = []
    for x, y0, y1 in points:
        xs += [x, x, math.nan]
        ys += [y0, y1, math.nan]
    return xs, ys


def _group_labels(ax, rows: list[dict], x: float) -> list[int]:
    """Each group's name (a model) beside its rows, at ``x`` in axes units; the first row of each
    group and the row count."""
    n = len(rows)
    starts = [i for i in range(n) if i == 0 or rows[i]["group"] != rows[i - 1]["group"]] + [n]
    for a, b in zip(starts, starts[1:]):
        ax.text(x, (a + b - 1) / 2, rows[a]["group"], transform=ax.get_yaxis_transform(),
                ha="left", va="center", fontsize=9, fontweight="bold")
    return starts


def _breakdown_legend(used_terms: list[str], measured: bool) -> list:
    """``memory_breakdown``'s legend: the terms drawn, then the marks."""
    handles = [Patch(facecolor=TERM_COLORS[t], label=TERM_LABELS.get(t, t)) for t in used_terms]
    handles += [Line2D([], [], color="#000000", linewidth=1.6, label="peak allocated (est.)"),
                Line2D([], [], marker="o", color="#000000", linestyle="none", markersize=4.2,
                       label="device total (est.)"),
                Line2D([], [], color=CAPACITY, linestyle="--", label="GPU capacity")]
    if measured:
        handles.append(Line2D([], [], label="peak allocated (meas.)", **MEASURED))
    handles.append(Patch(facecolor="#333333", label="cut bar: its sum of terms (GiB)"))
    return handles


@job
def memory_breakdown(rows: list[dict], capacity_bytes: int, title: str) -> str:
    """Horizontal stacked bars of the memory terms of each row (``label``, ``group``, ``technique``,
    ``terms``, ``peak_allocated``, ``device_total``, optional ``measured``), with the GPU's capacity
    as a line.

    The bar is the SUM of the terms' sizes, which overstates the peak (activations, logits and
    transient buffers are not all live at once): the peak allocated and device total are drawn as
    markers, and the page's caption says so."""
    _style()
    cap = capacity_bytes / GIB
    xmax = cap * 2.0
    n = len(rows)
    group_w = 0.15 + 0.074 * max((len(r["group"]) for r in rows), default=10)
    label_w = group_w + 0.25 + 0.062 * max((len(r["label"]) for r in rows), default=10)
    right_w = 1.45  # "device total 123 GiB" of a row whose total is beyond the axis
    plot_w = max(3.6, MAX_WIDTH_IN - label_w - right_w)
    used_terms = [t for t in TERM_COLORS if any(r["terms"].get(t) for r in rows)]
    legend_rows = math.ceil((len(used_terms) + 5) / 3)
    top, bottom = 0.6, 0.75 + 0.21 * legend_rows
    height = top + bottom + 0.24 * max(n, 3)
    fig = plt.figure(figsize=(label_w + plot_w + right_w, height))
    ax = fig.add_axes((label_w / fig.get_figwidth(), bottom / height, plot_w / fig.get_figwidth(),
                       1 - (top + bottom) / height))
    lefts = [0.0] * n
    for term in used_terms:
        spans = []
        for i, r in enumerate(rows):
            v = (r["terms"].get(term) or 0) / GIB
            if v > 0:
                spans.append((i, lefts[i], v))
                lefts[i] += v
        _bars(ax, spans, TERM_COLORS[term], 0.72)
    for t in TECHNIQUE_COLORS:
        _bars(ax, [(i, -xmax * 0.03, xmax * 0.02) for i, r in enumerate(rows) if r["technique"] == t],
              TECHNIQUE_COLORS[t], 0.72)
    ticks, dots, meas = [], [], []
    for i, r in enumerate(rows):
        if lefts[i] > xmax:
            ax.text(xmax * 0.995, i, f"sum of terms {lefts[i]:,.0f} GiB ▸", ha="right", va="center",
                    fontsize=MIN_FONT, color="#ffffff", fontweight="bold",
                    bbox=dict(facecolor="#333333", edgecolor="none", pad=0.8, alpha=0.85))
        pa, dt = r["peak_allocated"] / GIB, r["device_total"] / GIB
        if pa <= xmax:
            ticks.append((pa, i - 0.42, i + 0.42))
        if dt <= xmax:
            dots.append((dt, i))
        else:
            ax.text(xmax * 1.01, i, f"device total {dt:,.0f} GiB", ha="left", va="center", fontsize=MIN_FONT,
                    color=TEXT)
        mv = (r.get("measured") or {}).get("peak_allocated")
        if mv is not None and mv / GIB <= xmax:
            meas.append((mv / GIB, i))
    xs, ys = _segments(ticks)
    ax.plot(xs, ys, color="#000000", linewidth=1.6, solid_capstyle="butt")
    if dots:
        ax.plot([d[0] for d in dots], [d[1] for d in dots], marker="o", markersize=4.2, markerfacecolor="#000000",
                markeredgecolor="#ffffff", markeredgewidth=0.7, linestyle="none")
    if meas:
        ax.plot([d[0] for d in meas], [d[1] for d in meas], **MEASURED)
    ax.axvline(cap, color=CAPACITY, linestyle="--", linewidth=1.3)
    ax.text(cap, -0.75, f" capacity {cap:.1f} GiB", color=CAPACITY, fontsize=9, va="bottom", ha="left")
    ax.set_xlim(-xmax * 0.035, xmax)
    ax.set_ylim(n - 0.5, -1.0)
    ax.set_yticks(range(n), [r["label"] for r in rows], fontsize=MIN_FONT)
    ax.tick_params(axis="y", length=0, pad=2)
    starts = _group_labels(ax, rows, -(label_w - 0.1) / plot_w)
    ax.set_xlabel("GiB on one GPU (2³⁰ bytes); the axis ends at twice the capacity: a longer bar is cut and "
                  "labelled with its sum", fontsize=9)
    ax.grid(axis="x")
    ax.set_axisbelow(True)
    for i in starts[1:-1]:
        ax.plot([-(label_w - 0.1) / plot_w, 1], [i - 0.5, i - 0.5], color="#999999", linewidth=0.6,
                transform=ax.get_yaxis_transform(), clip_on=False)
    ax.legend(handles=_breakdown_legend(used_terms, bool(meas)), loc="upper left",
              bbox_to_anchor=(-(label_w - 0.1) / plot_w, -0.6 / (height - top - bottom)),
              ncol=3, fontsize=MIN_FONT, title="bars: memory terms, stacked; marks: the step's totals",
              title_fontsize=MIN_FONT, alignment="left")
    ax.set_title(title, loc="left", pad=14)
    return _svg(fig, tight=False)


# ----- GPU page: throughput against batch --------------------------------------------------------
@job
def throughput_by_batch(panels: list[tuple[str, list[dict]]], title: str) -> str:
    """Small multiples, one panel per model: tokens/s against micro-batch for each technique, fitting
    cases only (estimates as lines, measurements as diamonds)."""
    _style()
    n = len(panels)
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    # at least the width of its title (11 pt bold: about 10.5 characters an inch) and legend (one or two
    # panels cut both off: a 4.8-inch figure)
    w, h = max(2.0 * ncols + 0.8, min(max(6.3, len(title) / 10.5 + 0.4), MAX_WIDTH_IN)), 1.95 * nrows + 1.35
    fig, axes = plt.subplots(nrows, ncols, figsize=(w, h), squeeze=False)
    fig.subplots_adjust(left=0.7 / w, right=1 - 0.1 / w, top=1 - 0.55 / h, bottom=1.15 / h, wspace=0.3, hspace=0.55)
    batches = sorted({r["batch"] for _, rows in panels for r in rows})
    seen: list[str] = []
    dashed = False
    for k, (name, rows) in enumerate(panels):
        ax = axes[k // ncols][k % ncols]
        by_t: dict[tuple, list[dict]] = {}
        for r in rows:
            by_t.setdefault((r["technique"], r.get("family", r["label"])), []).append(r)
        any_fit = False
        for (technique, label), rs in sorted(by_t.items(), key=lambda kv: (list(TECHNIQUE_COLORS).index(kv[0][0]),
                                                                           kv[0][1])):
            pts = sorted((r["batch"], r["tokens_per_s"]) for r in rs if r["fits"] and r["tokens_per_s"])
            if not pts:
                continue
            any_fit = True
            if technique not in seen:
                seen.append(technique)
            style = "-" if label == technique else "--"
            dashed = dashed or style == "--"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker=TECHNIQUE_MARKERS[technique],
                    markersize=5, color=TECHNIQUE_COLORS[technique], linewidth=1.5)
            meas = sorted((r["batch"], r["measured"]["tokens_per_s"]) for r in rs
                          if (r.get("measured") or {}).get("tokens_per_s") is not None)
            if meas:
                ax.plot([p[0] for p in meas], [p[1] for p in meas], **MEASURED)
        ax.set_title(name, fontsize=9.5)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(batches))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _tps(v) if v > 0 else "0"))
        tops = [r["tokens_per_s"] for r in rows if r["fits"] and r["tokens_per_s"]]
        tops += [r["measured"]["tokens_per_s"] for r in rows if (r.get("measured") or {}).get("tokens_per_s")]
        ax.set_ylim(0, max(tops, default=1.0) * 1.18)
        ax.tick_params(labelsize=MIN_FONT)
        ax.grid(True)
        ax.set_axisbelow(True)
        if batches:
            ax.set_xlim(batches[0] / 1.3, batches[-1] * 1.3)
        if not any_fit:
            ax.text(0.5, 0.5, "no swept setup fits", transform=ax.transAxes, ha="center", va="center", color="#777777")
            ax.set_yticks([])
        if k % ncols == 0:
            ax.set_ylabel("tokens/s (est.)", fontsize=9)
        if k // ncols == nrows - 1 or k + ncols >= n:
            ax.set_xlabel("micro-batch", fontsize=9)
    for k in range(n, nrows * ncols):
        axes[k // ncols][k % ncols].set_visible(False)
    handles = technique_legend([t for t in TECHNIQUE_COLORS if t in seen], markers=True)
    if dashed:
        handles.append(Line2D([], [], color="#555555", linestyle="--", label="dashed: multi-GPU or other variant"))
    if any((r.get("measured") or {}).get("tokens_per_s") is not None for _, rows in panels for r in rows):
        handles.append(Line2D([], [], label="measured", **MEASURED))
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), bbox_to_anchor=(0.5, 0.0),
                   fontsize=9)
    else:  # e.g. a card without a datasheet peak: no speed estimates at all
        fig.text(0.5, 0.02, "no speed estimates for this card (no datasheet peak FLOP/s)", ha="center",
                 fontsize=9, color="#555555")
    fig.suptitle(title, x=0.1 / w, y=1 - 0.08 / h, ha="left", va="top", fontsize=11, fontweight="bold")
    return _svg(fig, tight=False)


# ----- model page: memory against sequence length ------------------------------------------------
def spread_labels(ys: list[float], heights: list[float], top: float = 1.0, bottom: float = 0.0) -> list[float]:
    """Label centres (axes fractions) as close as possible to ``ys`` (sorted ascending) without two
    overlapping: each at least half its height plus half its neighbour's from the next, pushed up
    first, then back down where the top one would leave the axes."""
    out = list(ys)
    for i in range(1, len(out)):
        out[i] = max(out[i], out[i - 1] + (heights[i - 1] + heights[i]) / 2)
    if out and out[-1] + heights[-1] / 2 > top:
        out[-1] = top - heights[-1] / 2
        for i in range(len(out) - 2, -1, -1):
            out[i] = min(out[i], out[i + 1] - (heights[i] + heights[i + 1]) / 2)
    return [max(y, bottom + h / 2) for y, h in zip(out, heights)]


def _capacity_labels(ax, labels: list[tuple[float, str]], ylim: tuple[float, float], axes_height_pt: float) -> None:
    """The GPU capacities' labels right of a log-scale axes, spread so that close capacities (80 and
    94 GiB, 45 and 48, 22.5 and 24) do not print over each other; a moved label gets a thin leader
    to its line."""
    import math

    span = math.log(ylim[1]) - math.log(ylim[0])
    labels = sorted(labels)
    ys = [(math.log(y) - math.log(ylim[0])) / span for y, _ in labels]
    line_pt = MIN_FONT * 1.25
    heights = [(text.count("\n") + 1) * line_pt / axes_height_pt for _, text in labels]
    for (y, text), true_y, at in zip(labels, ys, spread_labels(ys, heights)):
        ax.text(1.03, at, text, transform=ax.transAxes, fontsize=MIN_FONT, va="center", ha="left", color="#555555")
        ax.plot([1.0, 1.03], [true_y, at], transform=ax.transAxes, color="#aaaaaa", linewidth=0.6, clip_on=False)


@job
def memory_by_seq(series: list[dict], capacities: list[tuple[float, str]], title: str) -> str:
    """Lines of device total (GiB, log axis) against sequence length, one per setup
    (``{"label", "technique", "multi_gpu", "points": [(seq, bytes)], "measured": [(seq, bytes)]}``),
    with each distinct GPU capacity ``(bytes, "names")`` as a horizontal line."""
    _style()
    fig, ax = plt.subplots(figsize=(6.3, 4.8))
    seqs = sorted({s for se in series for s, _ in se["points"]})
    values = [v / GIB for se in series for _, v in se["points"]] + [c / GIB for c, _ in capacities]
    lo, hi = min(values, default=1.0), max(values, default=10.0)
    ylim = (lo / 1.3, hi * 1.3)
    labels = []
    for cap, names in capacities:
        y = cap / GIB
        ax.axhline(y, color="#888888", linestyle=":", linewidth=0.9)
        labels.append((y, textwrap.fill(f"{y:.0f} GiB: {names}", 26, subsequent_indent="  ")))  # inside MAX_WIDTH_IN
    _capacity_labels(ax, labels, ylim, fig.get_size_inches()[1] * ax.get_position().height * 72)
    seen: dict[str, int] = {}
    for se in series:
        pts = sorted(se["points"])
        k = seen[se["technique"]] = seen.get(se["technique"], -1) + 1
        color, marker = variant_style(se["technique"], k)
        ax.plot([p[0] for p in pts], [p[1] / GIB for p in pts], "--" if se["multi_gpu"] else "-",
                marker=marker, markersize=5, linewidth=1.6, color=color, label=se["label"])
        if se.get("measured"):
            ms = sorted(se["measured"])
            ax.plot([p[0] for p in ms], [p[1] / GIB for p in ms], **MEASURED)
    ax.set_yscale("log")
    ax.set_ylim(*ylim)
    ax.set_xscale("log", base=2)
    if seqs:
        ax.xaxis.set_major_locator(FixedLocator(seqs))
        ax.set_xlim(seqs[0] / 1.25, seqs[-1] * 1.25)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:.1f}"))
    ax.set_xlabel("sequence length (tokens), micro-batch 1")
    ax.set_ylabel("device total on one GPU (GiB, log scale, est.)")
    ax.grid(True, which="major")
    ax.set_axisbelow(True)
    handles, labels = ax.get_legend_handles_labels()
    if any(se.get("measured") for se in series):
        handles.append(Line2D([], [], **MEASURED))
        labels.append("measured")
    handles.append(Line2D([], [], color="#888888", linestyle=":"))
    labels.append("GPU capacity")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.0, -0.13), ncol=3, fontsize=9)
    ax.set_title(title, loc="left")
    return _svg(fig)


# ----- validation: estimate against measurement --------------------------------------------------
@job
def estimate_vs_measured(panels: list[tuple[str, list[dict]]], title: str) -> str:
    """One scatter per quantity: x = measurement, y = estimate (``{"est", "meas", "technique"}``, the
    orientation of ``validation_scatter``), with the y = x line; both axes log scale, same limits."""
    _style()
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(2.8 * n + 0.4, 3.9), squeeze=False)
    seen: list[str] = []
    for k, (name, pts) in enumerate(panels):
        ax = axes[0][k]
        vals = [v for p in pts for v in (p["est"], p["meas"]) if v > 0]
        lo, hi = (min(vals) / 1.4, max(vals) * 1.4) if vals else (0.1, 10)
        ax.plot([lo, hi], [lo, hi], color="#666666", linewidth=1, linestyle="--", label="y = x")
        for p in sorted(pts, key=lambda p: (list(TECHNIQUE_COLORS).index(p["technique"]), p["est"], p["meas"])):
            ax.plot([p["meas"]], [p["est"]], marker=TECHNIQUE_MARKERS[p["technique"]], markersize=6.5, linestyle="none",
                    markerfacecolor=TECHNIQUE_COLORS[p["technique"]], markeredgecolor="#000000", markeredgewidth=0.8)
            if p["technique"] not in seen:
                seen.append(p["technique"])
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_minor_locator(NullLocator())
            axis.set_major_formatter(FuncFormatter(lambda v, _: _tps(v) if v >= 1000 else f"{v:g}"))
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal")
        ax.set_xlabel(f"measured {name}", fontsize=9)
        ax.set_ylabel(f"estimated {name}", fontsize=9)
        ax.grid(True, which="major")
        ax.set_axisbelow(True)
        ax.tick_params(labelsize=MIN_FONT)
    handles = technique_legend([t for t in TECHNIQUE_COLORS if t in seen], markers=True)
    handles.append(Line2D([], [], color="#666666", linestyle="--", label="y = x (no error)"))
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), bbox_to_anchor=(0.5, 0.0), fontsize=9)
    fig.suptitle(title, x=0.01, ha="left", fontsize=11, fontweight="bold")
    fig.tight_layout(rect=(0, 0.14, 1, 0.95))
    return _svg(fig)


# ----- validation: estimates against published and measured figures ------------------------------
#: colour per measure (Okabe-Ito), marker per source
MEASURE_COLORS = {"allocated": "#0072B2", "reserved": "#D55E00", "loss": "#009E73"}
SOURCE_MARKERS = ("o", "s", "^", "v", "P", "X")


@job
def validation_scatter(points: list[dict], bands: list[dict], title: str) -> str:
    """Estimated (y) against measured or published (x) memory in GB, log-log: one marker shape per
    source (``points``: ``{"x", "y", "source", "measure"}``, measure one of ``MEASURE_COLORS``), the
    y = x line, and per band ``{"measure", "lo", "hi"}`` (measured / estimated - 1, 10th and 90th
    percentile) the strip estimated = measured / (1 + r) it allows."""
    _style()
    fig, ax = plt.subplots(figsize=(8.4, 6.2))
    vals = [v for p in points for v in (p["x"], p["y"]) if v > 0]
    lo, hi = (min(vals) / 1.6, max(vals) * 1.6) if vals else (0.1, 10)
    line = [lo, hi]
    ax.plot(line, line, color="#444444", linewidth=1.1, linestyle="--", zorder=2)
    handles = [Line2D([], [], color="#444444", linestyle="--", label="y = x: estimate equals measurement")]
    for b in bands:
        color = MEASURE_COLORS[b["measure"]]
        ax.fill_between(line, [v / (1 + b["hi"]) for v in line], [v / (1 + b["lo"]) for v in line], color=color,
                        alpha=0.13, linewidth=0, zorder=1)
        handles.append(Patch(facecolor=color, alpha=0.25, label=(
            f"error band, {b['measure']}: measured {100 * b['lo']:+.1f}% to {100 * b['hi']:+.1f}% of estimate")))
    sources = list(dict.fromkeys(p["source"] for p in points))
    markers = {s: ("D" if s.startswith("measured") else SOURCE_MARKERS[i % len(SOURCE_MARKERS)])
               for i, s in enumerate(sources)}
    for s in sources:
        for measure, color in MEASURE_COLORS.items():
            pts = sorted((p["x"], p["y"]) for p in points if p["source"] == s and p["measure"] == measure)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[s], markersize=7, linestyle="none",
                        markerfacecolor=color, markeredgecolor="#000000", markeredgewidth=0.7, alpha=0.9, zorder=3)
        handles.append(Line2D([], [], marker=markers[s], markersize=7, linestyle="none", markerfacecolor="#ffffff",
                              markeredgecolor="#000000", label=s))
    handles += [Patch(facecolor=c, edgecolor="#000000", linewidth=0.5, label=f"colour: {m} memory")
                for m, c in MEASURE_COLORS.items() if any(p["measure"] == m for p in points)]
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_minor_locator(NullLocator())
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured or published (GB = 10⁹ bytes, log scale)")
    ax.set_ylabel("estimated (GB, log scale)")
    ax.grid(True, which="major")
    ax.set_axisbelow(True)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.1), ncol=2)
    ax.set_title(title, loc="left")
    return _svg(fig)
