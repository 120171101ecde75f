"""A run of steps of different lengths through one caching allocator (``reportgen trace --lengths``).

With batches padded to their longest sample (``estimate/lengths.py``), each step has its own length,
and the allocator keeps the blocks every earlier step left cached: the reserve grows with the longest
step seen so far, and with the fragmentation that blocks of many sizes add on top. This module traces
the step once per padded length the drawn batches take (``trace/step.run_trace``: the harness's step on
meta), then plays the steps' allocation events, in the drawn order, through ONE allocator simulation
(``trace/allocator.py``), which keeps its cached blocks between steps as ``CUDACachingAllocator`` does
(nothing is returned to the driver without ``empty_cache`` or a failed ``cudaMalloc``).

Why the reserve can grow past the longest step's own: a step slightly longer than every earlier one
asks for blocks slightly larger than the cached ones; some of its tensors fit in cached blocks meant for
larger ones and leave unusable slivers at their ends, the rest get new segments, and nothing merges
across segments (``c10/cuda/CUDACachingAllocator.cpp``, Note [Expandable Segments], Rationale: "if it runs
at size N + 1, then it will have to make new allocations that are slightly larger"). The analytic answer
(``estimate/lengths.reserved_growth``: the longest step's reserve) leaves this out.

Splicing steps traced at different lengths: a trace is build, ``empty_cache``, one warm-up step,
``reset_peak``, the measured step. The run's first step is the first length's trace up to
``reset_peak`` (build and warm-up step: the optimizer states appear in it); every later step is the
measured step of its length's trace. What a step touches that it did not make is of two kinds, each
paired with the run's own blocks in allocation order (the same code made them, so the order is the
same; a pair made by different ops is refused):

* kept for the whole run (weights, adapters, optimizer states, cuBLAS workspaces, the token batches):
  the first trace's;
* made by the step before and released by this one (the loop's kept outputs): the previous step's.

The token batches are the first trace's for the whole run (``batch x length`` int64, kilobytes);
steps with ``accum > 1`` (micro-batches of different lengths in one step) are not spliced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reportgen.errors import UserError
from reportgen.trace.allocator import CachingAllocatorSim
from reportgen.trace.recorder import ALIAS, ALLOC, FREE, MARK

#: the most lengths traced: beyond it, lengths are padded up to a multiple (``bucket_lengths``)
MAX_TRACED_LENGTHS = 24


@dataclass(frozen=True)
class LengthTrace:
    """One length's trace, cut where the measured step begins (``reset_peak``) and ends (``train_step``'s
    ``end`` mark; what the trace frees after it is the traced objects' teardown, no step's)."""

    length: int
    run: object  # trace/step.TraceRun
    reset: int  # index of the reset_peak mark
    end: int  # index of the measured step's end mark
    kept: tuple[int, ...]  # alive at reset_peak and at the end, in allocation order
    carry_in: tuple[int, ...]  # alive at reset_peak, released in the measured step
    carry_out: tuple[int, ...]  # made in the measured step, alive at its end


def split_trace(length: int, run) -> LengthTrace:
    """``run``'s storages by what the measured step does with them (module docstring)."""
    events, storages = run.recorder.events, run.recorder.storages
    reset = events.index((MARK, "reset_peak"))
    end = len(events) - 1 - events[::-1].index((MARK, "phase:end"))

    def alive(s, at: int) -> bool:
        return s.alloc_at < at and (s.free_at is None or s.free_at > at)

    kept, carry_in, carry_out = [], [], []
    for s in sorted(storages, key=lambda s: s.alloc_at):
        if alive(s, reset):
            (kept if alive(s, end) else carry_in).append(s.id)
        elif s.alloc_at > reset and alive(s, end):
            carry_out.append(s.id)
    return LengthTrace(length, run, reset, end, tuple(kept), tuple(carry_in), tuple(carry_out))


def bucket_lengths(steps: list[int], cap: int, most: int = MAX_TRACED_LENGTHS) -> tuple[list[int], int]:
    """The steps' lengths with at most ``most`` distinct ones, and the multiple they were padded up to (1:
    none): the smallest power of two ``m`` for which ``min(cap, m * ceil(x / m))`` takes at most ``most``
    values, as ``DataCollatorWithPadding(pad_to_multiple_of=m)`` would pad (transformers'
    ``data/data_collator.py``; the cut ``cap`` stays a length of its own)."""
    multiple = 1
    while True:
        padded = [min(cap, -(-x // multiple) * multiple) for x in steps]
        if len(set(padded)) <= most:
            return padded, multiple
        multiple *= 2


@dataclass
class StepsReplay:
    """Per step of the run: its padded length and the allocator's peaks in it (a reset at its start)."""

    lengths: list[int]
    reserved: list[int]  # simulated torch.cuda.max_memory_reserved of each step
    allocated: list[int]  # simulated torch.cuda.max_memory_allocated of each step
    alone: dict[int, int] = field(default_factory=dict)  # reserved of each length's step run alone

    @property
    def peak_reserved(self) -> int:
        return max(self.reserved)

    @property
    def worst(self) -> int:
        """Index of the step with the largest allocated peak (the first of equals)."""
        return self.allocated.index(max(self.allocated))


def _pair(what: str, ours: list, theirs: tuple[int, ...], trace: LengthTrace, first: LengthTrace) -> dict:
    """Trace ``trace``'s storages ``theirs`` mapped to the run's blocks ``ours`` ((storage, block) pairs of
    trace ``first``'s making), checked to be the same tensors."""
    if len(ours) != len(theirs):
        raise UserError(f"reportgen trace --lengths: the step at {trace.length:,} tokens has {len(theirs)} {what}, "
                        f"the run has {len(ours)}: steps of these lengths cannot be spliced")
    storages, out = trace.run.recorder.storages, {}
    for (src, block), sid in zip(ours, theirs):
        if src.op != storages[sid].op:
            raise UserError(f"reportgen trace --lengths: {what} {src.op!r} of the run is {storages[sid].op!r} in the "
                            f"step at {trace.length:,} tokens: steps of these lengths cannot be spliced")
        out[sid] = block
    return out


def _play(sim: CachingAllocatorSim, trace: LengthTrace, events, handles: dict) -> None:
    """``events`` of ``trace`` through ``sim``; ``handles``: the blocks of its storages, updated."""
    storages = trace.run.recorder.storages
    for kind, x in events:
        if kind == ALLOC:
            handles[x] = sim.malloc(storages[x].nbytes)
        elif kind == FREE:
            sim.free(handles.pop(x, None))
        elif kind == ALIAS:  # an in-place gradient sum: the sum takes over the addend's block
            handles[x[0]] = handles.pop(x[1], None)
        elif x == "empty_cache":  # after the build: the run's first step starts here
            sim.empty_cache()
            sim.reset_peak()


def replay_steps(traces: dict[int, LengthTrace], lengths: list[int]) -> StepsReplay:
    """Play a run whose steps have ``lengths`` (each a key of ``traces``) through one allocator."""
    from reportgen.trace.replay import replay

    sim, first = CachingAllocatorSim(), traces[lengths[0]]
    handles: dict = {}
    _play(sim, first, first.run.recorder.events[:first.reset], handles)
    out = StepsReplay(lengths=list(lengths), reserved=[sim.peak_reserved], allocated=[sim.peak_allocated],
                      alone={n: replay(t.run).peak_reserved for n, t in traces.items()})
    own = first.run.recorder.storages
    kept = [(own[s], handles[s]) for s in first.kept]
    carried = [(own[s], handles[s]) for s in first.carry_in]
    for length in lengths[1:]:
        trace = traces[length]
        handles = {**_pair("tensors kept for the run", kept, trace.kept, trace, first),
                   **_pair("tensors kept from the step before", carried, trace.carry_in, trace, first)}
        sim.reset_peak()
        _play(sim, trace, trace.run.recorder.events[trace.reset + 1:trace.end], handles)
        out.reserved.append(sim.peak_reserved)
        out.allocated.append(sim.peak_allocated)
        storages = trace.run.recorder.storages
        carried = [(storages[s], handles[s]) for s in trace.carry_out]
    return out


def trace_lengths(spec, setup, gpu, lengths: set[int], warmup: int = 1) -> dict[int, LengthTrace]:
    """The step traced once per length (``lengths.at_length``: the setup as a batch of that length)."""
    from reportgen.estimate import constants as K
    from reportgen.estimate.lengths import at_length
    from reportgen.estimate.memory import cublas_workspace_bytes
    from reportgen.trace.step import run_trace

    per_handle = cublas_workspace_bytes(gpu) // K.CUBLAS_HANDLES
    return {n: split_trace(n, run_trace(spec, at_length(setup, n), per_handle, K.CUBLAS_HANDLES, warmup=warmup))
            for n in sorted(lengths)}


def lengths_replay(spec, gpu, setup, lengths, steps: int, seed: int = 0, warmup: int = 1) -> dict:
    """``steps`` steps drawn from the dataset's ``lengths`` (``estimate/lengths.draw_step_lengths``), replayed
    through one allocator, beside the analytic ``estimate/lengths.reserved_growth`` at the same step."""
    from reportgen.estimate import constants as K
    from reportgen.estimate.lengths import draw_step_lengths, reserved_growth

    if setup.accum != 1:
        raise UserError(f"reportgen trace --lengths: accum={setup.accum}: the replay splices whole steps of one "
                        "length, not micro-batches of different lengths in one step", hint="trace with --accum 1")
    if setup.padding.value != "longest":
        raise UserError(f"reportgen trace --lengths: padding {setup.padding.value} makes every step {setup.seq:,} "
                        "tokens long: nothing to replay", hint="--padding longest, or trace without --lengths")
    drawn = [s[0] for s in draw_step_lengths(lengths, setup, steps, seed)]
    padded, multiple = bucket_lengths(drawn, setup.seq)
    traces = trace_lengths(spec, setup, gpu, set(padded), warmup=warmup)
    r = replay_steps(traces, padded)
    from reportgen.trace.spec import is_known_family

    if is_known_family(spec):
        analytic = reserved_growth(spec, setup, gpu, lengths, steps)
    else:  # a family the estimator has no formulas for: the replay is the only answer
        analytic = {"error": f"model_type {spec.model_type!r} has no analytic formulas"}
    worst = r.worst
    after = analytic.get(str(steps), {}).get("peak_reserved")
    device_total = r.peak_reserved + K.CUDA_CONTEXT_BYTES
    return {"steps": steps, "seed": seed, "batch": setup.batch, "cap": setup.seq, "pad_multiple": multiple,
            "traced_lengths": sorted(traces), "step_lengths": r.lengths, "reserved_per_step": r.reserved,
            "first_step": {"longest": r.lengths[0], "peak_reserved": r.reserved[0]},
            "peak_reserved": r.peak_reserved, "device_total": device_total, "capacity": gpu.memory_bytes,
            "fits": device_total <= gpu.memory_bytes,
            "alone_at_longest": r.alone[max(traces)],
            "worst_batch": {"step": worst + 1, "longest": r.lengths[worst], "peak_allocated": r.allocated[worst]},
            "analytic": analytic,
            "difference": None if after is None else (r.peak_reserved - after) / after}
