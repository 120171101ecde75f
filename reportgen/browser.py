"""What the site's calculator runs in the browser (under Pyodide); it runs the same on CPython.

The calculator page (``docs/javascripts/calculator.js``) sends its form as JSON to ``run``, which

1. turns the form into the argument list of ``reportgen estimate`` (``argv``: the flags that differ
   from their defaults, in the order of ``TrainingSetup.model_fields``);
2. parses it with the CLI's own ``estimate`` parser (``reportgen.cli.add_estimate_parser``) and runs
   the CLI's own command (``reportgen.cli.run_command``) with ``--format json``;
3. returns that JSON text as the CLI printed it, the command line, and ``view``: the JSON laid out as
   rows of strings formatted by ``reportgen.format`` (the page only places them).

So the numbers on the page are the ones ``reportgen estimate --format json`` prints for the command
line shown beside them, and nothing here estimates. A user error (a bad value, a malformed pasted
config) comes back as the CLI's message, never as a traceback.

A pasted config.json is written to ``config.json`` in the working directory and passed as
``--model config.json``: the command line works as shown once a reader saves the config under that
name. A pasted TRL or Axolotl training config is written to ``train.yaml`` and passed as ``--from
train.yaml`` (``reportgen.configs``): it gives the model and the setup, so of the form's setup only
the number of GPUs and the sharding are sent (the launcher's, not the file's); the answer carries
``from``, the lines the CLI prints about each key of the file. Beside it, a pasted accelerate launch file
(``accelerate launch --config_file FILE``) is written to ``launch.yaml`` and passed as ``--launch launch.yaml``
(``reportgen.configs.launch``): it is the launcher, so its processes and sharding replace the form's GPUs, and
``from`` ends with the lines about its keys. Without a training config the launch file is not sent (the CLI
refuses ``--launch`` without ``--from``).
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
from contextlib import redirect_stderr, redirect_stdout
from enum import Enum
from pathlib import Path

from reportgen import catalog, cli, flags
from reportgen.flags import DEFAULT_TRAIN_TOKENS
from reportgen.estimate.memory import TOTALS  # keys of the ``memory`` object that are not terms
from reportgen.estimate.run import PHASE_LABELS, PHASES, RUN_ONLY_PHASES
from reportgen.errors import UserError
from reportgen.setup import TrainingSetup
from reportgen.format import GIB, TERM_LABELS, demand_note, gib, money, pct, rate, seconds

#: the file a pasted config.json is written to (relative to the working directory)
PASTED = "config.json"
#: the file a pasted TRL or Axolotl config is written to
TRAIN_PASTED = "train.yaml"
#: where a pasted GPU profile (``reportgen profile-gpu``'s YAML) is written for ``--gpu-profile``
PROFILE_PASTED = "gpu-profile.yaml"
#: where a pasted accelerate launch file is written for ``--launch`` (beside a training config only)
LAUNCH_PASTED = "launch.yaml"
#: the setup fields the form still sends beside a pasted training config (the launcher's choices)
LAUNCHER_FIELDS = ("gpus", "sharding")

_last_pasted: str | None = None
_last_train: str | None = None


class ArgumentError(Exception):
    """What argparse would print before exiting (a value the parser refuses)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse calls it instead of raising; subparsers share the class
        raise ArgumentError(message)


_parser: argparse.ArgumentParser | None = None


def parser() -> argparse.ArgumentParser:
    """``reportgen`` with its ``estimate`` subcommand only (the other subcommands need more than the
    estimator core)."""
    global _parser
    if _parser is None:
        _parser = _Parser(prog="reportgen")
        cli.add_estimate_parser(_parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    return _parser


# ----- the form -> the command line --------------------------------------------------------------
def _is_default(spec, text: str, default) -> bool:
    t = spec.annotation
    try:
        if isinstance(t, type) and issubclass(t, Enum):
            return text == (default.value if default is not None else "")
        if t is str:
            return text.strip() == default
        if t is int:
            return default is not None and int(text) == default
        if t is float:
            return default is not None and float(text) == default
    except ValueError:
        return False
    return False


def _train_tokens_default(text: str) -> bool:
    try:
        return flags.positive_count(text) == DEFAULT_TRAIN_TOKENS
    except argparse.ArgumentTypeError:
        return False


def argv(form: dict) -> list[str]:
    """``reportgen estimate`` arguments for a form: ``model`` (a catalog name) or ``config`` (a
    pasted config.json), ``gpu``, ``gpu_memory`` (optional, e.g. ``48GiB``), ``gpu_profile`` (optional: a
    pasted ``reportgen profile-gpu`` YAML), ``training_config`` (optional: a pasted TRL, Axolotl,
    LLaMA-Factory, ... config), ``launch_config`` (optional, only beside ``training_config``: a pasted
    accelerate launch file, which then gives the GPUs and sharding too), ``train_tokens``
    (optional) and ``setup`` (field -> value; a field left out takes its default)."""
    training = form.get("training_config") is not None
    launched = training and form.get("launch_config") is not None
    model = PASTED if form.get("config") is not None else str(form.get("model") or "")
    out = ["estimate"] + (["--model", model] if model and (form.get("config") is not None or not training) else [])
    out += ["--gpu", str(form.get("gpu") or "")]
    memory = str(form.get("gpu_memory") or "").strip()
    if memory:
        out += ["--gpu-memory", memory]
    if form.get("gpu_profile") is not None:
        out += ["--gpu-profile", PROFILE_PASTED]
    if training:
        out += ["--from", TRAIN_PASTED]
    if launched:
        out += ["--launch", LAUNCH_PASTED]
    default = TrainingSetup()
    setup = form.get("setup") or {}
    for name, spec in TrainingSetup.model_fields.items():
        if name not in setup or (training and (launched or name not in LAUNCHER_FIELDS)):
            continue
        flag, value, d = "--" + name.replace("_", "-"), setup[name], getattr(default, name)
        if spec.annotation is bool:
            if bool(value) != d:
                out.append(flag if value else "--no-" + flag[2:])
            continue
        text = "" if value is None else str(value).strip()
        if (text == "" and spec.optional) or _is_default(spec, text, d):
            continue
        out += [flag, text]
    tokens = str(form.get("train_tokens") or "").strip()
    if tokens and not _train_tokens_default(tokens):
        out += ["--train-tokens", tokens]
    return out


def command_line(args: list[str]) -> str:
    """The shell command for an argument list."""
    return "reportgen " + shlex.join(args)


# ----- running it --------------------------------------------------------------------------------
def _write_pasted(text: str) -> None:
    """Write a pasted config where ``--model config.json`` finds it; a new text drops the catalog's
    cached model of that path."""
    global _last_pasted
    if text != _last_pasted or not Path(PASTED).is_file():
        Path(PASTED).write_text(text)
        catalog.load_model.cache_clear()
        _last_pasted = text


def _write_train(text: str) -> None:
    """Write a pasted TRL or Axolotl config where ``--from train.yaml`` finds it."""
    global _last_train
    if text != _last_train or not Path(TRAIN_PASTED).is_file():
        Path(TRAIN_PASTED).write_text(text)
        _last_train = text


def translation_lines(form: dict) -> list[str]:
    """What ``--from`` prints about each key of the pasted training config, and ``--launch`` about each key of
    the pasted launch file (after a successful run; the CLI's ``flags.translation_from_args``)."""
    from reportgen.configs import translate_file

    gpu = catalog.load_gpu(str(form.get("gpu") or ""))
    t = translate_file(TRAIN_PASTED, bf16_capable=gpu.supports_bf16)
    if LAUNCH_PASTED in argv(form):
        from reportgen.configs import launch

        t = launch.apply(Path(LAUNCH_PASTED), t)
    return t.lines()


def estimate_json(args: list[str]) -> str:
    """What ``reportgen <args> --format json`` prints; raises ``UserError`` or ``ArgumentError``."""
    parsed = parser().parse_args(args + ["--format", "json"])
    buf = io.StringIO()
    with redirect_stdout(buf), redirect_stderr(io.StringIO()):  # --from's report: ``run`` returns it as ``from``
        cli.run_command(parsed)
    return buf.getvalue()


def run(form_json: str) -> str:
    """The page's one call: form JSON in; JSON out with ``command`` and ``argv``, and either
    ``json`` (the CLI's output text) and ``view``, or ``error`` (``message``, ``hint``)."""
    form = json.loads(form_json)
    args = argv(form)
    out: dict = {"argv": args, "command": command_line(args)}
    try:
        if form.get("config") is not None:
            _write_pasted(str(form["config"]))
        if form.get("training_config") is not None:
            _write_train(str(form["training_config"]))
        if form.get("gpu_profile") is not None:
            Path(PROFILE_PASTED).write_text(str(form["gpu_profile"]))
        if LAUNCH_PASTED in args:
            Path(LAUNCH_PASTED).write_text(str(form["launch_config"]))
        text = estimate_json(args)
        out.update(json=text, view=view(json.loads(text)))
        if form.get("training_config") is not None:
            out["from"] = translation_lines(form)
    except UserError as exc:
        out["error"] = {"message": exc.message, "hint": exc.hint}
    except ArgumentError as exc:
        out["error"] = {"message": str(exc), "hint": "see reportgen estimate --help"}
    return json.dumps(out)


# ----- the JSON laid out for the page ------------------------------------------------------------
def _row(key: str, label: str, value: str, note: str = "", **extra) -> dict:
    return {"key": key, "label": label, "value": value, "note": note, **extra}


def _count(x: int | None, none: str) -> str:
    return none if x is None else f"{x:,}"


def _run_rows(run: dict | None, deciding: str) -> list[dict]:
    """One row per phase of the run: what it asks of one GPU, and the node's host RAM term by term."""
    if not run:
        return []
    rows = []
    for name in [p for p in PHASES if p in run["phases"]]:  # the run's order (the JSON's keys are sorted)
        ph = run["phases"][name]
        terms = ", ".join(f"{k.replace('_', ' ')} {gib(b)}" for k, b in ph["host_terms"].items())
        label = PHASE_LABELS.get(name, name) + (" (decides)" if name == deciding and len(run["phases"]) > 1 else "")
        rows.append(_row(f"run.{name}", label, f"{gib(ph['gpu_demand'])} GiB GPU",
                         f"host RAM {gib(ph['host'])} GiB" + (f": {terms}" if terms else "")))
    rows.append(_row("run.not_counted", "host RAM not counted", "", run["not_counted"]))
    return rows


def _grpo_rows(g: dict | None, verdict_phase: str | None = None) -> list[dict]:
    """Recipe grpo (``estimate/grpo.py``): each phase's device memory and seconds per optimizer step, the
    phases that decide the verdict (unless a phase of the run around the step does: ``verdict_phase``) and the
    time, and the largest num_generations that fits."""
    if not g:
        return []
    rows = []
    step_decides = verdict_phase not in RUN_ONLY_PHASES
    for name, secs in g["times"].items():
        mem = g["phases"].get(name)
        marks = [w for w, on in (("decides the verdict", step_decides and name == g["peak_phase"]),
                                 ("dominates the time", name == g["time_phase"])) if on]
        rows.append(_row(f"grpo.{name}", name, "-" if mem is None else f"{gib(mem)} GiB",
                         f"{seconds(secs) if secs else '-'} per step" + (f"; {', '.join(marks)}" if marks else "")))
    n = g.get("max_num_generations")
    rows.append(_row("grpo.max_num_generations", "largest num_generations that fits", _count(n, "none fits")))
    if "max_completion_length" in g:
        rows.append(_row("grpo.max_completion_length", "longest completion that fits",
                         _count(g["max_completion_length"], "none fits")))
    if g.get("turn_down"):
        rows.append(_row("grpo.turn_down", "to make it fit, one of", ", ".join(
            f"{x['field'].replace('_', ' ')} {x['value']}" for x in g["turn_down"])))
    return rows


def view(d: dict) -> dict:
    """``reportgen estimate --format json``'s object as titled sections of rows of strings (the
    terminal table's content, ``reportgen.views.terminal``); each row has a stable ``key``."""
    setup = TrainingSetup.model_validate(d["setup"])
    gpu = catalog.load_gpu(d["gpu"])
    mem, t, params = d["memory"], d["time"], d["params"]
    capacity = f"{d['capacity'] / GIB:.1f} GiB"

    terms = [k for k in TERM_LABELS if k in mem] + sorted(k for k in mem if k not in TERM_LABELS and k not in TOTALS)
    shown = [k for k in terms if mem[k]]
    biggest = max((mem[k] for k in shown), default=0) or 1
    memory = [_row(f"memory.{k}", TERM_LABELS.get(k, k.replace("_", " ")), gib(mem[k]), bar=round(mem[k] / biggest, 4))
              for k in shown]

    totals = [
        _row("memory.peak_allocated", "peak allocated", gib(mem["peak_allocated"]),
             f"torch.cuda.max_memory_allocated, at {d['peak_phase']}"),
        _row("memory.peak_reserved", "peak reserved", gib(mem["peak_reserved"]), "torch.cuda.max_memory_reserved"),
        _row("memory.device_total", "device total", gib(mem["device_total"]), "nvidia-smi"),
    ]
    if mem.get("cache_released"):
        totals.append(_row("memory.cache_released", "cached blocks released to fit", gib(mem["cache_released"]),
                           "reserved would pass the card without it"))
    if d["demand"] != mem["device_total"]:
        totals.append(_row("demand", "asked of the card", gib(d["demand"]), demand_note(mem)))
    band = d.get("band")
    if band:
        lo, hi = band["demand_range"]
        totals.append(_row("band.demand_range", "expected range (error band)", f"{gib(lo)}-{gib(hi)}",
                           f"{100 * band['lo']:+.0f}% to {100 * band['hi']:+.0f}%, from {band['n']} comparisons"))
    totals.append(_row("verdict", "verdict", d["verdict"], f"margin {d['margin'] / GIB:+.2f} GiB of {capacity}"))
    if mem.get("host_ram"):
        totals.append(_row("memory.host_ram", "host RAM (offload)", gib(mem["host_ram"])))

    hours = t.get("train_hours")
    time_rows = [
        _row("time.step_s", "step time", seconds(t["step_s"])),
        _row("time.tokens_per_s", "tokens/s (all GPUs)", rate(t["tokens_per_s"])),
        _row("time.mfu", "MFU (PaLM model FLOPs)", pct(t["mfu"])),
        _row("time.hfu", "HFU (FLOPs the kernels execute)", pct(t["hfu"])),
        _row("time.bound", "bound by", t["bound"] or "-"),
        _row("time.model_flops_per_token", "model FLOPs per token", f"{t['model_flops_per_token'] / 1e9:.1f} GFLOP"),
        _row("time.hardware_flops_per_token", "hardware FLOPs per token",
             f"{t['hardware_flops_per_token'] / 1e9:.1f} GFLOP"),
        _row("time.train_hours", f"hours for {t['train_tokens'] / 1e6:,.0f}M tokens",
             "-" if hours is None else f"{hours:.1f} h"),
        _row("time.train_dollars", f"dollars for {t['train_tokens'] / 1e6:,.0f}M tokens", money(t.get("train_dollars")),
             "" if t.get("train_dollars") is not None else "the GPU catalog has no price for this card"),
    ]
    limit = d.get("context_limit")
    none = f"none fits (batch {setup.batch}, seq {setup.seq:,}: {d['verdict']})"
    reverse = [] if d.get("grpo") else [  # GRPO's reverse question is num_generations (its own section)
        _row("max_batch", f"largest micro-batch that fits at seq {setup.seq:,}", _count(d["max_batch"], none)),
        _row("max_seq", f"longest sequence that fits at batch {setup.batch}", _count(d["max_seq"], none),
             f"the model's context is {limit:,}" if limit else ""),
    ]
    share = 100 * params["trainable"] / params["total"] if params["total"] else 0.0
    return {
        "title": f"{d['model']} on {gpu.name} ({capacity}): {setup.short()}",
        "params": f"parameters {params['total']:,}, trainable {params['trainable']:,} ({share:.2f}%)",
        "verdict": d["verdict"],
        "verdict_text": d["verdict_text"],
        "sections": [section for section in [
            {"id": "memory", "title": "Memory on one GPU, by term (GiB = 2^30 bytes)", "rows": memory},
            {"id": "totals", "title": "Totals and fit", "rows": totals},
            {"id": "run", "title": "The whole run: each phase's peak on one GPU and in the node's host RAM",
             "rows": _run_rows(d.get("run"), d.get("verdict_phase", "train"))},
            {"id": "grpo", "title": "GRPO: each phase of the step (recipe grpo)",
             "rows": _grpo_rows(d.get("grpo"), d.get("verdict_phase"))},
            {"id": "time", "title": "Time" + (" if it fit (it does not: the step would run out of memory)"
                                              if d["verdict"] == "does not fit" else "")
             + " (estimated kernel by kernel: GPU, host and transfers)", "rows": time_rows,
             "dim": d["verdict"] == "does not fit"},  # as the terminal says it, and greyed as the site's tables
            {"id": "reverse", "title": "Largest batch and longest sequence that fit (the verdict \"fits\": "
                                        "the whole error band within the card)", "rows": reverse},
        ] if section["rows"]],
        "notes": list(d["notes"]),
    }
