"""Reverse questions: the largest micro-batch and the longest sequence that fit a GPU.

"Fit" is the verdict's (``verdict.py``): the whole error band of the demand within the card, so
the largest batch and the longest sequence agree with the verdict of the same setup at that batch
or length (a setup the verdict calls tight is past them). Memory grows monotonically with batch
and sequence length, so a doubling search followed by a bisection finds the largest fitting
value in O(log n) estimates.
"""

from __future__ import annotations

from collections.abc import Callable

from reportgen.estimate.memory import estimate_memory
from reportgen.estimate.verdict import judge
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import TrainingSetup

MAX_BATCH = 4096
MAX_SEQ = 1_048_576


def fits(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec) -> bool:
    """The verdict of the setup is "fits" (``verdict.judge``)."""
    return fits_memory(estimate_memory(model, setup, gpu), gpu, setup.method.value)


def fits_memory(mem, gpu: GpuSpec, method: str) -> bool:
    """The verdict of a memory estimate is "fits": what the step asks of the card (paged optimizer
    states may spill to host RAM, so they do not count) within the card, with its whole error band."""
    return judge(mem, gpu.memory_bytes, method).fits


def _largest(ok: Callable[[int], bool], start: int, limit: int, step: int = 1) -> int | None:
    """Largest multiple of ``step`` in [start, limit] with ok(); None if even ``start`` fails."""
    if not ok(start):
        return None
    lo, hi = start, start
    while hi < limit:
        nxt = min(limit, hi * 2)
        if not ok(nxt):
            hi = nxt
            break
        lo = hi = nxt
    else:
        return lo
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            break
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def max_batch(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec) -> int | None:
    """Largest micro-batch that fits at the setup's sequence length (None: not even batch 1)."""
    return _largest(lambda b: fits(model, setup.model_copy(update={"batch": b}), gpu), 1, MAX_BATCH)


def context_limit(model: ModelSpec) -> int:
    """The longest sequence the model is made for: its config's ``max_position_embeddings`` (which
    already includes a RoPE scaling the config declares, e.g. Llama 3.1's ``llama3`` rope_scaling to
    131,072), or ``MAX_SEQ`` when the config does not say."""
    return model.max_position_embeddings or MAX_SEQ


def max_seq(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, multiple: int = 128) -> int | None:
    """Longest sequence (a multiple of 128 tokens, or the context limit itself) that fits at the
    setup's micro-batch, never past the model's context length (``context_limit``): memory would
    allow TinyLlama 43,008 tokens on a 24 GB card, but it was trained on 2,048."""
    limit = min(MAX_SEQ, context_limit(model))
    # memory follows the longest sample (lengths.py): the mean length does not enter the search
    setup = setup if setup.seq_mean is None else setup.model_copy(update={"seq_mean": None, "seq_padded": None})

    def ok(s: int) -> bool:
        return fits(model, setup.model_copy(update={"seq": s}), gpu)

    if limit < multiple:
        return limit if ok(limit) else None
    best = _largest(ok, multiple, limit // multiple * multiple, multiple)
    if best is not None and best == limit // multiple * multiple and limit % multiple and ok(limit):
        return limit
    return best


def default_precision(gpu: GpuSpec) -> str:
    """bf16 autocast where the card has bf16, fp16 with loss scaling otherwise (T4)."""
    return "bf16-mixed" if gpu.supports_bf16 else "fp16-mixed"
