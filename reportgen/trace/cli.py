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
from reportgen.estimate.lengths import GROWTH_STEP


#: the most steps ``--lengths`` replays (each is a traced step through the allocator: ~20 ms for a 1B model)
MAX_STEPS = 10_000


def register(sub) -> None:
    """Add ``trace`` to the ``reportgen`` parser."""
    from reportgen.flags import add_setup_flags, positive_count

    p = sub.add_parser("trace", help="run the real training step on storage-less tensors and replay its "
                                     "allocations through a model of the CUDA caching allocator (no GPU)",
                       description="Build the model from its config on the meta device, run the measuring "
                                   "harness's training step (forward, loss, backward, optimizer step), record "
                                   "every allocation and free, and replay them through a simulation of "
                                   "PyTorch's CUDA caching allocator. Numbers are labelled traced.")
    add_setup_flags(p)
    _add_torchtune_recipe(p)
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps traced before the recorded one (the step the harness would time)")
    p.add_argument("--lengths", type=Path, default=None, metavar="FILE",
                   help="the dataset's sample lengths in tokens (as reportgen estimate --lengths): trace the step at "
                        "each padded length the batches take and replay --steps steps of lengths drawn from the file "
                        "through one allocator, beside the analytic answer of estimate --lengths")
    p.add_argument("--steps", type=positive_count, default=None, metavar="N",
                   help=f"with --lengths: steps replayed (default {GROWTH_STEP}, at most {MAX_STEPS:,})")
    p.add_argument("--seed", type=int, default=None, help="with --lengths: the seed the batches are drawn with (default 0)")
    p.set_defaults(func=cmd_trace)


#: ``--recipe``'s choice of this command alone: torchtune's own recipe, read from ``--from`` (``trace/torchtune_recipe.py``)
TORCHTUNE = "torchtune"


def _add_torchtune_recipe(p) -> None:
    """``--recipe torchtune``, beside the setup's recipes: the setup stays the file's (recipe loop, as
    ``configs/torchtune.py`` reads it for the estimate) and the step is torchtune's recipe."""
    action = next(a for a in p._actions if a.dest == "recipe")
    action.choices = [*action.choices, TORCHTUNE]
    action.help += (f"; {TORCHTUNE} (trace only, with --from a torchtune config): torchtune 0.6.1's own "
                    "lora_finetune_single_device recipe on the meta device, beside the estimate of the same file")


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

    torchtune = args.recipe == TORCHTUNE
    if torchtune:
        args.recipe = None  # the setup is the file's (recipe loop); the step is torchtune's recipe
        _check_torchtune_file(args)
    from reportgen.flags import refuse_beside_lengths

    refuse_beside_lengths(args)
    setup = setup_from_args(args)
    lengths = _read_lengths(args)
    if lengths is not None:
        from reportgen.estimate.lengths import apply_lengths

        setup = apply_lengths(setup, lengths, seq_given=args.seq is not None or args.from_file is not None)
    gpu = catalog.load_gpu(args.gpu)
    if torchtune:
        from reportgen.trace.torchtune_recipe import check_torchtune_traced

        check_torchtune_traced(setup)
        if lengths is not None:
            raise UserError("--lengths: replays the harness's loop steps, not torchtune's recipe",
                            hint="drop --lengths, or --recipe loop")
    check_traceable(setup)
    from reportgen.trace.runner import check_recipe_traced

    check_recipe_traced(setup, torchtune_recipe=torchtune)
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
    if lengths is not None:
        return _trace_lengths(args, spec, gpu, setup, lengths)
    if torchtune:
        return _trace_torchtune(args, spec, gpu, setup)
    from reportgen.trace.result import trace_case
    from reportgen.trace.runner import recipe_context
    from reportgen.trace.sft import recipe_dict

    with recipe_context(setup):  # the trainer's step for recipes trainer, trl-sft and grpo
        result = trace_case(spec, gpu, setup, warmup=args.warmup)
        d = recipe_dict(setup, result.as_dict())
        grpo = grpo_beside_estimate(spec, gpu, setup, d) if setup.recipe.value == "grpo" else None
        if args.format == "json":
            print(json.dumps(with_verdict_fields({**d, **({"grpo": grpo} if grpo else {})}), indent=2,
                             sort_keys=True))
            return 0
        from reportgen.views.trace import print_grpo_agreement, print_trace

        print_trace(result, gpu)
        if grpo:
            print_grpo_agreement(grpo)
    return 0


def _check_torchtune_file(args: argparse.Namespace) -> None:
    """``--recipe torchtune`` reads the recipe's config: ``--from`` must be a torchtune file."""
    from reportgen.errors import UserError

    if args.from_file is None:
        raise UserError("--recipe torchtune: runs torchtune's recipe from its config", hint="add --from CONFIG.yaml "
                        "(a tune run config, e.g. llama3_2/1B_lora_single_device.yaml)")
    from reportgen.configs import translate_file

    tool = translate_file(args.from_file).tool
    if tool != "torchtune":
        raise UserError(f"--recipe torchtune: {args.from_file} is a {tool} config, not torchtune's",
                        hint="--from a tune run config, or drop --recipe torchtune")


def _trace_torchtune(args: argparse.Namespace, spec, gpu, setup) -> int:
    """torchtune's recipe traced (``trace/torchtune_recipe.py``), beside the estimate of the same setup."""
    from reportgen.trace.result import trace_case
    from reportgen.trace.torchtune_recipe import torchtune_dict, torchtune_trace

    with torchtune_trace(setup, args.from_file):
        result = trace_case(spec, gpu, setup, warmup=args.warmup)
        d = torchtune_dict(spec, gpu, setup, result.as_dict())
    if args.format == "json":
        print(json.dumps(with_verdict_fields(d), indent=2, sort_keys=True))
        return 0
    from reportgen.views.trace import print_torchtune_agreement, print_trace

    print_trace(result, gpu)
    print_torchtune_agreement(d["torchtune"])
    return 0


def grpo_beside_estimate(spec, gpu, setup, d: dict) -> dict:
    """The traced GRPO step's phases beside ``estimate/grpo.grpo_memory``'s (``agreement.grpo_agreement``)."""
    from reportgen.estimate.grpo import grpo_memory
    from reportgen.trace.agreement import grpo_agreement

    mem, _ = grpo_memory(spec, setup, gpu)
    return grpo_agreement(d["timeline"], d["memory"]["peak_allocated"], mem.phases, mem.peak_allocated)


def _read_lengths(args: argparse.Namespace):
    """``--lengths``' file read (``datalengths.read_lengths``: a bad file is an error naming its line), with
    ``--steps`` checked; None without ``--lengths``."""
    from reportgen.errors import UserError

    if args.lengths is None:
        if args.steps is not None:
            raise UserError("--steps: replays steps of the lengths in --lengths FILE", hint="add --lengths FILE")
        if args.seed is not None:
            raise UserError("--seed: draws the batches of --lengths FILE", hint="add --lengths FILE")
        return None
    if args.steps is not None and args.steps > MAX_STEPS:
        raise UserError(f"--steps: {args.steps:,} steps is more than the {MAX_STEPS:,} the replay runs",
                        hint=f"--steps {GROWTH_STEP}: the reserve grows with the longest batch seen, which a few "
                             "hundred steps reach")
    from reportgen.datalengths import read_lengths

    return read_lengths(args.lengths)


def _trace_lengths(args: argparse.Namespace, spec, gpu, setup, lengths) -> int:
    """``--lengths``: the multi-step replay (``trace/multistep.py``) as JSON or a few lines."""
    from reportgen.errors import UserError

    if setup.recipe.value == "grpo":
        raise UserError("reportgen trace --lengths: recipe grpo: a GRPO step's lengths are its prompts' and the "
                        "completions it generates, not the dataset's padded samples", hint="--recipe loop, trainer "
                        "or trl-sft")
    from reportgen.fingerprint import steps_trace_hash
    from reportgen.trace.multistep import lengths_replay
    from reportgen.trace.runner import recipe_context

    with recipe_context(setup):  # the trainer's step for recipes trainer and trl-sft (trace/sft.py)
        d = lengths_replay(spec, gpu, setup, lengths, args.steps or GROWTH_STEP, seed=args.seed or 0, warmup=args.warmup)
    d = {"kind": "traced", "model": spec.name, "gpu": gpu.key, "setup": setup.model_dump(mode="json"),
         "file": str(args.lengths), **d, "trace_hash": steps_trace_hash(recipe=setup.recipe.value)}
    if args.format == "json":
        print(json.dumps(d, indent=2, sort_keys=True))
        return 0
    from reportgen.views.trace import print_lengths_replay

    print_lengths_replay(d, gpu)
    return 0
