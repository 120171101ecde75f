"""Hashes of the code that makes recomputable numbers, so stored ones are redone when it changes.

An estimate depends on its inputs (the case, the model config, the GPU's catalog entry: hashed per
case by ``runner.inputs_hash``) and on the estimator's code: its formulas, constants, library
assumptions and the way the catalogs are read. Instead of a version number someone has to
remember to bump, every stored estimate records ``estimator_hash()``, a hash of those source files
as installed (the approach of airspeed-velocity, which keys results by commit): any edit to them,
even a constant, changes the hash and a sweep recomputes every estimate of the old one. Walks of the
decision tree add their own code (``advice_hash``).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent

#: the sources an estimate is computed by (globs relative to the package): code, and the data files it
#: reads beside it (``estimate/error_band.json``, the band every verdict is judged with; ``catalog/cpus.yaml``,
#: the host CPUs whose single-thread speed scales every card's dispatch); the catalog entries of a case's
#: model and card are hashed per case (``runner.inputs_hash``)
ESTIMATOR_SOURCES = ("estimate/*.py", "estimate/*.json", "model.py", "config_check.py", "hardware.py", "setup.py",
                     "catalog/__init__.py", "catalog/cpus.yaml", "runner.py", "results.py")
#: the sources a stored decision-tree walk is computed by, besides the estimator's
ADVICE_SOURCES = ("advise/tree.py", "advise/walk.py", "advise/claims.py", "advise/store.py")
#: the sources a traced figure is computed by: the tracer, the shared step and the recipes' builder
TRACE_SOURCES = ("trace/*.py", "measure/step.py", "measure/build.py", "measure/data.py", "measure/optimizers.py")
#: modules under trace/ that present or schedule traces but compute no figure: editing them (the list
#: of known disagreements, the command, the sweep loop, the logging filters) does not make stored traces stale. A new
#: module under trace/ counts as a source until it is named here.
TRACE_NOT_SOURCES = ("trace/agreement.py", "trace/cli.py", "trace/runner.py", "trace/quiet.py")
#: the sources only a recipe's trace runs (``setup.recipe``, ``trace/sft.py``, ``trace/grpo.py``): hashed into the traces of
#: that recipe and left out of the plain loop's, so editing them leaves every stored loop trace current
RECIPE_TRACE_SOURCES = {"trainer": ("trace/sft.py", "measure/sft.py"), "trl-sft": ("trace/sft.py", "measure/sft.py"),
                        # TRL's GRPOTrainer step (trace/grpo.py), which reuses sft.py's fused-head emulation and optimizer
                        "grpo": ("trace/grpo.py", "measure/grpo.py", "trace/sft.py", "measure/sft.py"),
                        # torchtune 0.6.1's own LoRA recipe (``reportgen trace --recipe torchtune``), with sft.py's
                        # host-read emulation
                        "torchtune": ("trace/torchtune_recipe.py", "trace/sft.py")}
#: the multi-step replay of ``reportgen trace --lengths`` (steps of different lengths through one allocator): it
#: computes no stored figure and is left out of every stored trace's hash (``steps_trace_hash`` is its own)
STEPS_TRACE_SOURCES = ("trace/multistep.py",)
_RECIPE_ONLY = tuple(sorted({p for paths in RECIPE_TRACE_SOURCES.values() for p in paths if p.startswith("trace/")}))


def source_hash(patterns: tuple[str, ...], root: Path = PACKAGE, n: int = 16, exclude: tuple[str, ...] = ()) -> str:
    """sha256 over the relative path and bytes of every file the patterns match (but ``exclude``), in
    sorted order."""
    h = hashlib.sha256()
    files = sorted({p for pattern in patterns for p in root.glob(pattern)
                    if p.is_file() and p.relative_to(root).as_posix() not in exclude})
    if not files:
        raise FileNotFoundError(f"no source files match {patterns} under {root}")
    for path in files:
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:n]


def catalog_entries() -> dict:
    """Every catalog model's config and GPU entry, for the hash of a document computed over the whole
    catalog (the cards table, the comparison with published rows)."""
    from reportgen import catalog

    return {"models": {name: catalog.load_model(name).config for name in catalog.model_names()},
            "gpus": {key: catalog.gpu_entry(key) for key in catalog.gpu_names()}}


@lru_cache(maxsize=1)
def estimator_hash() -> str:
    return source_hash(ESTIMATOR_SOURCES)


@lru_cache(maxsize=1)
def advice_hash() -> str:
    return source_hash(ADVICE_SOURCES)


def loop_trace_hash(root: Path = PACKAGE) -> str:
    """The plain loop's tracer: its sources but those that compute no stored figure, the recipe-only ones
    and the multi-step replay's."""
    return source_hash(TRACE_SOURCES, root=root, exclude=TRACE_NOT_SOURCES + _RECIPE_ONLY + STEPS_TRACE_SOURCES)


@lru_cache(maxsize=4)
def trace_hash(recipe: str = "loop") -> str:
    """The tracer's code; for a recipe other than the loop, also the code only its trace runs."""
    loop = loop_trace_hash()
    if recipe not in RECIPE_TRACE_SOURCES:
        return loop
    return hashlib.sha256(f"{loop}:{recipe}:{source_hash(RECIPE_TRACE_SOURCES[recipe])}".encode()).hexdigest()[:16]


def steps_trace_hash(root: Path = PACKAGE, recipe: str = "loop") -> str:
    """The loop's tracer (and for a recipe other than the loop, the code only its trace runs, as ``trace_hash``)
    and the multi-step replay on top of it (``trace --lengths``)."""
    steps, base = source_hash(STEPS_TRACE_SOURCES, root=root), loop_trace_hash(root)
    if recipe in RECIPE_TRACE_SOURCES:
        base = f"{base}:{recipe}:{source_hash(RECIPE_TRACE_SOURCES[recipe], root=root)}"
    return hashlib.sha256(f"{base}:steps:{steps}".encode()).hexdigest()[:16]
