"""Reverse questions: the largest micro-batch and the longest sequence that fit a GPU.

Memory grows monotonically with batch and sequence length, so a doubling search followed by a
bisection finds the largest value whose ``device_total`` fits, in O(log n) estimates.
"""

from __future__ import annotations

from collections.abc import Callable

from reportgen.estimate.memory import estimate_memory
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import TrainingSetup

MAX_BATCH = 4096
MAX_SEQ = 1_048_576


def fits(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec) -> bool:
    return fits_memory(estimate_memory(model, setup, gpu), gpu)


def fits_memory(mem, gpu: GpuSpec) -> bool:
    """``device_total`` (what nvidia-smi shows) within the card's memory; paged optimizer states
    may spill to host RAM, so they do not count against it."""
    return mem.device_total - mem.terms.get("optimizer_paged", 0) <= gpu.memory_bytes


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


def max_seq(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, multiple: int = 128) -> int | None:
    """Longest sequence (a multiple of 128 tokens) that fits at the setup's micro-batch."""
    return _largest(lambda s: fits(model, setup.model_copy(update={"seq": s}), gpu), multiple, MAX_SEQ, multiple)
