"""Subcommands of this package (see ``reportgen.cli.PLUGINS``): ``render``, ``validation`` and ``show``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reportgen.errors import UserError
from reportgen.published import DEFAULT_OUT

DEFAULT_RESULTS = Path("results")
DEFAULT_DOCS = Path("docs")


def register(sub) -> None:
    """Add this package's subcommands to the ``reportgen`` parser."""
    p = sub.add_parser("render", help="render the site's pages from stored result files (no estimating)")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="results directory (one folder per sweep)")
    p.add_argument("--docs", type=Path, default=DEFAULT_DOCS, help="site source directory to render into")
    p.add_argument("--published", type=Path, default=None,
                   help=f"comparison with published measurements (reportgen compare-published; default {DEFAULT_OUT}, "
                        "if it exists)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("validation", help="every stored measurement against this code's estimate: the headline "
                                          "errors the validation page opens with")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="results directory")
    p.add_argument("--format", choices=["table", "markdown"], default="table")
    p.set_defaults(func=cmd_validation)

    p = sub.add_parser("show", help="one stored case: inputs, estimate, measurement, and how to recompute it")
    p.add_argument("case_id", metavar="CASE_ID", help="as printed in the site's tables and result file names")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="results directory")
    p.set_defaults(func=cmd_show)


def measured_items(results_dir: Path) -> tuple[list[dict], list[dict]]:
    """Every stored measurement under ``results_dir`` (the current attempt of each case, every sweep
    folder with measurement files) against a fresh estimate of its case by this code, as
    ``compare.summary`` reads them; and ``(case id, environment)`` of those that count. No estimate
    file is needed: a fresh clone has only the committed measurements."""
    from reportgen import catalog, store
    from reportgen.estimate import estimate
    from reportgen.report import compare
    from reportgen.report.rows import setup_label, training_setup

    items, envs = [], []
    for folder in sorted(p.parent for p in Path(results_dir).glob(f"*/{store.MEASURED_DIR}") if p.is_dir()):
        for doc in store.load_measured(folder):
            case, block = doc["case"], doc["measurement"]
            setup = training_setup(case["setup"])
            try:  # a file naming a model or card this checkout cannot load is skipped, named, as a malformed one
                est = estimate(catalog.load_model(case["model"]), catalog.load_gpu(case["gpu"]), setup, reverse=False)
            except UserError as exc:
                print(f"warning: {folder / store.MEASURED_DIR}: {doc['id']}: {exc.message}; skipped", file=sys.stderr)
                continue
            c = compare.compare(est.as_dict(), block, case["gpu"])
            if c is None or not c["counts"]:
                continue
            items.append({"id": doc["id"], "compare": c,
                          "label": compare.case_label(case["model"], setup_label(setup), setup.batch, setup.seq)})
            if isinstance(block.get("environment"), dict):
                envs.append((doc["id"], block["environment"]))
    return items, envs


def set_aside_runs(results_dir: Path) -> list[tuple[str, str]]:
    """``(case id, why)`` of every stored current measurement that cannot be what it says
    (``provenance.inconsistency``): compared with nothing, and listed so that nobody wonders where it went."""
    from reportgen import store
    from reportgen.provenance import provenance_of

    out = []
    for folder in sorted(p.parent for p in Path(results_dir).glob(f"*/{store.MEASURED_DIR}") if p.is_dir()):
        for doc in store.load_measured(folder, warn=lambda m: None):  # load_measured's own warnings came first
            why = provenance_of(doc["measurement"]).mismatch
            if why:
                out.append((doc["id"], why))
    return out


def cmd_validation(args: argparse.Namespace) -> int:
    from reportgen.errors import UserError
    from reportgen.report import compare

    if not args.results.is_dir():
        raise UserError(f"--results {args.results}: not a directory", hint="run from the repository root")
    refuse_a_sweep_folder(args.results)
    items, envs = measured_items(args.results)
    aside = set_aside_runs(args.results)
    said = "; ".join(f"{cid}: {why}" for cid, why in aside)
    if not items:
        raise UserError(f"no measurement under {args.results}/*/measured/ counts for its case's card"
                        + (f" (set aside, compared with nothing: {said})" if aside else ""),
                        hint="measure a sweep on a GPU: reportgen sweep sweeps/validation.yaml --measure")
    headline = compare.summary(items)
    groups = compare.environment_groups(envs)
    failed = sum(1 for i in items if i["compare"]["status"] != "ok")
    head = (f"{len(items)} measured cases ({len(items) - failed} finished, {failed} did not) in "
            f"{len(groups)} environment{'s' if len(groups) != 1 else ''}: " + "; ".join(g["title"] for g in groups))
    step = next((h for h in headline if h["quantity"] == "step_s"), None)
    memory = [h for h in headline if h["quantity"] != "step_s"]
    note = ""
    if memory and memory[0]["capped"]:
        note = (f"Memory: {memory[0]['capped']} of the cases ran on a larger card capped to the case card's memory "
                "(they count for memory only). ")
    if step:
        excluded = len(compare.speed_excluded(items))
        note += (f"Step time: {step['n']} cases timed on the card that ran them"
                + (f" ({excluded} capped run{'s' if excluded != 1 else ''} without speed comparison)" if excluded else ""))
        if step["fixed"]:
            note += (f"; {step['fixed']} of them are medians of only {' or '.join(map(str, step['steps']))} timed steps "
                     f"(fastest to slowest step up to {100 * step['spread_max']:.0f}% of the median apart, median spread "
                     f"{100 * step['spread_median']:.0f}%)")
        note += ("; the time model was fitted to these step times, so its row is in-sample "
                 "(scripts/calibrate.py prints the leave-one-out error).")
    if aside:
        note += f"\n\nSet aside, compared with nothing ({len(aside)}): {said}."
    if args.format == "markdown":
        print(head + ".\n\n" + compare.headline_markdown(headline) + ("\n\n" + note if note else ""))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console() if Console().is_terminal else Console(width=170)
    table = Table(title="estimate against measurement: relative error = (estimate - measured) / measured")
    for col in ("quantity", "cases", "median |error|", "signed median", "worst", "worst case"):
        table.add_column(col, justify="left" if col in ("quantity", "worst case") else "right", overflow="fold")
    for h in headline:
        table.add_row(h["label"], str(h["n"]), f"{100 * h['median_abs']:.2f}%", f"{100 * h['median']:+.2f}%",
                      f"{100 * h['worst']['err']:+.1f}%", f"{h['worst']['label']} ({h['worst']['id']})")
    console.print(head, highlight=False, soft_wrap=True)
    console.print(table)
    if note:
        console.print(note, highlight=False, soft_wrap=True)
    return 0


def refuse_a_sweep_folder(results: Path) -> None:
    """``--results results/validation`` names one sweep's folder, not the folder of sweeps: its
    ``measured/`` or ``_advice/`` beside its case files would be read as sweeps and nothing found. Said, with the fix."""
    inner = [p.name for p in results.iterdir() if p.is_dir() and p.name in ("measured", "_advice")]
    if inner and (any(results.glob("*.json")) or "_advice" in inner):  # a sweep named "measured" is a folder of sweeps
        raise UserError(f"--results {results}: holds {', '.join(n + '/' for n in sorted(inner))}, so it is one sweep's folder",
                        hint=f"pass the folder of sweeps above it: --results {results.parent}")


def cmd_render(args: argparse.Namespace) -> int:
    from rich.console import Console

    from reportgen.errors import UserError
    from reportgen.report.render import render_all
    from reportgen.views.progress import Stages

    if not args.results.is_dir():
        raise UserError(f"--results {args.results}: not a directory",
                        hint="run a sweep first (reportgen sweep sweeps/consumer.yaml), or pass the folder it wrote")
    refuse_a_sweep_folder(args.results)
    if not any(p.is_dir() for p in args.results.iterdir()):
        print(f"warning: {args.results} holds no sweep yet: the pages say so (run a sweep to fill them)")
    if args.published is not None and not args.published.is_file():  # named: not silently left out
        raise UserError(f"--published {args.published}: no such file",
                        hint=f"reportgen compare-published --out {args.published} writes it; without --published "
                             f"the site uses {DEFAULT_OUT} where it exists")
    args.published = args.published or DEFAULT_OUT
    console = Console(stderr=True)
    with Stages(console) as stages:
        pages = render_all(args.results, args.docs, published=args.published, progress=stages.render_progress())
        stages.finish_render()
    print(f"{pages.said(args.docs)} in {stages.summary()}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from reportgen.report.show import show

    if args.results.is_dir():
        refuse_a_sweep_folder(args.results)
    show(args.results, args.case_id)
    return 0
