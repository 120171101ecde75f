"""``reportgen advise``: walk the decision tree for one model and GPU and print every step with its
numbers; ``--store`` writes the walks of a sweep for the guide pages."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_RESULTS = Path("results")


def register(sub) -> None:
    """Add this package's subcommands to the ``reportgen`` parser."""
    from reportgen.flags import add_from_flag, add_gpu_profile_flag, add_host_cpu_flag, named, train_tokens

    p = sub.add_parser("advise", help="what to turn on first: walk the decision tree for a model and GPU "
                                      "with estimates at every step",
                       description="Walk the decision tree (Step 1: weights, gradients, optimizer states; Step 2a: "
                                   "activations of micro-batch 1; Step 2b: micro-batch 1 -> n) for one model and GPU, "
                                   "estimating every step. "
                                   "With --store SWEEP.yaml: write the walks of every (model, GPU, sequence length) "
                                   "the sweep covers next to its results, for the guide pages.")
    p.add_argument("--model", type=named, help="catalog name (see `reportgen models`) or path to a config.json")
    p.add_argument("--gpu", type=named, help="catalog name (see `reportgen gpus`)")
    p.add_argument("--gpu-memory", default=None, metavar="SIZE",
                   help="the card's memory instead of the catalog's, e.g. 48GiB (its speed stays the --gpu card's)")
    add_gpu_profile_flag(p)
    add_host_cpu_flag(p)
    p.add_argument("--seq", type=int, default=None, help="sequence length in tokens (default 2048, or --from's)")
    p.add_argument("--lengths", type=Path, default=None, metavar="FILE",
                   help="the dataset's sample lengths in tokens (as reportgen estimate --lengths): the walk runs at "
                        "its longest sample (or --seq), then says what padding costs the recommended setup and what "
                        "packing or a shorter cut would save")
    add_from_flag(p)
    p.add_argument("--train-tokens", type=train_tokens, default=100_000_000,
                   help="tokens to train, for hours and dollars (e.g. 1e8)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--store", type=Path, metavar="SWEEP.yaml", default=None,
                   help="instead: store the walks of every single-GPU (model, GPU, seq) of this sweep file")
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="results directory (with --store)")
    p.add_argument("--force", action="store_true", help="with --store: redo walks whose inputs did not change")
    p.add_argument("--mermaid", action="store_true", help="print the decision tree as a Mermaid flowchart and exit")
    p.set_defaults(func=run)

    c = sub.add_parser("cards", help="how many of each card every catalog model needs, with which sharding and at "
                                     "what speed (for the GPU pages)",
                       description="For every catalog GPU and model and for full fine-tuning, LoRA and QLoRA: the "
                                   "fewest cards on which a data-parallel strategy fits at micro-batch 1, the fastest "
                                   "strategy there and its estimated tokens/s (reportgen/advise/cards.py). Writes the "
                                   "JSON the GPU pages render.")
    c.add_argument("--seq", type=int, default=2048, help="sequence length in tokens")
    c.add_argument("--out", type=Path, default=Path("data/cards_needed.json"))
    c.set_defaults(func=run_cards)


def run_cards(args: argparse.Namespace) -> int:
    from reportgen.advise.cards import all_cards_needed
    from reportgen.artifacts import Artifact
    from reportgen.flags import checked_field

    data = all_cards_needed(checked_field("seq", args.seq))
    Artifact("cards", args.out, data["inputs_hash"]).write(data)
    print(f"wrote {args.out}: {len(data['gpus'])} GPUs x {len(next(iter(data['gpus'].values())))} models")
    return 0


#: the flags of one walk (``advise --model --gpu``), which --mermaid and --store do not read
WALK_FLAGS = ("model", "gpu", "gpu_memory", "gpu_profile", "host_cpu", "seq", "lengths", "from_file", "launch_file")


def _refuse_unused(args: argparse.Namespace) -> None:
    """``--mermaid`` prints the tree itself and ``--store`` walks the sweep's own cases: a walk's flag
    beside them was silently ignored (``advise --store s.yaml --gpu t4`` stored every card's walks)."""
    from reportgen.errors import UserError

    mode = "--mermaid" if args.mermaid else "--store" if args.store is not None else None
    given = [f for f in WALK_FLAGS if getattr(args, f, None) is not None]
    if mode and given:
        flag = "--from" if given[0] == "from_file" else "--" + given[0].replace("_", "-")
        what = "prints the decision tree itself, for every model and card" if mode == "--mermaid" else \
            "walks every (model, GPU, sequence) of the sweep file"
        raise UserError(f"{flag}: not read with {mode}, which {what}",
                        hint=f"drop {flag}, or drop {mode} to walk one model and card")
    if mode and args.format != "table":
        raise UserError(f"--format {args.format}: {mode} prints no table", hint="drop --format")
    if not mode and (args.force or args.results != DEFAULT_RESULTS):
        raise UserError(f"{'--force' if args.force else '--results'}: applies only with --store SWEEP.yaml")


def run(args: argparse.Namespace) -> int:
    from reportgen.errors import UserError

    _refuse_unused(args)
    if args.mermaid:
        from reportgen.advise.tree import mermaid

        print(mermaid())
        return 0
    if args.store is not None:
        from reportgen.advise.store import write_advice
        from reportgen.sweep import load_sweep

        sweep = load_sweep(args.store)
        stats = write_advice(sweep, args.results, force=args.force)
        print(f"{sweep.name}: {stats.written} walks written, {stats.skipped} unchanged, {stats.removed} removed, "
              f"{stats.failed} failed -> {args.results / sweep.name / '_advice'}")
        return 1 if stats.failed else 0
    if not args.gpu or not (args.model or args.from_file):
        raise UserError("--model and --gpu are required (or --from CONFIG with --gpu, or --store SWEEP.yaml, or --mermaid)",
                        hint="e.g. reportgen advise --model llama-3.1-8b --gpu rtx-4090")
    from reportgen import catalog
    from reportgen.advise.walk import walk
    from reportgen.flags import checked_field, gpu_from_args

    yours = None
    if args.from_file is not None:
        from reportgen.flags import translation_from_args
        from reportgen.configs import setup_from

        translation = translation_from_args(args)
        yours = setup_from(translation, model=args.model)
        if yours.recipe.value == "grpo":
            return advise_grpo(args, translation.model if args.model is None else args.model, yours)
        if args.seq is None:
            args.seq = yours.seq
    lengths = None
    if args.lengths is not None:
        from reportgen.datalengths import read_lengths

        lengths = read_lengths(args.lengths)
        args.seq = lengths.longest if args.seq is None else args.seq
    args.seq = 2048 if args.seq is None else args.seq
    model, gpu = catalog.load_model(args.model), gpu_from_args(args)
    checked_field("seq", args.seq)
    doc = walk(model, gpu, args.seq, train_tokens=int(args.train_tokens))
    if gpu.profile is not None:
        doc["gpu_profile"] = gpu.profile.source
    from reportgen.estimate.dispatch import host_dispatch

    host = host_dispatch(gpu)
    doc["host_dispatch"], doc["host_dispatch_note"] = host.as_dict(), host.note()
    if yours is not None:
        doc["config"] = config_verdict(model, gpu, yours, args)
    if lengths is not None:
        doc["lengths"] = lengths_advice(lengths, doc, args.seq)
    if args.format == "json":
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    measured_text = None
    if doc.get("quantization"):  # the walk states QLoRA's speed against LoRA: cite the measurements too
        from reportgen.measured import cases_from_files, qlora_pairs, ratio_text, with_estimates

        measured_text = ratio_text(with_estimates(qlora_pairs(cases_from_files(DEFAULT_RESULTS))), doc["model"])
    print_walk(doc, measured_text=measured_text)
    if lengths is not None:
        from reportgen.setup import TrainingSetup
        from reportgen.views.terminal import print_lengths

        print_lengths(doc["lengths"], TrainingSetup.model_validate(doc["lengths"]["setup"]))
    return 0


def lengths_advice(lengths, doc: dict, seq: int) -> dict:
    """What the dataset's lengths mean for the walk's recommended setup (or the default setup at the
    walk's length when nothing fits): ``estimate/lengths.dataset_report`` with the setup it read."""
    from reportgen.estimate.lengths import dataset_report
    from reportgen.setup import TrainingSetup

    rec = doc.get("recommended")
    setup = TrainingSetup.model_validate(rec["setup"]) if rec else TrainingSetup(seq=seq)
    return {**dataset_report(lengths, setup), "setup": setup.model_dump(mode="json")}


def advise_grpo(args: argparse.Namespace, model_name: str, setup) -> int:
    """A GRPO config (recipe grpo): the decision tree walks SFT steps, so the answer is the GRPO step's own
    (``estimate/grpo.py``): its phases, the largest num_generations and longest completion that fit, and what to
    turn down first."""
    from reportgen import catalog
    from reportgen.estimate import estimate
    from reportgen.flags import gpu_from_args

    model, gpu = catalog.load_model(model_name), gpu_from_args(args)
    est = estimate(model, gpu, setup, train_tokens=int(args.train_tokens))
    why = ("recipe grpo: the decision tree walks SFT steps; what to turn down first is the GRPO step's own answer "
           "(reportgen estimate --recipe grpo)")
    if args.format == "json":
        print(json.dumps({"recipe": "grpo", "config": str(args.from_file), "note": why, **est.as_dict()}, indent=2,
                         sort_keys=True))
        return 0
    from reportgen.views.terminal import print_estimate

    print(why)
    print_estimate(est, model, gpu, footer=f"from {args.from_file}")
    return 0


def config_verdict(model, gpu, setup, args) -> dict:
    """The ``--from`` config's own setup beside the walk: its estimate's verdict and speed."""
    from reportgen.estimate import estimate

    est = estimate(model, gpu, setup, train_tokens=int(args.train_tokens)).as_dict()
    return {"path": str(args.from_file), "label": setup.short(), "setup": setup.model_dump(mode="json"),
            "verdict": est["verdict"], "verdict_text": est["verdict_text"],
            "device_total": est["memory"]["device_total"], "tokens_per_s": est["time"]["tokens_per_s"]}


# ----- terminal view ----------------------------------------------------------------------------
def _gib(n) -> str:
    return "-" if n is None else f"{n / 2**30:.1f}"


def _tps(n: dict | None) -> str:
    from reportgen.format import rate

    return "-" if n is None else rate(n["tokens_per_s"])


def _print_walk_notes(doc: dict, console) -> None:
    """What the walk's numbers rest on, before its table: the context limit, a GPU profile, the host's dispatch."""
    from rich.markup import escape

    if doc.get("context_note"):
        console.print(f"[bold yellow]warning:[/] {doc['context_note']}", highlight=False)
    if doc.get("gpu_profile"):
        console.print(f"note: the tokens/s use your card's profile ({escape(doc['gpu_profile'])}) instead of the "
                      "datasheet's rates", highlight=False, soft_wrap=True)
    if doc.get("host_dispatch_note"):
        console.print(f"note: the tokens/s assume {escape(doc['host_dispatch_note'])}", highlight=False,
                      soft_wrap=True)


def print_walk(doc: dict, console=None, measured_text: str | None = None) -> None:
    """The walk as a table and its verdict; ``measured_text``: the measured QLoRA/LoRA ratio to cite
    beside the walk's estimated one (``measured.ratio_text``)."""
    from rich.console import Console
    from rich.table import Table

    from reportgen.advise.tree import BY_ID, STAGES

    console = console or (Console() if Console().is_terminal else Console(width=160))
    cap = doc["gpu_memory_bytes"]
    console.print(f"[bold]{doc['model']}[/] on [bold]{doc['gpu_name']}[/] ({_gib(cap)} GiB), sequence "
                  f"{doc['seq']:,} tokens: what to turn on first", highlight=False)
    console.print("[dim]every number is an estimate (reportgen estimate); GiB = 2^30 bytes; memory is the device "
                  "total, what nvidia-smi would show[/]", highlight=False)
    _print_walk_notes(doc, console)
    table = Table(title_justify="left")
    for col, just in (("#", "right"), ("step", "left"), ("setup evaluated", "left"), ("GiB (est.)", "right"),
                      ("tokens/s (est.)", "right"), ("result", "left")):
        table.add_column(col, justify=just)
    stage = None
    for i, s in enumerate(doc["steps"], 1):
        node = BY_ID[s["node"]]
        if node.stage != stage:
            stage = node.stage
            table.add_section()
            table.add_row("", f"[bold]{STAGES[stage]}[/]", "", "", "", "")
        n = s.get("numbers")
        if s["kind"] == "action":
            what = ", ".join(f"{f} {a} -> {b}" for f, (a, b) in s["changed"].items()) or (
                "baseline" if s["node"] == "start" else "no change")
            table.add_row(str(i), f"+ {node.label}", n["label"] if n else "-", _gib(n and n["device_total"]),
                          _tps(n), what + "".join(f"; {note}" for note in s["notes"]))
        elif s["kind"] == "check":
            answer = {"yes": "[green]yes[/]", "no": "[red]no[/]"}.get(s["outcome"], s["outcome"])
            table.add_row(str(i), f"? {s['question']}", n["label"], _gib(n["device_total"]), _tps(n),
                          f"{answer}: {s['explain']}")
        else:
            table.add_row(str(i), f"[bold]{s['title']}[/]", "", "", "", "")
    console.print(table)
    taken = [BY_ID[s["node"]] for s in doc["steps"] if s["kind"] == "action" and not s["skipped"]
             and s["node"] != "start"]
    if taken:
        console.print("[bold]turned on, and why[/]")
        for node in taken:
            console.print(f"  [bold]{node.label}[/]: {node.why}. [dim]Cost: {node.tradeoff}.[/]", highlight=False)
    v = doc["verdict"]
    colour = "green" if v["kind"] == "fits" else "yellow" if v["kind"] == "shorter-sequence" else "red"
    console.print(f"[bold {colour}]verdict:[/] {v['summary']}", highlight=False)
    console.print(v["text"], highlight=False)
    if doc.get("quantization") and measured_text:
        console.print(measured_text, highlight=False)
    rec = doc["recommended"]
    if rec:
        mb = "-" if rec["max_batch"] is None else rec["max_batch"]
        console.print(f"recommended: [bold]{rec['label']}[/]: {rec['verdict_text']}; {_tps(rec)} tokens/s, "
                      f"largest micro-batch that fits {mb}, peak at {rec['peak_phase']} (est.)", highlight=False)
    for o in doc["options"]:
        mark = "[green]fits[/]" if o["fits"] else "[red]no[/]"
        tps = "" if not o["numbers"] or not o["numbers"]["tokens_per_s"] else f", {_tps(o['numbers'])} tokens/s"
        label = o["label"].replace("n GPUs", f"{o['gpus']} GPUs")
        console.print(f"  option {label}: {mark}: {o['text']}{tps}", highlight=False)
    console.print(f"[bold]compared with a search of every candidate:[/] {doc['search']['text']}", highlight=False)
    cfg = doc.get("config")
    if cfg:
        from rich.markup import escape

        colour = "green" if cfg["verdict"] == "fits" else "yellow" if cfg["verdict"] == "tight" else "red"
        console.print(f"your config ({escape(cfg['path'])}): [bold]{escape(cfg['label'])}[/]: [{colour}]"
                      f"{escape(cfg['verdict_text'])}[/]; {_tps(cfg)} tokens/s (est.)", highlight=False)
    for note in dict.fromkeys((rec or {}).get("notes", [])):
        console.print(f"[yellow]note:[/] {note}", highlight=False)
