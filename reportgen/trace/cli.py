"""Subcommand of this package (see ``reportgen.cli.PLUGINS``): ``reportgen trace``.

``reportgen trace --model M --gpu G [setup flags] [--format json]`` runs the harness's training
step on the meta device (no GPU, no weights, no download) and replays its allocations through the
caching-allocator simulation. ``--model`` takes a catalog name or a path to any causal LM's
``config.json``, including families the analytic estimator has no formulas for. Importing this
module imports neither torch nor transformers; the handler does, and says which extra to install
when they are missing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reportgen.errors import MEASURE_EXTRA


def register(sub) -> None:
    """Add ``trace`` to the ``reportgen`` parser."""
    from reportgen.flags import add_setup_flags

    p = sub.add_parser("trace", help="run the real training step on storage-less tensors and replay its "
                                     "allocations through a model of the CUDA caching allocator (no GPU)",
                       description="Build the model from its config on the meta device, run the measuring "
                                   "harness's training step (forward, loss, backward, optimizer step), record "
                                   "every allocation and free, and replay them through a simulation of "
                                   "PyTorch's CUDA caching allocator. Numbers are labelled traced.")
    add_setup_flags(p)
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps traced before the recorded one (the step the harness would time)")
    p.set_defaults(func=cmd_trace)


def _load(model: str):
    """``trace.spec.load_any``'s model, also by Hub id (``hub.py``) of any family transformers knows:
    the config.json from the Hugging Face cache, named as the user wrote it, with its commit."""
    import dataclasses

    from reportgen import catalog, hub
    from reportgen.trace.spec import load_any  # imports transformers only for a config.json of another family

    ref = hub.parse(model)
    if model in catalog.model_names() or ref is None or Path(model).exists() or ref[0] in catalog.catalog_ids() \
            and ref[1] is None:
        return load_any(model)
    fetched = hub.fetch_config(*ref, catalog.catalog_ids())
    spec = load_any(str(fetched.path))
    return dataclasses.replace(spec, name=model, hf_repo=ref[0], revision=fetched.commit or ref[1])


def with_verdict_fields(d: dict) -> dict:
    """The traced JSON with the verdict fields ``reportgen estimate --format json`` has (``demand``,
    ``margin``, ``verdict_text``; ``estimate/verdict.py``), for the traced total, which has no error
    band: the replay itself says whether the step runs within the card (releasing cached blocks if it
    must), and what nvidia-smi would then show is what it asks of the card."""
    from reportgen.estimate.verdict import verdict_text

    demand = d["memory"]["device_total"]
    return {**d, "demand": demand, "margin": d["capacity"] - demand,
            "verdict_text": verdict_text(d["verdict"], demand, d["capacity"], None)}


def cmd_trace(args: argparse.Namespace) -> int:
    from reportgen import catalog
    from reportgen.flags import setup_from_args
    from reportgen.errors import UserError

    from reportgen.trace.step import check_traceable

    setup = setup_from_args(args)
    gpu = catalog.load_gpu(args.gpu)
    check_traceable(setup)
    from reportgen.trace.runner import check_recipe_traced

    check_recipe_traced(setup)
    if args.warmup < 1:
        raise UserError("--warmup: must be 1 or more (the optimizer states appear in the first step)")
    from reportgen.trace.quiet import quiet_libraries

    quiet_libraries()
    spec = _load(args.model)
    try:
        import peft  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise UserError(f"reportgen trace needs torch, transformers and peft ({exc})",
                        hint=MEASURE_EXTRA) from None
    if setup.method.value == "qlora":
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as exc:
            raise UserError(f"--method qlora: tracing needs bitsandbytes ({exc})", hint=MEASURE_EXTRA) from None
    from reportgen.trace.result import trace_case
    from reportgen.trace.sft import recipe_dict, recipe_trace

    with recipe_trace(setup):  # the trainer's step for recipes trainer and trl-sft
        result = trace_case(spec, gpu, setup, warmup=args.warmup)
        if args.format == "json":
            print(json.dumps(with_verdict_fields(recipe_dict(setup, result.as_dict())), indent=2, sort_keys=True))
            return 0
        from reportgen.views.trace import print_trace

        print_trace(result, gpu)
    return 0
