"""``reportgen sweep FILE --trace``: trace a sweep's cases and store one traced file per case
(layout and staleness: ``reportgen/traced_results.py``).

Resumable: a case whose traced file is current (same ``inputs_hash``: case, config, card, constants,
trace code) is skipped unless ``force``. Each file is written atomically as soon as its case is
traced, so an interrupt (Ctrl-C) loses at most the case in progress. Cases the tracer does not
emulate (several GPUs, offload, fused loss, paged optimizer) are skipped with their reason; a case
that fails is reported and nothing is written for it.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from reportgen import catalog, traced_results
from reportgen.artifacts import Artifact
from reportgen.errors import MEASURE_EXTRA, UserError
from reportgen.store import Warn, stderr_warn
from reportgen.sweep import Case, Sweep


@dataclass
class TraceStats:
    written: int = 0
    skipped: int = 0
    untraceable: int = 0
    failed: list[str] = field(default_factory=list)


def check_installed(method: str | None = None) -> None:
    from reportgen.trace.quiet import quiet_libraries

    quiet_libraries()  # before peft imports bitsandbytes (trace/quiet.py)
    try:
        import peft  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
        if method == "qlora":
            import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise UserError(f"--trace needs torch, transformers, peft and bitsandbytes ({exc})", hint=MEASURE_EXTRA) from None


def is_current(sweep_dir: Path, case: Case) -> bool:
    """Whether the case's traced file (by its id, or the id it was written under before) is current,
    judged as every artifact is: a readable document recording today's inputs hash."""
    path = traced_results.existing_path(sweep_dir, case.id)
    if path is None:
        return False
    artifact = Artifact("trace", path, traced_results.inputs_hash(case.as_dict()))
    return artifact.is_current(artifact.stored(traced_results.read_traced))


def trace_sweep(sweep: Sweep, results_dir: Path, force: bool = False,
                progress: Callable[[list[Case]], Iterable[Case]] = lambda xs: xs,
                warn: Warn = stderr_warn) -> TraceStats:
    from reportgen.trace.result import trace_case
    from reportgen.trace.sft import recipe_dict
    from reportgen.trace.step import check_traceable

    check_installed("qlora" if any(c.setup.method.value == "qlora" for c in sweep.cases) else None)
    sweep_dir = Path(results_dir) / sweep.name
    traced_results.migrate_ids(sweep_dir)  # files named by the 8-digit ids of before take their case's id
    stats = TraceStats()
    todo = []
    for case in sweep.cases:
        try:
            check_traceable(case.setup)
            check_recipe_traced(case.setup)
        except UserError as exc:
            stats.untraceable += 1
            warn(f"{case.id}: not traced ({exc.message})")
            continue
        if not force and is_current(sweep_dir, case):
            stats.skipped += 1
            continue
        todo.append(case)
    if todo and os.environ.get("PYTHONHASHSEED") != "0":
        warn("PYTHONHASHSEED is not 0: a model built by iterating a set (Gemma 3's layer types) may allocate in "
             "another order than the committed traced files, which were traced with PYTHONHASHSEED=0 (one 2 MiB "
             "block of peak_reserved); export PYTHONHASHSEED=0 to reproduce them to the byte")
    for case in progress(todo):
        ihash = traced_results.inputs_hash(case.as_dict())
        spec = catalog.load_model(case.model)  # measure/build.py hf_config copies what transformers edits
        with recipe_context(case.setup):  # the trainer's step for recipes trainer, trl-sft and grpo
            try:
                trace = trace_case(spec, catalog.load_gpu(case.gpu), case.setup)
            except (KeyboardInterrupt, MemoryError):
                raise
            except Exception as exc:  # noqa: BLE001 - one case failing is reported, the others go on
                stats.failed.append(case.id)
                warn(f"{case.id}: trace failed ({type(exc).__name__}: {exc}); nothing written")
                continue
            traced_results.write_traced(sweep_dir, case.id, case.as_dict(), recipe_dict(case.setup, trace.as_dict()),
                                        ihash)
        stats.written += 1
        del trace
        gc.collect()
    return stats


def check_recipe_traced(setup, torchtune_recipe: bool = False) -> None:
    """Refuse the losses the tracer does not run (chunked-compiled, no-upcast: they would be traced as the standard
    loss), torchtune's model outside torchtune's own recipe (the loop traces transformers' model), and recipe grpo's
    vLLM generation (``trace/grpo.check_grpo_traced``)."""
    if setup.kernels.value == "liger":
        raise UserError("reportgen trace: kernels=liger runs Liger-Kernel's Triton kernels, which the trace does not "
                        "emulate", hint="reportgen estimate models them (estimate/liger.py)")
    if setup.modeling.value == "torchtune" and not torchtune_recipe:
        raise UserError("reportgen trace: modeling=torchtune is torchtune's own model; the harness's loop traces "
                        "transformers' model", hint="reportgen trace --recipe torchtune --from YOUR_TORCHTUNE.yaml "
                        "runs torchtune's recipe and model")
    if setup.loss.value in ("chunked-compiled", "no-upcast") or setup.fsdp_param_dtype.value != "compute":
        what = (f"loss={setup.loss.value}" if setup.loss.value in ("chunked-compiled", "no-upcast")
                else "fsdp_param_dtype=fp32")
        raise UserError(f"reportgen trace: {what} is estimated only: the trace runs the harness's step, which has "
                        "no such loss or FSDP gather", hint="reportgen estimate models it (estimate/logits.py, "
                        "estimate/sharding.py)")
    from reportgen.trace.grpo import check_grpo_traced

    check_grpo_traced(setup)  # recipe grpo: TRL's GRPOTrainer step with transformers' generate, never an SFT step


def recipe_context(setup):
    """The context ``trace_case`` of ``setup`` runs in: TRL's GRPOTrainer step for recipe grpo
    (``trace/grpo.py``), the trainer's for trainer and trl-sft (``trace/sft.py``), nothing for the loop."""
    from reportgen.trace.grpo import grpo_trace
    from reportgen.trace.sft import recipe_trace

    return grpo_trace(setup) if setup.recipe.value == "grpo" else recipe_trace(setup)
