"""One artifact type for the recomputable documents the producers store.

An estimate of a case (``runner.py``), a walk of the decision tree (``advise/store.py``), a traced
figure (``traced_results.py``), the cards table (``reportgen cards``) and the comparison with
published measurements (``reportgen compare-published``) are each an ``Artifact``:
its kind, its path, and the hash of everything it was computed from. A stored document is current
when it records that hash (under ``inputs_hash``); a
producer skips a current document, writes the others atomically (``results.write_json_atomic``) and
prunes the files of its folder that no case keeps any more; a reader calls a document that is not
current stale. Measurements are no artifacts: they are written once and never recomputed
(``store.py``).

Each producer keeps its own loop over the cases on this type (``runner.run_estimates``,
``advise/store.write_advice``, ``trace/runner.trace_sweep``: its skip test and, through
``traced_results.write_traced``, its writes); ARCHITECTURE.md says why they are not one loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from reportgen.results import UnreadableResult, read_json, write_json_atomic

#: the kinds of artifact, each with the module that produces it
KINDS = {"estimate": "runner", "advice": "advise.store", "trace": "traced_results", "cards": "advise.cards",
         "published": "published.compare"}


@dataclass(frozen=True)
class Artifact:
    """A recomputable document: what it is, where it lives, and the hash of its inputs now."""

    kind: str
    path: Path
    inputs_hash: str
    hash_key: str = "inputs_hash"  # the document's field that records the hash it was computed with

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown artifact kind {self.kind!r}: one of {', '.join(KINDS)}")

    def stored(self, read: Callable[[Path], dict] = read_json) -> dict | None:
        """The stored document as ``read`` returns it, or None when there is none or it cannot be read."""
        if not self.path.exists():
            return None
        try:
            return read(self.path)
        except UnreadableResult:
            return None

    def is_current(self, doc: dict | None) -> bool:
        """Whether ``doc`` was computed from the inputs this artifact hashes now."""
        return is_current(doc, self.inputs_hash, self.hash_key)

    def write(self, doc: dict) -> Path:
        write_json_atomic(self.path, doc)
        return self.path

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def is_current(doc: dict | None, inputs_hash: str, hash_key: str = "inputs_hash") -> bool:
    """Whether a stored document records the hash of the inputs as they are now (else it is stale)."""
    return doc is not None and doc.get(hash_key) == inputs_hash


def prune(files: Iterable[Path], keep: Callable[[Path], bool]) -> int:
    """Delete the (recomputable) files that ``keep`` does not keep; how many were deleted."""
    removed = 0
    for path in files:
        if not keep(path):
            path.unlink()
            removed += 1
    return removed
