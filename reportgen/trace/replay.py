"""Replay a recorded step through the caching-allocator simulation and read off what a CUDA run
would report: ``max_memory_allocated`` and ``max_memory_reserved`` after ``reset_peak``, the
largest allocated bytes in each phase of the measured step, and what was alive at the peak.

Categories of the storages alive at the peak (the tracer's analogue of the estimator's terms):
tagged ones keep their tag (weights, buffers, quant_constants, lora_adapters, inputs,
autocast_copies, gradients, optimizer, cublas_workspace); otherwise

* ``logits``: vocab-sized tensors (last dimension = the vocabulary) made in the forward or in the
  loss's backward: the head's output, its fp32 copy, the log-softmax and their gradients;
* ``activations``: made in a forward and still alive when that forward ended (kept for backward),
  or recomputed by activation checkpointing during the backward;
* ``transient``: everything else (working tensors of the forward, the backward and the
  optimizer step).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from reportgen.trace.allocator import CachingAllocatorSim, SimulatedOutOfMemory
from reportgen.trace.recorder import ALIAS, ALLOC, FREE, MARK

TAGGED = ("weights", "buffers", "quant_constants", "lora_adapters", "inputs", "autocast_copies", "gradients",
          "optimizer", "cublas_workspace")


@dataclass
class Replay:
    peak_allocated: int  # simulated torch.cuda.max_memory_allocated after reset_peak
    peak_reserved: int  # simulated torch.cuda.max_memory_reserved after reset_peak
    peak_live_bytes: int  # bytes of the tensors alive at the allocated peak (before rounding)
    peak_phase: str
    peak_op: str  # the op whose allocation reached the peak
    phases: dict[str, int]  # largest allocated bytes in each phase of the measured step
    at_peak: dict[str, int]  # bytes alive at the peak by category
    activations_by_op: dict[str, int]  # activations alive at the peak by the op that made them
    oom: SimulatedOutOfMemory | None = None
    alloc_retries: int = 0
    segments: int = 0
    notes: list[str] = field(default_factory=list)


def forward_ends(storages, events) -> dict[tuple[int, int], int]:
    """Event index where each (step, micro-batch) forward ended (the ``loss-backward`` phase mark)."""
    ends: dict[tuple[int, int], int] = {}
    step = micro = 0
    for i, (kind, x) in enumerate(events):
        if kind == ALLOC:
            step, micro = storages[x].step, storages[x].micro
        elif kind == MARK and x == "phase:loss-backward":
            ends[(step, micro)] = i
    return ends


def category(rec, ends: dict, vocab: int) -> str:
    if rec.category in TAGGED:
        return rec.category
    if rec.phase in ("forward", "loss-backward") and vocab and len(rec.shape) >= 2 and rec.shape[-1] == vocab:
        return "logits"
    if rec.phase == "forward":
        end = ends.get((rec.step, rec.micro))
        if end is None or rec.free_at is None or rec.free_at > end:
            return "activations"
        return "transient"
    if rec.recomputed:
        return "activations"
    return "transient"


def replay(run, limit_bytes: int | None = None) -> Replay:
    """Replay ``run.recorder``'s events; ``limit_bytes``: what the allocator may reserve (OOM beyond)."""
    rec = run.recorder
    storages, events = rec.storages, rec.events
    sim = CachingAllocatorSim(limit_bytes=limit_bytes)
    handles: dict[int, object] = {}
    live = 0
    measuring = False
    phase = "build"
    phases: dict[str, int] = {}
    peak, peak_at, peak_phase, peak_live = -1, 0, "", 0
    oom = None
    for i, (kind, x) in enumerate(events):
        if kind == ALLOC:
            try:
                handles[x] = sim.malloc(storages[x].nbytes)
            except SimulatedOutOfMemory as exc:
                oom = exc
                break
            live += storages[x].nbytes
        elif kind == FREE:
            sim.free(handles.pop(x, None))
            live -= storages[x].nbytes
            continue
        elif kind == ALIAS:  # an in-place sum: the new storage takes over the old one's block
            handles[x[0]] = handles.pop(x[1], None)
            continue
        elif x == "empty_cache":
            sim.empty_cache()
            continue
        elif x == "reset_peak":
            sim.reset_peak()
            measuring = True
            peak, peak_at, peak_phase, peak_live = sim.allocated, i, phase, live
            continue
        elif x.startswith("phase:"):
            phase = x[len("phase:"):]
        if measuring:
            phases[phase] = max(phases.get(phase, 0), sim.allocated)
            if sim.allocated > peak:
                peak, peak_at, peak_phase, peak_live = sim.allocated, i, phase, live
    at_peak: dict[str, int] = defaultdict(int)
    by_op: dict[str, int] = defaultdict(int)
    peak_op = ""
    if oom is None:
        ends = forward_ends(storages, events)
        for s in storages:
            if s.alloc_at <= peak_at and (s.free_at is None or s.free_at > peak_at):
                cat = category(s, ends, run.vocab_size)
                at_peak[cat] += s.nbytes
                if cat == "activations":
                    by_op[s.op] += s.nbytes
        kind, x = events[peak_at]
        peak_op = storages[x].op if kind == ALLOC else ""  # the peak is reached by an allocation
    return Replay(peak_allocated=sim.peak_allocated if oom is None else sim.allocated,
                  peak_reserved=sim.peak_reserved, peak_live_bytes=peak_live, peak_phase=peak_phase,
                  peak_op=peak_op, phases=phases,
                  at_peak=dict(sorted(at_peak.items(), key=lambda kv: -kv[1])),
                  activations_by_op=dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
                  oom=oom, alloc_retries=sim.num_alloc_retries, segments=sim.segments)
