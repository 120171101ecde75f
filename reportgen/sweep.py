"""Sweep files: YAML -> validated pydantic models -> a list of cases with stable ids.

A sweep has one or more ``grids``. In a grid every key is ``model``, ``gpu`` or a TrainingSetup
field; a list expands into one cell per value (the cartesian product over all lists). A grid's
``from`` (a TRL or Axolotl config, or a list of them, relative to the sweep file) gives each cell
the config's model and setup, as ``reportgen estimate --from`` reads it; the grid's other keys
override the file's values, as flags beside ``--from`` do. The case stores the resulting setup. ``exclude``
rules drop every cell that matches all keys of a rule (a rule value may be a list: any of them).
``override`` rules set fields on matching cells (e.g. fp16 on a T4, which has no bf16).

Errors name the file, the line, the key and the allowed values; the CLI exits with status 2
and writes nothing.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from reportgen import catalog
from reportgen.errors import UserError
from reportgen.results import case_id, short_hash
from reportgen.setup import SetupError, TrainingSetup

#: besides the setup's fields: the model, the card, and the card's memory when it differs from the
#: catalog's (``gpu_memory: 48GiB`` -> the case's gpu is ``rtx-4090@48GiB``)
CASE_KEYS = {"model", "gpu", "gpu_memory"} | set(TrainingSetup.model_fields)


#: ``measure.max_steps`` when a sweep does not set it (at least ``steps``)
DEFAULT_MAX_STEPS = 50


class MeasureConfig(BaseModel):
    """A sweep's ``measure:`` settings. Timed steps (``reportgen/measure/timing.py``): at least
    ``steps``, then on until the median's 95 % confidence interval lies within ``target_rel_ci`` of
    it, ``max_steps`` ran, or the timed steps reach ``max_timed_s`` seconds; ``max_steps: <steps>``
    is a fixed count."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    warmup: int = Field(3, ge=0)
    #: the minimum number of timed steps
    steps: int = Field(5, ge=1)
    #: the most timed steps (default: the larger of ``steps`` and ``DEFAULT_MAX_STEPS``)
    max_steps: int | None = Field(None, ge=1)
    #: time cap on the timed steps' wall times, seconds (null: no cap)
    max_timed_s: float | None = Field(5.0, gt=0)
    #: stop once the median is known to +- this fraction at 95 % (null: no early stop)
    target_rel_ci: float | None = Field(0.02, gt=0, lt=1)
    timeout_s: int = Field(900, ge=10)
    #: emulate this GPU's memory on a larger card (torch.cuda.set_per_process_memory_fraction)
    cap_to_gpu: bool = False
    #: run ``profile_steps`` more steps under torch.profiler after the timed ones (trace + per-step figures)
    profile: bool = False
    profile_steps: int = Field(2, ge=1)

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
    train_tokens: int = Field(100_000_000, ge=1)


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
    #: what the configs of ``from`` keys left unread (unknown keys, keys that change the step but are not modelled)
    warnings: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name


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
    return f"expected {getattr(ann, '__name__', ann)}"


def load_sweep(path: str | Path) -> Sweep:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: no such sweep file", hint="see sweeps/*.yaml for examples") from None
    try:
        node = yaml.compose(text)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise UserError(f"{path}:{line}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}:1: a sweep file is a mapping with keys name, grids, exclude, override, measure")
    lines = _line_map(node) if node is not None else {}
    try:
        spec = SweepFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = err["loc"]
        what = ".".join(str(p) for p in loc)
        hint = ("measure keys: " + ", ".join(MeasureConfig.model_fields) if loc and loc[0] == "measure"
                else "top-level keys: " + ", ".join(SweepFile.model_fields))
        raise UserError(f"{path}:{_line_of(lines, loc)}: {what}: {err['msg']}", hint=hint) from None
    warnings: list[str] = []
    cases = _expand(path, spec, lines, warnings)
    return Sweep(path=path, spec=spec, cases=cases, content_hash=short_hash(raw, 12),
                 warnings=tuple(dict.fromkeys(warnings)))


def _values(v: Any) -> list:
    return v if isinstance(v, list) else [v]


def _matches(rule: dict[str, Any], cell: dict[str, Any]) -> bool:
    return all(str(cell.get(k)) in {str(x) for x in _values(v)} for k, v in rule.items())


def _from_config(path: Path, line: int, config: Any, cell: dict, fields: dict, gpu: str,
                 warnings: list[str]) -> tuple[str, TrainingSetup]:
    """A cell with a ``from`` key: the config's model (unless the cell names one) and its setup,
    the cell's fields overriding the file's."""
    from reportgen.configs import setup_from, translate_file

    try:
        t = translate_file(path.parent / str(config), bf16_capable=catalog.load_gpu(gpu).supports_bf16)
        model = str(cell["model"]) if cell.get("model") is not None else t.model
        if model is None:
            raise UserError(f"{t.path}: names no model", hint="add it, or a model key to the grid")
        setup = setup_from(t, fields, model=model)
    except UserError as exc:
        raise UserError(f"{path}:{line}: from: {exc.message}", exc.hint) from None
    warnings += [f"{t.path}: {text}" for text in t.lines() if text.startswith("warning")]
    return model, setup


def _expand(path: Path, spec: SweepFile, lines: dict[tuple, int], warnings: list[str] | None = None) -> list[Case]:
    warnings = [] if warnings is None else warnings
    for section, rules in (("exclude", spec.exclude), ("override", [r.when for r in spec.override])):
        for i, rule in enumerate(rules):
            for key in rule:
                if key not in CASE_KEYS:
                    loc = (section, i, key) if section == "exclude" else (section, i, "when", key)
                    raise UserError(f"{path}:{_line_of(lines, loc)}: {section}: unknown key {key!r}",
                                    hint="keys: " + ", ".join(sorted(CASE_KEYS)))
    seen: dict[str, Case] = {}
    for gi, grid in enumerate(spec.grids):
        for key in grid:
            if key not in CASE_KEYS and key != "from":
                raise UserError(f"{path}:{_line_of(lines, ('grids', gi, key))}: grids[{gi}]: unknown key {key!r}",
                                hint="keys: model, gpu, from, " + ", ".join(TrainingSetup.model_fields))
        for key in ("model", "gpu"):
            if key not in grid and not (key == "model" and "from" in grid):
                raise UserError(f"{path}:{_line_of(lines, ('grids', gi))}: grids[{gi}]: missing key {key!r}")
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
        keys = list(grid)
        for combo in itertools.product(*(_values(grid[k]) for k in keys)):
            cell = dict(zip(keys, combo))
            if any(_matches(rule, cell) for rule in spec.exclude):
                continue
            for rule in spec.override:
                if _matches(rule.when, cell):
                    cell.update(rule.set)
            fields = {k: v for k, v in cell.items() if k not in ("model", "gpu", "gpu_memory", "from")}
            gpu = str(cell["gpu"])
            if cell.get("gpu_memory") is not None:
                try:
                    gpu = catalog.gpu_key(gpu, str(cell["gpu_memory"]))
                except UserError as exc:
                    line = _line_of(lines, ("grids", gi, "gpu_memory"))
                    raise UserError(f"{path}:{line}: grids[{gi}].gpu_memory: {exc.message}", exc.hint) from None
            if "from" in cell:
                model, setup = _from_config(path, _line_of(lines, ("grids", gi, "from")), cell["from"], cell, fields,
                                            str(cell["gpu"]), warnings)
                case = Case(model=model, gpu=gpu, setup=setup)
                seen.setdefault(case.id, case)
                continue
            try:
                setup = TrainingSetup(**fields)
            except SetupError as exc:
                key = exc.field or ""
                line = _line_of(lines, ("grids", gi, key) if key in grid else ("grids", gi))
                hint = _allowed(str(key)) if key else None
                raise UserError(f"{path}:{line}: grids[{gi}].{key}: {exc.message} (in cell {cell})",
                                hint=hint) from None
            case = Case(model=str(cell["model"]), gpu=gpu, setup=setup)
            seen.setdefault(case.id, case)
    if not seen:
        raise UserError(f"{path}: the grids expand to no case (everything excluded?)")
    return [seen[k] for k in sorted(seen)]
