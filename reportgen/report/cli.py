"""Subcommands of this package (see ``reportgen.cli.PLUGINS``): ``render`` and ``show``."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_RESULTS = Path("results")
DEFAULT_DOCS = Path("docs")


def register(sub) -> None:
    """Add this package's subcommands to the ``reportgen`` parser."""
    p = sub.add_parser("render", help="render the site's pages from stored result files (no estimating)")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="results directory (one folder per sweep)")
    p.add_argument("--docs", type=Path, default=DEFAULT_DOCS, help="site source directory to render into")
    p.add_argument("--published", type=Path, default=Path("data/published_comparison.json"),
                   help="comparison with published measurements (reportgen compare-published), if it exists")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("show", help="one stored case: inputs, estimate, measurement, and how to recompute it")
    p.add_argument("case_id", metavar="CASE_ID", help="as printed in the site's tables and result file names")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="results directory")
    p.set_defaults(func=cmd_show)


def cmd_render(args: argparse.Namespace) -> int:
    from rich.console import Console

    from reportgen.errors import UserError
    from reportgen.report.render import render_all
    from reportgen.views.progress import Stages

    if not args.results.is_dir():
        raise UserError(f"--results {args.results}: not a directory",
                        hint="run a sweep first (reportgen sweep sweeps/consumer.yaml), or pass the folder it wrote")
    if not any(p.is_dir() for p in args.results.iterdir()):
        print(f"warning: {args.results} holds no sweep yet: the pages say so (run a sweep to fill them)")
    console = Console(stderr=True)
    with Stages(console) as stages:
        pages = render_all(args.results, args.docs, published=args.published, progress=stages.render_progress())
        stages.finish_render()
    print(f"rendered {len(pages)} pages into {args.docs} in {stages.summary()}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from reportgen.report.show import show

    show(args.results, args.case_id)
    return 0
