"""Published training speed on consumer and workstation cards (issue 30): ``data/consumer_speed.csv``
holds each source's figure as published (value, unit, verbatim quote, clock, grade), and
``data/consumer_speed_setups.yaml`` maps a row to a model, a card and a ``TrainingSetup`` (each field
from the row's recipe or its framework's default, the defaults named in ``assumptions``), or says why it
is not compared (``unmapped``). The CSV is the record; this module only reads and divides.

A row's tokens/s follows from its rate by arithmetic, by the kind of rate its mapping names:

* ``step_time``: the value is seconds per optimizer step (a steady progress-bar rate, ``s/it``):
  tokens/s = ``tokens_per_step`` / value;
* ``tqdm_step``: the value is the ``s/it`` a tqdm bar showed after optimizer step ``steps`` (k), and
  ``previous`` what it showed after step k - 1, both in the row's quote. tqdm does not show a mean but an
  exponential average of each refresh's seconds, corrected for its start (``tqdm/std.py`` ``EMA``:
  ``last = a x + (1 - a) last``, shown as ``last / (1 - (1 - a)^calls)``; ``smoothing`` a = 0.3, which
  transformers' ``ProgressCallback`` keeps), so early in a run the shown rate still carries the first step
  and its warm-up (the first allocations, Triton's compilation). Step k's own seconds follow exactly:
  ``x_k = ((1 - b^k) shown_k - b (1 - b^(k-1)) shown_(k-1)) / a``, b = 1 - a (``tqdm_step_seconds``);
* ``total_time``: the value is a run's time (seconds, minutes, or ``h:mm:ss``) over ``steps`` optimizer
  steps: tokens/s = ``tokens_per_step`` x steps / seconds;
* ``tokens_per_s``: the program printed tokens/s (all GPUs, or per GPU with ``per_gpu``);
* ``samples_per_s``: tokens/s = value x tokens per sample, ``tokens_per_step`` / (batch x accum x GPUs);
* ``eta_minutes``: the program printed, at loader iterations ``at``, the minutes left in an epoch of ``steps``
  iterations as ``elapsed / (i + 1) * steps // 60 - elapsed // 60`` (jingyaogong/minimind's training scripts):
  each print bounds its elapsed time (``elapsed_bounds``: within 60 / (steps / (i + 1) - 1) seconds, a
  twentieth of a second at iteration 100 of 111,769, seconds late in an epoch), and the seconds per
  iteration between the first and the last print give tokens/s = ``tokens_per_step`` / accum / that; a
  rate the bounds leave more than ``ETA_RATE_SPREAD`` uncertain is refused.

``tokens_per_step`` is the CSV's (fixed by packing, padding to a maximum length or synthetic data) and
must equal the mapped setup's ``batch x seq x accum x gpus``: a mapping that disagrees with its own row
is an error, not a comparison.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reportgen import yamlfile
from reportgen.errors import UserError
from reportgen.estimate.libraries import CURRENT, Libraries
from reportgen.published.mapping import CONFIGS, Unmapped, read_rows
from reportgen.published.speed import SpeedRow
from reportgen.setup import SetupError, TrainingSetup

CSV_NAME = "consumer_speed.csv"
SETUPS_NAME = "consumer_speed_setups.yaml"
#: columns of ``consumer_speed.csv`` read here
COLUMNS = ("row_id", "url", "gpu", "gpus", "model", "value", "unit", "clock_scope", "grade", "tokens_per_step", "quote")
KIND = yamlfile.Kind("consumer-speed mapping file", "one entry per row id of data/consumer_speed.csv",
                     "see data/consumer_speed_setups.yaml")


class RowMap(BaseModel):
    """One row's mapping (``consumer_speed_setups.yaml``)."""

    model_config = ConfigDict(extra="forbid")
    unmapped: str | None = None  # why the row is not compared; nothing else is then needed
    model: str | None = None  # catalog name, or configs/NAME.json: a config.json under reportgen/published/configs
    gpu: str | None = None  # catalog name
    rate: Literal["step_time", "tqdm_step", "total_time", "tokens_per_s", "samples_per_s", "eta_minutes"] | None = None
    # total_time: optimizer steps the time covers; eta_minutes: an epoch's iterations; tqdm_step: the step
    # after which the bar showed the value
    steps: int | None = Field(None, ge=1)
    previous: str | None = None  # tqdm_step: the s/it the bar showed one step earlier, as printed
    at: list[int] | None = None  # eta_minutes: the loader iterations the printed values belong to
    per_gpu: bool = False  # tokens_per_s printed per GPU
    setup: dict = Field(default_factory=dict)
    libs: dict = Field(default_factory=dict)  # Libraries fields: bitsandbytes, transformers
    assumptions: list[str] = Field(default_factory=list)


def seconds(value: str, unit: str) -> float:
    """A time as the source wrote it: ``h:mm:ss`` (or ``mm:ss``), else a number in the unit's seconds,
    minutes or hours (``s``, ``s/it``, ``min``, ``h``). ``ValueError`` when it is neither."""
    text = value.strip()
    if ":" in text:
        parts = [float(p) for p in text.split(":")]
        if len(parts) > 3:
            raise ValueError(f"{value!r} is not h:mm:ss")
        return sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    number = float(text)
    u = unit.strip().lower()
    return number * (60.0 if u.startswith("min") else 3600.0 if re.match(r"h(ours?)?\b", u) else 1.0)


def number(value: str) -> float:
    """A figure as the source printed it: ``2,722``, ``8.2k``, ``1.5M`` (thousands separators, a k or M
    suffix as the source rounded it). ``ValueError`` when it is not a number."""
    m = re.fullmatch(r"\s*([0-9][0-9,]*(?:\.[0-9]+)?)\s*([kKM]?)\s*", value)
    if not m:
        raise ValueError(f"{value!r} is not a number")
    return float(m.group(1).replace(",", "")) * {"": 1, "k": 1e3, "K": 1e3, "M": 1e6}[m.group(2)]


def read_csv(path: Path) -> dict[str, dict]:
    """``row_id -> row`` of ``consumer_speed.csv`` (``mapping.read_rows``: a ``UserError`` when it is not that file)."""
    return {r["row_id"]: r for r in read_rows(path, COLUMNS, "consumer-speed CSV", "data/consumer_speed.csv")}


def read_setups(path: Path) -> dict[str, RowMap]:
    """The mapping file, each entry validated; errors name the file and the row id."""
    _, data = yamlfile.load(path, KIND)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of row ids to entries", hint=KIND.what_it_holds)
    out = {}
    for rid, entry in data.items():
        try:
            out[str(rid)] = RowMap.model_validate(entry or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise UserError(f"{path}: {rid}: {where}: {first['msg']}") from None
    return out


def published_rate(row: dict, m: RowMap, setup: TrainingSetup) -> tuple[float, str]:
    """(tokens/s over all GPUs, how it follows from the row)."""
    value, unit = row["value"], row["unit"]
    tokens = int(row["tokens_per_step"])
    if m.rate == "step_time":
        s = seconds(value, unit)
        return tokens / s, f"{tokens:,} tokens a step / {s:g} s a step"
    if m.rate == "tqdm_step":
        return tqdm_rate(row, m.previous or "", m.steps, tokens)
    if m.rate == "total_time":
        s = seconds(value, unit)
        return tokens * m.steps / s, f"{tokens:,} tokens a step x {m.steps} steps / {s:g} s"
    if m.rate == "tokens_per_s":
        n = setup.gpus if m.per_gpu else 1
        return number(value) * n, f"stated {value} tokens/s" + (f" per GPU x {n} GPUs" if m.per_gpu else "")
    if m.rate == "eta_minutes":
        return eta_rate(value, m.at or [], m.steps, tokens // setup.accum)
    samples = setup.batch * setup.accum * setup.gpus
    return number(value) * tokens / samples, f"{value} samples/s x {tokens // samples:,} tokens a sample"


#: tqdm's default ``smoothing`` (``tqdm.std.tqdm.__init__``), which transformers' ``ProgressCallback`` keeps
TQDM_SMOOTHING = 0.3


def tqdm_step_seconds(shown: float, previous: float, k: int, smoothing: float = TQDM_SMOOTHING) -> float:
    """Step ``k``'s own seconds from the ``s/it`` a tqdm bar showed after steps ``k`` and ``k - 1`` (one
    refresh a step): ``tqdm.std.EMA`` keeps ``last = a x + b last`` (b = 1 - a) and shows
    ``last / (1 - b^calls)``, so ``a x_k = (1 - b^k) shown_k - b (1 - b^(k-1)) shown_(k-1)``. Step 1 is
    the shown value itself. Example: 5.89 then 5.08 s/it after steps 1 and 2 are a step 2 of
    1.7 x 5.08 - 0.7 x 5.89 = 4.513 s, not 5.08."""
    b = 1 - smoothing
    return ((1 - b ** k) * shown - b * (1 - b ** (k - 1)) * previous) / smoothing


#: one state of a tqdm bar as it prints it: ``2/11 [00:10<00:45,  5.08s/it]`` (step, total, elapsed<left, rate)
TQDM_BAR = re.compile(r"(?<![0-9])([0-9]+)/[0-9]+ \[[0-9:]+<[0-9:?]+,\s*([0-9]+(?:\.[0-9]+)?)s/it\]")


def tqdm_rate(row: dict, previous: str, k: int, tokens: int) -> tuple[float, str]:
    """tokens/s of step ``k`` (``tqdm_step``). The row's quote must hold the bar's line for step ``k`` with the
    row's value and, for k > 1, its line for step ``k - 1`` with ``previous``: the mapping cannot bring a number
    the source did not print, nor pair a number with another step."""
    shown = {int(step): rate for step, rate in TQDM_BAR.findall(row["quote"])}
    readings = [row["value"].strip()] + ([previous.strip()] if k > 1 else [])
    for step, reading in zip((k, k - 1), readings):
        if shown.get(step) != reading:
            printed = f"{shown[step]} s/it" if step in shown else "no line"
            raise ValueError(f"the quote's tqdm bar has {printed} at step {step}, not {reading} s/it")
    s = tqdm_step_seconds(float(row["value"]), float(readings[-1]), k)
    if s <= 0:
        raise ValueError(f"{row['value']} s/it after step {k} and {previous} after step {k - 1} leave no time to step {k}")
    b = 1 - TQDM_SMOOTHING
    weight = b * (1 - b ** (k - 1)) / (1 - b ** k)
    return tokens / s, (f"{tokens:,} tokens a step / {s:.4g} s, step {k}'s own time (tqdm's {row['value']} s/it "
                        f"after it weighs the {readings[-1]} before at {weight:.2f})")


def elapsed_bounds(minutes_left: int, i: int, steps: int) -> tuple[float, float]:
    """The elapsed seconds at which ``elapsed / (i + 1) * steps // 60 - elapsed // 60`` is ``minutes_left``
    (the least and the greatest found on a grid of 4,001 points across the window). The expression is within 1
    of ``elapsed x d``, ``d = steps / (i + 1) / 60 - 1 / 60``, so the answers lie in ``((minutes_left - 1) / d,
    (minutes_left + 1) / d)``.
    ``ValueError`` when none does (a value that expression cannot print)."""
    d = steps / (i + 1) / 60 - 1 / 60
    if d <= 0:
        raise ValueError(f"iteration {i} of {steps} leaves no time to print")
    lo, n = (minutes_left - 1) / d, 4000
    hits = [t for t in (lo + k * 2 / d / n for k in range(n + 1))
            if t >= 0 and t / (i + 1) * steps // 60 - t // 60 == minutes_left]
    if not hits:
        raise ValueError(f"{minutes_left} minutes left at iteration {i} of {steps} is not a value the formula prints")
    return min(hits), max(hits)


#: the widest relative spread of a decoded rate (``eta_rate``) that is compared
ETA_RATE_SPREAD = 0.02


def eta_rate(value: str, at: list[int], steps: int, tokens_per_iteration: int) -> tuple[float, str]:
    """tokens/s from the minutes left printed at iterations ``at`` (``eta_minutes``): the seconds per iteration
    between the first and the last print, each print's elapsed time the middle of its ``elapsed_bounds``.
    ``ValueError`` for iterations that are not increasing within the epoch, or a rate the bounds leave more
    than ``ETA_RATE_SPREAD`` uncertain."""
    left = [int(float(v)) for v in value.split(";")]
    if len(left) != len(at) or len(at) < 2:
        raise ValueError(f"{len(left)} printed values for the iterations {at}: give one iteration per value, two at least")
    if any(b <= a for a, b in zip(at, at[1:])) or at[0] < 0 or at[-1] >= steps:
        raise ValueError(f"the iterations {at} must increase, from 0 to below the epoch's {steps}")
    (a0, a1), (b0, b1) = elapsed_bounds(left[0], at[0], steps), elapsed_bounds(left[-1], at[-1], steps)
    n = at[-1] - at[0]
    per_it, slow, fast = ((b0 + b1) - (a0 + a1)) / 2 / n, (b1 - a0) / n, (b0 - a1) / n
    if fast <= 0 or (slow - fast) / per_it > ETA_RATE_SPREAD:
        raise ValueError(f"the prints at iterations {at[0]} and {at[-1]} bound the seconds per iteration only to "
                         f"{max(fast, 0):.4g}-{slow:.4g}: more than {ETA_RATE_SPREAD:.0%} apart")
    return tokens_per_iteration / per_it, (f"{tokens_per_iteration:,} tokens an iteration / {per_it:.4g} s "
                                           f"({fast:.4g}-{slow:.4g}), the elapsed time decoded from the minutes left "
                                           f"printed at iterations {at[0]} ({a0:.2f}-{a1:.2f} s) and {at[-1]} "
                                           f"({b0:.2f}-{b1:.2f} s)")


def map_entry(row: dict, m: RowMap, where: str) -> SpeedRow | Unmapped:
    """One row as a ``SpeedRow`` (or why not); a mapping inconsistent with its row is a ``UserError``."""
    rid, url = row["row_id"], row["url"]
    if m.unmapped:
        return Unmapped(rid, url, m.unmapped)
    needed = [k for k in ("model", "gpu", "rate") if getattr(m, k) is None] + (
        ["steps"] if m.rate in ("total_time", "eta_minutes", "tqdm_step") and m.steps is None else []) + (
        ["at"] if m.rate == "eta_minutes" and not m.at else []) + (
        ["previous"] if m.rate == "tqdm_step" and not m.previous and (m.steps or 0) > 1 else [])
    if needed:
        raise UserError(f"{where}: {rid}: missing {', '.join(needed)} (or write `unmapped: why`)")
    try:
        setup = TrainingSetup.model_validate(m.setup)
        libs = Libraries(**{**CURRENT.__dict__, **m.libs})
    except (SetupError, TypeError) as exc:
        raise UserError(f"{where}: {rid}: setup or libs not valid ({str(exc).splitlines()[0]})") from None
    if not re.fullmatch(r"[0-9]+", row["tokens_per_step"].strip()):
        raise UserError(f"{where}: {rid}: the CSV gives no tokens_per_step; a rate needs it")
    if int(row["tokens_per_step"]) != setup.tokens_per_step:
        raise UserError(f"{where}: {rid}: the setup has {setup.tokens_per_step:,} tokens a step "
                        f"(batch x seq x accum x gpus), the CSV's tokens_per_step {row['tokens_per_step']}")
    try:
        rate, how = published_rate(row, m, setup)
    except ValueError as exc:
        raise UserError(f"{where}: {rid}: value {row['value']!r} ({row['unit']}): {exc}") from None
    notes = [f"grade {row['grade']}; clock: {row['clock_scope']}"] + m.assumptions
    return SpeedRow(rid, url, model_path(m.model, f"{where}: {rid}"), m.gpu, setup, rate, how, notes, libs)


def model_path(model: str, where: str) -> str:
    """A mapping's model: a catalog name as written, ``configs/NAME.json`` as the path of that file under
    ``reportgen/published/configs`` (wherever the command runs)."""
    if not model.startswith("configs/"):
        return model
    path = CONFIGS / model.removeprefix("configs/")
    if not path.is_file():
        raise UserError(f"{where}: model {model}: no such file under {CONFIGS}",
                        hint="configs/ names a config.json of reportgen/published/configs")
    return str(path)


def consumer_speed_rows(data_dir: Path) -> list[SpeedRow | Unmapped]:
    """Every row of ``consumer_speed.csv`` with a mapping, as a ``SpeedRow`` or the reason it is not
    compared; rows without an entry are not compared ("no mapping yet"). An entry for a row id the CSV
    does not have is an error."""
    csv_path, map_path = data_dir / CSV_NAME, data_dir / SETUPS_NAME
    if not csv_path.is_file() or not map_path.is_file():
        return []
    rows, maps = read_csv(csv_path), read_setups(map_path)
    unknown = sorted(set(maps) - set(rows))
    if unknown:
        raise UserError(f"{map_path}: row ids not in {csv_path.name}: {', '.join(unknown)}")
    return [map_entry(row, maps[rid], str(map_path)) if rid in maps else
            Unmapped(rid, row["url"], "no mapping yet") for rid, row in rows.items()]


__all__ = ["RowMap", "consumer_speed_rows", "number", "published_rate", "seconds", "tqdm_step_seconds"]
