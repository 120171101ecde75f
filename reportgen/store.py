"""The results directory: where estimates and measurements live, and how they are joined.

::

    results/<sweep>/<case-id>.json                       estimate (recomputable, rewritten by sweeps)
    results/<sweep>/measured/<case-id>.<utc>.json        one measuring attempt (immutable)
    results/<sweep>/_advice/<model>.<gpu>.s<seq>.json    decision-tree walks (reportgen.advise.store)
    results/<sweep>/set-aside/<file>.<utc>               files a sweep could not use, kept for a person
    results/<sweep>/profiles/<case-id>.<utc>.pt.trace.json.gz  profiler traces (measure.profile; not committed)

Rules:

* A measurement file is written once, under a name no other file has (``results.write_json_new``),
  and no command deletes or rewrites it. A remeasurement is a new file; every attempt is kept and
  ``current_measurement`` picks the one shown.
* Estimate files are rewritten freely. Before a sweep touches a directory, ``prepare`` migrates
  files of an older schema (an embedded v1 measurement becomes its own measurement file first) and
  sets aside what it cannot use (invalid JSON, a newer schema), with a warning naming the file and
  what to do. Nothing is deleted that is not an estimate this version can recompute.
* Readers (``load_results``: the renderer, ``show``) never write: they migrate in memory and skip what
  they cannot read, with the same warnings.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from reportgen.results import (UnreadableResult, canonical, current_id, legacy_id, measurement_document, migrate,
                               read_json, read_measurement, write_json_atomic, write_json_new)
from reportgen.userfile import try_writing

MEASURED_DIR = "measured"
ASIDE_DIR = "set-aside"
#: profiler traces of ``measure.profile`` (``reportgen.measure.profiling``; not committed)
PROFILES_DIR = "profiles"
#: statuses that settle a case (a rerun does not measure it again): an OOM is a result
DONE_STATUSES = ("ok", "oom")

Warn = Callable[[str], None]


def stderr_warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


#: measurement files of a newer schema already warned about in this process: such a file stays where
#: it is and every reader skips it, so one run (estimates, walks, render) says so once, not per reader
_NEWER_WARNED: set[str] = set()


def _newer(exc: UnreadableResult, warn: Warn) -> None:
    """Warn once per process about a measurement file of a newer schema (left in place, ignored)."""
    key = str(Path(exc.path).resolve())
    if key not in _NEWER_WARNED:
        _NEWER_WARNED.add(key)
        warn(f"{exc.path}: {exc.reason}; ignored by this version (left in place). Upgrade reportgen to use it.")


def _stamp(when: str | None = None) -> str:
    """``2026-11-21T17:00:00+00:00`` -> ``20261121T170000Z`` (file names sort by time)."""
    try:
        t = datetime.fromisoformat(when) if when else datetime.now(timezone.utc)
    except ValueError:
        t = datetime.now(timezone.utc)
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def estimate_files(sweep_dir: Path) -> list[Path]:
    return sorted(Path(sweep_dir).glob("*.json"))


def measurement_files(sweep_dir: Path) -> list[Path]:
    return sorted((Path(sweep_dir) / MEASURED_DIR).glob("*.json"))


def read_checked_measurement(path: Path) -> dict:
    """A measurement document of the shape every reader relies on (``result_schema``); else
    ``UnreadableResult`` saying why."""
    from reportgen.result_schema import check_measurement  # pydantic: imported when a file is read

    return check_measurement(read_measurement(path), path)


def read_estimate(path: Path) -> tuple[dict, list[dict]]:
    """An estimate document as the current schema, checked (``result_schema``), and the measurement
    blocks an older schema embedded in it. Raises ``UnreadableResult``."""
    from reportgen.result_schema import check_estimate

    doc, blocks = migrate(read_json(path), path)
    return check_estimate(doc, path), blocks


# ----- writing ----------------------------------------------------------------------------------------
def add_measurement(sweep_dir: Path, cid: str, case: dict, block: dict) -> Path:
    """Store one measuring attempt as a new file; never overwrites. Returns its path."""
    sweep_dir = Path(sweep_dir)
    doc = measurement_document(cid, sweep_dir.name, case, block)
    name = f"{cid}.{_stamp(block.get('measured_at'))}.json"
    return write_json_new(sweep_dir / MEASURED_DIR / name, doc)


def ready_for_measurements(sweep_dir: Path) -> None:
    """Make sure a measurement can be stored under ``sweep_dir`` before one is made (issue 29: with
    ``measured`` a file, a case was measured for minutes and then lost): the folder exists, is a
    folder and takes a new file. A ``UserError`` (exit 2) saying what to fix otherwise."""
    from reportgen.errors import UserError

    folder = Path(sweep_dir) / MEASURED_DIR
    try:
        try_writing(folder)
    except FileExistsError:
        raise UserError(f"{folder} is not a folder: measurements are stored there",
                        hint=f"move it away (mv {folder} {folder}.old) and run again") from None
    except OSError as exc:
        raise UserError(f"cannot store measurements under {folder} ({exc.strerror or exc})",
                        hint="measure into a folder you can write to: --results DIR") from None


def set_aside(path: Path, why: str, what_to_do: str, warn: Warn = stderr_warn) -> Path:
    """Move a file a sweep cannot use out of its way, keeping it: ``<sweep>/set-aside/<name>.<utc>``."""
    path = Path(path)
    sweep_dir = path.parent.parent if path.parent.name == MEASURED_DIR else path.parent
    target = sweep_dir / ASIDE_DIR / f"{path.name}.{_stamp()}"
    n = 1
    while target.exists():
        n += 1
        target = sweep_dir / ASIDE_DIR / f"{path.name}.{_stamp()}-{n}"
    target.parent.mkdir(parents=True, exist_ok=True)
    path.replace(target)
    warn(f"{path}: {why}; moved to {target}. {what_to_do}")
    return target


def _known(sweep_dir: Path) -> set[str]:
    """Canonical text of every readable measurement document of the directory as stored (migration
    runs twice without duplicating what it already stored). Not the checked form: that fills in the
    setup fields a file leaves out, and would no longer equal what a migration writes."""
    out = set()
    for p in measurement_files(sweep_dir):
        try:
            out.add(canonical(read_measurement(p)))
        except UnreadableResult:
            continue
    return out


def prepare(sweep_dir: Path, warn: Warn = stderr_warn) -> None:
    """Make a sweep directory safe to write into: migrate older estimate files (storing their
    embedded measurements as measurement files first), set aside files this version cannot use."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return
    known: set[str] | None = None
    for path in estimate_files(sweep_dir):
        try:
            raw = read_json(path)
            doc, blocks = migrate(raw, path)
        except UnreadableResult as exc:
            todo = ("Upgrade reportgen to use it (pip install -U reportgen), or delete it if you do not need it."
                    if exc.newer else "If it holds a measurement, repair it (resolve the merge conflict) and move it "
                    "back; an estimate-only file can be deleted, the sweep recomputes it.")
            set_aside(path, exc.reason, todo, warn)
            continue
        if raw == doc:
            continue
        if known is None:
            known = _known(sweep_dir)
        for block in blocks:
            mdoc = measurement_document(doc["id"], sweep_dir.name, doc["case"], block)
            if canonical(mdoc) not in known:
                written = add_measurement(sweep_dir, doc["id"], doc["case"], block)
                known.add(canonical(mdoc))
                warn(f"{path}: schema {raw.get('schema_version')} file; its measurement now lives in {written}")
        write_json_atomic(path, doc)
    for path in measurement_files(sweep_dir):
        try:
            read_checked_measurement(path)
        except UnreadableResult as exc:
            if exc.newer:  # nothing here will overwrite it: leave it where the newer version finds it
                _newer(exc, warn)
            else:
                set_aside(path, exc.reason, "Repair it (resolve the merge conflict) and move it back to "
                          f"{path.parent}/: it is a measurement and nothing recomputes it.", warn)


# ----- reading ----------------------------------------------------------------------------------------
def _order(block: dict) -> tuple:
    """Attempts in the order they were made: by ``measured_at``, then by the ``-N`` that
    ``write_json_new`` adds to a name already taken within the same second."""
    path = str(block.get("path") or "")
    m = re.search(r"-(\d+)\.json$", path)
    return str(block.get("measured_at") or ""), int(m.group(1)) if m else 1, path


def _as_current(doc: dict, path: Path) -> dict:
    """A measurement document keyed by its case's current id (``results.current_id``: a file written
    under an older, shorter id joins its case), with ``path`` added; in memory only, the file keeps
    its ``id`` (``stored_id`` when it differs)."""
    cid = current_id(doc)
    extra = {"stored_id": doc["id"]} if cid != doc["id"] else {}
    return {**doc, **extra, "id": cid, "path": path.as_posix()}


def load_measurements(sweep_dir: Path, warn: Warn = stderr_warn) -> dict[str, list[dict]]:
    """``{case id: [attempts, oldest first]}`` of a sweep directory; each attempt is its document
    with ``path`` added (in memory only). Unreadable files are skipped with a warning."""
    out: dict[str, list[dict]] = {}
    for doc in _attempts(measurement_files(sweep_dir), warn):
        out.setdefault(doc["id"], []).append(doc)
    for attempts in out.values():
        attempts.sort(key=_order)
    return out


def _attempts(paths: list[Path], warn: Warn):
    """The measurement documents of ``paths`` keyed by their case's current id (``_as_current``),
    the unreadable ones skipped with a warning (a newer schema's once per process)."""
    for path in paths:
        try:
            yield _as_current(read_checked_measurement(path), path)
        except UnreadableResult as exc:
            if exc.newer:
                _newer(exc, warn)
            else:
                warn(f"{exc}; skipped")


def load_case_measurements(sweep_dir: Path, cid: str, warn: Warn = stderr_warn) -> list[dict]:
    """The attempts of one case, oldest first, read now (as ``load_measurements`` reads them)."""
    mine = [p for p in measurement_files(sweep_dir) if p.name.startswith((cid + ".", legacy_id(cid) + "."))]
    return sorted((doc for doc in _attempts(mine, warn) if doc["id"] == cid), key=_order)


def current_measurement(attempts: list[dict]) -> dict | None:
    """The attempt a page shows: the newest that settled the case (ok or oom), else the newest."""
    if not attempts:
        return None
    done = [b for b in attempts if b.get("status") in DONE_STATUSES]
    return (done or attempts)[-1]


def _join(doc: dict, legacy: list[dict], measured: list[dict], path: Path) -> dict:
    doc = {**doc, "id": current_id(doc)}  # an estimate file written under an older id (``_as_current``)
    legacy = [{**b, "id": doc["id"], "case": doc["case"], "path": path.as_posix()} for b in legacy]
    attempts = sorted(legacy + measured, key=_order)
    return {**doc, "measurement": current_measurement(attempts), "measurements": attempts}


def load_results(sweep_dir: Path, warn: Warn = stderr_warn) -> list[dict]:
    """Every case of a sweep directory, sorted by id: its estimate document (current schema) with
    ``measurement`` (the current attempt, or None) and ``measurements`` (all attempts) joined in.
    Measurements embedded in older files count too. Never writes."""
    sweep_dir = Path(sweep_dir)
    measured = load_measurements(sweep_dir, warn)
    results = []
    for path in estimate_files(sweep_dir):
        try:
            doc, blocks = read_estimate(path)
        except UnreadableResult as exc:
            warn(f"{exc}; skipped (a sweep of this directory recomputes or sets it aside)")
            continue
        results.append(_join(doc, blocks, measured.pop(current_id(doc), []), path))
    if measured:
        warn(f"{sweep_dir}: {len(measured)} measured case(s) have no estimate file "
             f"({', '.join(sorted(measured)[:3])}{', ...' if len(measured) > 3 else ''}): run its sweep to estimate them")
    return sorted(results, key=lambda r: r["id"])


#: the former name, for scripts outside the package; ``sweep.load_sweep`` reads a sweep file
load_sweep = load_results


def load_measured(sweep_dir: Path, warn: Warn = stderr_warn) -> list[dict]:
    """Every measured case of a sweep directory from its measurement files alone (no estimate file
    needed: a fresh clone has only the committed measurements), sorted by id:
    ``{"id", "case", "measurement", "measurements"}`` as ``load_results`` joins them. For the scripts
    that compare measurements with the current code's estimates (calibration, the error band)."""
    out = []
    for cid, attempts in sorted(load_measurements(Path(sweep_dir), warn).items()):
        out.append({"id": cid, "case": attempts[-1]["case"], "measurement": current_measurement(attempts),
                    "measurements": attempts})
    return out


def load_case(sweep_dir: Path, cid: str, warn: Warn = stderr_warn) -> dict:
    """One case of a sweep directory, joined like ``load_results``. Raises ``UnreadableResult``."""
    sweep_dir = Path(sweep_dir)
    path = sweep_dir / f"{cid}.json"
    doc, blocks = read_estimate(path)
    return _join(doc, blocks, load_case_measurements(sweep_dir, cid, warn), path)
