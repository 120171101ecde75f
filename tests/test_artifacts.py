"""One artifact type for every recomputable document (``reportgen/artifacts.py``): a producer skips a
document computed from today's inputs, rewrites a stale one, and prunes the files nobody keeps; every
producer of a recomputable document stores it through it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from reportgen.artifacts import KINDS, Artifact, is_current, prune

ROOT = Path(__file__).resolve().parents[1]


def test_a_document_is_current_only_with_the_hash_of_todays_inputs(tmp_path):
    a = Artifact("estimate", tmp_path / "sweep" / "case.json", "abc")
    assert a.stored() is None and not a.is_current(a.stored())  # nothing stored yet: compute it
    a.write({"inputs_hash": "abc", "x": 1})
    assert a.stored() == {"inputs_hash": "abc", "x": 1} and a.is_current(a.stored())
    assert not Artifact("estimate", a.path, "abd").is_current(a.stored())  # an input changed: stale
    a.path.write_text("{not json")
    assert a.stored() is None  # unreadable: recomputed, never a crash
    cards = Artifact("cards", tmp_path / "cards.json", "e1", hash_key="estimator_hash")
    assert cards.is_current({"estimator_hash": "e1"}) and not cards.is_current({"inputs_hash": "e1"})
    assert not is_current(None, "abc")
    a.remove()
    a.remove()  # removing what is not there is no error
    assert not a.path.exists()
    with pytest.raises(ValueError, match="unknown artifact kind"):
        Artifact("measurement", a.path, "abc")  # measurements are written once, never recomputed


def test_prune_removes_only_what_is_not_kept(tmp_path):
    files = [tmp_path / f"{n}.json" for n in "abc"]
    for f in files:
        f.write_text(json.dumps({}))
    assert prune(files, lambda p: p.stem != "b") == 1
    assert [f.exists() for f in files] == [True, False, True]


def test_every_producer_outside_trace_and_measure_writes_through_an_artifact():
    """The modules that store recomputable documents build an ``Artifact`` of their kind and write no
    JSON file of their own (``write_json_atomic`` only in the store's modules)."""
    users = {"estimate": "reportgen/runner.py", "advice": "reportgen/advise/store.py",
             "trace": "reportgen/traced_results.py", "cards": "reportgen/advise/cli.py",
             "published": "reportgen/published/cli.py"}
    assert set(users) == set(KINDS)
    for kind, rel in users.items():
        tree = ast.parse((ROOT / rel).read_text())
        built = {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", None) == "Artifact" and isinstance(n.args[0], ast.Constant)}
        assert kind in built, f"{rel} does not store its {kind} documents as an Artifact"
    writers = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "reportgen").rglob("*.py")
                     if "write_json_atomic(" in p.read_text())
    allowed = {"reportgen/results.py", "reportgen/artifacts.py",
               "reportgen/store.py",  # migrating an old schema's file in place, not a new document
               "reportgen/traced_results.py"}  # renaming files of old ids, not a new document
    outside = [w for w in writers if w not in allowed and not w.startswith(("reportgen/measure/", "reportgen/trace/"))]
    assert not outside, f"recomputable documents written outside the artifact store: {outside}"
