"""The setup flags every command shares (``estimate``, ``measure``, ``trace``, ``advise``; the calculator
runs ``estimate``'s parser in the browser): one flag per ``TrainingSetup`` field, ``--from`` a TRL or
Axolotl config, and turning the parsed flags into a setup. Below the CLI: the command modules and the
browser import this, and nothing here imports a command (ARCHITECTURE.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from enum import Enum

from reportgen import catalog
from reportgen.errors import UserError
from reportgen.setup import TrainingSetup

#: ``reportgen estimate``'s default number of training tokens (its ``--train-tokens``)
DEFAULT_TRAIN_TOKENS = 100_000_000
#: the most training tokens a flag or a sweep file takes: 10^15, a hundred times the largest
#: pre-training runs published (Llama 3: 15.6e12 tokens), so a typo such as ``1e30`` is refused
MAX_TRAIN_TOKENS = 10**15


def add_setup_flags(p: argparse.ArgumentParser) -> None:
    """The flags of one TrainingSetup, shared by ``estimate``, ``measure``, ``trace`` and ``advise``:
    one per field of ``TrainingSetup.model_fields`` (its choices, bounds and meaning), so a new setup
    field is a new flag without another edit here. Every setup flag defaults to None (not given):
    ``setup_from_args`` fills in the setup's defaults, or the ``--from`` config's values, so a flag
    given beside ``--from`` overrides the file (``--no-FLAG`` turns off a switch the file turns on)."""
    p.add_argument("--model", default=None, type=named,
                   help="catalog name (see `reportgen models`) or path to a config.json (default: --from's model)")
    p.add_argument("--gpu", required=True, type=named, help="catalog name (see `reportgen gpus`)")
    p.add_argument("--gpu-memory", default=None, metavar="SIZE",
                   help="the card's memory instead of the catalog's, e.g. 48GiB (its speed stays the --gpu card's)")
    add_from_flag(p)
    default = TrainingSetup()
    for name, spec in TrainingSetup.model_fields.items():
        flag = "--" + name.replace("_", "-")
        value = getattr(default, name)
        t = spec.annotation
        shown = f" (default {value.value if isinstance(value, Enum) else value})" if value is not None else ""
        if isinstance(t, type) and issubclass(t, Enum):
            p.add_argument(flag, choices=[m.value for m in t], default=None, help=spec.description + shown)
        elif t is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=spec.description)
        else:
            p.add_argument(flag, type=t, default=None, help=spec.description + shown)


def add_gpu_profile_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu-profile", type=Path, default=None, metavar="FILE",
                   help="a profile of your own card (and host) written by `reportgen profile-gpu`: step times use "
                        "its measured rates instead of the datasheet's")


def add_host_cpu_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host-cpu", default=None, metavar="NAME", type=named,
                   help="the CPU of the machine that runs the training loop (see `reportgen cpus`): the host's "
                        "dispatch is scaled by its single-thread speed (default: a desktop CPU for GeForce and "
                        "workstation cards, a server CPU for data-center cards; a --gpu-profile's measured host wins)")


def gpu_from_args(args: argparse.Namespace):
    """The ``--gpu`` card (``card@SIZE`` with ``--gpu-memory``), on the ``--host-cpu`` host when given (a
    ``UserError`` naming the close names for one the catalog lacks), priced with ``--gpu-profile`` when
    given (a ``UserError`` for a profile of another card model: ``gpu_profile.attach``)."""
    from reportgen.gpu_profile import on_machine

    host = None
    if getattr(args, "host_cpu", None):
        try:
            host = catalog.load_cpu(args.host_cpu)
        except UserError as exc:
            exc.message = f"--host-cpu: {exc.message}"
            raise
    return on_machine(catalog.load_gpu(args.gpu), host, getattr(args, "gpu_profile", None))


def add_from_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="from_file", type=Path, default=None, metavar="CONFIG",
                   help="a TRL (trl sft --config), Axolotl, LLaMA-Factory (llamafactory-cli train) or torchtune "
                        "(tune run) YAML/JSON config, or unsloth's arguments as YAML (sections "
                        "FastLanguageModel.from_pretrained, FastLanguageModel.get_peft_model, SFTConfig): its model and "
                        "setup (the docs' configs page lists what each "
                        "key becomes); setup flags given beside it "
                        "override the file's values")
    p.add_argument("--launch", dest="launch_file", type=Path, default=None, metavar="FILE",
                   help="the accelerate config the run is launched with (accelerate launch --config_file FILE, e.g. "
                        "LLaMA-Factory's examples/accelerate/fsdp_config.yaml), beside --from: num_processes is "
                        "--gpus, distributed_type FSDP / DEEPSPEED and its section the sharding")


#: the setup's fields in the CLI's order (method first)
SETUP_FIELDS = tuple(TrainingSetup.model_fields)


def translation_from_args(args: argparse.Namespace):
    """``--from``'s translation (None without it); sets ``args.model`` to the file's model unless
    ``--model`` was given, and prints what became of each key to stderr."""
    if getattr(args, "from_file", None) is None:
        if getattr(args, "launch_file", None) is not None:
            raise UserError("--launch: needs --from CONFIG (the training config it launches)",
                            hint="e.g. --from lf.yaml --launch examples/accelerate/fsdp_config.yaml")
        return None
    from reportgen.configs import translate_file

    gpu = catalog.load_gpu(args.gpu) if getattr(args, "gpu", None) else None
    t = translate_file(args.from_file, bf16_capable=gpu.supports_bf16 if gpu else True)
    if getattr(args, "launch_file", None) is not None:
        from reportgen.configs import launch

        t = launch.apply(args.launch_file, t)
    if args.model is None:
        if t.model is None:
            if t.model_missing:
                raise UserError(f"{t.model_missing}", hint="pass --model ORG/NAME (the checkpoint's Hub id) or --model "
                                "path/to/config.json beside --from; reportgen models lists the catalog")
            key = "base_model" if t.tool == "axolotl" else "model_name_or_path"
            raise UserError(f"{args.from_file}: names no model ({key})", hint="add it, or pass --model")
        args.model = t.model
    print_translation(t)
    return t


def print_translation(t) -> None:
    """``--from``'s report on stderr (plain where rich is absent: the calculator's bundle)."""
    try:
        from rich.console import Console
        from rich.markup import escape
    except ImportError:
        for line in t.lines():
            print(line, file=sys.stderr)
        return
    console = Console(stderr=True)
    for line in t.lines():
        style = "yellow" if line.startswith("warning") else "dim" if line.startswith("ignored") else ""
        text = escape(line)
        console.print(f"[{style}]{text}[/]" if style else text, highlight=False, soft_wrap=True)


def _refuse_flags_of_other_methods(explicit: dict, method: str, method_fields: dict) -> None:
    """A setup flag the user typed that the method ignores (``--lora-rank`` with full fine-tuning) is
    refused: it would change nothing, and is almost surely a mistake."""
    for name in explicit:
        methods = method_fields.get(name, ())
        if methods and method not in methods:
            flag = "--" + name.replace("_", "-")
            only = " or ".join(f"--method {m}" for m in methods)
            raise UserError(f"{flag}: applies only to {only}; with --method {method} it changes nothing",
                            hint=f"drop {flag}, or pass {only}")


def grpo_lengths(values: dict) -> dict:
    """Recipe grpo: a prompt length given without ``seq`` sets ``seq`` to prompt + completion (TRL's
    rows, ``estimate/grpo.py``); with ``seq`` the setup checks that they agree. Flags alone: beside a
    ``--from`` file ``configs.setup_from`` adds the file's lengths."""
    if values.get("max_prompt_length") is not None and "seq" not in values:
        completion = values.get("max_completion_length", TrainingSetup.max_completion_length)
        return {**values, "seq": values["max_prompt_length"] + completion}
    return values


def setup_from_args(args: argparse.Namespace):
    from reportgen.setup import METHOD_FIELDS, SetupError, TrainingSetup

    explicit = {f: getattr(args, f) for f in SETUP_FIELDS if getattr(args, f, None) is not None}
    translation = translation_from_args(args)
    if translation is not None:
        from reportgen.configs import setup_from

        setup = setup_from(translation, explicit, model=args.model)
        _refuse_flags_of_other_methods(explicit, setup.method.value, METHOD_FIELDS)
        return setup
    if args.model is None:
        raise UserError("--model is required (or --from CONFIG)",
                        hint="e.g. --model llama-3.1-8b, or --from sft.yaml (a TRL or Axolotl config)")
    _refuse_flags_of_other_methods(explicit, str(explicit.get("method", "full")), METHOD_FIELDS)
    explicit = grpo_lengths(explicit)  # beside --from, configs.setup_from does it with the file's lengths
    try:
        return TrainingSetup(**explicit)
    except SetupError as exc:
        raise flag_error(exc) from None


def flag_error(exc) -> UserError:
    """A ``SetupError`` as the user's flag names it: ``--eval-seq: must be >= 8 (got 4)``."""
    return UserError(f"{'--' + exc.field.replace('_', '-') if exc.field else 'setup'}: {exc.message}")


def checked_field(name: str, value):
    """``value`` as the setup's field ``name`` accepts it (``TrainingSetup.model_fields``), else the
    ``UserError`` its flag gives: ``--seq: must be <= 1048576 (got 2000000)``."""
    from reportgen.setup import SetupError

    try:
        return TrainingSetup.model_fields[name].check(name, value)
    except SetupError as exc:
        raise flag_error(exc) from None


def refuse_beside_lengths(args: argparse.Namespace) -> None:
    """``--seq-mean``/``--seq-padded`` beside ``--lengths FILE``, which sets both from the samples
    (``estimate/lengths.apply_lengths``): one would silently replace the other, so neither is taken."""
    if getattr(args, "lengths", None) is None:
        return
    for field in ("seq_mean", "seq_padded"):
        if getattr(args, field, None) is not None:
            flag = "--" + field.replace("_", "-")
            raise UserError(f"{flag}: --lengths {args.lengths} gives it, from the samples' lengths",
                            hint=f"give {flag} or --lengths, not both")


def named(text: str) -> str:
    """An argparse type: a name or path that is not empty (``--model ''`` was looked for as
    ``config.json``, ``--host-cpu ''`` taken as the default CPU)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: give a name (reportgen models, gpus and cpus list the catalogs)")
    return text


def train_tokens(text: str) -> int:
    """An argparse type: a number of training tokens, 1 to ``MAX_TRAIN_TOKENS``, also written as ``1e8``."""
    value = positive_count(text)
    if value > MAX_TRAIN_TOKENS:
        raise argparse.ArgumentTypeError(f"{text!r}: at most 1e15 tokens (a hundred times a frontier "
                                         "model's pre-training)")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1 or more")
    return value


def positive_count(text: str) -> int:
    """An argparse type: a whole number >= 1, also written as ``1e8``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 1 or value == float("inf") or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of 1 or more (1e3 is 1,000)")
    return int(value)


def form_fields() -> list[dict]:
    """Every setup field as the form shows it: flag, kind, choices, bounds, default, meaning (from
    ``TrainingSetup.model_fields``, like the CLI's flags)."""
    default = TrainingSetup()
    out = []
    for name, spec in TrainingSetup.model_fields.items():
        t = spec.annotation
        value = getattr(default, name)
        field = {"name": name, "flag": "--" + name.replace("_", "-"), "description": spec.description,
                 "optional": spec.optional, "min": spec.ge, "max": spec.le, "below": spec.lt}
        if isinstance(t, type) and issubclass(t, Enum):
            # an optional choice (None: the recipe's default) is offered as "" first
            field.update(kind="enum", choices=([""] if spec.optional else []) + [m.value for m in t],
                         default=value.value if value is not None else "")
        elif t is bool:
            field.update(kind="bool", default=value)
        elif t is str:
            field.update(kind="str", default=value, pattern=spec.pattern)
        else:
            field.update(kind="int" if t is int else "float", default=value)
        out.append(field)
    return out
