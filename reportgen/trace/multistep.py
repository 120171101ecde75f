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
``reset_peak``, the measured step (``trace/step.run_trace``), and a step is ``train_step``'s
(``measure/step.py``): each micro-batch's forward and backward, the gradients summed from one to the
next, then the optimizer step and ``zero_grad``. So a step is cut into segments at its marks: each
micro-batch from its ``phase:forward`` mark, the optimizer from ``phase:optimizer-step`` to the step's end.
The run's first step is the first trace's build and warm-up step (the optimizer states appear in it),
every later step the measured step; a step of ``accum`` micro-batches of lengths ``l_1..l_a`` plays
micro-batch ``k`` from the trace at ``l_k`` and the optimizer from the last one's: the first
micro-batch makes the gradients (``set_to_none`` freed them), every later one adds to them in place,
as on CUDA. With no outputs kept, every micro-batch after the first starts holding the same tensors,
so each length is traced with two micro-batches and the second stands for the later ones
(``traced_accum``); with kept outputs each micro-batch is traced. At each cut, what the next segment
touches that it did not make is of two kinds, each paired with the run's own blocks in allocation
order (the same code made them, so the order is the same; a pair made by different ops is refused):

* kept for the whole run (weights, adapters, optimizer states, cuBLAS workspaces, the token batches):
  the first trace's;
* made by the micro-batch or step before and still held (the gradients, the loop's kept outputs).

The token batches are the first trace's for the whole run (``batch x length`` int64, kilobytes). With
padding ``max`` or ``packed`` every micro-batch is ``seq`` long: the run is one length and the replay the
traced step's own reserve (nothing grows), answered rather than refused.
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
    """One length's trace, cut where its steps and their micro-batches begin and end (module docstring:
    the run's first step is the trace's first, up to ``reset_peak``; every later step is its measured step,
    up to ``train_step``'s ``end`` mark: what the trace frees after it is the traced objects' teardown)."""

    length: int
    run: object  # trace/step.TraceRun
    reset: int  # index of the reset_peak mark
    end: int  # index of the measured step's end mark
    first: tuple[tuple[int, int], ...]  # the first step's segments: each micro-batch's, then the optimizer's
    measured: tuple[tuple[int, int], ...]  # the measured step's, the same way
    _live: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def micro_batches(self) -> int:
        """Micro-batches of the traced step (``traced_accum``)."""
        return len(self.measured) - 1

    def live(self, cut: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The storages alive at event ``cut``, in allocation order, as two lists: kept for the whole run (made
        before the measured step and alive after it: weights, adapters, optimizer states, workspaces, token
        batches) and the rest (made by the step or micro-batch before and still held: gradients, kept outputs)."""
        if cut not in self._live:
            kept, held = [], []
            for s in self.run.recorder.storages:  # in allocation order: ids are given as storages appear
                if s.alloc_at < cut and (s.free_at is None or s.free_at > cut):
                    whole_run = s.alloc_at < self.reset and (s.free_at is None or s.free_at > self.end)
                    (kept if whole_run else held).append(s.id)
            self._live[cut] = (tuple(kept), tuple(held))
        return self._live[cut]


def _segments(marks: list[tuple[int, str]], after: int, stop: int, micro: int) -> tuple[tuple[int, int], ...]:
    """The ``micro`` micro-batches and the optimizer of the first step whose marks follow event ``after``, as
    (start, stop) event ranges: a micro-batch from its ``phase:forward`` mark to the next micro-batch's or to
    ``phase:optimizer-step``, the optimizer from there to ``stop``."""
    forwards = [i for i, label in marks if i > after and label == "phase:forward"][:micro]
    optimizer = next(i for i, label in marks if i > forwards[-1] and label == "phase:optimizer-step")
    bounds = [*forwards, optimizer, stop]
    return tuple(zip(bounds, bounds[1:]))


def split_trace(length: int, run, micro: int = 1) -> LengthTrace:
    """``run`` (traced with ``micro`` micro-batches a step) cut into its steps' segments (``LengthTrace``)."""
    events = run.recorder.events
    marks = [(i, x) for i, (kind, x) in enumerate(events) if kind == MARK]
    reset = next(i for i, label in marks if label == "reset_peak")
    end = [i for i, label in marks if label == "phase:end"][-1]
    first = _segments(marks, -1, reset, micro)
    first = ((0, first[0][1]), *first[1:])  # the build and the token batches come before the first step
    return LengthTrace(length, run, reset, end, first, _segments(marks, reset, end, micro))


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
    """Per step of the run: its micro-batches' padded lengths and the allocator's peaks in it (a reset at its
    start)."""

    micro_lengths: list[tuple[int, ...]]
    reserved: list[int]  # simulated torch.cuda.max_memory_reserved of each step
    allocated: list[int]  # simulated torch.cuda.max_memory_allocated of each step

    @property
    def lengths(self) -> list[int]:
        """Each step's longest micro-batch."""
        return [max(step) for step in self.micro_lengths]

    @property
    def peak_reserved(self) -> int:
        return max(self.reserved)

    @property
    def worst(self) -> int:
        """Index of the step with the largest allocated peak (the first of equals)."""
        return self.allocated.index(max(self.allocated))


def _pair(what: str, ours: tuple[int, ...], theirs: tuple[int, ...], before: LengthTrace, trace: LengthTrace,
          handles: dict) -> dict:
    """Trace ``trace``'s storages ``theirs`` mapped to the run's blocks: those of trace ``before``'s storages
    ``ours`` (``handles``), checked to be the same tensors (made by the same op, in the same order)."""
    if len(ours) != len(theirs):
        raise UserError(f"reportgen trace --lengths: the step at {trace.length:,} tokens has {len(theirs)} {what}, "
                        f"the run has {len(ours)}: steps of these lengths cannot be spliced")
    mine, other, out = before.run.recorder.storages, trace.run.recorder.storages, {}
    for src, sid in zip(ours, theirs):
        if mine[src].op != other[sid].op:
            raise UserError(f"reportgen trace --lengths: {what} {mine[src].op!r} of the run is {other[sid].op!r} in "
                            f"the step at {trace.length:,} tokens: steps of these lengths cannot be spliced")
        out[sid] = handles[src]
    return out


def _hand_over(before: LengthTrace, stop: int, trace: LengthTrace, start: int, handles: dict) -> dict:
    """The run's blocks, keyed by ``before``'s storages alive at event ``stop``, re-keyed by ``trace``'s alive at
    ``start`` (the next segment is played from there): what lives for the whole run, and what the micro-batch
    or step before made and still holds, each paired in allocation order."""
    if trace is before and start == stop:  # the next segment of the same trace: nothing to re-key
        return handles
    (kept, held), (their_kept, their_held) = before.live(stop), trace.live(start)
    return {**_pair("tensors kept for the run", kept, their_kept, before, trace, handles),
            **_pair("tensors held from the micro-batch or step before", held, their_held, before, trace, handles)}


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


def step_plan(traces: dict[int, LengthTrace], micro_lengths: tuple[int, ...], first: bool) -> list:
    """The (trace, start, stop) event ranges of one step whose micro-batches have ``micro_lengths``: micro-batch
    ``k`` is micro-batch ``min(k, traced)`` of its length's trace (the traced step's later micro-batches repeat
    its second: ``traced_accum``), the optimizer is the last micro-batch's trace's."""
    plan = []
    for k, length in enumerate(micro_lengths):
        trace = traces[length]
        segments = trace.first if first else trace.measured
        plan.append((trace, *segments[min(k, trace.micro_batches - 1)]))
    plan.append((trace, *segments[-1]))
    return plan


def replay_steps(traces: dict[int, LengthTrace], steps: list) -> StepsReplay:
    """Play a run through one allocator: each step an ``int`` (one micro-batch of that length) or a tuple of its
    micro-batches' lengths, each a key of ``traces``."""
    steps = [s if isinstance(s, tuple) else (s,) for s in steps]
    for s in steps:
        traced = {traces[n].micro_batches for n in s}
        if traced != {len(s)} and not (traced == {2} and len(s) > 2):
            raise ValueError(f"a step of {len(s)} micro-batches cannot be spliced from traces of {traced}")
    sim, out, handles, before = CachingAllocatorSim(), StepsReplay(steps, [], []), {}, None
    for i, micro_lengths in enumerate(steps):
        if i:
            sim.reset_peak()
        for trace, start, stop in step_plan(traces, micro_lengths, first=i == 0):
            if before is not None:
                handles = _hand_over(*before, trace, start, handles)
            _play(sim, trace, trace.run.recorder.events[start:stop], handles)
            before = (trace, stop)
        out.reserved.append(sim.peak_reserved)
        out.allocated.append(sim.peak_allocated)
    return out


def traced_accum(setup) -> int:
    """Micro-batches each length's step is traced with: the setup's, but two when the loop keeps no outputs
    (``keep_outputs none``), since every micro-batch after the first then holds the same tensors at its start
    (the gradients the first made) and does the same; with kept outputs the k-th micro-batch holds k - 1 of
    them (``step``) or the one before's (``next-step``), so each is traced. Traced with two, the run holds two
    token batches, not ``accum``: ``(accum - 2) x batch x length`` int64 fewer bytes allocated (kilobytes;
    ``tests/test_lengths_replay.py`` pins the difference), the same reserve."""
    return setup.accum if setup.keep_outputs.value != "none" else min(setup.accum, 2)


def trace_lengths(spec, setup, gpu, lengths: set[int], warmup: int = 1) -> dict[int, LengthTrace]:
    """The step traced once per length (``lengths.at_length``: the setup as a batch of that length), with
    ``traced_accum`` micro-batches."""
    from reportgen.estimate import constants as K
    from reportgen.estimate.lengths import at_length
    from reportgen.estimate.memory import cublas_workspace_bytes
    from reportgen.trace.step import run_trace

    per_handle, micro = cublas_workspace_bytes(gpu) // K.CUBLAS_HANDLES, traced_accum(setup)
    return {n: split_trace(n, run_trace(spec, at_length(setup, n).model_copy(update={"accum": micro}), per_handle,
                                        K.CUBLAS_HANDLES, warmup=warmup), micro)
            for n in sorted(lengths)}


def _draw(lengths, setup, steps: int, seed: int) -> tuple[list[tuple[int, ...]], int]:
    """Each step's micro-batch lengths (``estimate/lengths.draw_step_lengths``) bucketed (``bucket_lengths``),
    and the multiple they were padded up to; with padding ``max`` or ``packed`` every micro-batch is ``seq``."""
    from reportgen.estimate.lengths import draw_step_lengths

    if setup.padding.value != "longest":
        return [(setup.seq,) * setup.accum] * steps, 1
    drawn = draw_step_lengths(lengths, setup, steps, seed)
    flat, multiple = bucket_lengths([n for step in drawn for n in step], setup.seq)
    return [tuple(flat[i:i + setup.accum]) for i in range(0, len(flat), setup.accum)], multiple


def analytic_growth(spec, setup, gpu, lengths, steps: int) -> dict:
    """``estimate --lengths``' answer (``estimate/lengths.reserved_growth``); with padding ``max`` or ``packed``
    every step is ``seq`` long, so the reserve is the step's own (``memory.estimate_memory``) from the first."""
    from reportgen.estimate.lengths import reserved_growth
    from reportgen.estimate.memory import estimate_memory
    from reportgen.trace.spec import is_known_family

    if not is_known_family(spec):  # a family the estimator has no formulas for: the replay is the only answer
        return {"error": f"model_type {spec.model_type!r} has no analytic formulas"}
    if setup.padding.value == "longest":
        return reserved_growth(spec, setup, gpu, lengths, steps)
    row = {"longest": setup.seq, "peak_reserved": estimate_memory(spec, setup, gpu).peak_reserved}
    return {"first": row, str(steps): dict(row)}


def lengths_replay(spec, gpu, setup, lengths, steps: int, seed: int = 0, warmup: int = 1) -> dict:
    """``steps`` steps of ``accum`` micro-batches drawn from the dataset's ``lengths``
    (``estimate/lengths.draw_step_lengths``), replayed through one allocator, beside the analytic
    ``estimate/lengths.reserved_growth`` at the same step (``analytic_growth``)."""
    from reportgen.estimate import constants as K

    planned, multiple = _draw(lengths, setup, steps, seed)
    traces = trace_lengths(spec, setup, gpu, {n for step in planned for n in step}, warmup=warmup)
    r = replay_steps(traces, planned)
    longest = max(traces)
    alone = replay_steps(traces, [(longest,) * setup.accum] * 2).reserved[-1]
    analytic = analytic_growth(spec, setup, gpu, lengths, steps)
    worst = r.worst
    after = analytic.get(str(steps), {}).get("peak_reserved")
    device_total = r.peak_reserved + K.CUDA_CONTEXT_BYTES
    return {"steps": steps, "seed": seed, "batch": setup.batch, "accum": setup.accum, "cap": setup.seq,
            "padding": setup.padding.value, "pad_multiple": multiple, "traced_lengths": sorted(traces),
            "traced_micro_batches": traced_accum(setup), "step_lengths": r.lengths,
            "micro_batch_lengths": [list(s) for s in r.micro_lengths], "reserved_per_step": r.reserved,
            "first_step": {"longest": r.lengths[0], "peak_reserved": r.reserved[0]},
            "peak_reserved": r.peak_reserved, "device_total": device_total, "capacity": gpu.memory_bytes,
            "fits": device_total <= gpu.memory_bytes, "alone_at_longest": alone,
            "worst_batch": {"step": worst + 1, "longest": r.lengths[worst], "peak_allocated": r.allocated[worst]},
            "analytic": analytic, "notes": _notes(setup),
            "difference": None if after is None else (r.peak_reserved - after) / after}


def _notes(setup) -> list[str]:
    """What the reader of a replay with micro-batches, or of one length, must know beside its numbers."""
    if setup.padding.value != "longest":
        return [f"padding {setup.padding.value}: every micro-batch is {setup.seq:,} tokens, so the run has one length "
                "and nothing grows: the reserve is the traced step's own from the second step on (the first also "
                "holds the build's and the warm-up's blocks), and the analytic answer is the step's estimate"]
    if setup.accum == 1:
        return []
    return [f"a step is {setup.accum} micro-batches of {setup.batch}, each padded to its own longest sample, with the "
            "gradients held between them, as estimate --lengths draws them (batch x accum x steps samples); the "
            "first step's reserve follows the longest of its micro-batches, in both answers"]
