"""Stored walks: the decision tree walked at sweep time, read by the guide pages.

Computing never renders and rendering never computes: a guide page needs a walk per model, GPU
and sequence length, and a walk is estimator work. So ``write_advice`` walks every (model, GPU,
sequence length) a sweep covers with single-GPU cases, when the sweep runs, and writes one JSON
file per walk (an ``artifacts.Artifact`` of kind ``advice``) next to the sweep's results::

    results/<sweep>/_advice/<model>.<gpu>.s<seq>.json

(``reportgen.store`` reads estimates from ``results/<sweep>/*.json`` only, so these files are not
taken for cases.) ``load_advice`` reads them back for the renderer. A walk is redone when its
inputs change: the model config, the GPU entry, the estimator's code
(``fingerprint.estimator_hash``), the tree's data (``tree.tree_hash``), the walk's own code
(``fingerprint.advice_hash``), the sequence length and the training tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reportgen import __version__
from reportgen.artifacts import Artifact, prune
from reportgen.advise.tree import tree_hash
from reportgen.advise.walk import ADVICE_SCHEMA_VERSION, walk
from reportgen.fingerprint import advice_hash
from reportgen.results import UnreadableResult, model_file_part, read_json, short_hash
from reportgen.runner import inputs_hash
from reportgen.setup import TrainingSetup
from reportgen.sweep import Case, Sweep

ADVICE_DIR = "_advice"


@dataclass
class AdviceStats:
    written: int = 0
    skipped: int = 0
    removed: int = 0
    failed: int = 0


def advice_keys(sweep: Sweep) -> list[tuple[str, str, int]]:
    """(model, GPU, sequence length) of every single-GPU case of the sweep, sorted, once each. A GRPO case
    (recipe grpo) asks no SFT question: the tree walks SFT steps, and the GRPO step's own answer (what to turn
    down first, the largest num_generations and completion) is stored with its estimate (``runner.estimate_case``)."""
    return sorted({(c.model, c.gpu, c.setup.seq) for c in sweep.cases
                   if c.setup.gpus == 1 and c.setup.recipe.value != "grpo"})


def advice_path(results_dir: Path, sweep: str, model: str, gpu: str, seq: int) -> Path:
    return Path(results_dir) / sweep / ADVICE_DIR / f"{model_file_part(model)}.{gpu}.s{seq}.json"


def advice_inputs_hash(model: str, gpu: str, seq: int, train_tokens: int) -> str:
    case = Case(model=model, gpu=gpu, setup=TrainingSetup(seq=seq))
    return short_hash({"estimate_inputs": inputs_hash(case, train_tokens), "tree": tree_hash(),
                       "code": advice_hash(), "schema": ADVICE_SCHEMA_VERSION}, 16)


def write_advice(sweep: Sweep, results_dir: Path, force: bool = False, progress=None) -> AdviceStats:
    """Walk the tree for every (model, GPU, seq) the sweep covers; write what changed, remove walks
    the sweep no longer covers. Call it after ``runner.run_estimates`` for the same sweep.
    ``progress(keys) -> iterable``: wraps the loop (a progress bar), as in ``runner.run_estimates``."""
    stats = AdviceStats()
    keep: set[Path] = set()
    keys = list(advice_keys(sweep))
    for model, gpu, seq in progress(keys) if progress else keys:
        artifact = Artifact("advice", advice_path(results_dir, sweep.name, model, gpu, seq),
                            advice_inputs_hash(model, gpu, seq, sweep.spec.train_tokens))
        keep.add(artifact.path)
        if not force and artifact.is_current(intact(artifact.stored())):
            stats.skipped += 1
            continue
        try:
            doc = walk(model, gpu, seq, train_tokens=sweep.spec.train_tokens)
        except Exception:  # a failed walk must not stop the sweep: the guide then shows the command
            stats.failed += 1
            artifact.remove()
            continue
        doc.update(sweep=sweep.name, inputs_hash=artifact.inputs_hash, reportgen_version=__version__)
        artifact.write({**doc, CONTENT_KEY: content_hash(doc)})
        stats.written += 1
    folder = Path(results_dir) / sweep.name / ADVICE_DIR
    stats.removed = prune(sorted(folder.glob("*.json")) if folder.is_dir() else [], lambda path: path in keep)
    return stats


#: the field a stored walk carries the hash of the rest of itself in
CONTENT_KEY = "content_hash"


def content_hash(doc: dict) -> str:
    return short_hash({k: v for k, v in doc.items() if k != CONTENT_KEY}, 16)


def intact(doc: dict | None) -> dict | None:
    """``doc`` when it is the walk this code wrote, byte for byte in meaning: its ``content_hash``
    matches the rest of it (issue 29). A walk edited or damaged after it was written (a value of
    the wrong type, a step removed) is not: the next sweep recomputes it and the guides skip it,
    instead of a traceback deep in a page. A walk is derived data, so one check of the whole covers
    every field a page reads."""
    return doc if doc is not None and doc.get(CONTENT_KEY) == content_hash(doc) else None


def load_advice(results_dir: Path, warn=None) -> dict[str, list[dict]]:
    """``{sweep: [walk, ...]}`` of every stored walk under ``results_dir``, sorted by file name.
    Walks written by another layout (``schema_version``) are skipped: the next sweep rewrites them;
    walks changed since they were written (``intact``) too, with a warning naming the file."""
    out: dict[str, list[dict]] = {}
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return out
    for folder in sorted(results_dir.glob(f"*/{ADVICE_DIR}")):
        docs = []
        for path in sorted(folder.glob("*.json")):
            try:
                doc = read_json(path)
            except UnreadableResult:  # not JSON, not an object, nested too deeply: not a walk
                continue
            if doc.get("schema_version") != ADVICE_SCHEMA_VERSION:
                continue
            if intact(doc) is None:
                if warn is not None:
                    warn(f"{path}: changed since reportgen wrote it (its content_hash does not match); skipped "
                         f"(the next `reportgen sweep` of {folder.parent.name} recomputes it)")
                continue
            docs.append(doc)
        if docs:
            out[folder.parent.name] = docs
    return out
