"""Case ids (issue 20): long enough not to collide, a collision within a sweep is an error naming both
setups, a model given by path gets an id of its own (two config.json files are two models) that is
safe as a file name, and the files written under the 8-digit ids of before (the committed H100
measurements, the committed traces) still join their cases on the site and in ``reportgen show``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reportgen import results as R
from reportgen import store
from reportgen.cli import main
from reportgen.errors import UserError
from reportgen.report.render import load_site
from reportgen.runner import run_estimates
from reportgen.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "results" / "validation" / "measured"
CONFIG = ROOT / "reportgen" / "catalog" / "models" / "llama-3.2-1b.json"


def committed_measurements() -> list[dict]:
    return [R.read_measurement(p) for p in sorted(MEASURED.glob("*.json"))]


def test_committed_measurements_are_keyed_by_the_current_id_and_keep_their_old_one():
    docs = committed_measurements()
    legacy = [d for d in docs if len(d["id"].rpartition(".")[2]) != R.ID_HASH_DIGITS]
    assert len(legacy) == 52 and len(docs) > 52  # the first 52 files, and the later ones written with today's ids
    for doc in docs:
        now = R.current_id(doc)
        assert len(now.rpartition(".")[2]) == R.ID_HASH_DIGITS
        assert (now != doc["id"] and R.legacy_id(now) == doc["id"]) if doc in legacy else now == doc["id"]
    by_id = store.load_measurements(MEASURED.parent, warn=pytest.fail)
    assert sum(len(v) for v in by_id.values()) == len(docs)
    assert set(by_id) == {R.current_id(d) for d in docs}


@pytest.fixture(scope="module")
def validation(tmp_path_factory):
    """The validation sweep estimated next to a copy of the committed measurement files."""
    results = tmp_path_factory.mktemp("results")
    shutil.copytree(MEASURED, results / "validation" / "measured")
    run_estimates(load_sweep(ROOT / "sweeps" / "validation.yaml"), results, warn=lambda _: None)
    return results


def test_the_site_joins_every_committed_measurement_to_its_case(validation):
    site = load_site(validation, warn=pytest.fail)
    cases = site.results["validation"]
    measured = {r["id"] for r in cases if r["measurement"]}
    assert measured == {R.current_id(d) for d in committed_measurements()}
    # a row shows its case's latest run: an early file keeps its 8-digit id (stored_id), a later one has today's
    latest = {}
    for d in sorted(committed_measurements(), key=lambda d: d["measured_at"]):
        latest[R.current_id(d)] = d["id"]
    for r in cases:
        if r["measurement"]:
            assert r["measurement"].get("stored_id", r["id"]) == latest[r["id"]]


@pytest.mark.parametrize("which", ["current", "legacy"])
def test_show_finds_a_committed_measurement_by_its_new_and_its_old_id(validation, capsys, which):
    doc = next(d for d in committed_measurements() if d["status"] == "ok")
    now = R.current_id(doc)
    typed = now if which == "current" else doc["id"]
    assert main(["show", typed, "--results", str(validation)]) == 0
    out = capsys.readouterr().out
    assert f"case {now}  (sweep validation" in out and "measurement: none" not in out
    assert Path(MEASURED.name, Path(sorted(MEASURED.glob(doc["id"] + ".*.json"))[0]).name).as_posix() in out


def test_show_refuses_a_prefix_of_several_cases_and_what_is_no_id(validation, capsys):
    assert main(["show", "llama-3.1-8b.h100-sxm", "--results", str(validation)]) == 2
    assert "the beginning of" in capsys.readouterr().err
    assert main(["show", "../../etc/passwd", "--results", str(validation)]) == 2
    assert "is not a case id" in capsys.readouterr().err


# ----- collisions ----------------------------------------------------------------------------------
GRID = """\
name: many
grids:
  - model: llama-3.2-1b
    gpu: rtx-4090
    method: lora
    lora_rank: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
"""


def test_two_setups_with_one_id_are_an_error_naming_both(tmp_path, monkeypatch):
    path = tmp_path / "s.yaml"
    path.write_text(GRID)
    assert len(load_sweep(path).cases) == 20
    monkeypatch.setattr(R, "ID_HASH_DIGITS", 1)  # 16 possible ids for 20 setups: a collision for sure
    monkeypatch.setattr(R.case_id, "__defaults__", (1,))
    with pytest.raises(UserError) as exc:
        load_sweep(path)
    msg = str(exc.value)
    assert "two different setups have the case id" in msg
    ranks = [int(x) for x in __import__("re").findall(r"lora_rank=(\d+)", msg)]
    assert len(ranks) == 2 and ranks[0] != ranks[1]


def test_ids_of_a_large_grid_do_not_collide(tmp_path):
    """The audit's case: 100,000 setups collided at 8 hex digits; at 12 none do (and none may)."""
    from reportgen.setup import TrainingSetup

    base = TrainingSetup(method="lora").model_dump(mode="json")
    ids = {R.case_id("llama-3.2-1b", "rtx-4090", {**base, "lora_rank": r, "batch": b, "accum": a})
           for r in range(1, 101) for b in range(1, 101) for a in range(1, 11)}
    assert len(ids) == 100_000


# ----- models given by path ------------------------------------------------------------------------
def test_two_config_json_files_of_one_name_are_two_models(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        shutil.copy(CONFIG, tmp_path / folder / "config.json")
    path = tmp_path / "s.yaml"
    path.write_text(f"name: two\ngrids:\n  - model: [{tmp_path / 'a' / 'config.json'}, {tmp_path / 'b'}]\n"
                    "    gpu: t4\n")
    cases = load_sweep(path).cases
    assert len(cases) == 2 and len({c.id for c in cases}) == 2
    assert {c.id.split(".")[0] for c in cases} == {"a", "b"}


@pytest.mark.parametrize("model", ["{tmp}/<img src=x onerror=alert(4)>", "../m/dir", "{tmp}/dir/"])
def test_a_path_model_writes_only_under_results(tmp_path, monkeypatch, model):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    model = model.format(tmp=tmp_path)
    folder = (work / model).resolve() if not Path(model).is_absolute() else Path(model)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONFIG, folder / "config.json")
    Path("s.yaml").write_text(f"name: p\ngrids:\n  - model: '{model}'\n    gpu: t4\n    method: lora\n")
    before = {p for p in tmp_path.rglob("*")}
    assert main(["sweep", "s.yaml", "--results", "results", "--no-render"]) == 0
    new = {p for p in tmp_path.rglob("*")} - before
    assert new and all((work / "results") in p.parents or p == work / "results" for p in new), sorted(new)
    for p in new:
        assert "<" not in p.name and ">" not in p.name
