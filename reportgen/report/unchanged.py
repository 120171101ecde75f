"""Whether a render would write what the last one wrote: the key of everything a render reads.

A second ``reportgen sweep sweeps/consumer.yaml`` with nothing changed re-rendered every page (about
5 s of the 6 s run, issue 31). A render reads only: the result files under ``--results``, the
comparison with published rows (``--published``), the code and data of the package (templates,
catalogs, the estimator whose hash pages print), the repository's ``data/`` files, the commit it
prints and whether the calculator's runtime is cached. The key hashes the path, size and mtime of
each of those files (a ``stat`` each, no reading, except the package's own sources), so a run with
nothing changed compares one string and writes nothing. ``write_outputs`` records the key in the
manifest beside the files it wrote; ``render_all`` skips when both are there as they were left.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from reportgen.fingerprint import PACKAGE, source_hash


def _stats(root: Path | None) -> list:
    if root is None or not Path(root).exists():
        return []
    root = Path(root)
    if root.is_file():
        st = root.stat()
        return [(root.name, st.st_size, st.st_mtime_ns)]
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out.append((p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns))
    return out


def render_key(results_dir: Path, published: Path | None, commit: str | None, providers: tuple | None) -> str:
    """The hash of every input of a render (module docstring)."""
    from reportgen.report.pyodide import VERSION, cache_dir

    parts = {
        "results": _stats(results_dir),
        "published": _stats(published),
        "data": _stats(PACKAGE.parent / "data"),
        "code": source_hash(("**/*.py", "**/*.j2", "**/*.yaml", "**/*.json", "**/*.md", "**/*.js")),
        "commit": commit,
        "providers": list(providers) if providers else None,
        "runtime": (cache_dir() / f"pyodide-{VERSION}.tgz").is_file(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def unchanged(docs_dir: Path, manifest: dict | None, key: str) -> list[str] | None:
    """The pages of the last render when it read what this one would and left every file it wrote
    in place; else None (render)."""
    if not manifest or manifest.get("inputs") != key or not isinstance(manifest.get("pages"), list):
        return None
    files = manifest.get("files") or []
    if not all((Path(docs_dir) / f).is_file() for f in files):
        return None
    return manifest["pages"]
