"""Subcommands of this package (see ``reportgen.cli.PLUGINS``): ``reportgen measure``.

``reportgen measure`` takes the setup flags of ``reportgen estimate`` and runs the case for real,
in a subprocess (``isolate.py``); this process never imports torch. ``--format json`` prints
exactly one JSON object (``protocol.py``); the exit status is 0 for ``ok``, 1 for ``oom``,
``error`` and ``timeout`` (the answer is printed all the same). ``--gpus N --sharding ddp|fsdp``
runs one process per GPU under torchrun (``distributed.py``, ``ranks.py``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

DEFAULT_TIMEOUT_S = 900.0


def register(sub) -> None:
    """Add this package's subcommands to the ``reportgen`` parser."""
    from reportgen.flags import add_setup_flags
    from reportgen.measure import defaults as D  # not the sweep module: pydantic is not imported to build the parser

    p = sub.add_parser("measure", help="measure one setup for real (peak memory, step time) on this machine",
                       description="Train a few steps of the setup on random weights and tokens, in a subprocess, "
                                   "and report PyTorch's peak memory, the driver's view and the step times.")
    add_setup_flags(p)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (default) or cpu (timings only: memory figures are null on CPU)")
    p.add_argument("--warmup", type=int, default=D.WARMUP,
                   help=f"untimed steps first (optimizer states appear here; default {D.WARMUP})")
    p.add_argument("--steps", type=int, default=D.STEPS,
                   help=f"timed steps, at least (default {D.STEPS}); more until the median is stable "
                        "(--target-rel-ci), --max-steps ran or --max-timed-s is reached")
    p.add_argument("--max-steps", type=int, default=None, metavar="N",
                   help=f"at most N timed steps (default: the larger of --steps and {D.MAX_STEPS}; "
                        "equal to --steps: exactly that many)")
    p.add_argument("--max-timed-s", type=float, default=D.MAX_TIMED_S, metavar="S",
                   help=f"stop the timed steps once their times add up to S seconds (default {D.MAX_TIMED_S:g})")
    p.add_argument("--target-rel-ci", type=float, default=D.TARGET_REL_CI, metavar="F",
                   help="stop once the median's 95%% confidence interval is within +-F of it "
                        f"(default {D.TARGET_REL_CI:g}; 0: never early)")
    p.add_argument("--profile", type=Path, nargs="?", const=Path("profiles"), default=None, metavar="DIR",
                   help="after the timed steps, run --profile-steps more under torch.profiler and write the trace "
                        "(Chrome trace JSON, gzipped: open it in https://ui.perfetto.dev) into DIR (default ./profiles); "
                        "the answer gets each profiled step's GPU-busy time, wall time, kernels and CPU ops")
    p.add_argument("--profile-steps", type=int, default=None, metavar="N",
                   help=f"steps to profile with --profile (default {D.PROFILE_STEPS})")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--cap-to-gpu", action="store_true",
                   help="limit PyTorch's allocator to the --gpu card's memory (emulate a smaller card)")
    p.add_argument("--snapshot", type=Path, default=None, metavar="DIR",
                   help="write a CUDA memory snapshot pickle into DIR (view at https://pytorch.org/memory_viz)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"kill the measurement after S seconds (default {DEFAULT_TIMEOUT_S:g})")
    p.set_defaults(func=cmd_measure)
    _register_profile(sub)


def _register_profile(sub) -> None:
    p = sub.add_parser("profile-gpu", help="measure this machine's GPU and host rates in about a minute "
                                           "(use them with --gpu-profile FILE)",
                       description="Time GEMMs at a model's shapes, memory bandwidth, kernel launches, the host's "
                                   "dispatch, a host AdamW step, the host link and the CUDA context on this machine, "
                                   "and write them as a profile that `reportgen estimate --gpu-profile FILE` prices "
                                   "a step with instead of the datasheet.")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (default): the card and the host; cpu: the host alone, for a card named by --gpu "
                        "(its GPU rates stay the datasheet's)")
    p.add_argument("--gpu", default=None, help="the card's catalog name: checked against the device with cuda, "
                                               "required with --device cpu")
    p.add_argument("--model", default="llama-3.1-8b",
                   help="the model whose linear layers' shapes the GEMMs are timed at (default llama-3.1-8b)")
    p.add_argument("--out", type=Path, default=None, metavar="FILE",
                   help="where to write the profile: a file, or a folder to write gpu-profile-CARD.yaml into (default: here)")
    p.set_defaults(func=cmd_profile_gpu)


def cmd_profile_gpu(args: argparse.Namespace) -> int:
    """Run the profile (``profile_gpu.py``) in this process, print its figures, write the YAML."""
    import yaml
    from rich.console import Console

    from reportgen import catalog
    from reportgen.gpu_profile import from_document
    from reportgen.measure.profile_gpu import profile

    if args.gpu:
        catalog.load_gpu(args.gpu)  # an unknown name fails here, with did-you-mean
    model = catalog.load_model(args.model)
    err = Console(stderr=True)
    folder = args.out if args.out is not None and args.out.is_dir() else None  # --out DIR: its default name there
    out = args.out if args.out is not None and folder is None else None
    _writable(folder or (out.parent if out else Path(".")), "--out")
    doc = profile(args.device, args.gpu, model, step=lambda name: err.print(f"[dim]measuring {name}...[/]"))
    if out is None:
        out = (folder or Path(".")) / f"gpu-profile-{doc['card']}.yaml"
    doc = json.loads(json.dumps(doc, allow_nan=False))  # plain types (torch's version is a str subclass)
    read_back = from_document(doc, str(out))  # what is written must read back
    out.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    _print_profile(doc, read_back, out)
    return 0


def _print_profile(doc: dict, read_back, out: Path) -> None:
    from rich.console import Console

    from reportgen.gpu_profile import summary_lines

    con = Console()
    con.print(f"profile of {doc['card']} ({doc['device']}) in {doc['seconds']:g} s, written to {out}", markup=False)
    for line in summary_lines(read_back):
        con.print("  " + line, soft_wrap=True, markup=False)
    if doc["device"] == "cpu":
        con.print("  the GPU's rates were not measured (--device cpu): estimates use the datasheet's for them")
    con.print(f"use it: reportgen estimate --gpu {doc['card']} --gpu-profile {out} ...")


def cmd_measure(args: argparse.Namespace) -> int:
    from rich.console import Console

    from reportgen import catalog
    from reportgen.flags import setup_from_args
    from reportgen.errors import UserError
    from reportgen.measure.isolate import require_measure_packages, run_case
    from reportgen.measure.protocol import MeasureRequest
    from reportgen.results import case_id

    setup = setup_from_args(args)
    require_measure_packages()
    model, gpu = catalog.load_model(args.model), catalog.load_gpu(args.gpu)
    max_steps, profile_steps = _checked(args)
    setup_dict = setup.model_dump(mode="json")
    snapshot = None
    if args.snapshot is not None:
        if args.device != "cuda":
            raise UserError("--snapshot: CUDA memory snapshots need --device cuda")
        snapshot = str((args.snapshot / f"{case_id(args.model, args.gpu, setup_dict)}.pickle").resolve())
    if snapshot is not None and setup.gpus > 1:
        raise UserError("--snapshot: a CUDA memory snapshot records one process; not with --gpus > 1")
    if args.cap_to_gpu and args.device != "cuda":
        raise UserError("--cap-to-gpu: caps the CUDA allocator; needs --device cuda")
    trace = None
    if args.profile is not None:
        from datetime import datetime, timezone

        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        from reportgen.measure.profiling import TRACE_SUFFIX

        trace = str((args.profile / f"{case_id(args.model, args.gpu, setup_dict)}.{stamp}{TRACE_SUFFIX}").resolve())
    request = MeasureRequest(model=args.model, gpu=args.gpu, setup=setup_dict, device=args.device,
                             warmup=args.warmup, steps=args.steps, max_steps=max_steps, max_timed_s=args.max_timed_s,
                             target_rel_ci=args.target_rel_ci or None, cap_to_gpu=args.cap_to_gpu, snapshot=snapshot,
                             profile=trace, profile_steps=profile_steps)
    from reportgen.measure.isolate import refusal

    refused = refusal(request)
    if refused is not None:  # what no machine measures: exit 2 before running, not 1 as a failed run
        raise UserError(f"cannot measure this setup: {refused['error']}", hint="`reportgen estimate` estimates it")
    err = Console(stderr=True)
    how = "subprocess" if setup.gpus == 1 else f"torchrun, {setup.gpus} processes"
    what = f"measuring {model.name} {setup.short()} on {args.device} ({how}, timeout {args.timeout:g} s)"
    with err.status(what):
        result = run_case(request, args.timeout)
    if args.format == "json":
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        from reportgen.estimate import estimate
        from reportgen.views.measurement import print_measurement

        try:
            est = estimate(model, gpu, setup, reverse=False)
        except Exception:  # noqa: BLE001 - the measurement stands without its estimate
            est = None
        print_measurement(result, est)
    return 0 if result["status"] == "ok" else 1


def _writable(folder: Path, flag: str) -> None:
    """A folder the run writes into at its end, tried now (``userfile.try_writing``): a path that
    cannot be written fails before minutes of measuring, not after them."""
    from reportgen.errors import UserError
    from reportgen.userfile import try_writing

    try:
        try_writing(folder)
    except OSError as exc:
        raise UserError(f"{flag} {folder}: cannot be written ({exc.strerror or exc})",
                        hint="name a folder you can write to") from None


def _checked(args: argparse.Namespace) -> tuple[int, int]:
    """The flags' own checks, before anything runs: ``(max_steps, profile_steps)``."""
    from reportgen.errors import UserError
    from reportgen.measure import defaults as D

    if args.warmup < 0:
        raise UserError("--warmup: must be 0 or more")
    if args.steps < 1:
        raise UserError("--steps: must be 1 or more")
    max_steps = args.max_steps if args.max_steps is not None else max(args.steps, D.MAX_STEPS)
    if max_steps < args.steps:
        raise UserError(f"--max-steps {max_steps}: below --steps {args.steps}, the minimum number of timed steps",
                        hint=f"--max-steps {args.steps} times exactly {args.steps} steps")
    if args.max_timed_s is not None and not (math.isfinite(args.max_timed_s) and args.max_timed_s > 0):
        raise UserError(f"--max-timed-s {args.max_timed_s:g}: must be a positive number of seconds")
    if args.target_rel_ci is not None and not 0 <= args.target_rel_ci < 1:
        raise UserError(f"--target-rel-ci {args.target_rel_ci:g}: a fraction of the median, 0 <= F < 1 (0.02: +-2%)")
    if args.profile_steps is not None and args.profile is None:
        raise UserError("--profile-steps: only with --profile")
    profile_steps = args.profile_steps if args.profile_steps is not None else D.PROFILE_STEPS
    if profile_steps < 1:
        raise UserError("--profile-steps: must be 1 or more")
    if args.profile is not None and args.profile.exists() and not args.profile.is_dir():
        raise UserError(f"--profile {args.profile}: not a directory", hint="name a directory for the trace files")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UserError(f"--timeout {args.timeout:g}: must be a positive number of seconds")
    if args.profile is not None:
        _writable(args.profile, "--profile")
    return max_steps, profile_steps
