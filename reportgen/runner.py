"""Run a sweep's estimates and store one estimate file per case (layout: ``reportgen/store.py``; each
an ``artifacts.Artifact`` of kind ``estimate``).

Estimates are instant and need no torch. A rerun skips cases whose ``inputs_hash`` (case, model
config, GPU entry, the estimator's code hash, training tokens) is unchanged; ``force`` redoes them.
Measurements live in their own files, which this module never writes or deletes: a case the sweep
no longer lists keeps being estimated while it has a measurement (``in_sweep: false``), so a
measurement is never left next to a stale estimate or without one.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from reportgen import __version__, catalog, store
from reportgen.artifacts import Artifact, prune
from reportgen.estimate import estimate
from reportgen.estimate.search import max_batch, max_seq
from reportgen.fingerprint import estimator_hash
from reportgen.results import SCHEMA_VERSION, canonical, result_path, short_hash
from reportgen.setup import TrainingSetup
from reportgen.sweep import Case, Sweep


@dataclass
class SweepStats:
    written: int = 0
    skipped: int = 0
    failed: int = 0
    removed: int = 0
    orphans: int = 0


def profile_of(sweep: Sweep, case: Case) -> tuple[str, str] | None:
    """The ``gpu_profiles`` entry of the case's card (a card given another memory is still that card)."""
    return sweep.profiles.get(case.gpu.partition("@")[0])


def inputs_hash(case: Case, train_tokens: int, profile: tuple[str, str] | None = None,
                host_cpu: str | None = None) -> str:
    model = catalog.load_model(case.model)
    extra = {"gpu_profile": profile[1]} if profile else {}
    if host_cpu:  # the sweep's ``host_cpu``: its catalog entry prices the dispatch
        extra["host_cpu"] = dataclasses.asdict(catalog.load_cpu(host_cpu))
    return short_hash({"case": case.as_dict(), "model_config": model.config, "gpu": catalog.gpu_entry(case.gpu),
                       "estimator": estimator_hash(), "train_tokens": train_tokens, **extra}, 16)


@lru_cache(maxsize=256)
def _gpu(gpu: str, profile: tuple[str, str] | None, host_cpu: str | None = None):
    """The card, on the sweep's ``host_cpu`` when it names one, priced with the profile when the sweep
    gives one (keyed by the file's hash too; the profile's measured host wins, as on the command line:
    ``flags.gpu_from_args``)."""
    from reportgen.gpu_profile import on_machine

    return on_machine(catalog.load_gpu(gpu), catalog.load_cpu(host_cpu) if host_cpu else None,
                      Path(profile[0]) if profile else None)


@lru_cache(maxsize=4096)
def _reverse(model: str, gpu: str, setup_json: str, which: str, profile: tuple[str, str] | None = None,
             host_cpu: str | None = None) -> int | None:
    setup = TrainingSetup.model_validate_json(setup_json)
    m, g = catalog.load_model(model), _gpu(gpu, profile, host_cpu)
    return max_batch(m, setup, g) if which == "batch" else max_seq(m, setup, g)


def estimate_case(case: Case, train_tokens: int, profile: tuple[str, str] | None = None,
                  host_cpu: str | None = None) -> dict:
    """The ``estimate`` block of a result file (reverse searches cached across the sweep: the
    largest batch does not depend on the batch, the longest sequence not on the sequence). Recipe
    grpo: ``max_batch`` and ``max_seq`` are None, ``grpo`` holds GRPO's reverse answers instead."""
    m, g = catalog.load_model(case.model), _gpu(case.gpu, profile, host_cpu)
    grpo = case.setup.recipe.value == "grpo"
    # recipe grpo: its own reverse answers (the largest num_generations and completion, what to turn down
    # first: ``estimate/grpo.py``) come with the estimate; the batch and length searches do not apply
    est = estimate(m, g, case.setup, reverse=grpo, train_tokens=train_tokens)
    data = est.as_dict()
    for key in ("model", "gpu", "setup"):
        data.pop(key)
    if grpo:
        return data
    data["max_batch"] = _reverse(case.model, case.gpu, canonical(case.setup.model_copy(update={"batch": 1})
                                                                 .model_dump(mode="json")), "batch", profile, host_cpu)
    data["max_seq"] = _reverse(case.model, case.gpu, canonical(case.setup.model_copy(update={
        "seq": 128, "seq_mean": None}).model_dump(mode="json")), "seq", profile, host_cpu)
    return data


def new_result(sweep: Sweep, case: Case, ihash: str, in_sweep: bool = True) -> dict:
    result = {
        "schema_version": SCHEMA_VERSION,
        "id": case.id,
        "sweep": sweep.name,
        "sweep_hash": sweep.content_hash,
        "in_sweep": in_sweep,
        "case": case.as_dict(),
        "inputs_hash": ihash,
        "estimator_hash": estimator_hash(),
        "reportgen_version": __version__,
        "estimate": None,
        "status": None,
        "error": None,
    }
    model = catalog.load_model(case.model)
    if model.revision:  # a model given by Hub id: the commit its config.json came from (hub.py)
        result["model_source"] = {"hub": model.hf_repo, "revision": model.revision}
    profile = profile_of(sweep, case)
    if profile:
        result["gpu_profile"] = dict(zip(("file", "hash"), profile))
    if sweep.spec.host_cpu:
        result["host_cpu"] = sweep.spec.host_cpu
    return result


def compute_result(sweep: Sweep, case: Case, ihash: str | None = None, in_sweep: bool = True) -> dict:
    """A new estimate document for one case; a failed estimate is a result (``status: error``)."""
    profile = profile_of(sweep, case)
    host_cpu = sweep.spec.host_cpu
    result = new_result(sweep, case, ihash or inputs_hash(case, sweep.spec.train_tokens, profile, host_cpu), in_sweep)
    try:
        result["estimate"] = estimate_case(case, sweep.spec.train_tokens, profile, host_cpu)
        result["status"] = "ok"
    except Exception as exc:  # a failed case is a result, not a crash of the sweep
        result["status"] = "error"
        result["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return result


def measured_orphans(sweep: Sweep, results_dir: Path, warn: store.Warn = store.stderr_warn) -> list[Case]:
    """Cases measured under this sweep that its grids no longer list (their estimates are kept fresh)."""
    listed = {c.id for c in sweep.cases}
    out = []
    for cid, attempts in sorted(store.load_measurements(Path(results_dir) / sweep.name, warn).items()):
        if cid in listed:
            continue
        case = attempts[-1]["case"]
        try:
            out.append(Case(model=case["model"], gpu=case["gpu"], setup=TrainingSetup.model_validate(case["setup"])))
        except Exception as exc:  # noqa: BLE001 - an old setup this version cannot read: keep the file, say so
            warn(f"measured case {cid} cannot be read as a setup of this version ({exc}); not estimated")
    return out


def run_estimates(sweep: Sweep, results_dir: Path, force: bool = False,
                  progress: Callable[[list[Case]], Iterable[Case]] = lambda xs: xs,
                  warn: store.Warn = store.stderr_warn) -> SweepStats:
    stats = SweepStats()
    sweep_dir = Path(results_dir) / sweep.name
    store.prepare(sweep_dir, warn)
    orphans = measured_orphans(sweep, results_dir, warn)
    stats.orphans = len(orphans)
    listed = {c.id for c in sweep.cases}
    for case in progress(list(sweep.cases) + orphans):
        artifact = Artifact("estimate", result_path(results_dir, sweep.name, case.id),
                            inputs_hash(case, sweep.spec.train_tokens, profile_of(sweep, case), sweep.spec.host_cpu))
        in_sweep = case.id in listed
        # prepare() set unusable files aside; one that appeared since is only an estimate
        old = artifact.stored(lambda path: store.read_estimate(path)[0])  # a damaged one is recomputed
        if (not force and artifact.is_current(old) and old.get("status") == "ok"
                and old.get("in_sweep", True) == in_sweep):
            stats.skipped += 1
            continue
        result = compute_result(sweep, case, artifact.inputs_hash, in_sweep)
        stats.failed += result["status"] == "error"
        artifact.write(result)
        stats.written += 1
    keep = listed | {c.id for c in orphans}
    # an estimate of a case nobody lists or measured: recomputable, drop it
    stats.removed = prune(store.estimate_files(sweep_dir), lambda path: path.stem in keep)
    return stats
