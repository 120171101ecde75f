"""The shape a stored result must have before any page, ``show``, ``validation`` or a sweep uses it.

Files under ``results/`` are input (issue 29): a file edited by hand, damaged by a merge or written by
another tool reaches the same readers as one this code wrote. ``results.read_json`` refuses what is
not a small regular file of strict JSON; the models here refuse what is JSON of the wrong shape
(``memory: "lots"``, a dict where a number belongs, a setup that is a string, no ``sweep``, a card
this version's catalog does not have), with the first wrong field named. A refused estimate is
recomputed by the next sweep (it is not current, ``runner.run_estimates``) and skipped by the
readers with a warning naming the file, as a traced file is; a refused measurement is set aside by the next sweep
(``store.prepare``) and skipped by the readers. Whether a well-formed measurement's figures can be
true is ``provenance.inconsistency``'s question, answered on the pages.

Only the fields the readers use are typed; others pass as they are (``extra="allow"``), so a field
added later does not make an older reader refuse a newer file of the same schema version.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, field_validator,
                      model_validator)

from reportgen import catalog
from reportgen.results import UnreadableResult
from reportgen.setup import SetupError, TrainingSetup

#: a figure: an int or a float (never a bool or a numeric string), finite (``read_json`` refuses NaN)
Number = Annotated[float, Field(strict=True)]
Positive = Annotated[float, Field(strict=True, gt=0)]


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class StoredCase(_Loose):
    model: StrictStr = Field(min_length=1)
    gpu: StrictStr
    setup: dict[str, Any]

    @field_validator("gpu")
    @classmethod
    def _known_card(cls, gpu: str) -> str:
        if gpu.partition("@")[0] not in catalog.gpu_names():
            raise ValueError(f"GPU {gpu!r} is not in this version's GPU catalog (reportgen gpus)")
        return gpu

    @field_validator("setup")
    @classmethod
    def _readable_setup(cls, setup: dict) -> dict:
        """A setup this version reads (an estimate is recomputed from it, a measurement compared with
        its estimate): an older file whose setup no longer reads is refused, with the field."""
        try:
            full = TrainingSetup.model_validate(setup).model_dump(mode="json")
        except SetupError as exc:
            raise ValueError(f"not a setup of this version ({exc})") from None
        return {**setup, **full}  # every field, a field left out read as its default


class _Figures(_Loose):
    """Every other field of the mapping is a figure too (``__pydantic_extra__``)."""
    __pydantic_extra__: dict[str, Number | None]


class Memory(_Figures):
    """A step's memory: its totals are more than nothing (the weights alone are bytes; the model page's
    chart draws them on a log scale)."""
    peak_allocated: Positive
    peak_reserved: Positive
    device_total: Positive


class Time(_Loose):
    bound: StrictStr | None = None
    peak_dtype: StrictStr | None = None
    parts: dict[str, Number] = {}
    work: dict[str, Any] = {}
    step_s: Number | None = None
    tokens_per_s: Number | None = None
    mfu: Number | None = None
    hfu: Number | None = None
    compute_s: Number | None = None
    memory_s: Number | None = None
    transfer_s: Number | None = None
    train_hours: Number | None = None
    train_dollars: Number | None = None
    train_tokens: Number | None = None
    model_flops_per_token: Number | None = None
    hardware_flops_per_token: Number | None = None


class Band(_Loose):
    basis: StrictStr | None = None
    quantity: StrictStr | None = None
    demand_range: list[Number] | None = None
    coverage: Number | None = None
    hi: Number | None = None
    lo: Number | None = None
    n: Number | None = None


class Estimate(_Loose):
    memory: Memory
    params: dict[str, StrictInt] = {}
    time: Time | None = None
    fits: StrictBool | None = None
    verdict: StrictStr | None = None
    verdict_text: StrictStr | None = None
    band: Band | None = None
    notes: list[StrictStr] = []
    peak_phase: StrictStr | None = None
    capacity: Number | None = None
    demand: Number | None = None
    margin: Number | None = None
    max_batch: Number | None = None
    max_seq: Number | None = None
    context_limit: Number | None = None


class EstimateDocument(_Loose):
    id: StrictStr
    sweep: StrictStr
    case: StoredCase
    status: Literal["ok", "error"]
    estimate: Estimate | None = None
    error: StrictStr | None = None
    reportgen_version: StrictStr | None = None
    estimator_hash: StrictStr | None = None
    inputs_hash: StrictStr | None = None
    sweep_hash: StrictStr | None = None
    in_sweep: StrictBool = True

    @model_validator(mode="after")
    def _ok_has_an_estimate(self):
        if self.status == "ok" and self.estimate is None:
            raise ValueError("status ok but no estimate")
        return self


class Measured(_Loose):
    """A measurement block's figures; its lists and notes as what they are, any other field free."""
    peak_allocated: Number | None = None
    peak_reserved: Number | None = None
    device_used: Number | None = None
    memory_after_load: Number | None = None
    memory_after_load_reserved: Number | None = None
    step_s: Number | None = None
    step_s_min: Number | None = None
    step_s_max: Number | None = None
    tokens_per_s: Number | None = None
    tokens_per_step: Number | None = None
    real_tokens_per_step: Number | None = None
    mfu: Number | None = None
    final_loss: Number | None = None
    params_trainable: Number | None = None
    step_times_s: list[Number] | None = None
    notes: list[StrictStr] = []
    # host memory (issue 32; harness.py): byte counts, whole numbers; absent from older files. A
    # negative one is well-formed but impossible: provenance.inconsistency sets the file aside
    host_rss_after_load: StrictInt | None = None
    host_peak_rss_load: StrictInt | None = None
    host_peak_rss_warmup: StrictInt | None = None
    host_peak_rss: StrictInt | None = None
    host_peak_rss_children: StrictInt | None = None
    host_peak_rss_at_failure: StrictInt | None = None


class Settings(_Loose):
    device: StrictStr | None = None
    cap_to_gpu: StrictBool | None = None
    profile: StrictBool | None = None
    launcher: StrictStr | None = None
    backend: StrictStr | None = None
    __pydantic_extra__: dict[str, Number | None]  # steps, warmup, timeout_s, max_steps, ...


class Environment(_Loose):
    device: StrictStr | None = None
    gpu_name: StrictStr | None = None
    gpu_catalog_key: StrictStr | None = None
    gpu_total_bytes: Number | None = None
    world_size: StrictInt | None = None
    cpu: StrictStr | None = None
    versions: dict[str, StrictStr | None] = {}


class Cap(_Loose):
    applied: StrictBool | None = None
    emulated_gpu: StrictStr | None = None
    device_total_bytes: Number | None = None
    emulated_memory_bytes: Number | None = None
    fraction: Number | None = None


class MeasurementDocument(_Loose):
    id: StrictStr
    sweep: StrictStr
    case: StoredCase
    status: StrictStr
    measurement: Measured | None = None
    environment: Environment | None = None
    settings: Settings | None = None
    cap: Cap | None = None
    measured_at: StrictStr | None = None
    error: StrictStr | None = None


class TracedDocument(_Loose):
    id: StrictStr
    case: StoredCase
    memory: Memory
    params: dict[str, StrictInt] = {}
    fits: StrictBool | None = None
    verdict: StrictStr | None = None
    notes: list[StrictStr] = []
    emulations: list[StrictStr] = []
    work: dict[str, Any] | None = None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "the document"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{where}: missing" if err["type"] == "missing" else f"{where}: {msg} (got {err.get('input')!r:.60})"


def _check(model: type[BaseModel], doc: dict, path, noun: str) -> dict:
    """``doc`` when it validates, with its setup in full (a field left out read as its default, as
    ``TrainingSetup`` reads it: the pages read every field)."""
    try:
        setup = model.model_validate(doc).case.setup
    except ValidationError as exc:
        raise UnreadableResult(path, f"not a well-formed {noun}: {_first_error(exc)}") from None
    return {**doc, "case": {**doc["case"], "setup": setup}}


def check_estimate(doc: dict, path) -> dict:
    """``doc`` (an estimate document of the current schema) when it has the shape the readers rely on;
    else ``UnreadableResult`` naming the first wrong field."""
    return _check(EstimateDocument, doc, path, "estimate")


def check_traced(doc: dict, path) -> dict:
    """``doc`` (a traced document) when it has the shape the readers rely on; else ``UnreadableResult``."""
    return _check(TracedDocument, doc, path, "traced result")


def check_measurement(doc: dict, path) -> dict:
    """``doc`` (a measurement document) when it has the shape the readers rely on; else
    ``UnreadableResult`` naming the first wrong field."""
    return _check(MeasurementDocument, doc, path, "measurement")
