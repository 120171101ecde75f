"""The Python runtime of the site's calculator: Pyodide's core, served from the built site.

The files come from the npm registry's tarball of one pinned Pyodide version, checked against the
integrity hash the registry publishes for it (``npm view pyodide@VERSION dist.integrity``), and
kept under ``~/.cache/reportgen/`` (``$REPORTGEN_CACHE``, else ``$XDG_CACHE_HOME/reportgen``): the
first render on a machine downloads 6.5 MB once, later renders and the built site need no network.
Nothing is vendored in git. ``$npm_config_registry`` (npm's own setting) points at a mirror; the
integrity check stays.

Only the core is served (no packages from Pyodide's CDN): the estimator is pure Python and needs
nothing beyond the standard library and PyYAML's pure-Python modules (``calculator.py`` ships those).
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import tarfile
import urllib.request
from functools import lru_cache
from pathlib import Path

VERSION = "314.0.7"
#: ``dist.integrity`` of pyodide@VERSION in the npm registry
INTEGRITY = "sha512-0YvXxEhfEdpLfb/XkM2BFAeMROq0iMUX2bzzH9pOttyMcWkwq+HbE5uyuGD82LN7y2q+SNvi/6V5JEsOlD2R1A=="
REGISTRY = "https://registry.npmjs.org/"
#: the files of the tarball the browser loads (``loadPyodide`` with no packages), and its license field
FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json",
         "package.json")
SOURCE = "https://github.com/pyodide/pyodide"
LICENSE = "MPL-2.0"
LICENSE_URL = "https://mozilla.org/MPL/2.0/"


class RuntimeUnavailable(Exception):
    """The tarball is neither cached nor downloadable (offline on a fresh machine, a bad download)."""


def cache_dir() -> Path:
    root = os.environ.get("REPORTGEN_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "reportgen"


def tarball_url(registry: str | None = None) -> str:
    registry = (registry or os.environ.get("npm_config_registry") or REGISTRY).rstrip("/")
    return f"{registry}/pyodide/-/pyodide-{VERSION}.tgz"


def integrity_of(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def tarball(download: bool = True) -> Path:
    """The checked tarball in the cache, downloaded first when missing (``download=False``: raise)."""
    path = cache_dir() / f"pyodide-{VERSION}.tgz"
    if path.is_file() and integrity_of(path.read_bytes()) == INTEGRITY:
        return path
    if not download:
        raise RuntimeUnavailable(f"{path} is missing")
    url = tarball_url()
    print(f"reportgen: downloading Pyodide {VERSION} for the calculator from {url} (once; cached in {path.parent})",
          file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            data = response.read()
    except OSError as exc:
        raise RuntimeUnavailable(f"cannot download {url}: {exc}") from None
    got = integrity_of(data)
    if got != INTEGRITY:
        raise RuntimeUnavailable(f"{url}: integrity {got} is not the pinned {INTEGRITY}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


@lru_cache(maxsize=2)
def _files(path: Path, mtime_ns: int) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with tarfile.open(path, "r:gz") as tar:
        for name in FILES:
            member = tar.extractfile(f"package/{name}")
            if member is None:
                raise RuntimeUnavailable(f"{path} has no package/{name}")
            out[name] = member.read()
    return out


def runtime_files(download: bool = True) -> dict[str, bytes]:
    """``{file name: bytes}`` of the files the browser loads, from the checked tarball."""
    path = tarball(download)
    try:
        return _files(path, path.stat().st_mtime_ns)
    except (OSError, tarfile.TarError, KeyError) as exc:
        raise RuntimeUnavailable(f"{path}: {exc}") from None


def notice() -> str:
    """Where the runtime's files come from and under which license (served beside them)."""
    return (f"Pyodide {VERSION}: the files {', '.join(FILES)} of the npm package pyodide@{VERSION}, unmodified,\n"
            f"from {tarball_url(REGISTRY)} ({INTEGRITY}).\n"
            f"License: {LICENSE} (package.json), {LICENSE_URL}; source code: {SOURCE} (tag {VERSION}).\n"
            "It contains CPython and its standard library (PSF License Agreement, https://docs.python.org/3/license.html).\n"
            "reportgen's calculator page loads it to run reportgen's own estimator in the browser.\n")
