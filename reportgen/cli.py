"""The ``reportgen`` command line: parse arguments, call the library, print with rich."""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import re
import sys
from pathlib import Path

from reportgen import __version__, catalog
from reportgen.errors import UserError
from reportgen.flags import (DEFAULT_TRAIN_TOKENS, add_gpu_profile_flag, add_host_cpu_flag, add_setup_flags, flag_error, gpu_from_args,
                             positive_int, refuse_beside_lengths, setup_from_args, train_tokens)

GIB = 2**30
DEFAULT_RESULTS = Path("results")
DEFAULT_DOCS = Path("docs")

#: modules that add subcommands: each has ``register(subparsers)``, adds its parsers and sets
#: ``func`` on them with ``set_defaults``; heavy imports stay inside the handlers.
PLUGINS = ("reportgen.measure.cli", "reportgen.report.cli", "reportgen.advise.cli", "reportgen.published.cli",
           "reportgen.trace.cli")


def add_estimate_parser(sub) -> argparse.ArgumentParser:
    """The ``estimate`` subcommand (also built alone by the site's calculator, ``reportgen.browser``)."""
    p = sub.add_parser("estimate", help="memory, time and fit of one setup (no GPU, no torch needed)")
    add_setup_flags(p)
    add_gpu_profile_flag(p)
    add_host_cpu_flag(p)
    p.add_argument("--train-tokens", type=train_tokens, default=DEFAULT_TRAIN_TOKENS,
                   help="tokens to train, for hours and dollars (e.g. 1e8)")
    p.add_argument("--lengths", type=Path, default=None, metavar="FILE",
                   help="the dataset's sample lengths in tokens (one per line, 'LENGTH COUNT' lines, or a JSON list or "
                        "histogram): sets seq (the longest, or --seq as the cut), seq_mean and the padded length of a "
                        "micro-batch, and reports the padding waste")
    p.add_argument("--host-memory", default=None, metavar="SIZE",
                   help="the node's host RAM, e.g. 256GiB: the run's host peak (offloaded states, loading, saving) "
                        "is judged against it (default: shown, not judged)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    return p


class Parser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too: ``add_subparsers`` makes them of this class) with a did-you-mean
    on an invalid choice, as the catalogs' names have (``difflib``). No abbreviated flags: ``--seq-m 400``
    is not taken as ``--seq-mean`` (nor ``--lora 8`` refused as ambiguous): an option is spelled whole."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def unrecognized(self, extra: list[str]):
        """argparse's "unrecognized arguments" for this (sub)command, with the closest option of each."""
        options = sorted(o for o in self._option_string_actions if o.startswith("--") and o not in ("--help", "--version"))
        guesses = [g for x in extra if x.startswith("--")
                   for g in difflib.get_close_matches(x.partition("=")[0], options, n=1, cutoff=0.6)]
        self.error(f"unrecognized arguments: {' '.join(extra)}"
                   + (f"; did you mean {' or '.join(dict.fromkeys(guesses))}?" if guesses else ""))

    def error(self, message: str):
        m = re.match(r"argument (\S+): invalid choice: '?([^']*?)'? \(choose from (.*)\)$", message)
        if m:
            choices = [c.strip().strip("'") for c in m.group(3).split(",")]
            close = difflib.get_close_matches(m.group(2), choices, n=2, cutoff=0.6)
            if close:
                message += "; did you mean " + " or ".join(repr(c) for c in close) + "?"
        super().error(message)


DESCRIPTION = ("Will a fine-tuning run fit on your GPU, how fast will it go, and what to turn on first: memory term by\n"
               "term and step time kernel by kernel, estimated without a GPU and checked against CUDA measurements.")
EPILOG = """first steps:
  reportgen estimate --model llama-3.1-8b --gpu rtx-4090 --method qlora   one setup: memory, fit, speed
  reportgen advise --model Qwen/Qwen3-14B --gpu rtx-4090                 what to turn on first
  reportgen estimate --from sft.yaml --gpu rtx-3090                      your TRL/Axolotl/... config
  reportgen models; reportgen gpus                                       what the catalogs hold
each command's own flags: reportgen COMMAND --help"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="reportgen", description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"reportgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    add_estimate_parser(sub)

    p = sub.add_parser("sweep", help="estimate (and measure, if the sweep asks) every case of a sweep file")
    p.add_argument("file", type=Path)
    p.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="results directory")
    p.add_argument("--docs", type=Path, default=None, help=f"site source directory to render into (default {DEFAULT_DOCS})")
    p.add_argument("--force", action="store_true", help="recompute cases whose inputs did not change")
    p.add_argument("--no-render", action="store_true", help="do not render the site pages afterwards")
    p.add_argument("--measure", action="store_true", help="also measure on this machine's GPU")
    p.add_argument("--trace", action="store_true",
                   help="also trace every case (reportgen trace, 1-60 s a case, no GPU) into RESULTS/<sweep>/traced/; "
                        "cases traced by the current trace code are skipped unless --force")
    p.add_argument("--shard", default=None, help="I/N: measure only every N-th case starting at I (0-based)")
    p.add_argument("--max-cases", type=positive_int, default=None, metavar="N",
                   help="allow a sweep of up to N cases (default: refuse more than 10,000; see the README's Limits)")
    p.add_argument("--executor", choices=["local", "slurm"], default="local",
                   help="where --measure runs: local (this machine, one case after another; the default) or slurm "
                        "(a Slurm job array through submitit, a shard per task; see the README)")
    g = p.add_argument_group("Slurm (--executor slurm; submitit's parameter names in brackets)")
    g.add_argument("--partition", default=None, help="partition to run on [slurm_partition]")
    g.add_argument("--gpus-per-task", type=positive_int, default=None, metavar="N",
                   help="GPUs per array task [slurm_gpus_per_task] (default: the most a case needs)")
    g.add_argument("--time-limit", default=None, metavar="T",
                   help="time limit per task, minutes or HH:MM:SS or D-HH:MM [timeout_min] (default: each of the "
                        "task's cases at the sweep's measure.timeout_s, plus a minute)")
    g.add_argument("--slurm-array-parallelism", type=positive_int, default=None, metavar="K",
                   help="at most K tasks running at once [slurm_array_parallelism]")
    g.add_argument("--account", default=None, help="account to charge [slurm_account]")
    g.add_argument("--qos", default=None, help="quality of service [slurm_qos]")
    g.add_argument("--slurm-additional", action="append", default=[], metavar="KEY=VALUE",
                   help="any other sbatch option, e.g. constraint=h100 [slurm_additional_parameters]; repeatable")
    g.add_argument("--tasks", type=positive_int, default=None, metavar="N",
                   help="split the cases into N shards, one per array task (default: one task per case)")
    g.add_argument("--slurm-folder", type=Path, default=None, metavar="DIR",
                   help="submitit's logs and pickles (default: RESULTS/<sweep>/_slurm); on a shared filesystem")
    g.add_argument("--no-wait", action="store_true",
                   help="submit, print the job ids and return; rerun to submit what is still missing")

    sub.add_parser("models", help="list the model catalog")
    sub.add_parser("gpus", help="list the GPU catalog")
    sub.add_parser("cpus", help="list the host CPU catalog (--host-cpu NAME)")
    for module in PLUGINS:
        importlib.import_module(module).register(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that a measuring sweep stops its worker and removes its scratch
    folder (``measure/isolate.py``) instead of dying where it stands."""


def _terminated(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # `reportgen` alone: what it can do, not "required: command"
        parser.print_help(sys.stderr)
        return 2
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the subcommand that was given, with its closest options
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].unrecognized(extra)
    handler = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        handler = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _main(args)
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


def _pipe_closed(console) -> None:
    """rich's ``Console.on_broken_pipe`` exits with status 1 when ``| head`` closes the pipe; raised
    instead, the reader's leaving ends every command alike (``_main``: status 141, as a JSON print)."""
    raise BrokenPipeError


def _main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from reportgen.setup import SetupError

    Console.on_broken_pipe = _pipe_closed

    try:
        try:
            return run_command(args)
        except SetupError as exc:  # a flag's value a setup refuses, where a command did not check it first
            raise flag_error(exc) from None
    except UserError as exc:
        from rich.markup import escape

        console = Console(stderr=True)
        console.print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
        if exc.hint:
            console.print(f"  [yellow]hint:[/] {escape(exc.hint)}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except BrokenPipeError:  # `reportgen ... | head`: the reader left; say nothing more, as cat does
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush is no error
        return 141
    except OSError as exc:  # a path the user gave that cannot be read or written (--out, --results, ...)
        from rich.markup import escape

        where = f" {exc.filename}" if exc.filename else ""
        Console(stderr=True).print(f"[bold red]error:[/] cannot use{escape(where)}: {escape(_why(exc))}",
                                   highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt as exc:
        # only a sweep stores each case as it ends; every other command writes once, at its end
        saved = "finished cases are saved; rerun to continue" if args.command == "sweep" else "nothing was written"
        print(f"interrupted: {saved}", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130


def _why(exc: OSError) -> str:
    """What is wrong with a path, in words: "File exists" for a folder that cannot be made is a file
    in the way (``--out afile/x.json``, ``--docs afile/docs``): name it."""
    import errno
    import os
    from pathlib import Path

    if exc.errno in (errno.EEXIST, errno.ENOTDIR) and exc.filename:
        for parent in Path(exc.filename).parents:
            if parent.exists() and not parent.is_dir():
                return f"{parent} is a file, not a folder"
    if exc.strerror == os.strerror(errno.EEXIST) and exc.filename and not Path(exc.filename).is_dir():
        return f"{exc.filename} is a file, not a folder"  # mkdir of a folder a file already holds
    return exc.strerror or str(exc)


def run_command(args: argparse.Namespace) -> int:
    """Run parsed arguments; a ``UserError`` propagates (``main`` prints it, the calculator shows it)."""
    if getattr(args, "gpu_memory", None) and getattr(args, "gpu", None):
        args.gpu = catalog.gpu_key(args.gpu, args.gpu_memory)
    handler = getattr(args, "func", None) or COMMANDS[args.command]
    return handler(args)


# ----- commands ----------------------------------------------------------------------------------
def cmd_estimate(args: argparse.Namespace) -> int:
    from reportgen.estimate import estimate

    from reportgen.setup import SetupError

    refuse_beside_lengths(args)
    setup = setup_from_args(args)
    lengths = None
    if getattr(args, "lengths", None) is not None:
        from reportgen.datalengths import read_lengths
        from reportgen.estimate.lengths import apply_lengths

        lengths = read_lengths(args.lengths)
        setup = apply_lengths(setup, lengths, seq_given=args.seq is not None or args.from_file is not None)
    model, gpu = catalog.load_model(args.model), gpu_from_args(args)
    host_memory = catalog.parse_host_memory(args.host_memory) if getattr(args, "host_memory", None) else None
    try:
        est = estimate(model, gpu, setup, train_tokens=args.train_tokens)
    except SetupError as exc:  # what TRL or vLLM would refuse for this model and card (estimate/grpo.py)
        raise flag_error(exc) from None
    report = None
    if lengths is not None:
        from reportgen.estimate.lengths import dataset_report

        report = dataset_report(lengths, setup)
        if setup.padding.value == "longest":
            from reportgen.estimate.lengths import reserved_growth

            report["reserved_growth"] = reserved_growth(model, setup, gpu, lengths)
    if args.format == "json":
        out = est.as_dict()
        if report is not None:
            out["lengths"] = {**report, "file": str(args.lengths)}
        if host_memory:
            out["run"]["host_capacity"] = host_memory
            out["run"]["host_fits"] = est.run.host_peak <= host_memory
        if gpu.profile is not None:
            out["gpu_profile"] = {"file": gpu.profile.source, "card": gpu.profile.card, "device": gpu.profile.device}
        if model.revision:  # a model given by Hub id: the commit its config.json came from (hub.py)
            out["model_source"] = {"hub": model.hf_repo, "revision": model.revision}
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    from reportgen.measured import footer
    from reportgen.results import case_id
    from reportgen.views.terminal import print_estimate

    print_estimate(est, model, gpu, footer=footer(DEFAULT_RESULTS, case_id(model.name, gpu.key,
                                                                          setup.model_dump(mode="json")), gpu.key),
                   host_memory=host_memory)
    if report is not None:
        from reportgen.views.terminal import print_lengths

        print_lengths(report, setup)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.console import Console

    from reportgen.pipeline import run_sweep
    from reportgen.sweep import DEFAULT_MAX_CASES, load_sweep
    from reportgen.views.progress import Stages

    console = Console(stderr=True)
    if not console.is_terminal:  # piped or logged: one line per message, never wrapped inside a number
        console = Console(stderr=True, soft_wrap=True)
    sweep = load_sweep(args.file, max_cases=args.max_cases or DEFAULT_MAX_CASES)
    measuring = args.measure or sweep.spec.measure.enabled
    slurm = _slurm_options(args, measuring=measuring)
    _check_outputs(args, measuring)  # before anything is written

    def warn(message: str) -> None:
        from rich.markup import escape

        console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)

    for message in sweep.warnings:  # rules that match nothing, what the grids' ``from`` configs left unread
        warn(message)

    with Stages(console) as stages:
        run = run_sweep(sweep, args.results, stages=stages, warn=warn, console=console,
                        force=args.force, trace=args.trace, measure=measuring, shard=args.shard, slurm=slurm)
        if not args.no_render:
            from reportgen.report.render import render_all

            pages = render_all(args.results, args.docs, progress=stages.render_progress())
            stages.finish_render()
            console.print(pages.said(args.docs))
    console.print(f"time: {stages.summary()}", highlight=False)
    return 1 if run.failed else 0


def _check_outputs(args: argparse.Namespace, measuring: bool) -> None:
    """``reportgen sweep``'s paths and ``--shard``, checked before any estimate or walk is written."""
    if args.shard is not None:
        if not measuring:
            raise UserError(f"--shard {args.shard}: only applies when measuring",
                            hint="add --measure (or measure: {enabled: true} in the sweep file), or drop --shard")
        from reportgen.measure.runner import parse_shard

        parse_shard(args.shard)
    if args.no_render and args.docs is not None:  # it would write nothing there: said, not ignored
        raise UserError(f"--docs {args.docs}: --no-render renders no pages", hint="drop --docs or --no-render")
    args.docs = args.docs or DEFAULT_DOCS
    folders = [("--results", args.results)] + ([] if args.no_render else [("--docs", args.docs)])
    for flag, folder in folders:
        if folder.exists() and not folder.is_dir():
            raise UserError(f"{flag} {folder}: is a file, not a directory",
                            hint=f"pass a directory for {flag} (it is created if missing)")
        parent = next((p for p in folder.absolute().parents if p.exists()), None)
        if not folder.exists() and parent is not None and not parent.is_dir():
            raise UserError(f"{flag} {folder}: {parent} is a file, not a directory")
    for flag, folder in folders:
        _writable(flag, folder)


def _writable(flag: str, folder: Path) -> None:
    """``folder`` takes a file (``userfile.try_writing``; nothing it made is left), else a ``UserError``."""
    from reportgen.userfile import try_writing

    try:
        try_writing(folder, keep=False)
    except OSError as exc:
        raise UserError(f"{flag} {folder}: cannot be written ({exc.strerror or exc})",
                        hint=f"pass a directory you can write to for {flag}") from None


#: ``reportgen sweep`` flags that only mean something with ``--executor slurm``
SLURM_FLAGS = ("partition", "gpus_per_task", "time_limit", "slurm_array_parallelism", "account", "qos",
               "slurm_additional", "tasks", "slurm_folder", "no_wait")


def _slurm_options(args: argparse.Namespace, measuring: bool):
    """The Slurm options of ``reportgen sweep``, checked before anything is computed (None: local)."""
    given = [f for f in SLURM_FLAGS if getattr(args, f) not in (None, False, [])]
    if args.executor != "slurm":
        if given:
            raise UserError(f"--{given[0].replace('_', '-')} only applies with --executor slurm")
        return None
    if not measuring:
        raise UserError("--executor slurm submits the measurements: add --measure (or measure: {enabled: true} "
                        "in the sweep file)")
    if args.shard is not None:
        raise UserError("--shard splits a local run; with --executor slurm each array task is a shard (--tasks N)")
    from reportgen.measure.cluster import (SlurmOptions, check_cluster, parse_additional, parse_time_limit,
                                           require_submitit)

    if args.time_limit is not None:
        parse_time_limit(args.time_limit)
    parse_additional(args.slurm_additional)
    require_submitit()
    check_cluster()
    return SlurmOptions(partition=args.partition, gpus_per_task=args.gpus_per_task, time_limit=args.time_limit,
                        array_parallelism=args.slurm_array_parallelism, account=args.account, qos=args.qos,
                        tasks=args.tasks, additional=list(args.slurm_additional), folder=args.slurm_folder,
                        wait=not args.no_wait)

def wide_console():
    """Tables of the catalogs stay unwrapped when piped (rich assumes 80 columns there)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=160)


def cmd_models(args: argparse.Namespace) -> int:
    from rich.table import Table

    table = Table(title="model catalog (reportgen estimate --model NAME)")
    for col in ("name", "hf repo", "family", "params", "layers", "hidden", "heads/kv", "vocab", "tied"):
        table.add_column(col, justify="right" if col in ("params", "layers", "hidden", "vocab") else "left")
    for name in catalog.model_names():
        m = catalog.load_model(name)
        table.add_row(name, m.hf_repo, m.model_type, f"{m.total_params:,}", str(m.num_layers), str(m.hidden_size),
                      f"{m.num_heads}/{m.num_kv_heads}", f"{m.vocab_size:,}", "yes" if m.tie_word_embeddings else "no")
    wide_console().print(table)
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    from rich.table import Table

    table = Table(title="GPU catalog (datasheet peaks, dense; see reportgen/catalog/gpus.yaml for sources)")
    for col in ("name", "GPU", "memory", "GB/s", "fp32", "tf32", "fp16", "bf16", "host link", "$/h"):
        table.add_column(col)
    for key in catalog.gpu_names():
        g = catalog.load_gpu(key)

        def tf(d):
            v = g.peak_tflops.get(d)
            return "-" if v is None else f"{v:g}" + ("*" if d in g.derived else "")

        table.add_row(key, g.name, f"{g.memory_bytes / GIB:.1f} GiB", f"{g.memory_bandwidth_gbs:g}", tf("fp32"),
                      tf("tf32"), tf("fp16"), tf("bf16"), g.host_link,
                      "-" if g.price_usd_per_hour is None else f"{g.price_usd_per_hour:.2f}")
    console = wide_console()
    console.print(table)
    console.print("TFLOP/s; * derived by reportgen, not published (see the catalog notes)")
    return 0


def cmd_cpus(args: argparse.Namespace) -> int:
    from rich.table import Table

    from reportgen.estimate.dispatch import single_thread_factor

    table = Table(title="host CPU catalog (reportgen estimate --host-cpu NAME; sources in reportgen/catalog/cpus.yaml)")
    for col in ("name", "CPU", "kind", "PassMark single-thread", "dispatch vs the H100 machine's"):
        table.add_column(col)
    for key in catalog.cpu_names():
        c = catalog.load_cpu(key)
        table.add_row(key, c.name, c.kind, f"{c.single_thread:,.0f}", f"x{single_thread_factor(c):.2f}")
    wide_console().print(table)
    return 0


COMMANDS = {"estimate": cmd_estimate, "sweep": cmd_sweep, "models": cmd_models, "gpus": cmd_gpus, "cpus": cmd_cpus}
