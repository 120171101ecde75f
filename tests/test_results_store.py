"""Nothing measured is ever lost and no estimate goes stale (reportgen/store.py, results.py,
fingerprint.py): schema migrations round-trip, unusable files are set aside (never deleted),
measurement files are never rewritten, and a change to the estimator's code recomputes every
estimate while keeping every measurement."""

from __future__ import annotations

import json
import re
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from reportgen import results, store
from reportgen.results import (MEASUREMENT_SCHEMA_VERSION, SCHEMA_VERSION, UnreadableResult, current_id, migrate, read_json,
                               write_json_new)
from reportgen.runner import run_estimates
from reportgen.sweep import load_sweep

FIXTURES = Path(__file__).parent / "fixtures"
#: result files as reportgen wrote them at estimate schema 1 (a real CPU run of the harness at commit
#: f675adf, the model path made relative): one holds an embedded measurement, one does not
V1 = FIXTURES / "results-v1"
V1_MEASURED = "tiny-llama.h100-sxm.full.11f0b679"
V1_PLAIN = "tiny-llama.h100-sxm.lora.952df44a"
ROOT = Path(__file__).resolve().parents[1]


def _now(stored: str) -> str:
    """The current id of a v1 fixture's case (its file name holds the 8-digit id of the time)."""
    return current_id(json.loads((V1 / "v1" / f"{stored}.json").read_text()))


V1_MEASURED_NOW, V1_PLAIN_NOW = _now(V1_MEASURED), _now(V1_PLAIN)


def copy_v1(tmp_path: Path) -> Path:
    shutil.copytree(V1, tmp_path / "work")
    return tmp_path / "work"


def files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def quiet(_: str) -> None:
    pass


# ----- migration ------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", sorted({1}))  # every estimate schema before SCHEMA_VERSION
def test_every_earlier_schema_round_trips(tmp_path, version):
    """A file of each earlier version, migrated on disk by a sweep's ``prepare``, reads back with the
    same case, estimate and measurement as the original; migrating twice changes nothing."""
    assert version < SCHEMA_VERSION
    work = copy_v1(tmp_path)
    original = {p.stem: json.loads(p.read_text()) for p in (work / "v1").glob("*.json")}
    assert {d["schema_version"] for d in original.values()} == {version}
    in_memory = {r["id"]: r for r in store.load_results(work / "v1", quiet)}  # a reader migrates in memory

    store.prepare(work / "v1", quiet)
    after = files(work)
    store.prepare(work / "v1", quiet)
    assert files(work) == after  # idempotent: no second copy of the measurement
    measured = store.measurement_files(work / "v1")
    assert len(measured) == 1 and measured[0].name.startswith(V1_MEASURED + ".")

    loaded = {r["id"]: r for r in store.load_results(work / "v1", quiet)}
    for cid, old in original.items():
        new = json.loads((work / "v1" / f"{cid}.json").read_text())
        assert new["schema_version"] == SCHEMA_VERSION and "measurement" not in new
        for key in ("id", "case", "estimate", "status", "error", "inputs_hash", "sweep", "sweep_hash"):
            assert new[key] == old[key], key
        now = current_id(old)  # readers key every document by its case's current id (results.current_id)
        block = loaded[now]["measurement"]
        if old["measurement"] is None:
            assert block is None and loaded[now]["measurements"] == []
        else:
            doc = read_json(measured[0])
            assert doc["schema_version"] == MEASUREMENT_SCHEMA_VERSION and doc["id"] == cid
            assert doc["case"] == old["case"]
            assert {k: v for k, v in doc.items() if k not in ("schema_version", "id", "sweep", "case")} == \
                old["measurement"]
            assert {k: v for k, v in block.items() if k in old["measurement"]} == old["measurement"]
        # what a reader saw before the migration is what it sees after it
        assert {k: v for k, v in in_memory[now].items() if k not in ("measurement", "measurements")} == \
            {k: v for k, v in loaded[now].items() if k not in ("measurement", "measurements")}
        drop = ("path", "schema_version", "sweep", "stored_id")
        assert [{k: v for k, v in b.items() if k not in drop} for b in in_memory[now]["measurements"]] == \
            [{k: v for k, v in b.items() if k not in drop} for b in loaded[now]["measurements"]]


def test_a_sweep_over_v1_files_keeps_the_measurement(tmp_path, monkeypatch):
    work = copy_v1(tmp_path)
    monkeypatch.chdir(work)
    run_estimates(load_sweep("v1.yaml"), Path("."), warn=quiet)
    loaded = store.load_results(work / "v1", quiet)
    # the case is stored under its current id now; the measurement, filed under the old one, joins it
    [case] = [r for r in loaded if r["measurements"]]
    assert case["measurement"]["status"] == "ok" and case["measurement"]["stored_id"] == V1_MEASURED
    assert case["id"] == current_id(case) != V1_MEASURED
    assert case["estimator_hash"] and not case["estimator_hash"].startswith("v1-")


def test_newer_schema_is_refused_not_guessed():
    with pytest.raises(UnreadableResult) as exc:
        migrate({"schema_version": SCHEMA_VERSION + 1, "id": "x", "case": {}}, "f.json")
    assert exc.value.newer and "newer reportgen" in exc.value.reason
    with pytest.raises(UnreadableResult):
        migrate({"schema_version": "one", "id": "x", "case": {}}, "f.json")


# ----- unusable files are set aside ----------------------------------------------------------------
CONFLICT = '<<<<<<< HEAD\n{"schema_version": 1}\n=======\n{"schema_version": 2}\n>>>>>>> theirs\n'


def test_unreadable_and_newer_files_are_set_aside_with_a_warning(tmp_path):
    work = copy_v1(tmp_path)
    sweep_dir = work / "v1"
    conflicted = sweep_dir / f"{V1_MEASURED}.json"
    conflicted.write_text(CONFLICT)
    newer = sweep_dir / f"{V1_PLAIN}.json"
    newer_doc = {**json.loads(newer.read_text()), "schema_version": SCHEMA_VERSION + 1}
    newer.write_text(json.dumps(newer_doc))
    bad_measurement = sweep_dir / store.MEASURED_DIR / "x.20260101T000000Z.json"
    bad_measurement.parent.mkdir()
    bad_measurement.write_text("{truncated")
    newer_measurement = sweep_dir / store.MEASURED_DIR / "y.20260101T000000Z.json"
    newer_measurement.write_text(json.dumps({"schema_version": MEASUREMENT_SCHEMA_VERSION + 1, "id": "y",
                                             "status": "ok"}))
    warnings: list[str] = []
    store.prepare(sweep_dir, warnings.append)
    aside = sorted((sweep_dir / store.ASIDE_DIR).iterdir())
    assert [p.name.split(".json.")[0] for p in aside] == [V1_MEASURED, V1_PLAIN, "x.20260101T000000Z"]
    assert aside[0].read_text() == CONFLICT and json.loads(aside[1].read_text()) == newer_doc  # bytes kept
    assert not conflicted.exists() and not newer.exists() and not bad_measurement.exists()
    assert newer_measurement.exists()  # a newer measurement stays where a newer reportgen finds it
    text = "\n".join(warnings)
    assert f"{conflicted}: not valid JSON" in text and "merge conflict" in text and "move it back" in text
    assert f"{newer}: schema_version {SCHEMA_VERSION + 1} was written by a newer reportgen" in text
    assert "Upgrade reportgen" in text and f"{newer_measurement}" in text


def test_render_reads_around_unusable_files_without_moving_them(tmp_path):
    work = copy_v1(tmp_path)
    bad = work / "v1" / f"{V1_PLAIN}.json"
    bad.write_text(CONFLICT)
    warnings: list[str] = []
    loaded = store.load_results(work / "v1", warnings.append)
    assert [r["id"] for r in loaded] == [V1_MEASURED_NOW] and bad.read_text() == CONFLICT
    assert any(str(bad) in w for w in warnings)


def test_files_nested_too_deeply_are_unreadable_not_a_traceback(tmp_path, capsys):
    """json.loads recurses per level: a result, walk or traced file nested 100,000 deep (a corrupt or
    hostile copy) is set aside by render and named by show, as a merge conflict is."""
    from reportgen.advise.store import ADVICE_DIR
    from reportgen.cli import main

    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    results = tmp_path / "results"
    walks = results / "x" / ADVICE_DIR
    walks.mkdir(parents=True)
    (results / "x" / "deep.json").write_text(deep)
    (walks / "deep.json").write_text(deep)
    (walks / "list.json").write_text("[1, 2]")
    with pytest.raises(UnreadableResult, match="nested too deeply to be a result file"):
        read_json(results / "x" / "deep.json")
    assert main(["render", "--results", str(results), "--docs", str(tmp_path / "docs")]) == 0
    assert "deep.json: nested too deeply to be a result file; skipped" in capsys.readouterr().err
    assert main(["show", "deep", "--results", str(results)]) == 2
    assert "deep.json: nested too deeply to be a result file" in capsys.readouterr().err


# ----- measurements are immutable ------------------------------------------------------------------
def test_write_json_new_never_overwrites(tmp_path):
    first = write_json_new(tmp_path / "a.json", {"n": 1})
    second = write_json_new(tmp_path / "a.json", {"n": 2})
    assert first.name == "a.json" and second.name == "a-2.json"
    assert json.loads(first.read_text()) == {"n": 1} and json.loads(second.read_text()) == {"n": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-2.json", "a.json"]  # no temp file left


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_result_files_get_the_mode_any_new_file_gets(tmp_path):
    """A team shares a results folder: files were 0600 (mkstemp's mode), unreadable to the others."""
    old = os.umask(0o027)
    try:
        results._umask.cache_clear()
        atomic = tmp_path / "estimate.json"
        results.write_json_atomic(atomic, {"n": 1})
        new = write_json_new(tmp_path / "measured.json", {"n": 1})
        assert stat.S_IMODE(atomic.stat().st_mode) == stat.S_IMODE(new.stat().st_mode) == 0o640
    finally:
        os.umask(old)
        results._umask.cache_clear()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_writing_never_puts_a_file_in_place_of_something_else(tmp_path, capsys):
    """As root, ``reportgen cards --out /dev/full`` replaced the device node with the JSON file (and
    ``--out /dev/stdout`` would have replaced the link): os.replace puts the file in place of whatever
    is there. Now a path that is not a file is refused and left alone; a symlink is written through."""
    from reportgen.cli import main

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FileExistsError, match="not a regular file"):
        results.write_json_atomic(fifo, {"n": 1})
    with pytest.raises(IsADirectoryError, match="a directory"):
        results.write_json_atomic(tmp_path, {"n": 1})
    assert main(["compare-published", "--out", str(fifo)]) == 2
    assert f"cannot use {fifo}: not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # left alone
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("{}")
    link.symlink_to(target)
    results.write_json_atomic(link, {"n": 1})
    assert link.is_symlink() and json.loads(target.read_text()) == {"n": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.json", "target.json"]  # no temp file
    loop = tmp_path / "loop.json"  # a link to itself: Path.resolve raised RuntimeError (a traceback)
    loop.symlink_to(loop.name)
    results.write_json_atomic(loop, {"n": 2})
    assert json.loads(loop.read_text()) == {"n": 2}


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_a_rewritten_file_keeps_its_mode(tmp_path):
    """As ``open(path, "w")`` does: a file someone made private stays private when it is rewritten."""
    path = tmp_path / "private.json"
    results.write_json_atomic(path, {"n": 1})
    path.chmod(0o600)
    results.write_json_atomic(path, {"n": 2})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and json.loads(path.read_text()) == {"n": 2}


def test_a_case_dropped_from_the_sweep_keeps_its_measurement_and_a_fresh_estimate(tmp_path, monkeypatch):
    work = copy_v1(tmp_path)
    monkeypatch.chdir(work)
    run_estimates(load_sweep("v1.yaml"), Path("."), warn=quiet)
    measured = files(work / "v1" / store.MEASURED_DIR)
    Path("v1.yaml").write_text(Path("v1.yaml").read_text().replace("method: [full, lora]", "method: lora"))
    stats = run_estimates(load_sweep("v1.yaml"), Path("."), warn=quiet)
    assert stats.orphans == 1 and stats.removed == 0
    assert files(work / "v1" / store.MEASURED_DIR) == measured
    kept = json.loads((work / "v1" / f"{V1_MEASURED_NOW}.json").read_text())
    assert kept["in_sweep"] is False and kept["status"] == "ok"
    # an estimate of a case nobody lists or measured is recomputable: it goes
    Path("v1.yaml").write_text(Path("v1.yaml").read_text().replace("method: lora", "method: full"))
    stats = run_estimates(load_sweep("v1.yaml"), Path("."), warn=quiet)
    assert stats.removed == 1 and not (work / "v1" / f"{V1_PLAIN_NOW}.json").exists()
    assert files(work / "v1" / store.MEASURED_DIR) == measured


# ----- estimates are keyed to the code that made them ----------------------------------------------
def test_a_changed_constant_recomputes_every_estimate_and_keeps_every_measurement(tmp_path):
    """The issue's test: change a constant, rerun the sweep, every estimate is rewritten and every
    measurement kept. The package is copied so the change is a real edit of a source file."""
    pkg = tmp_path / "code"
    shutil.copytree(ROOT / "reportgen", pkg / "reportgen", ignore=shutil.ignore_patterns("__pycache__"))
    work = copy_v1(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(pkg))

    def sweep() -> str:
        proc = subprocess.run([sys.executable, "-m", "reportgen", "sweep", "v1.yaml", "--no-render", "--results", "."],
                              cwd=work,
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return " ".join(proc.stderr.split())

    sweep()
    before = files(work / "v1")
    assert "2 unchanged" in sweep()  # nothing changed: nothing rewritten
    constants = pkg / "reportgen" / "estimate" / "constants.py"
    text = constants.read_text()
    value = re.search(r"^DRAM_EFFICIENCY = ([0-9.]+)$", text, re.M).group(1)
    constants.write_text(text.replace(f"DRAM_EFFICIENCY = {value}", f"DRAM_EFFICIENCY = {float(value) / 2}"))
    out = sweep()
    assert "2 written, 0 unchanged" in out
    after = files(work / "v1")
    estimates = [k for k in before if k.count("/") == 0 and k.endswith(".json")]
    assert len(estimates) == 2
    for name in estimates:
        old, new = json.loads(before[name]), json.loads(after[name])
        assert new["estimator_hash"] != old["estimator_hash"]
        assert new["estimate"]["time"]["memory_s"] == pytest.approx(2 * old["estimate"]["time"]["memory_s"])
    for name, data in before.items():
        if name.startswith("measured/"):
            assert after[name] == data
    assert sum(k.startswith("measured/") for k in after) == 1


def test_a_newer_measurement_is_warned_about_once_per_run(tmp_path, monkeypatch, capsys):
    """Issue 20: kept in place (nothing overwrites it) but warned about three times per run (the
    sweep's preparation, its estimate pass and its render each said so)."""
    from reportgen.cli import main

    work = copy_v1(tmp_path)
    monkeypatch.chdir(work)
    newer = work / "v1" / store.MEASURED_DIR / "y.20260101T000000Z.json"
    newer.parent.mkdir(exist_ok=True)
    newer.write_text(json.dumps({"schema_version": MEASUREMENT_SCHEMA_VERSION + 1, "id": "y", "status": "ok"}))
    assert main(["sweep", "v1.yaml", "--results", ".", "--docs", str(tmp_path / "docs")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert err.count("newer reportgen") == 1 and "left in place" in err
    assert newer.is_file()


def test_a_stored_measurement_is_known_as_written_so_a_second_migration_adds_no_copy(tmp_path):
    """``store._known`` compares what a migration would write with the files as stored: a file whose
    setup leaves fields out (an older writer's) is still recognised (the checked form fills them in)."""
    import json as _json

    from reportgen import store
    from reportgen.results import canonical, measurement_document

    real = sorted((Path(__file__).resolve().parents[1] / "results" / "validation" / "measured").glob("*.json"))[0]
    doc = _json.loads(real.read_text())
    case = {**doc["case"], "setup": {k: v for k, v in doc["case"]["setup"].items() if k != "compile"}}
    block = {k: v for k, v in doc.items() if k not in ("schema_version", "id", "sweep", "case")}
    mdoc = measurement_document(doc["id"], "s", case, block)
    (tmp_path / "s" / "measured").mkdir(parents=True)
    (tmp_path / "s" / "measured" / real.name).write_text(_json.dumps(mdoc))
    assert canonical(mdoc) in store._known(tmp_path / "s")
