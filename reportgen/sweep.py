"""Sweep files: YAML -> validated pydantic models -> a list of cases with stable ids.

A sweep has one or more ``grids``. In a grid every key is ``model``, ``gpu`` or a TrainingSetup
field; a list expands into one cell per value (the cartesian product over all lists). A grid's
``from`` (a TRL or Axolotl config, or a list of them, relative to the sweep file) gives each cell
the config's model and setup, as ``reportgen estimate --from`` reads it (and ``launch``, an accelerate
launch file beside it, its GPUs and sharding, as ``--launch``); the grid's other keys
override the file's values, as flags beside ``--from`` do. The case stores the resulting setup. ``exclude``
rules drop every cell that matches all keys of a rule (a rule value may be a list: any of them).
``override`` rules set fields on matching cells (e.g. fp16 on a T4, which has no bf16).

Errors name the file, the line, the key and the allowed values; the CLI exits with status 2
and writes nothing. Limits that protect the machine (README, "Limits"): the file's size, values and
nesting as ``yamlfile.py`` reads any YAML a user wrote (duplicate keys are an error there too);
at most ``DEFAULT_MAX_CASES`` cases unless the caller (``reportgen sweep --max-cases N``) allows more.
"""

from __future__ import annotations

import difflib
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reportgen import catalog, hub, yamlfile
from reportgen.flags import DEFAULT_TRAIN_TOKENS, MAX_TRAIN_TOKENS
from reportgen.measure import defaults as D
from reportgen.errors import UserError
from reportgen.results import case_id, short_hash
from reportgen.setup import METHOD_FIELDS, SetupError, TrainingSetup

#: the most cases a sweep may expand to unless the caller allows more (``--max-cases``): 10,000
#: cases estimate in about 15 s, take 40 MB of result files and render in about 15 s
DEFAULT_MAX_CASES = 10_000

#: besides the setup's fields: the model, the card, and the card's memory when it differs from the
#: catalog's (``gpu_memory: 48GiB`` -> the case's gpu is ``rtx-4090@48GiB``)
CASE_KEYS = {"model", "gpu", "gpu_memory"} | set(TrainingSetup.model_fields)


#: ``measure.max_steps`` when a sweep does not set it (at least ``steps``)
DEFAULT_MAX_STEPS = D.MAX_STEPS


class MeasureConfig(BaseModel):
    """A sweep's ``measure:`` settings. Timed steps (``reportgen/measure/timing.py``): at least
    ``steps``, then on until the median's 95 % confidence interval lies within ``target_rel_ci`` of
    it, ``max_steps`` ran, or the timed steps reach ``max_timed_s`` seconds; ``max_steps: <steps>``
    is a fixed count."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    warmup: int = Field(D.WARMUP, ge=0)
    #: the minimum number of timed steps
    steps: int = Field(D.STEPS, ge=1)
    #: the most timed steps (default: the larger of ``steps`` and ``DEFAULT_MAX_STEPS``)
    max_steps: int | None = Field(None, ge=1)
    #: time cap on the timed steps' wall times, seconds (null: no cap)
    max_timed_s: float | None = Field(D.MAX_TIMED_S, gt=0)
    #: stop once the median is known to +- this fraction at 95 % (null: no early stop)
    target_rel_ci: float | None = Field(D.TARGET_REL_CI, gt=0, lt=1)
    timeout_s: int = Field(D.TIMEOUT_S, ge=10)
    #: emulate this GPU's memory on a larger card (torch.cuda.set_per_process_memory_fraction)
    cap_to_gpu: bool = False
    #: run ``profile_steps`` more steps under torch.profiler after the timed ones (trace + per-step figures)
    profile: bool = False
    profile_steps: int = Field(D.PROFILE_STEPS, ge=1)

    @model_validator(mode="after")
    def _steps_fit(self) -> "MeasureConfig":
        if self.max_steps is not None and self.max_steps < self.steps:
            raise ValueError(f"max_steps ({self.max_steps}) is below steps ({self.steps}), the minimum number of "
                             f"timed steps; write max_steps: {self.steps} or more (equal to steps: a fixed count)")
        return self

    @property
    def max_steps_or_default(self) -> int:
        return self.max_steps if self.max_steps is not None else max(self.steps, DEFAULT_MAX_STEPS)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    when: dict[str, Any]
    set: dict[str, Any]


class SweepFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    description: str = ""
    grids: list[dict[str, Any]] = Field(min_length=1)
    exclude: list[dict[str, Any]] = []
    override: list[Rule] = []
    measure: MeasureConfig = MeasureConfig()
    train_tokens: int = Field(DEFAULT_TRAIN_TOKENS, ge=1, le=MAX_TRAIN_TOKENS)
    #: profiles of real cards (``reportgen profile-gpu``): each card's cases are priced with its profile
    gpu_profiles: list[str] = []
    #: the host CPU (``reportgen cpus``) every case's dispatch is priced for, as ``--host-cpu``; None: each
    #: card's default host (a card's ``gpu_profiles`` entry, which measured its own host, wins)
    host_cpu: str | None = None

    @field_validator("train_tokens", mode="before")
    @classmethod
    def _written_as_1e8(cls, value: Any) -> Any:
        """``train_tokens: 1e8`` is a string to YAML 1.1 (its floats need a dot: ``1.0e+8``); read it as
        the CLI's ``--train-tokens 1e8`` does."""
        if isinstance(value, str):
            try:
                number = float(value.replace("_", ""))
            except ValueError:
                return value
            return int(number) if number.is_integer() and abs(number) <= MAX_TRAIN_TOKENS else number
        return value


@dataclass(frozen=True)
class Case:
    model: str
    gpu: str
    setup: TrainingSetup

    @property
    def id(self) -> str:
        return case_id(self.model, self.gpu, self.setup.model_dump(mode="json"))

    def as_dict(self) -> dict:
        return {"model": self.model, "gpu": self.gpu, "setup": self.setup.model_dump(mode="json")}


@dataclass(frozen=True)
class Sweep:
    path: Path
    spec: SweepFile
    cases: list[Case]
    content_hash: str
    #: legal input that is almost surely a mistake (a rule that matches no cell), and what the configs of
    #: ``from`` keys left unread (unknown keys, keys that change the step but are not modelled), to print
    warnings: tuple[str, ...] = ()
    #: card -> (profile file, hash of its bytes) of ``gpu_profiles``: that card's cases use the profile
    profiles: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name


# ----- reading the file --------------------------------------------------------------------------
SWEEP_FILE = yamlfile.Kind(noun="sweep file", what_it_holds="a sweep lists models, GPUs and setup values; a grid "
                           "expands them", example="see sweeps/*.yaml for examples",
                           repeated_key="write each key once; a list gives several values: key: [a, b]")


# ----- YAML with line numbers -------------------------------------------------------------------
def _line_map(node: yaml.Node, path: tuple = ()) -> dict[tuple, int]:
    """Map each key path (tuple of keys/indices) to its 1-based line in the file."""
    lines = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = path + (key.value,)
            lines[sub] = key.start_mark.line + 1
            lines.update({k: v for k, v in _line_map(value, sub).items() if k != sub})
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_line_map(item, path + (i,)))
    return lines


def _line_of(lines: dict[tuple, int], loc: tuple) -> int:
    loc = tuple(loc)
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def _allowed(field: str) -> str:
    info = TrainingSetup.model_fields.get(field)
    if info is None:
        return ""
    ann = info.annotation
    if isinstance(ann, type) and hasattr(ann, "__members__"):
        return "allowed: " + ", ".join(m.value for m in ann)  # type: ignore[attr-defined]
    kind = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}.get(ann, str(ann))
    low = None if info.ge is None else f"{info.ge:g}"
    high = None if info.le is None and info.lt is None else (f"{info.le:g}" if info.le is not None else f"below {info.lt:g}")
    bounds = f" from {low} to {high}" if low and high else f" of {low} or more" if low else f" up to {high}" if high else ""
    return f"{field}: {kind}{bounds}" + (f" ({info.description})" if info.description else "")


def _did_you_mean(key: str, known) -> str:
    close = difflib.get_close_matches(str(key), list(known), n=3, cutoff=0.6)
    return ("did you mean " + " or ".join(repr(c) for c in close) + "? ") if close else ""


def _unknown_keys(path: Path, lines: dict, raw: dict, known, where: tuple, what: str) -> None:
    for key in raw:
        if key not in known:
            raise UserError(f"{path}:{_line_of(lines, where + (key,))}: {what}: unknown key {key!r}",
                            hint=_did_you_mean(key, known) + f"{what} keys: " + ", ".join(known))


def _content_hash(raw) -> str:
    try:
        return short_hash(raw, 12)
    except (TypeError, ValueError):  # a date or another non-JSON value YAML constructed: hash its text
        import hashlib
        import json

        return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:12]


#: what a top-level key of a sweep file takes, as its error's hint
FILE_KEY_HINTS = {
    "name": "name: lower-case letters, digits, - and _ (it names the results folder), e.g. name: my-sweep",
    "train_tokens": "train_tokens: a whole number of tokens from 1 to 1e15, e.g. train_tokens: 1e8",
    "grids": "grids: a list of mappings, e.g. grids: [{model: [llama-3.2-1b], gpu: [rtx-4090]}]",
    "exclude": "exclude: a list of mappings of key: value a cell must not match",
    "override": "override: a list of {when: {key: value}, set: {key: value}}",
    "gpu_profiles": "gpu_profiles: a list of profile files written by reportgen profile-gpu",
    "host_cpu": "host_cpu: a name from reportgen cpus",
    "description": "description: one line of text",
}


def _file_hint(loc: tuple) -> str:
    """The hint of a sweep file's value pydantic refused at ``loc``: what that key takes."""
    if loc and loc[0] == "measure":
        return "measure keys: " + ", ".join(MeasureConfig.model_fields)
    return FILE_KEY_HINTS.get(str(loc[0]) if loc else "", "top-level keys: " + ", ".join(SweepFile.model_fields))


def load_sweep(path: str | Path, max_cases: int | None = DEFAULT_MAX_CASES) -> Sweep:
    """Read, check and expand a sweep file. ``max_cases``: refuse a sweep of more cases (None: no limit)."""
    path = Path(path)
    node, raw = yamlfile.load(path, SWEEP_FILE)
    if not isinstance(raw, dict):
        raise UserError(f"{path}:1: a sweep file is a mapping with keys name, grids, exclude, override, measure")
    lines = _line_map(node) if node is not None else {}
    # unknown keys first, so a misspelled ``grid:`` is named as such (not as a missing ``grids``)
    _unknown_keys(path, lines, raw, SweepFile.model_fields, (), "top-level")
    if isinstance(raw.get("measure"), dict):
        _unknown_keys(path, lines, raw["measure"], MeasureConfig.model_fields, ("measure",), "measure")
    for i, rule in enumerate(raw.get("override") or []) if isinstance(raw.get("override"), list) else ():
        if isinstance(rule, dict):
            _unknown_keys(path, lines, rule, Rule.model_fields, ("override", i), f"override[{i}]")
    try:
        spec = SweepFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = err["loc"]
        what = ".".join(str(p) for p in loc)
        got = f" (got {err['input']!r})" if err["type"] != "missing" and not isinstance(err["input"], (dict, list)) else ""
        raise UserError(f"{path}:{_line_of(lines, loc)}: {what}: {err['msg']}{got}", hint=_file_hint(loc)) from None
    if spec.host_cpu is not None:
        try:
            catalog.load_cpu(spec.host_cpu)
        except UserError as exc:
            raise UserError(f"{path}:{_line_of(lines, ('host_cpu',))}: host_cpu: "
                            f"{exc.message}", hint=exc.hint) from None
    cases, warnings = _expand(path, spec, lines, max_cases)
    return Sweep(path=path, spec=spec, cases=cases, content_hash=_content_hash(raw), warnings=tuple(warnings),
                 profiles=_profiles(path, spec, lines))


def _profiles(path: Path, spec: SweepFile, lines: dict) -> dict[str, tuple[str, str]]:
    """``gpu_profiles``: card -> (file, hash of its bytes), each file found beside the sweep file or in the
    current directory and read as ``--gpu-profile`` reads it; a ``UserError`` naming the sweep's line."""
    import hashlib

    from reportgen.gpu_profile import read_profile

    out: dict[str, tuple[str, str]] = {}
    for i, name in enumerate(spec.gpu_profiles):
        where = f"{path}:{_line_of(lines, ('gpu_profiles', i))}: gpu_profiles[{i}]"
        file = next((c for c in (path.parent / name, Path(name)) if c.is_file()), None)
        if file is None:
            raise UserError(f"{where}: {name}: no such GPU profile (looked beside the sweep file and here)",
                            hint="write one with `reportgen profile-gpu` on the machine with the card")
        try:
            profile = read_profile(file)
        except UserError as exc:
            raise UserError(f"{where}: {exc.message}", hint=exc.hint) from None
        if profile.card in out:
            raise UserError(f"{where}: a second profile of {profile.card} (the first: {out[profile.card][0]})",
                            hint="give one profile per card")
        out[profile.card] = (str(file), hashlib.sha256(file.read_bytes()).hexdigest()[:16])
    return out


def _values(v: Any) -> list:
    return v if isinstance(v, list) else [v]


# ----- rules -------------------------------------------------------------------------------------
def _normal(key: str, value: Any) -> Any:
    """A value as a rule compares it: setup fields through their check (``lora`` and ``Method.lora``,
    ``2048`` and ``2048.0`` are one value), everything else as text."""
    spec = TrainingSetup.model_fields.get(key)
    if spec is not None:
        try:
            return spec.check(key, value)
        except SetupError:
            return ("invalid", str(value))
    return str(value)


def _matches(rule: dict[str, Any], cell: dict[str, Any]) -> bool:
    return all(k in cell and _normal(k, cell[k]) in [_normal(k, x) for x in _values(v)] for k, v in rule.items())


def _excluded(rules: list[dict[str, Any]], cell: dict[str, Any], used: dict[tuple, bool]) -> bool:
    """Whether an ``exclude`` rule matches the cell (marking the rules that do as used). A cell with
    ``from`` is matched twice: as written, and with the setup and model its config gives (an
    ``exclude: {method: qlora}`` sees the QLoRA a config names)."""
    hit = [i for i, rule in enumerate(rules) if _matches(rule, cell)]
    used.update({("exclude", i): True for i in hit})
    return bool(hit)


def _check_value(path: Path, line: int, where: str, key: str, value: Any, known_models: set[str],
                 known_gpus: set[str], load: bool) -> None:
    """A rule's value (``exclude``, ``override.when``; ``load``: an ``override.set`` value, which must
    also load) names a model, a card or a choice that exists; else a ``UserError`` at ``line``."""
    prefix = f"{path}:{line}: {where}.{key}"
    if key == "model":
        if str(value) in known_models and not load:
            return
        try:
            catalog.load_model(str(value))
        except UserError as exc:
            if not load and str(value) not in catalog.model_names():
                close = difflib.get_close_matches(str(value), sorted(known_models) + catalog.model_names(), n=3,
                                                  cutoff=0.5)
                raise UserError(f"{prefix}: {value!r} names no model of the grids or the catalog",
                                hint=("did you mean " + " or ".join(repr(c) for c in close) + "?") if close
                                else "models of the grids: " + ", ".join(sorted(known_models))) from None
            raise UserError(f"{prefix}: {exc.message}", exc.hint) from None
    elif key == "gpu":
        if str(value) in known_gpus and not load:
            return
        try:
            catalog.load_gpu(str(value))
        except UserError as exc:
            raise UserError(f"{prefix}: {exc.message}", exc.hint) from None
    elif key == "gpu_memory":
        if value is None:
            return
        try:
            catalog.parse_memory(str(value))
        except UserError as exc:
            raise UserError(f"{prefix}: {exc.message}", exc.hint) from None
    else:
        try:
            TrainingSetup.model_fields[key].check(key, value)
        except SetupError as exc:
            raise UserError(f"{prefix}: {exc.message}", hint=_allowed(key) or None) from None


def _check_rules(path: Path, spec: SweepFile, lines: dict[tuple, int]) -> None:
    """Every key and value of ``exclude``, ``override.when`` and ``override.set`` names something."""
    known_models = {str(m) for g in spec.grids if "model" in g for m in _values(g["model"])}
    known_gpus = {str(m) for g in spec.grids if "gpu" in g for m in _values(g["gpu"])}
    sections = [("exclude", i, ("exclude", i), f"exclude[{i}]", rule, False) for i, rule in enumerate(spec.exclude)]
    for i, rule in enumerate(spec.override):
        sections.append(("override", i, ("override", i, "when"), f"override[{i}].when", rule.when, False))
        sections.append(("override", i, ("override", i, "set"), f"override[{i}].set", rule.set, True))
    for _section, _i, loc, where, rule, load in sections:
        for key, value in rule.items():
            line = _line_of(lines, loc + (key,))
            if key not in CASE_KEYS:
                raise UserError(f"{path}:{line}: {where}: unknown key {key!r}",
                                hint=_did_you_mean(key, sorted(CASE_KEYS)) + "keys: " + ", ".join(sorted(CASE_KEYS)))
            if load and isinstance(value, list):
                raise UserError(f"{path}:{line}: {where}.{key}: sets one value, not a list ({value!r})",
                                hint="an override sets each key to one value; a grid takes lists")
            for v in _values(value):
                _check_value(path, line, where, key, v, known_models, known_gpus, load)


def _grid_size(grid: dict[str, Any]) -> int:
    return math.prod(len(_values(v)) for v in grid.values())


# ----- expansion ---------------------------------------------------------------------------------
def _expand(path: Path, spec: SweepFile, lines: dict[tuple, int],
            max_cases: int | None = DEFAULT_MAX_CASES) -> tuple[list[Case], list[str]]:
    _check_rules(path, spec, lines)
    for gi, grid in enumerate(spec.grids):
        for key in grid:
            if key not in CASE_KEYS and key not in ("from", "launch"):
                raise UserError(f"{path}:{_line_of(lines, ('grids', gi, key))}: grids[{gi}]: unknown key {key!r}",
                                hint=_did_you_mean(key, sorted(CASE_KEYS) + ["from", "launch"])
                                + "keys: model, gpu, from, launch, " + ", ".join(TrainingSetup.model_fields))
        if "launch" in grid and "from" not in grid:
            raise UserError(f"{path}:{_line_of(lines, ('grids', gi, 'launch'))}: grids[{gi}].launch: an accelerate "
                            "launch file goes with the training config it launches", hint="add from: CONFIG")
        for key in ("model", "gpu"):
            if key not in grid and not (key == "model" and "from" in grid):
                raise UserError(f"{path}:{_line_of(lines, ('grids', gi))}: grids[{gi}]: missing key {key!r}")
        for key, value in grid.items():
            if isinstance(value, list) and not value:
                raise UserError(f"{path}:{_line_of(lines, ('grids', gi, key))}: grids[{gi}].{key}: an empty list "
                                "expands to no case", hint=f"give {key} one value or a list of values")
    total = sum(_grid_size(g) for g in spec.grids)
    if max_cases is not None and total > max_cases:
        sizes = " + ".join(f"{_grid_size(g):,}" for g in spec.grids)
        raise UserError(f"{path}:{_line_of(lines, ('grids',))}: the grids expand to {total:,} cells ({sizes}), more "
                        f"than the {max_cases:,} a sweep runs without asking",
                        hint=f"split the sweep, or allow it: reportgen sweep {path} --max-cases {total} (each case "
                             "is a result file of about 4 KB; 10,000 cases render in about 15 s)")
    _check_names(path, spec, lines)
    seen: dict[str, Case] = {}
    from_warnings: list[str] = []
    used = {("exclude", i): False for i in range(len(spec.exclude))}
    used.update({("override", i): False for i in range(len(spec.override))})
    applied = {(gi, k): False for gi, g in enumerate(spec.grids) if "from" not in g for k in g if k in METHOD_FIELDS}
    for gi, grid in enumerate(spec.grids):
        keys = list(grid)
        for combo in itertools.product(*(_values(grid[k]) for k in keys)):
            cell = dict(zip(keys, combo))
            origin = {k: ("grids", gi, k) for k in keys}  # where each value of the cell was written
            if _excluded(spec.exclude, cell, used):
                continue
            for ri, rule in enumerate(spec.override):
                if _matches(rule.when, cell):
                    used[("override", ri)] = True
                    cell.update(rule.set)
                    origin.update({k: ("override", ri, "set", k) for k in rule.set})
            setup = None
            if "from" in cell:
                fields = {k: v for k, v in cell.items() if k not in ("model", "gpu", "gpu_memory", "from", "launch")}
                model, setup = _from_config(path, _line_of(lines, ("grids", gi, "from")), cell["from"], cell, fields,
                                            str(cell["gpu"]), from_warnings)
                cell = {**cell, "model": model}
                if _excluded(spec.exclude, {**setup.model_dump(mode="json"), **cell}, used):  # the file's values too
                    continue
            else:
                cell = _drop_other_methods(cell, applied, gi)
            case = _case(path, lines, gi, cell, origin, setup=setup)
            cid = case.id
            other = seen.get(cid)
            if other is None:
                seen[cid] = case
            elif other != case:
                raise UserError(f"{path}: two different setups have the case id {cid}: {_describe(other)} and "
                                f"{_describe(case)}",
                                hint="a hash collision of the case ids (reportgen/results.py case_id); please report "
                                     "it, and split the two setups into separate sweeps meanwhile")
    if not seen:
        raise UserError(f"{path}: the grids expand to no case (everything excluded?)")
    for (gi, key), hit in applied.items():
        if not hit:
            only = " or ".join(f"method {m}" for m in METHOD_FIELDS[key])
            raise UserError(f"{path}:{_line_of(lines, ('grids', gi, key))}: grids[{gi}].{key}: applies only to {only}; "
                            "no cell of this grid has that method, so it changes nothing",
                            hint=f"add the method to the grid (method: [full, {METHOD_FIELDS[key][0]}]) or drop {key}")
    warnings = [f"{path}:{_line_of(lines, (kind, i))}: {kind}[{i}] matches no cell of the grids: it does nothing"
                for (kind, i), hit in sorted(used.items()) if not hit]
    return [seen[k] for k in sorted(seen)], warnings + list(dict.fromkeys(from_warnings))


def _check_names(path: Path, spec: SweepFile, lines: dict[tuple, int]) -> None:
    """Every grid's models and GPUs are known (catalog names, Hub ids, config files), before a case is made."""
    for gi, grid in enumerate(spec.grids):
        for name in _values(grid.get("model", [])):
            try:
                catalog.load_model(str(name))
            except UserError as exc:
                raise UserError(f"{path}:{_line_of(lines, ('grids', gi, 'model'))}: {exc.message}", exc.hint) from None
        for name in _values(grid["gpu"]):
            try:
                catalog.load_gpu(str(name))
            except UserError as exc:
                raise UserError(f"{path}:{_line_of(lines, ('grids', gi, 'gpu'))}: {exc.message}", exc.hint) from None


def _drop_other_methods(cell: dict, applied: dict, gi: int) -> dict:
    """The cell without the fields its method does not read (``METHOD_FIELDS``: a grid of
    ``method: [full, lora]`` and ``lora_rank: [8, 16]`` has one full case, not two with the same
    run under two ids); ``applied`` records which of grid ``gi``'s keys some cell used."""
    method = str(cell.get("method", TrainingSetup.method.value))
    keep = {}
    for key, value in cell.items():
        if key in METHOD_FIELDS and method not in METHOD_FIELDS[key]:
            continue
        if (gi, key) in applied:
            applied[(gi, key)] = True
        keep[key] = value
    return keep


def _from_config(path: Path, line: int, config: Any, cell: dict, fields: dict, gpu: str,
                 warnings: list[str]) -> tuple[str, TrainingSetup]:
    """A cell with a ``from`` key: the config's model (unless the cell names one) and its setup,
    the cell's fields overriding the file's."""
    from reportgen.configs import setup_from, translate_file

    if not isinstance(config, str) or not config.strip():
        raise UserError(f"{path}:{line}: from: names no config file (got {'null' if config is None else repr(config)})",
                        hint="from: configs/qlora.yml (a TRL or Axolotl config, relative to this sweep file)")
    try:
        t = translate_file(path.parent / str(config), bf16_capable=catalog.load_gpu(gpu).supports_bf16)
        if cell.get("launch") is not None:  # an accelerate launch file (configs/launch.py), relative to the sweep file
            from reportgen.configs import launch

            t = launch.apply(path.parent / str(cell["launch"]), t)
        model = str(cell["model"]) if cell.get("model") is not None else t.model
        if model is None:
            raise UserError(t.model_missing or f"{t.path}: names no model", hint="add it, or a model key to the grid")
        setup = setup_from(t, fields, model=model, option=_grid_key)
    except UserError as exc:
        raise UserError(f"{path}:{line}: from: {exc.message}", exc.hint) from None
    warnings += [f"{t.path}: {text}" for text in t.lines() if text.startswith("warning")]
    return model, setup


def _grid_key(field: str, value: str = "") -> str:
    """A setup field as a sweep file sets it (``setup_from``'s ``option``): the grid's key."""
    return f"`{field}: {value}` in the grid" if value else f"the grid's {field}"


def _describe(case: Case) -> str:
    setup = case.setup.model_dump(mode="json")
    default = TrainingSetup.defaults_json()
    changed = ", ".join(f"{k}={v}" for k, v in setup.items() if v != default[k])
    return f"({case.model} on {case.gpu}: {changed or 'the default setup'})"


def _where(loc: tuple) -> str:
    return f"grids[{loc[1]}]" if loc[0] == "grids" else f"override[{loc[1]}].set"


def _valid_alone(field: str, value: Any) -> bool:
    """``value`` is one the setup field takes by itself (its error came from a rule across fields)."""
    spec = TrainingSetup.model_fields.get(field)
    if spec is None or value is None:
        return False
    try:
        spec.check(field, value)  # converts an Enum field's value itself
    except (SetupError, ValueError, TypeError):
        return False
    return True


def _case(path: Path, lines: dict[tuple, int], gi: int, cell: dict[str, Any], origin: dict[str, tuple],
          setup: TrainingSetup | None = None) -> Case:
    """One cell as a case; a bad value is reported where it was written (the grid or the override).
    ``setup``: the one a ``from`` config and the cell's fields made (``_from_config``)."""
    fields = {k: v for k, v in cell.items() if k not in ("model", "gpu", "gpu_memory", "from", "launch")}
    gpu = str(cell["gpu"])
    if cell.get("gpu_memory") is not None:
        loc = origin.get("gpu_memory", ("grids", gi, "gpu_memory"))
        try:
            gpu = catalog.gpu_key(gpu, str(cell["gpu_memory"]))
        except UserError as exc:
            raise UserError(f"{path}:{_line_of(lines, loc)}: {_where(loc)}.gpu_memory: {exc.message}",
                            exc.hint) from None
    try:
        setup = setup or TrainingSetup.model_validate(fields)
    except SetupError as exc:
        key = exc.field or ""
        # a rule across fields (gpus needs sharding) broken by an override's value: the override's line
        set_by = [loc[:3] for loc in origin.values() if loc[0] == "override"]
        loc = origin.get(key) or (max(set_by) if set_by else ("grids", gi))
        hint = _allowed(str(key)) if key and not _valid_alone(str(key), fields.get(key)) else (
            "a rule across fields: leave that cell out (exclude: [{...}]) or set the other field for it (override: "
            "[{when: {...}, set: {...}}])")
        raise UserError(f"{path}:{_line_of(lines, loc)}: {_where(loc)}.{key}: {exc.message} (in cell {cell})",
                        hint=hint) from None
    model = str(cell["model"])
    return Case(model=model if Path(model).exists() else hub.canonical(model), gpu=gpu, setup=setup)
