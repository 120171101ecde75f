"""Traced result files: one per traced case, ``results/<sweep>/traced/<case id>.json``.

A traced figure (``reportgen trace``: the real step on the meta device, replayed through the
caching-allocator simulation) is recomputable like an estimate but costs seconds per case, so it is
stored like a measurement: written by ``reportgen sweep FILE --trace`` only, never by the estimate
pass, and committed (an ``artifacts.Artifact`` of kind ``trace``). Each file records
``inputs_hash``: the case, the model's config, the GPU's catalog entry, the estimator constants the
trace injects (cuBLAS workspaces, CUDA context) and ``fingerprint.trace_hash()`` (the tracer's code).
A file whose hash is not the current one is **stale**: readers skip it with a warning (the site
never shows a stale traced figure) and the next ``--trace`` run redoes it. Library versions are
recorded (``environment``), not hashed.

Only the fields the site and ``reportgen show`` use are kept (memory terms and totals, fits, the
peak's phase and op, the names of the emulations applied, notes), a few KB per case.

Torch-free: the renderer and ``show`` read these files.
"""

from __future__ import annotations

from pathlib import Path

from reportgen import catalog
from reportgen.artifacts import Artifact, is_current
from reportgen.result_schema import check_traced
from reportgen.results import (ADDED_SETUP_FIELDS, UnreadableResult, current_id, legacy_id, read_versioned, short_hash,
                               write_json_atomic)
from reportgen.store import Warn, stderr_warn

TRACED_DIR = "traced"
TRACED_SCHEMA_VERSION = 1
#: the fields of ``Trace.as_dict()`` a traced file keeps
KEPT = ("memory", "fits", "verdict", "peak_phase", "peak_op", "model_type", "params", "sdpa_backends", "environment",
        "notes", "trace_hash")


def _constants(gpu: str) -> dict:
    from reportgen.estimate import constants as K
    from reportgen.estimate.memory import cublas_workspace_bytes

    return {"cublas_workspace": cublas_workspace_bytes(catalog.load_gpu(gpu)), "cublas_handles": K.CUBLAS_HANDLES,
            "cuda_context": K.CUDA_CONTEXT_BYTES}


def cache_limited(doc: dict) -> bool:
    """Whether a traced document's figures come from the replay limited to the card (the allocator
    released cached blocks to fit; ``trace/result.py`` ``cache_released``)."""
    return bool((doc.get("memory") or {}).get("cache_released"))


#: catalog keys of a GPU that only the time model reads (its pricing of a stored inventory is redone with
#: today's rates whenever a trace is read, ``traced_time``): adding or changing them leaves traces current
TIME_ONLY_GPU_KEYS = frozenset({"l2_cache_mb", "l2_cache_source", "default_host", "peer_p2p"})


def inputs_hash(case: dict) -> str:
    """What a traced figure of ``case`` (``{model, gpu, setup}``) depends on, hashed."""
    from reportgen.fingerprint import trace_hash

    # setup fields added later count only when set (as in ``results.case_id``): adding a field with a
    # default leaves every stored trace current, as it leaves every case id unchanged
    setup = {k: v for k, v in case["setup"].items()
             if k not in ADDED_SETUP_FIELDS or v != ADDED_SETUP_FIELDS[k]}
    return short_hash({"case": {**case, "setup": setup}, "model_config": catalog.load_model(case["model"]).config,
                       "gpu": {k: v for k, v in catalog.gpu_entry(case["gpu"]).items() if k not in TIME_ONLY_GPU_KEYS},
                       "constants": _constants(case["gpu"]),
                       "trace": trace_hash(case["setup"].get("recipe", "loop"))}, 16)


def traced_path(sweep_dir: Path, cid: str) -> Path:
    return Path(sweep_dir) / TRACED_DIR / f"{cid}.json"


def traced_files(sweep_dir: Path) -> list[Path]:
    return sorted((Path(sweep_dir) / TRACED_DIR).glob("*.json"))


def existing_path(sweep_dir: Path, cid: str) -> Path | None:
    """The traced file of case ``cid``: named by its current id, or by the 8-digit id it was written
    under before ids grew (``results.legacy_id``); None when there is neither."""
    for path in (traced_path(sweep_dir, cid), traced_path(sweep_dir, legacy_id(cid))):
        if path.is_file():
            return path
    return None


def migrate_ids(sweep_dir: Path) -> int:
    """Rename the traced files written under an older id to their case's current id (``id`` field
    rewritten; the figures and ``inputs_hash`` are untouched, so a current file stays current).
    ``reportgen sweep --trace`` runs it first. Returns how many were renamed."""
    renamed = 0
    for path in traced_files(sweep_dir):
        try:
            doc = read_traced(path)
        except UnreadableResult:
            continue
        cid = current_id(doc)
        target = traced_path(sweep_dir, cid)
        if target == path or target.exists():
            continue
        write_json_atomic(target, {**doc, "id": cid})
        path.unlink()
        renamed += 1
    return renamed


def traced_document(cid: str, sweep: str, case: dict, trace: dict, ihash: str | None = None) -> dict:
    """The file form of one trace (``Trace.as_dict()``), labelled ``kind: traced``; ``ihash``: the
    case's ``inputs_hash`` taken before tracing (default: now)."""
    doc = {k: trace[k] for k in KEPT}
    doc["emulations"] = [e["name"] for e in trace["emulations"]]
    # the traced step's inventory (trace/work.py): independent of the time constants, so the traced step
    # time is priced when read (``traced_time``), with the constants of the day
    doc["work"] = (trace.get("time") or {}).get("work")
    return {**doc, "schema_version": TRACED_SCHEMA_VERSION, "kind": "traced", "id": cid, "sweep": sweep,
            "case": case, "inputs_hash": ihash or inputs_hash(case)}


def traced_time(doc: dict):
    """The time model (``time.estimate_time``) priced on a traced file's inventory, or None for a file
    traced before inventories were stored."""
    from reportgen.estimate.time import estimate_time
    from reportgen.estimate.work import StepWork
    from reportgen.setup import TrainingSetup

    if not doc.get("work"):
        return None
    case = doc["case"]
    return estimate_time(catalog.load_model(case["model"]), TrainingSetup.model_validate(case["setup"]),
                         catalog.load_gpu(case["gpu"]), work=StepWork.from_dict(doc["work"]))


def write_traced(sweep_dir: Path, cid: str, case: dict, trace: dict, ihash: str | None = None) -> Path:
    doc = traced_document(cid, Path(sweep_dir).name, case, trace, ihash)
    return Artifact("trace", traced_path(sweep_dir, cid), doc["inputs_hash"]).write(doc)


def read_traced(path: Path) -> dict:
    """A traced document. Raises ``UnreadableResult``."""
    doc = read_versioned(path, "traced", "traced result", TRACED_SCHEMA_VERSION, {"id", "case", "memory"},
                         ok=lambda data: data.get("kind") == "traced")
    return check_traced(doc, path)


def staleness(doc: dict) -> str | None:
    """Why a traced document no longer describes its case with this code and catalog, else None."""
    try:
        current = inputs_hash(doc["case"])
    except Exception as exc:  # noqa: BLE001 - a model or card no longer in the catalog
        return f"its case cannot be read by this version ({exc})"
    if not is_current(doc, current):
        return "traced by other trace code, constants or catalog entries than this reportgen's"
    return None


def load_traced(results_dir: Path, warn: Warn = stderr_warn) -> dict[str, dict]:
    """``{case id: traced document}`` of every sweep under ``results_dir``, current ones only (a case
    traced in several sweeps: the first sweep's). Stale and unreadable files are skipped, with one
    warning per sweep that says how to redo them. Never writes."""
    out: dict[str, dict] = {}
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return out
    for sweep_dir in sorted(p for p in results_dir.iterdir() if p.is_dir()):
        stale = []
        for path in traced_files(sweep_dir):
            try:
                doc = read_traced(path)
            except UnreadableResult as exc:
                warn(f"{exc}; skipped")
                continue
            doc["id"] = current_id(doc)  # a file written under an older id joins its case (results.current_id)
            if staleness(doc):
                stale.append(doc["id"])
            elif doc["id"] not in out:
                out[doc["id"]] = {**doc, "path": path.as_posix()}
        if stale:
            warn(f"{sweep_dir}: {len(stale)} traced case(s) are stale for this trace code and not shown "
                 f"({', '.join(stale[:3])}{', ...' if len(stale) > 3 else ''}): "
                 f"`reportgen sweep sweeps/{sweep_dir.name}.yaml --trace` traces them again")
    return out


def find_traced(results_dir: Path, cid: str) -> list[dict]:
    """Every traced document of case ``cid`` under ``results_dir`` (stale ones too, for ``show``),
    each with ``path`` and ``stale`` (the reason, or None)."""
    out = []
    for sweep_dir in sorted(p.parent for p in Path(results_dir).glob(f"*/{TRACED_DIR}")):
        path = existing_path(sweep_dir, cid)
        if path is None:
            continue
        try:
            doc = read_traced(path)
        except UnreadableResult as exc:
            out.append({"id": cid, "path": path.as_posix(), "stale": str(exc), "unreadable": True})
            continue
        if current_id(doc) == cid:
            out.append({**doc, "id": cid, "path": path.as_posix(), "stale": staleness(doc)})
    return out
