"""Run a sweep's estimates and store one result file per case.

Estimates are instant and need no torch. A rerun skips cases whose ``inputs_hash`` (case, model
config, GPU entry, estimator version, training tokens) is unchanged; ``force`` redoes them.
Measurements, when a sweep asks for them, are merged into the same files by
``reportgen.measure.runner`` without touching the estimate.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from reportgen import __version__, catalog
from reportgen.estimate import ESTIMATOR_VERSION, estimate
from reportgen.estimate.search import max_batch, max_seq
from reportgen.results import SCHEMA_VERSION, canonical, read_result, result_path, short_hash, write_json_atomic
from reportgen.setup import TrainingSetup
from reportgen.sweep import Case, Sweep


@dataclass
class SweepStats:
    written: int = 0
    skipped: int = 0
    failed: int = 0


def inputs_hash(case: Case, train_tokens: int) -> str:
    model = catalog.load_model(case.model)
    return short_hash({"case": case.as_dict(), "model_config": model.config, "gpu": catalog.gpu_entry(case.gpu),
                       "estimator": ESTIMATOR_VERSION, "train_tokens": train_tokens}, 16)


@lru_cache(maxsize=4096)
def _reverse(model: str, gpu: str, setup_json: str, which: str) -> int | None:
    setup = TrainingSetup.model_validate_json(setup_json)
    m, g = catalog.load_model(model), catalog.load_gpu(gpu)
    return max_batch(m, setup, g) if which == "batch" else max_seq(m, setup, g)


def estimate_case(case: Case, train_tokens: int) -> dict:
    """The ``estimate`` block of a result file (reverse searches cached across the sweep: the
    largest batch does not depend on the batch, the longest sequence not on the sequence)."""
    m, g = catalog.load_model(case.model), catalog.load_gpu(case.gpu)
    est = estimate(m, g, case.setup, reverse=False, train_tokens=train_tokens)
    data = est.as_dict()
    for key in ("model", "gpu", "setup"):
        data.pop(key)
    data["max_batch"] = _reverse(case.model, case.gpu, canonical(case.setup.model_copy(update={"batch": 1})
                                                                 .model_dump(mode="json")), "batch")
    data["max_seq"] = _reverse(case.model, case.gpu, canonical(case.setup.model_copy(update={"seq": 128})
                                                               .model_dump(mode="json")), "seq")
    return data


def new_result(sweep: Sweep, case: Case, ihash: str) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "id": case.id,
        "sweep": sweep.name,
        "sweep_hash": sweep.content_hash,
        "case": case.as_dict(),
        "inputs_hash": ihash,
        "estimator_version": ESTIMATOR_VERSION,
        "reportgen_version": __version__,
        "estimate": None,
        "status": None,
        "error": None,
        "measurement": None,
    }


def run_estimates(sweep: Sweep, results_dir: Path, force: bool = False,
                  progress: Callable[[Iterable[Case]], Iterable[Case]] = lambda xs: xs) -> SweepStats:
    stats = SweepStats()
    for case in progress(sweep.cases):
        path = result_path(results_dir, sweep.name, case.id)
        ihash = inputs_hash(case, sweep.spec.train_tokens)
        old = None
        if path.exists():
            try:
                old = read_result(path)
            except (ValueError, OSError):
                old = None
        if old and not force and old.get("inputs_hash") == ihash and old.get("status") == "ok":
            stats.skipped += 1
            continue
        result = new_result(sweep, case, ihash)
        if old and old.get("measurement"):
            result["measurement"] = old["measurement"]  # a new estimate never drops a measurement
        try:
            result["estimate"] = estimate_case(case, sweep.spec.train_tokens)
            result["status"] = "ok"
        except Exception as exc:  # a failed case is a result, not a crash of the sweep
            result["status"] = "error"
            result["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            stats.failed += 1
        write_json_atomic(path, result)
        stats.written += 1
    _remove_stale(results_dir / sweep.name, {c.id for c in sweep.cases})
    return stats


def _remove_stale(sweep_dir: Path, keep: set[str]) -> None:
    """Drop result files of cases the sweep no longer has, unless they hold a measurement."""
    for path in sweep_dir.glob("*.json"):
        if path.stem in keep:
            continue
        try:
            if read_result(path).get("measurement"):
                continue
        except (ValueError, OSError):
            pass
        path.unlink()
