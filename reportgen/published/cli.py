"""``reportgen compare-published``: estimate every mappable published row and print the errors."""

from __future__ import annotations

import argparse
from pathlib import Path

from reportgen.published import DEFAULT_CSV, DEFAULT_OUT


def register(sub) -> None:
    p = sub.add_parser("compare-published",
                       help="compare estimates with measurements published by other projects (data/*.csv)")
    p.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON written for the validation page")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from reportgen.artifacts import Artifact
    from reportgen.errors import UserError
    from reportgen.published.compare import compare

    if not args.csv.exists():
        raise UserError(f"{args.csv}: no such file", hint="run from the repository root or pass --csv")
    summary = compare(args.csv)
    console = Console() if Console().is_terminal else Console(width=170)
    table = Table(title="published measurements vs reportgen estimates (same measure as the row reports; "
                        "GB = 1e9 bytes)")
    cols = ("id", "model", "technique", "GPU", "b", "seq", "measure", "as published", "published GB", "estimated GB",
            "error")
    for col in cols:  # cells wrap between words, never inside one
        wide = {"model": 16, "technique": 24}.get(col)
        table.add_column(col, justify="left" if col in ("id", "model", "technique", "GPU", "measure") else "right",
                         max_width=wide, overflow="fold")
    for r in summary["rows"]:
        rid = r["id"] + "".join(f" = {o}" for o in r.get("same_as", []))
        table.add_row(rid, r.get("model_as", r["model"]), r["technique"], r["gpu"], str(r["batch"]), str(r["seq"]),
                      r["measure"], f"{r['published']:g} {r['unit']}", f"{r['published_gb']:.2f}",
                      f"{r['estimated_gb']:.2f}", f"{100 * r['rel_error']:+.0f}%")
    console.print(table)
    repeated = [r for r in summary["rows"] if r.get("same_as")]
    if repeated:
        console.print(f"{len(repeated)} measurements are printed twice by their source and counted once: "
                      + ", ".join(f"{r['id']} = {' = '.join(r['same_as'])}" for r in repeated), highlight=False)
    for src, s in summary["by_source"].items():
        console.print(f"{src}: {s['rows']} rows, median |error| {s['median_abs_error_gb']:.2f} GB, "
                      f"median signed error {100 * s['median_rel_error']:+.0f}%")
    if summary["rows"]:
        console.print(f"[bold]all mapped rows: {len(summary['rows'])}, median absolute error "
                      f"{summary['median_abs_error_gb']:.2f} GB (1e9 bytes), median |relative error| "
                      f"{100 * summary['median_abs_rel_error']:.0f}%, median signed error "
                      f"{100 * summary['median_rel_error']:+.0f}%[/]")
    else:
        console.print("[bold]no row could be mapped to a setup[/] (reasons below)")
    multi = summary.get("multi_gpu")
    if multi and multi["memory_rows"]:
        console.print(f"[bold]multi-GPU rows: memory {multi['memory_rows']} rows, median |relative error| "
                      f"{100 * multi['memory_median_abs_rel_error']:.1f}% (signed {100 * multi['memory_median_rel_error']:+.1f}%)"
                      + (f"; tokens/s {multi['speed_rows']} rows, median |relative error| "
                         f"{100 * multi['speed_median_abs_rel_error']:.1f}% (signed "
                         f"{100 * multi['speed_median_rel_error']:+.1f}%)" if multi["speed_rows"] else "") + "[/]")
    console.print(f"{len(summary['unmapped'])} rows not mapped:")
    for u in summary["unmapped"]:
        console.print(f"  {u['id']}: {u['reason']}", highlight=False)
    print_speed(console, summary["speed"])
    Artifact("published", args.out, summary["inputs_hash"]).write(summary)
    console.print(f"wrote {args.out}")
    return 0


def print_speed(console, speed: dict) -> None:
    """The tokens/s comparison (``speed.py``): every row that states a rate or a time."""
    from rich.table import Table

    table = Table(title="tokens/s (all GPUs together): published or derived from the source's time, vs estimated")
    for col in ("id", "model", "technique", "GPU", "GPUs", "b", "seq", "published", "how", "estimated", "error"):
        table.add_column(col, max_width={"model": 16, "technique": 24, "how": 30}.get(col), overflow="fold")
    for r in speed["rows"]:
        est = "-" if r["estimated_tokens_per_s"] is None else f"{r['estimated_tokens_per_s']:,.0f}"
        err = "-" if r["rel_error"] is None else f"{100 * r['rel_error']:+.0f}%"
        table.add_row(r["id"], r["model"], r["technique"], r["gpu"], str(r["gpus"]), str(r["batch"]), str(r["seq"]),
                      f"{r['published_tokens_per_s']:,.0f}", r["derivation"], est, err)
    console.print(table)
    if speed["median_abs_rel_error"] is not None:
        console.print(f"[bold]tokens/s: {len(speed['rows'])} rows, median |relative error| "
                      f"{100 * speed['median_abs_rel_error']:.0f}%, median signed error "
                      f"{100 * speed['median_rel_error']:+.0f}%[/]")
    for r in speed.get("qlora_over_lora", []):
        est = r["why_not"] if r["estimated_ratio"] is None else f"estimated {r['estimated_ratio']:.2f}"
        console.print(f"QLoRA/LoRA time {' / '.join(r['ids'])} ({r['model']}, {r['gpu']}): published "
                      f"{r['published_ratio']:.2f} ({r['published']}), {est}", highlight=False)
