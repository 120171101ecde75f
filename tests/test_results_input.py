"""Issue 29, class 2: files under ``results/`` are input. A link to a device, a FIFO, strict-JSON
violations and values of the wrong type are refused with the file named; the rest of the site renders;
a sweep recomputes a damaged estimate (or walk) although its inputs hash is current; and, property
tested, no damaged or forged file makes a command exit with anything but 0 or 2, or hang."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from reportgen import store
from reportgen.cli import main
from reportgen.results import UnreadableResult, read_json

ROOT = Path(__file__).resolve().parents[1]
REAL = sorted((ROOT / "results" / "validation" / "measured").glob("llama-3.2-1b.h100-sxm.lora.*.json"))[0]
SWEEP = """name: t
grids:
  - model: llama-3.2-1b
    gpu: h100-sxm
    method: lora
    lora_rank: 16
    batch: 1
    seq: 2048
    grad_ckpt: true
"""


def _run(*argv: str) -> int:
    try:
        return main(list(argv)) or 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A results folder of one swept case (estimate and walk) and its real H100 measurement."""
    root = tmp_path_factory.mktemp("pristine")
    (root / "t.yaml").write_text(SWEEP)
    assert _run("sweep", str(root / "t.yaml"), "--results", str(root / "results"), "--no-render") == 0
    doc = json.loads(REAL.read_text())
    (est,) = store.estimate_files(root / "results" / "t")
    assert est.stem == doc["id"] or est.stem.startswith(doc["id"]), "the sweep's case is the measured one"
    doc["sweep"] = "t"
    (root / "results" / "t" / "measured").mkdir()
    (root / "results" / "t" / "measured" / REAL.name).write_text(json.dumps(doc))
    return root


@pytest.fixture
def work(pristine, tmp_path) -> Path:
    shutil.copytree(pristine, tmp_path / "w")
    return tmp_path / "w"


def _estimate(work: Path) -> Path:
    return store.estimate_files(work / "results" / "t")[0]


def _measurement(work: Path) -> Path:
    return store.measurement_files(work / "results" / "t")[0]


def _edit(path: Path, dotted: str, value) -> None:
    doc = json.loads(path.read_text())
    where = doc
    *parents, last = dotted.split(".")
    for p in parents:
        where = where[p]
    if value is _DELETE:
        del where[last]
    else:
        where[last] = value
    path.write_text(json.dumps(doc))


_DELETE = object()


def _in_time(fn, seconds: float = 10):
    """``fn()``'s outcome, failing the test (instead of hanging the suite) when it blocks."""
    box: dict = {}

    def go():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "blocked: a reader waited on a FIFO or read a file that never ends"
    if "error" in box:
        raise box["error"]
    return box["value"]


# ----- the guarded reader ---------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_named_like_a_result_is_refused_at_once(tmp_path):
    fifo = tmp_path / "x.json"
    os.mkfifo(fifo)
    with pytest.raises(UnreadableResult, match="FIFO"):
        _in_time(lambda: read_json(fifo))


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_link_to_a_device_is_refused_not_read(tmp_path):
    link = tmp_path / "x.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(UnreadableResult, match="character device"):
        _in_time(lambda: read_json(link))


def test_nan_infinity_and_huge_files_are_refused(tmp_path, monkeypatch):
    p = tmp_path / "x.json"
    for constant in ("NaN", "Infinity", "-Infinity"):
        p.write_text('{"a": %s}' % constant)
        with pytest.raises(UnreadableResult, match=constant):
            read_json(p)
    from reportgen import results

    monkeypatch.setattr(results, "MAX_RESULT_BYTES", 10)
    p.write_text('{"a": "12345678901"}')
    with pytest.raises(UnreadableResult, match="at most 10"):
        read_json(p)


def test_a_result_is_never_written_with_nan(tmp_path):
    from reportgen.results import write_json_atomic

    with pytest.raises(ValueError):
        write_json_atomic(tmp_path / "x.json", {"a": float("nan")})


# ----- values of the wrong type -----------------------------------------------------------------------
@pytest.mark.parametrize("which, dotted, value, says", [
    ("estimate", "estimate.memory", "lots", "estimate.memory"),
    ("estimate", "estimate.memory.weights", {"a": 1}, "estimate.memory.weights"),
    ("estimate", "estimate.time.step_s", "fast", "estimate.time.step_s"),
    ("estimate", "estimate.fits", "yes", "estimate.fits"),
    ("estimate", "case.setup", "lora", "case.setup"),
    ("estimate", "case.setup.batch", "four", "not a setup of this version"),
    ("estimate", "case.gpu", "tpu-v9", "not in this version's GPU catalog"),
    ("estimate", "sweep", _DELETE, "sweep: missing"),
    ("estimate", "estimate", None, "status ok but no estimate"),
    ("measurement", "case.setup", "lora", "case.setup"),
    ("measurement", "sweep", _DELETE, "sweep: missing"),
    ("measurement", "measurement", [1, 2], "measurement"),
    ("measurement", "environment", "cuda", "environment"),
    ("measurement", "case.gpu", "tpu-v9", "not in this version's GPU catalog"),
])
def test_a_file_of_the_wrong_shape_is_named_and_the_rest_renders(work, capsys, which, dotted, value, says):
    path = _estimate(work) if which == "estimate" else _measurement(work)
    _edit(path, dotted, value)
    assert _run("render", "--results", str(work / "results"), "--docs", str(work / "docs")) == 0
    err = capsys.readouterr().err
    assert str(path.name) in err and says in err, err
    assert (work / "docs" / "index.md").exists()
    # 2 when the one measurement was refused: "no measurement ... counts", said, not a traceback
    assert _run("validation", "--results", str(work / "results")) in (0, 2)
    assert _run("show", json.loads(REAL.read_text())["id"], "--results", str(work / "results")) in (0, 2)


def test_a_sweep_recomputes_a_damaged_estimate_whose_hash_is_current(work):
    path = _estimate(work)
    _edit(path, "estimate.memory", "lots")
    assert _run("sweep", str(work / "t.yaml"), "--results", str(work / "results"), "--no-render") == 0
    assert isinstance(json.loads(path.read_text())["estimate"]["memory"], dict)


def test_an_edited_walk_is_skipped_and_recomputed(work, capsys):
    (walk,) = sorted((work / "results" / "t" / "_advice").glob("*.json"))
    _edit(walk, "steps", "lots")
    assert _run("render", "--results", str(work / "results"), "--docs", str(work / "docs")) == 0
    assert walk.name in capsys.readouterr().err
    assert _run("sweep", str(work / "t.yaml"), "--results", str(work / "results"), "--no-render") == 0
    assert isinstance(json.loads(walk.read_text())["steps"], list)


def test_validation_names_a_forged_run_it_sets_aside(work, capsys):
    _edit(_measurement(work), "settings.device", "cpu")  # a CPU run edited to say cuda
    assert _run("validation", "--results", str(work / "results")) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "set aside, compared with nothing: llama-3.2-1b.h100-sxm.lora." in err
    assert "its settings say it ran on the CPU" in err


def test_validation_sets_aside_a_run_with_a_negative_host_peak(work, capsys):
    """Issue 32: the host memory figures are checked as the GPU ones: the file reads (well-formed),
    and is set aside with its reason."""
    _edit(_measurement(work), "measurement.host_peak_rss", -1)
    assert _run("validation", "--results", str(work / "results")) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "set aside, compared with nothing: llama-3.2-1b.h100-sxm.lora." in err
    assert "its host_peak_rss (-1) is not a size, time or rate" in err


# ----- property: no damaged file is a traceback, a hang or a published impossibility ---------------------
def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))


def _possible(m: dict) -> None:
    """What any run that is compared must be: a CUDA run by its settings too, with figures that are
    finite non-negative numbers in an order the allocator allows and an MFU within the card."""
    import math

    assert m["environment"]["device"] == "cuda" and (m.get("settings") or {}).get("device") != "cpu"
    fig = m.get("measurement") or {}
    for k in ("peak_allocated", "peak_reserved", "device_used", "step_s", "tokens_per_s", "mfu"):
        v = fig.get(k)
        assert v is None or (type(v) in (int, float) and math.isfinite(v) and v >= 0), (k, v)
    alloc, reserved, used = fig.get("peak_allocated"), fig.get("peak_reserved"), fig.get("device_used")
    assert None in (alloc, reserved) or reserved >= alloc
    assert None in (reserved, used) or used >= reserved
    assert (fig.get("mfu") or 0) <= 1 and fig.get("step_s") != 0 and (alloc is None or alloc >= 0.5 * 1_235_814_400)


def test_any_damaged_result_file_exits_0_or_2_and_publishes_nothing_impossible(pristine, tmp_path_factory):
    """Property (hypothesis): replace any value, at any depth, of the estimate or the measurement file
    with any JSON value (or delete it), then render, validate and show: each exits 0 or 2, never raises.
    A measurement that survives the readers is compared only if the consistency check passed it."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from reportgen.provenance import provenance_of
    from reportgen.report.render import load_site

    est_doc = json.loads(_estimate(pristine).read_text())
    meas_doc = json.loads(_measurement(pristine).read_text())
    targets = [("estimate", p) for p in _paths(est_doc) if p] + [("measurement", p) for p in _paths(meas_doc) if p]
    leaves = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**63, max_value=2**63),
                       st.floats(allow_nan=False), st.text(max_size=6))
    values = st.one_of(leaves, st.lists(leaves, max_size=2), st.dictionaries(st.text(max_size=3), leaves, max_size=2),
                       st.just(_DELETE))

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(targets), values)
    def check(target, value):
        work = tmp_path_factory.mktemp("damaged")
        shutil.copytree(pristine / "results", work / "results")
        which, path = target
        file = _estimate(work) if which == "estimate" else _measurement(work)
        _edit(file, ".".join(path), value)
        assert _run("render", "--results", str(work / "results"), "--docs", str(work / "docs")) in (0, 2)
        assert _run("validation", "--results", str(work / "results")) in (0, 2)
        assert _run("show", meas_doc["id"], "--results", str(work / "results")) in (0, 2)
        for r in load_site(work / "results", warn=lambda m: None).all_results():
            for m in r["measurements"]:
                if provenance_of(m).valid_quantities(r["case"]["gpu"]):
                    _possible(m)

    check()
