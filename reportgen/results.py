"""Result files: one JSON per case under ``results/<sweep>/``, written atomically.

A result holds the case (model, GPU, setup), the estimate, optionally a measurement with the
environment it was measured in, and a status. ``inputs_hash`` covers everything an estimate
depends on (case, model config, GPU entry, estimator version), so a rerun can skip unchanged
cases. ``schema_version`` lets later code migrate old files.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "error", "timeout")


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def short_hash(obj: Any, n: int = 10) -> str:
    return hashlib.sha256(canonical(obj).encode()).hexdigest()[:n]


#: setup fields added after the first result files, with the value every older setup had: left
#: out of the hash at that value, so adding a field keeps every existing case id
ADDED_SETUP_FIELDS = {"lora_dropout": 0.0}


def case_id(model: str, gpu: str, setup: dict) -> str:
    """Stable, readable id: ``<model>.<gpu>.<method>.<hash of the whole setup>``."""
    model_part = Path(model).stem if model.endswith(".json") else model
    hashed = {k: v for k, v in setup.items() if k not in ADDED_SETUP_FIELDS or v != ADDED_SETUP_FIELDS[k]}
    return f"{model_part}.{gpu}.{setup['method']}.{short_hash(hashed, 8)}"


def write_json_atomic(path: Path, data: dict) -> None:
    """Write sorted, indented JSON through a temp file and ``os.replace`` so a reader (or an
    interrupted run) never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_result(path: Path) -> dict:
    data = json.loads(path.read_text())
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {version!r}, this reportgen reads {SCHEMA_VERSION}")
    return data


def result_path(results_dir: Path, sweep: str, cid: str) -> Path:
    return results_dir / sweep / f"{cid}.json"


def iter_results(sweep_dir: Path) -> list[dict]:
    """All results of one sweep, sorted by case id (deterministic order for rendering)."""
    return [read_result(p) for p in sorted(sweep_dir.glob("*.json"))]
