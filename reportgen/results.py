"""Result documents: ids, hashes, atomic and exclusive writes, schema versions and their migrations.

Two kinds of document, kept in separate files (the layout is ``reportgen/store.py``'s):

* an **estimate** document per case (``SCHEMA_VERSION``): the case (model, GPU, setup), the
  estimate, its status, and ``inputs_hash``, which covers everything the estimate depends on (the
  case, the model config, the GPU's catalog entry, the estimator's source code through
  ``fingerprint.estimator_hash``, the training tokens), so a rerun recomputes exactly the
  estimates whose inputs or code changed. Recomputable: a sweep rewrites it at will.
* a **measurement** document per measuring attempt (``MEASUREMENT_SCHEMA_VERSION``): the case and
  the block ``reportgen.measure.runner`` records (status, figures, environment, cap, settings,
  time). Immutable: written once under a new name, never overwritten or deleted by any command.

Schema history (each step has a migration in ``MIGRATIONS``, tested by a round trip of a file of
every earlier version, ``tests/test_results_store.py``):

* estimate v1: the measurement block was embedded under ``measurement`` of the estimate file, so a
  recomputed estimate could drop or keep a stale measurement. v2 moves it to its own document
  (``migrate`` returns it) and drops ``estimator_version`` for ``estimator_hash``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import tempfile
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from reportgen import userfile

SCHEMA_VERSION = 2
MEASUREMENT_SCHEMA_VERSION = 1


class UnreadableResult(Exception):
    """A result file this reportgen cannot use: not JSON (a merge conflict, a truncated copy), not a
    result, or written by a newer reportgen (``newer``)."""

    def __init__(self, path: Path, reason: str, newer: bool = False):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.newer = Path(path), reason, newer


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def short_hash(obj: Any, n: int = 10) -> str:
    return hashlib.sha256(canonical(obj).encode()).hexdigest()[:n]


#: setup fields added after the first result files, with the value every older setup had: left
#: out of the hash at that value, so adding a field keeps every existing case id
ADDED_SETUP_FIELDS = {"lora_dropout": 0.0, "padding": "longest", "seq_mean": None, "keep_outputs": "none",
                      "optimizer_in_backward": False, "act_offload": False, "quant_head": False,
                      "frozen_dtype": "compute", "kbit_prep": None,
                      "compile": False, "dora": False, "recipe": "loop"}


#: hex digits of the setup hash in a case id: 12 (48 bits) keeps a sweep of a million cases free of
#: collisions with probability 0.998 (birthday bound n^2 / 2^49), and ``sweep.py`` refuses a collision
#: within a sweep. Ids written before had 8 (a 100,000-case grid collided): ``legacy_id`` gives that
#: form, a prefix of the current one, so files named or keyed by it stay joinable (``current_id``)
ID_HASH_DIGITS = 12
LEGACY_ID_HASH_DIGITS = 8
#: a model named like this is a catalog name (or a bare folder name): it is its own id part
_PLAIN_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _is_path_model(model: str) -> bool:
    return model.endswith(".json") or not _PLAIN_MODEL.fullmatch(model)


def model_slug(model: str) -> str:
    """The model's part of a case id and of file names: a catalog name as it is; for a path, the
    folder of its ``config.json`` (or the file's stem, or the folder's name) with every character
    outside ``A-Za-z0-9._-`` replaced, so an id never holds a path separator or markup."""
    if not _is_path_model(model):
        return model
    parts = [p for p in re.split(r"[\\/]+", model) if p not in ("", ".", "..")]
    name = parts[-1] if parts else "model"
    if name == "config.json" and len(parts) > 1:
        name = parts[-2]
    elif name.endswith(".json"):
        name = name[: -len(".json")]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:48].strip(".-")
    return slug or "model"


def model_file_part(model: str) -> str:
    """The model's part of a file name that has no hash of its own (``_advice/<model>.<gpu>...``):
    ``model_slug``, plus a hash of the path for a model given by path (two folders, two names)."""
    return model_slug(model) + (f"-{short_hash(model, 8)}" if _is_path_model(model) else "")


def _case_hash(model: str, setup: dict, digits: int) -> str:
    hashed = {k: v for k, v in setup.items() if k not in ADDED_SETUP_FIELDS or v != ADDED_SETUP_FIELDS[k]}
    if _is_path_model(model):  # two config.json files of one name are two models
        hashed = {**hashed, "model_path": model}
    return short_hash(hashed, digits)


def case_id(model: str, gpu: str, setup: dict, digits: int = ID_HASH_DIGITS) -> str:
    """Stable, readable id: ``<model>.<gpu>.<method>.<hash of the whole setup>`` (a model given by
    path: its slug, ``model_slug``, with the path in the hash)."""
    return f"{model_slug(model)}.{gpu}.{setup['method']}.{_case_hash(model, setup, digits)}"


def legacy_id(cid: str) -> str:
    """The 8-digit form of a current id (what files written before the longer hash hold)."""
    head, _, digest = cid.rpartition(".")
    return f"{head}.{digest[:LEGACY_ID_HASH_DIGITS]}" if len(digest) > LEGACY_ID_HASH_DIGITS else cid


def current_id(doc: dict) -> str:
    """The current id of a stored document's case (``doc["case"]``: model, gpu, setup), so a file
    written under an older id joins its case; the stored ``id`` when the case cannot be read."""
    from reportgen.setup import TrainingSetup

    case = doc.get("case")
    try:
        setup = TrainingSetup.model_validate(case["setup"]).model_dump(mode="json")
        return case_id(str(case["model"]), str(case["gpu"]), setup)
    except Exception:  # noqa: BLE001 - a case of another version: keep the id it was stored under
        return str(doc.get("id"))


def _dump(data: dict) -> str:
    """Strict JSON (``allow_nan=False``): a NaN or infinity reaching a result is a bug, refused where it
    is written rather than stored as a bare ``NaN`` no other JSON reader accepts."""
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


def _temp_beside(path: Path) -> tuple[int, str]:
    """A temp file in ``path``'s folder, with the mode ``open(path, "w")`` would leave: the file's own
    mode when it is being rewritten, else 0666 less the umask. ``mkstemp`` makes it 0600, so every
    result file was unreadable to the rest of a team sharing the results folder (a cluster's shared
    disk, a CI artifact)."""
    mode = 0o666 & ~_umask()
    try:
        if path.is_file():
            mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
    except (AttributeError, OSError):  # no fchmod (Windows, Pyodide): the temp file's own mode
        pass
    return fd, tmp


_UMASK_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _umask() -> int:
    """The process's umask: read from /proc (Linux), else set and restored once under a lock; set to
    0o077 in the meantime, so a file another thread creates then gets no more permission than it
    would have."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def write_json_atomic(path: Path, data: dict) -> None:
    """Write sorted, indented JSON through a temp file and ``os.replace`` so a reader (or an
    interrupted run) never sees a half-written file. A symlink is written through: its target is
    replaced, or created with its folders when missing. A path that is something other than a file
    is refused (``IsADirectoryError`` or ``FileExistsError``): ``os.replace`` would have put the file
    in its place, and as root ``reportgen cards --out /dev/full`` replaced the device node, ``--out
    /dev/stdout`` the link. (Checked, then written: a path that changes in between is not guarded.)"""
    path = Path(path)
    if path.is_dir():  # through a symlink: what it points to
        raise IsADirectoryError(errno.EISDIR, "a directory; reportgen writes a new file here", str(path))
    if path.exists() and not path.is_file():
        raise FileExistsError(errno.EEXIST, "not a regular file; reportgen writes a new file here", str(path))
    if path.is_symlink():
        path = Path(os.path.realpath(path))  # never raises (Path.resolve does on a loop): a loop is replaced
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _temp_beside(path)
    except OSError as exc:  # name the file the caller asked for, not the temp file
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(_dump(data))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_new(path: Path, data: dict) -> Path:
    """Write ``data`` to ``path`` only if nothing is there, atomically: a temp file hard-linked to
    the name (``link`` fails when the name exists, so nothing is ever overwritten). When the name
    is taken, ``-2``, ``-3``, ... is added before ``.json``. Returns the path written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(_dump(data))
        stem = path.name[: -len(".json")] if path.name.endswith(".json") else path.name
        for n in range(1, 10_000):
            target = path if n == 1 else path.with_name(f"{stem}-{n}.json")
            try:
                os.link(tmp, target)
                return target
            except FileExistsError:
                continue
        raise FileExistsError(f"{path}: no free name")
    finally:
        Path(tmp).unlink(missing_ok=True)


#: the largest result file read (the largest committed one is under 10 KB; a traced document with its
#: allocation timeline under 1 MB): a ``*.json`` that is a link to ``/dev/zero`` is refused, not read
MAX_RESULT_BYTES = 16_000_000


def _kind_of(mode: int) -> str:
    for test, noun in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return noun
    return "not a regular file"


def _no_constant(name: str):
    raise ValueError(f"{name} is no number a result file holds")


def read_json(path: Path) -> dict:
    """A result file's JSON object, read like user input (issue 29): only a regular file (a FIFO named
    like a result would block the reader forever, a link to a device never ends), at most
    ``MAX_RESULT_BYTES``, strict JSON (``NaN`` and ``Infinity`` are refused: no writer here writes
    them). Raises ``UnreadableResult`` saying why."""
    try:
        mode = os.stat(path).st_mode  # follows a link: what would be read
        if not stat.S_ISREG(mode):
            raise UnreadableResult(path, f"is {_kind_of(mode)}, not a result file")
        data = json.loads(userfile.read_bytes(path, MAX_RESULT_BYTES).decode("utf-8"),
                          parse_constant=_no_constant)
    except userfile.TooLarge as exc:
        raise UnreadableResult(path, f"holds {exc.amount()}; a result file is at most {MAX_RESULT_BYTES:,}") from None
    except json.JSONDecodeError as exc:
        raise UnreadableResult(path, f"not valid JSON at line {exc.lineno} ({exc.msg}); a merge conflict?") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableResult(path, f"cannot be read ({exc})") from None
    except ValueError as exc:  # NaN / Infinity (parse_constant); both errors above are ValueErrors too
        raise UnreadableResult(path, f"not a result file's JSON ({exc})") from None
    except RecursionError:  # json.loads recurses per nesting level
        raise UnreadableResult(path, "nested too deeply to be a result file") from None
    if not isinstance(data, dict):
        raise UnreadableResult(path, f"holds a JSON {type(data).__name__}, not a result object")
    return data


# ----- estimate documents ---------------------------------------------------------------------------
def _v1_to_v2(doc: dict) -> tuple[dict, dict | None]:
    """v1 -> v2: the embedded measurement block leaves the estimate document; ``estimator_version``
    (a number someone had to remember to bump) gives way to the code hash, unknown for v1 files."""
    doc = dict(doc)
    block = doc.pop("measurement", None) or None
    version = doc.pop("estimator_version", None)
    doc["estimator_hash"] = f"v1-estimator-{version}" if version is not None else None
    doc["in_sweep"] = True
    doc["schema_version"] = 2
    return doc, block


#: schema version -> migration to the next version: ``doc -> (next doc, measurement block or None)``
MIGRATIONS = {1: _v1_to_v2}


def migrate(doc: dict, path: Path | str = "<result>") -> tuple[dict, list[dict]]:
    """An estimate document of any known schema version as the current version, and the measurement
    blocks older versions embedded in it (each to be stored as its own measurement document).
    Raises ``UnreadableResult`` for a newer or unknown version."""
    version = doc.get("schema_version")
    blocks: list[dict] = []
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise UnreadableResult(Path(path), f"schema_version {version} was written by a newer reportgen "
                               f"(this one reads up to {SCHEMA_VERSION})", newer=True)
    while version != SCHEMA_VERSION:
        step = MIGRATIONS.get(version) if isinstance(version, int) else None  # a list is no key
        if step is None:
            raise UnreadableResult(Path(path), f"schema_version {version!r} is not a reportgen result schema")
        doc, block = step(doc)
        if block:
            blocks.append(block)
        version = doc["schema_version"]
    for key in ("id", "case"):
        if key not in doc:
            raise UnreadableResult(Path(path), f"has no {key!r}: not a reportgen result")
    return doc, blocks


def read_result(path: Path) -> dict:
    """The estimate document at ``path`` as the current schema (older ones migrated in memory; their
    embedded measurements are left out here, ``store.py`` keeps them). Raises ``UnreadableResult``."""
    return migrate(read_json(path), path)[0]


# ----- measurement documents ------------------------------------------------------------------------
def measurement_document(cid: str, sweep: str, case: dict, block: dict) -> dict:
    """The file form of one measuring attempt: the block plus what it measured."""
    return {**block, "schema_version": MEASUREMENT_SCHEMA_VERSION, "id": cid, "sweep": sweep, "case": case}


def read_versioned(path: Path, kind: str, noun: str, supported: int, required: set[str],
                   ok=lambda data: True) -> dict:
    """A write-once document of one schema version (a measurement, a trace): ``UnreadableResult``
    with ``newer`` for a later schema, plain for anything else that is not one (``required`` keys
    missing, or ``ok`` false)."""
    data = read_json(path)
    version = data.get("schema_version")
    if isinstance(version, int) and version > supported:
        raise UnreadableResult(path, f"{kind} schema_version {version} was written by a newer reportgen "
                               f"(this one reads up to {supported})", newer=True)
    if version != supported or not required <= set(data) or not ok(data):
        raise UnreadableResult(path, f"not a reportgen {noun} (schema_version {version!r})")
    return data


def read_measurement(path: Path) -> dict:
    """A measurement document. Raises ``UnreadableResult`` (``newer`` for a newer schema)."""
    return read_versioned(path, "measurement", "measurement", MEASUREMENT_SCHEMA_VERSION, {"id", "status"})


def result_path(results_dir: Path, sweep: str, cid: str) -> Path:
    return results_dir / sweep / f"{cid}.json"
