"""The estimator hash covers every file an estimate depends on (``reportgen/fingerprint.py``)."""

from __future__ import annotations

import json
import shutil


def test_every_file_an_estimate_reads_is_in_the_estimator_hash(tmp_path):
    """Issue 20: editing ``estimate/error_band.json`` left every stored estimate "unchanged" with the
    old band. Every data file beside the estimator's code is hashed, and an edit changes the hash."""
    from reportgen.fingerprint import ESTIMATOR_SOURCES, PACKAGE, source_hash

    covered = {p for pattern in ESTIMATOR_SOURCES for p in PACKAGE.glob(pattern)}
    data = [p for p in (PACKAGE / "estimate").iterdir() if p.is_file() and p.suffix != ".py"]
    assert data and set(data) <= covered, sorted(set(data) - covered)
    pkg = tmp_path / "reportgen"
    shutil.copytree(PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = source_hash(ESTIMATOR_SOURCES, root=pkg)
    band = pkg / "estimate" / "error_band.json"
    doc = json.loads(band.read_text())
    doc["edited_by_test"] = True
    band.write_text(json.dumps(doc))
    assert source_hash(ESTIMATOR_SOURCES, root=pkg) != before

