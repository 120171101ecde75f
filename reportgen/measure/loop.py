"""The steps a measurement runs (``harness.run``): one training step as a call, the warm-up, and the
timed loop with its CUDA calls, in the order ``harness.py``'s docstring describes.

``make_steps``: the optimizer (the Trainer's where a recipe's ``optim`` names one, ``sft.py``; else
``optimizers.make_optimizer``), the GradScaler (fp16-mixed), autocast, the synthetic data
(``data.py``) and the recipe's choices (kept outputs, offloaded activations, chunked loss) bound
into ``step()``, one ``step.train_step``. ``warm_up``: the untimed steps, then, on CUDA,
``synchronize`` and ``reset_peak_memory_stats``. ``timed_steps``: each timed step between two
``synchronize`` with CUDA events at its ends, its garbage collections counted, NVML sampled after
it, until ``timing.stop_reason`` says stop; the harness summarises what it returns (``Timed``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from reportgen.measure import timing
from reportgen.measure.optimizers import make_optimizer
from reportgen.measure.protocol import MeasureRequest
from reportgen.measure.step import train_step
from reportgen.setup import Precision, TrainingSetup


@dataclass
class Steps:
    """One optimizer step as a call, and the data it draws."""

    step: Callable[[], None]  # one step.train_step on ``batches``
    data: object  # data.MicroBatches
    batches: list  # the step's micro-batches; replaced in place before each timed step
    last_loss: list  # the last micro-batch's loss (a tensor), written by every step


@dataclass
class Timed:
    """What the timed steps gave, before the harness summarises it."""

    times: list = field(default_factory=list)  # wall seconds per step
    cuda_times: list = field(default_factory=list)  # CUDA-event seconds per step (CUDA only)
    used_samples: list = field(default_factory=list)  # NVML's process memory after each step
    source: str | None = None  # where NVML's figure came from (nvml.process_used)
    reason: str | None = None  # why the steps stopped (timing.stop_reason)
    gc_counts: list = field(default_factory=list)  # Python's collections inside each step
    gc_seconds: list = field(default_factory=list)  # and their pause


def make_steps(model, trainer, trainable: list, spec, setup: TrainingSetup, device: str, dist,
               chunked_loss: Callable) -> Steps:
    """``model``: what the steps train (the trainer's, or a rank's wrapped model); ``trainer``: the
    recipe's Trainer or None; ``dist``: the rank of a multi-GPU run or None; ``chunked_loss``: the
    forward of ``loss=chunked`` (``harness.chunked_loss``, where the tracer imports it from)."""
    import torch

    from reportgen.measure.data import MicroBatches

    optimizer = None
    if trainer is not None:
        from reportgen.measure.sft import trainer_optimizer

        optimizer = trainer_optimizer(trainer, setup)  # Trainer.create_optimizer where optim names it
    optimizer = optimizer if optimizer is not None else make_optimizer(trainable, setup, device)
    scaler = torch.amp.GradScaler(device) if setup.precision == Precision.fp16_mixed else None
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(setup.compute_dtype)

    def autocast():
        if setup.autocast:
            return torch.autocast(device_type=device, dtype=amp_dtype)
        return contextlib.nullcontext()

    gen = torch.Generator(device=device).manual_seed(dist.rank if dist is not None else 0)
    data = MicroBatches(setup, spec.vocab_size, device, gen)
    batches = data.next_step(longest=True)
    last_loss: list[float] = []

    keep = setup.keep_outputs.value
    kept: list = []  # outputs the loop holds (keep_outputs): past the loss, or into the next step
    # multi-GPU: the context of each micro-batch (DDP's no_sync before the last one)
    sync = dist.micro_batch_sync(model, setup) if dist is not None else None
    cuda = device == "cuda"
    offload = torch.autograd.graph.save_on_cpu(pin_memory=cuda) if setup.act_offload else contextlib.nullcontext()

    def forward(ids, mask, labels):
        if trainer is not None:
            return trainer.forward(ids, mask, labels)  # the trainer's compute_loss
        if setup.loss.value == "chunked":
            return chunked_loss(model, ids, mask, labels, spec)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        return out.loss, out

    def step() -> None:
        train_step(model, optimizer, batches, setup.accum, autocast, scaler, last_loss, keep=keep, kept=kept,
                   offload=offload, forward=forward, sync=sync)

    return Steps(step, data, batches, last_loss)


def warm_up(warmup: int, step: Callable[[], None], inject: Callable[[], None], cuda: bool) -> None:
    """``warmup`` untimed steps (the optimizer states come to exist; ``inject()`` before each, and
    once with none: the test-only fault), then, on CUDA, the allocator's peaks are reset: the peaks
    read after the timed steps are the steady state's."""
    for _ in range(warmup):
        inject()
        step()
    if warmup == 0:
        inject()
    if cuda:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def timed_steps(request: MeasureRequest, steps: Steps, device: str, nvml, dist, measurement: dict) -> Timed:
    """The timed steps, as many as the stopping rule asks (``timing.py``; a rank as many as the
    others); records the rule in ``measurement`` first."""
    import torch

    cuda = device == "cuda"
    rule = timing.rule_from_settings(vars(request))
    measurement.update(max_steps=rule.max_steps, max_timed_s=rule.max_timed_s, target_rel_ci=rule.target_rel_ci)
    out = Timed()
    times = out.times
    steps.data.real_tokens.clear()
    start_ev = torch.cuda.Event(enable_timing=True) if cuda else None
    end_ev = torch.cuda.Event(enable_timing=True) if cuda else None
    gc_pauses = timing.GcPauses()
    while out.reason is None:
        steps.batches[:] = steps.data.next_step(longest=not times)  # outside the timed window
        if cuda:
            torch.cuda.synchronize()
        gc_pauses.take()
        t = time.perf_counter()
        if cuda:
            start_ev.record()
        with gc_pauses:
            steps.step()
        if cuda:
            end_ev.record()
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        n_gc, s_gc = gc_pauses.take()
        out.gc_counts.append(n_gc)
        out.gc_seconds.append(s_gc)
        if cuda:
            out.cuda_times.append(start_ev.elapsed_time(end_ev) / 1000.0)  # milliseconds -> seconds
        if nvml is not None:
            used, out.source = nvml.process_used()
            if used is not None:
                out.used_samples.append(used)
        out.reason = timing.stop_reason(times, rule)
        if dist is not None:  # every rank runs as many steps as the others (collectives)
            out.reason = dist.agree_stop(out.reason, device)
    return out
