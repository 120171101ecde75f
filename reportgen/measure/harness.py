"""Measure one case in this process: build the model, train a few steps on synthetic tokens,
read PyTorch's and the driver's memory counters and the step times.

Runs inside the worker subprocess (``worker.py``), never in the CLI's own process.

``run`` goes through the phases (``Phase``: what a failure names as ``failed_in``) in order, one
function each: ``_prepare`` (setup, model spec, refusals), ``_start_device`` (CUDA context, NVML,
cap, memory history), ``connect`` (a rank), ``_build`` (model, adapters, a recipe's Trainer, a
rank's wrapping; ``build_s``), ``_record_load`` (dtypes, trainable parameters, memory after load),
``loop.make_steps`` (optimizer and data: the ``optimizer`` phase), ``loop.warm_up``,
``loop.timed_steps`` (``loop.py``: the loop and its CUDA calls), ``_record`` (the figures below
from the timed steps), ``_profile``; ``_failure`` turns an exception into the answer's status
(an OOM is a result, never an exception; Ctrl-C is raised again).

Training step (``step.py`` ``train_step``, shared with ``reportgen trace``; the loop of HF
Trainer without its extras, and what the estimator's timeline assumes, ``estimate/memory.py``):
for each of ``accum`` micro-batches of random token ids ``(batch, seq)`` with labels = input ids
(variable lengths: ``data.py``, padded and masked like transformers' collators),
``out = model(input_ids, attention_mask, labels)`` under ``torch.autocast`` for mixed precision,
``loss = out.loss / accum``, ``del out`` (the Trainer drops the outputs the same way, so the
logits die before the backward), ``loss.backward()`` (through ``torch.amp.GradScaler`` for
fp16-mixed); then ``optimizer.step()`` and
``optimizer.zero_grad(set_to_none=True)``. No gradient clipping, no learning-rate schedule.
Recipe choices: ``keep_outputs`` holds ``out`` past the loss (``step``: until the optimizer step;
``next-step``: until the next forward returns, as litgpt's loop does); ``optimizer_in_backward``
steps a per-parameter optimizer in each gradient's post-accumulate hook (``optimizers.InBackward``);
``act_offload`` runs the forward under ``torch.autograd.graph.save_on_cpu`` (PyTorch's offloading of
saved tensors to pinned host memory; synchronous, where torchtune's ``OffloadActivations`` overlaps
the copies on a side stream, so its step times are an upper bound); ``loss=chunked`` computes the
loss as torchtune's ``CEWithChunkedOutputLoss`` (``chunked_loss``).

Memory (PyTorch docs, "Understanding CUDA Memory Usage" and ``torch.cuda.memory_stats``):
``peak_allocated = torch.cuda.max_memory_allocated()``: bytes in live tensors;
``peak_reserved = torch.cuda.max_memory_reserved()``: bytes the caching allocator holds from the
driver (live tensors plus cached free blocks); both after ``reset_peak_memory_stats()`` once the
warm-up steps are done, so the optimizer states exist and the peak is the steady state's.
``device_used``: this process's memory as the driver sees it (NVML, ``nvml.py``), sampled after
every timed step, the largest sample; it adds the CUDA context and memory outside the allocator.
``memory_after_load``: ``memory_allocated()`` once the model (and adapters) are built.

Host memory (issue 32; ``host.py``, bytes, on any device, null off Linux): ``host_rss_after_load``:
the process's resident set size once the model is built (``VmRSS`` of ``/proc/self/status``,
where ``memory_after_load`` is read); ``host_peak_rss_load``, ``host_peak_rss_warmup``,
``host_peak_rss``: its peak resident set size (Linux getrusage(2): ``ru_maxrss`` of
``RUSAGE_SELF``, in kilobytes) up to the end of loading, of the warm-up, and of the timed steps
(read with the GPU peaks, before any profiled step); it only grows, and it counts from the
worker's start (interpreter and imports included). ``host_peak_rss_children``: ``ru_maxrss`` of
``RUSAGE_CHILDREN``, the largest peak of a child process that ended (not a sum; a child carries
its parent's resident set size at the time it started, ``host.py``). A failed run
records ``host_peak_rss_at_failure`` instead of ``host_peak_rss``: the peak up to the failure.
``ru_maxrss`` may read a few hundred KiB below ``VmRSS`` read at the same moment (``host.py``), so
``host_peak_rss_load`` can be just below ``host_rss_after_load``.
Measurements made before issue 32 lack these fields.

Time (``loop.timed_steps``, summarised by ``_record``): each timed step is timed twice: its wall
time (``torch.cuda.synchronize()`` before and after it, ``time.perf_counter`` around it:
``step_times_s``) and, on CUDA, the time between two CUDA events recorded on the current stream at
its start and end (``torch.cuda.Event.elapsed_time``:
``step_times_cuda_s``, median ``step_s_cuda``). ``step_s`` is the median of the wall times. The
number of timed steps adapts (``timing.py``): at least ``steps``, then on until the median's 95 %
confidence interval lies within ``target_rel_ci`` of it (``stable``), ``max_steps`` ran, or the
timed steps reach ``max_timed_s`` seconds (``time_cap``); ``steps_run``, ``stop_reason``,
``timed_s``, the min, max and quartiles (``step_s_q1``/``step_s_q3``), the IQR relative to the
median (``step_s_iqr_rel``) and the median's interval (``step_s_ci``, ``step_s_ci_rel``: known to
+- that fraction) are recorded. ``tokens_per_s`` = data tokens per optimizer step (padding left
out; the mean over the timed steps) / ``step_s``. Measurements made before the rule ran exactly
``steps`` timed steps and lack these fields. Per timed step, Python's garbage collections inside it
and their pause (``gc_collections``, ``gc_pause_s``; ``timing.GcPauses``): a host-bound step that a
collection interrupts is longer by the pause, which tells a slow step's cause from noise.
Profile (``profile``: ``reportgen measure --profile``, sweep ``measure.profile``): after the timed
steps and after every figure above is read, ``profile_steps`` more steps run under
``torch.profiler`` (``profiling.py``), and the measurement's ``profile`` block holds, per profiled
step, the wall time, the GPU-busy time (the union of the device's kernel and copy intervals),
the kernels and launches, the CPU operators dispatched (``trace_stats.py``), and the trace file's path.
``mfu`` (PaLM's definition, as ``estimate/time.py``): the model FLOPs per token of the technique
(without recomputation) x tokens/s / the datasheet dense peak of the compute dtype of the GPU
catalog entry that matches the MEASURED device (``environment.catalog_gpu_for``). When the
device is the case's ``--gpu`` card that is the card's peak; when it is another card (a capped
run emulating a smaller card, or a sweep measured elsewhere) it is the real device's peak, never
the emulated card's; when the catalog has no entry for the device (or on CPU) mfu is null.

Cap (``cap_to_gpu``): ``torch.cuda.set_per_process_memory_fraction(f)`` with
``f = (catalog memory of --gpu - this process's CUDA context) / device total``, so the caching
allocator can reserve at most what a process could on the emulated card. The allocator raises an
ordinary OOM at the limit. CUDA managed memory (paged optimizers) is not limited by it.

Multi-GPU (``gpus > 1``): one process per GPU under torchrun, each running ``run`` with its
``distributed.Rank`` (``dist``): it joins the process group, wraps the built model (DDP or FSDP2),
draws its own micro-batches, runs the same loop and reports its own figures on device
``local_rank``; the parent merges the ranks' answers (``ranks.py``). Without ``dist`` nothing of
this happens and the single-GPU run is unchanged.

Test-only fault injection: ``REPORTGEN_FAULT=oom`` raises ``torch.OutOfMemoryError`` in the first
warm-up step, ``crash`` kills the worker with SIGKILL, ``hang`` sleeps forever, ``error`` raises
``RuntimeError``; ``REPORTGEN_FAULT_RANK=R`` limits it to rank R of a multi-GPU run. Never set it
for real measurements: the measurement records it if it is set.
"""

from __future__ import annotations

import gc
import os
import signal
import statistics
import time
import traceback
from dataclasses import dataclass

from reportgen import catalog
from reportgen.measure import host, loop, timing
from reportgen.measure.optimizers import SetupNotSupported
from reportgen.measure.protocol import MeasureRequest, answer, empty_measurement, tail
from reportgen.setup import Offload, TrainingSetup

FAULT_ENV = "REPORTGEN_FAULT"
SNAPSHOT_MAX_ENTRIES = 200_000


class Phase:
    """Where the run is, so a failure can say where it failed; ``listener(name)`` hears each change
    (a multi-GPU rank records it, so a timeout can say where every rank was)."""

    def __init__(self, listener=None) -> None:
        self._listener = listener
        self._name = "setup"

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = value
        if self._listener is not None:
            self._listener(value)


def check_supported(setup: TrainingSetup, device: str, world_size: int = 1, *, count_gpus: bool = True) -> None:
    """Refuse, with a clear message, what the harness cannot run here (before importing much).
    ``world_size``: the processes of this run (torchrun's ``WORLD_SIZE``; 1 without torchrun);
    ``count_gpus=False``: only what needs no torch (the parent's check, ``isolate.refusal``)."""
    if setup.gpus > 1 and world_size > 1:
        from reportgen.measure.distributed import check_supported as check_ranks

        check_ranks(setup, device, world_size, count_gpus=count_gpus)
    elif setup.gpus > 1:
        import torch

        have = torch.cuda.device_count() if device == "cuda" and torch.cuda.is_available() else 0
        if have < setup.gpus:
            raise SetupNotSupported(f"gpus={setup.gpus} ({setup.sharding.value}) needs {setup.gpus} GPUs; "
                                    f"this machine has {have}")
        raise SetupNotSupported(f"gpus={setup.gpus} ({setup.sharding.value}): measured with one process per GPU "
                                "under torchrun, which `reportgen measure` starts; this worker runs alone")
    if setup.recipe.value == "grpo":  # the harness runs an SFT step: a GRPO step would be measured as one
        raise SetupNotSupported("recipe grpo (TRL's GRPOTrainer, generation in the loop) is estimated only: the "
                                "harness measures SFT steps")
    if setup.offload == Offload.params and world_size > 1 and setup.sharding.value in ("fsdp", "no-shard"):
        pass  # FSDP2's CPUOffloadPolicy (distributed.py)
    elif setup.offload == Offload.params:
        raise SetupNotSupported("offload=params (FSDP CPU offload of parameters) is not implemented by the harness; "
                                "only offload=optimizer (torchao CPUOffloadOptimizer) is measured")
    if setup.compile:
        raise SetupNotSupported("compile=true (torch.compile) is modelled by the estimator but not run by the "
                                "harness yet")
    if setup.loss.value in ("chunked-compiled", "no-upcast"):
        raise SetupNotSupported(f"loss={setup.loss.value!r} is modelled by the estimator (estimate/logits.py) but "
                                "the harness runs only the standard, fused and chunked losses")
    if setup.fsdp_param_dtype.value != "compute":
        raise SetupNotSupported("fsdp_param_dtype=fp32 (Lightning's FSDP gather under autocast) is modelled by the "
                                "estimator but not run by the harness, whose FSDP gathers in the compute dtype")
    if setup.modeling.value != "transformers":
        raise SetupNotSupported("modeling=torchtune (torchtune's own model) is modelled by the estimator and traced by "
                                "reportgen trace --recipe torchtune; the harness builds transformers' models")
    if (setup.loss.value == "fused" or setup.kernels.value == "liger") and device != "cuda":
        what = "loss='fused'" if setup.loss.value == "fused" else "kernels='liger'"
        raise SetupNotSupported(f"{what} uses Liger-Kernel's Triton kernels, which need a CUDA device")
    if setup.recipe.value != "loop" and setup.gpus > 1:
        raise SetupNotSupported(f"recipe {setup.recipe.value}: the trainer is measured on one GPU (its accelerate "
                                "launch on several is not run by the harness)")


def _inject(fault: str | None, where: str) -> None:
    if not fault:
        return
    import torch

    if fault == "oom" and where == "warmup":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB "
                                     f"(injected by {FAULT_ENV}=oom, test only)")
    if fault == "error" and where == "warmup":
        raise RuntimeError(f"injected failure ({FAULT_ENV}=error, test only)")
    if fault == "crash" and where == "build":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hang" and where == "build":
        time.sleep(10**6)


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "CUBLAS_STATUS_ALLOC_FAILED" in text)


def _cap(request: MeasureRequest, nvml, device_key: str | None = None, index: int = 0) -> dict | None:
    """Limit the caching allocator to what the ``--gpu`` card would leave this process.

    ``device_key``: the catalog key of the measured device (``environment.catalog_gpu_for``). When it
    is the ``--gpu`` card itself nothing is emulated: the card's own limit applies (the catalog's
    memory of a card is nvidia-smi's total, not CUDA's ``total_memory``, so a limit computed from it
    would be a fraction near 1 that records a cap where there is none). ``index``: the CUDA device
    (a multi-GPU rank's local rank).
    """
    import torch

    card = catalog.load_gpu(request.gpu)
    total = int(torch.cuda.get_device_properties(index).total_memory)
    if device_key is not None and device_key == request.gpu:
        return {"emulated_gpu": request.gpu, "emulated_memory_bytes": card.memory_bytes, "device_total_bytes": total,
                "fraction": None, "applied": False, "note": "the device is the emulated card: nothing to cap"}
    context, source = None, None
    if nvml is not None:
        used, source = nvml.process_used()
        if used is not None:
            context = max(0, used - int(torch.cuda.memory_reserved()))
    if context is None:
        from reportgen.estimate.constants import CUDA_CONTEXT_BYTES

        context, source = CUDA_CONTEXT_BYTES, "assumed (estimate/constants.py CUDA_CONTEXT_BYTES)"
    limit = card.memory_bytes - context
    cap = {"emulated_gpu": request.gpu, "emulated_memory_bytes": card.memory_bytes, "context_bytes": context,
           "context_source": source, "device_total_bytes": total, "limit_bytes": limit}
    if limit >= total:
        cap.update(fraction=None, applied=False,
                   note="the device has no more memory than the emulated card: nothing to cap")
        return cap
    fraction = limit / total
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    cap.update(fraction=fraction, applied=True)
    return cap


def _mfu(spec, setup: TrainingSetup, attn, tokens_per_s: float, device_key: str | None) -> tuple[float | None, dict]:
    from reportgen.estimate.time import flops_per_token, peak_dtype

    model_flops = flops_per_token(spec, setup, attn)[1]
    basis = {"model_flops_per_token": model_flops, "gpu": device_key, "dtype": None, "peak_flops": None}
    if device_key is None:
        return None, basis
    gpu = catalog.load_gpu(device_key)
    dtype, _ = peak_dtype(setup, gpu)
    peak = gpu.peak_flops(dtype)
    basis.update(dtype=dtype, peak_flops=peak)
    if not peak:
        return None, basis
    return model_flops * tokens_per_s / peak, basis


@dataclass
class _Device:
    """The device of the run and what the harness turned on there; a failure and the end of the run
    read it again (the allocator's peak, the memory history, the cap)."""

    name: str  # request.device: "cuda" or "cpu"
    started: bool = False  # CUDA context created: a failure can ask the allocator for its peak
    nvml: object = None  # nvml.Nvml of the device (device_used), when NVML answers
    cap: dict | None = None  # the answer's cap block (cap_to_gpu)
    snapshot_on: bool = False  # memory history recorded (--snapshot): dumped when the run ends

    @property
    def cuda(self) -> bool:
        return self.name == "cuda"


@dataclass
class _Model:
    """The model the steps train: built (``build.py``), inside its Trainer for a recipe other than
    the loop (``sft.py``), wrapped (DDP, FSDP2) for a multi-GPU rank."""

    model: object
    built: object  # build.Built: attention, dtypes, notes (the measurement's notes list itself)
    trainer: object = None  # recipes trainer and trl-sft: the real Trainer / SFTTrainer around the model
    trainer_dir: object = None  # the trainer's output folder, removed when the run ends


def run(request: MeasureRequest, environment: dict, dist=None, on_phase=None) -> dict:
    """Measure one case; every outcome (ok, OOM, error) is an answer, never an exception.
    ``dist``: this process's ``distributed.Rank`` in a multi-GPU run (None: one process, one GPU);
    ``on_phase(name)``: called at each phase change."""
    phase = Phase(on_phase)
    measurement = empty_measurement()
    dev = _Device(request.device)
    try:
        setup, spec, fault = _prepare(request, measurement, dist)
        _start_device(request, environment, measurement, dev, dist)
        if dist is not None:
            phase.name = "connect"
            dist.connect(dev.name)
        phase.name = "build"
        model = _build(spec, setup, fault, dev, dist, measurement, phase)
        trainable = _record_load(model, dev, measurement)
        phase.name = "optimizer"
        steps = loop.make_steps(model.model, model.trainer, trainable, spec, setup, dev.name, dist, chunked_loss)
        phase.name = "warmup"
        loop.warm_up(request.warmup, steps.step, lambda: _inject(fault, "warmup"), dev.cuda)
        measurement["host_peak_rss_warmup"] = host.peak_rss()
        phase.name = "timed"
        timed = loop.timed_steps(request, steps, dev.name, dev.nvml, dist, measurement)
        _record(environment, spec, setup, steps, timed, dev, measurement)
        if request.profile:  # profiled steps, after every figure above is read
            phase.name = "profile"

            def next_batches(_: int) -> None:
                steps.batches[:] = steps.data.next_step()

            measurement["profile"] = _profile(request, steps.step, next_batches, dev.cuda, dist)
        status, error = "ok", None
    except BaseException as exc:  # noqa: BLE001 - every failure is a result
        if isinstance(exc, KeyboardInterrupt):
            raise
        status, error = _failure(exc, phase, dev, dist, measurement)
    finally:
        if dev.snapshot_on:
            measurement["snapshot"] = _dump_snapshot(request.snapshot)
    return answer(request, status, measurement=measurement, error=error, environment=environment, cap=dev.cap)


def _prepare(request: MeasureRequest, measurement: dict, dist) -> tuple:
    """The case's setup and model spec, and the injected fault (test only); refuses what cannot run
    here (``check_supported``). Returns ``(setup, spec, fault)``."""
    import torch

    setup = TrainingSetup.model_validate(request.setup)
    spec = catalog.load_model(request.model)
    measurement.update(warmup=request.warmup, steps=request.steps, tokens_per_step=setup.tokens_per_step)
    fault = os.environ.get(FAULT_ENV) or None
    if dist is not None:
        fault = dist.fault(fault)
    if fault:
        measurement["fault_injected"] = fault
    if request.device == "cuda" and not torch.cuda.is_available():
        raise SetupNotSupported("--device cuda: no CUDA device is visible to PyTorch "
                                f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    check_supported(setup, request.device, dist.world_size if dist is not None else 1)
    return setup, spec, fault


def _start_device(request: MeasureRequest, environment: dict, measurement: dict, dev: _Device, dist) -> None:
    """On CUDA: the context, NVML, the cap (``cap_to_gpu``), the memory history (``--snapshot``);
    nothing on the CPU."""
    if not dev.cuda:
        return
    import torch

    index = dist.local_rank if dist is not None else 0  # the CUDA device of this process
    torch.cuda.set_device(index)
    dev.started = True
    torch.empty(1, device="cuda")  # create the context before reading its size
    try:
        from reportgen.measure.nvml import Nvml, uuid_of

        dev.nvml = Nvml(uuid_of(torch.cuda.get_device_properties(index)))
    except Exception as exc:  # noqa: BLE001 - no NVML: device_used stays null
        measurement["device_used_source"] = f"unavailable ({type(exc).__name__}: {exc})"
    if request.cap_to_gpu:
        dev.cap = _cap(request, dev.nvml, environment.get("gpu_catalog_key"), index)
    if request.snapshot:
        torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_MAX_ENTRIES)
        dev.snapshot_on = True
    # fp32 matmuls run on CUDA cores unless TF32 is allowed (PyTorch's default: not allowed)
    measurement["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)


def _build(spec, setup: TrainingSetup, fault: str | None, dev: _Device, dist, measurement: dict,
           phase: Phase) -> _Model:
    """Build the model (and adapters), put it in its Trainer (a recipe) or wrap it (a rank);
    ``build_s`` is the time it took (to the device's last kernel)."""
    import torch

    _inject(fault, "build")
    from reportgen.measure.build import build

    t0 = time.perf_counter()
    if dist is None:
        built = build(spec, setup, dev.name)
    else:
        built = build(spec, setup, dev.name, quant_storage=dist.quant_storage(setup))
    if setup.kernels.value == "liger":
        from reportgen.measure.liger import apply_layer_kernels

        apply_layer_kernels(built.model, built.notes)
    out = _Model(built.model, built)
    if setup.recipe.value != "loop":
        import tempfile

        from reportgen.measure.sft import make_trainer

        out.trainer_dir = tempfile.TemporaryDirectory(prefix="reportgen-trainer-")
        out.trainer = make_trainer(out.model, setup, dev.name, out.trainer_dir.name)
        out.model = out.trainer.model
        if setup.is_peft:  # as the trainer left them (SFTTrainer casts a 4-bit model's adapters to bf16)
            dtype = next(p.dtype for p in out.model.parameters() if p.requires_grad)
            built.adapter_dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
        built.notes.append("measured through " + ("TRL SFTTrainer" if setup.recipe.value == "trl-sft"
                                                  else "transformers Trainer"))
    if dist is not None:
        phase.name = "wrap"
        out.model = dist.wrap(out.model, setup, dev.name, built.notes)
    if dev.cuda:
        torch.cuda.synchronize()
    measurement["build_s"] = time.perf_counter() - t0
    return out


def _record_load(model: _Model, dev: _Device, measurement: dict) -> list:
    """What the build made (dtypes, notes, trainable parameters) and the memory after load; returns
    the trainable parameters."""
    import torch

    built = model.built
    measurement.update(attn_implementation=built.attn_implementation, storage_dtype=built.storage_dtype,
                       compute_dtype=built.compute_dtype, adapter_dtype=built.adapter_dtype, notes=built.notes)
    if dev.snapshot_on:
        built.notes.append("memory history recorded (--snapshot): step times include its overhead")
    trainable = [p for p in model.model.parameters() if p.requires_grad]
    measurement["params_trainable"] = sum(p.numel() for p in trainable)
    gc.collect()
    if dev.cuda:
        torch.cuda.empty_cache()  # drop what the build cached (QLoRA's 16-bit temporaries)
        measurement["memory_after_load"] = int(torch.cuda.memory_allocated())
        measurement["memory_after_load_reserved"] = int(torch.cuda.memory_reserved())
    measurement.update(host_rss_after_load=host.rss_now(), host_peak_rss_load=host.peak_rss())
    return trainable


def _record(environment: dict, spec, setup: TrainingSetup, steps: loop.Steps, timed: loop.Timed, dev: _Device,
            measurement: dict) -> None:
    """The figures of the timed steps: the timing summary and tokens/s, the last loss, the
    allocator's and the driver's memory peaks (CUDA), MFU."""
    import torch

    cuda = dev.cuda
    times, cuda_times = timed.times, timed.cuda_times
    stats = timing.summary(times)
    median = stats["step_s"]
    real_per_step = statistics.mean(steps.data.real_tokens)  # data tokens, padding left out
    tokens_per_s = real_per_step / median
    measurement["real_tokens_per_step"] = real_per_step
    measurement.update(stats, step_times_s=times, tokens_per_s=tokens_per_s, stop_reason=timed.reason,
                       timed_s=sum(times), step_times_cuda_s=cuda_times if cuda else None,
                       step_s_cuda=statistics.median(cuda_times) if cuda else None,
                       gc_collections=timed.gc_counts, gc_pause_s=timed.gc_seconds)
    if steps.last_loss:
        value = float(steps.last_loss[0].float().item()) * setup.accum
        measurement["final_loss"] = value if value == value and abs(value) != float("inf") else None
        measurement["loss_finite"] = value == value and abs(value) != float("inf")
    if cuda:
        measurement["peak_allocated"] = int(torch.cuda.max_memory_allocated())
        measurement["peak_reserved"] = int(torch.cuda.max_memory_reserved())
        measurement["device_used"] = max(timed.used_samples) if timed.used_samples else None
        measurement["device_used_source"] = timed.source if timed.used_samples \
            else measurement.get("device_used_source")
        if setup.optimizer.value == "paged-adamw-8bit":
            measurement.setdefault("notes", []).append(
                "paged optimizer states live in CUDA managed memory: in device_used, not in peak_allocated")
    measurement.update(host_peak_rss=host.peak_rss(), host_peak_rss_children=host.peak_rss_children())
    from reportgen.estimate.memory import effective_attention

    attn, _ = effective_attention(spec, setup)
    device_key = environment.get("gpu_catalog_key") if cuda else None
    measurement["mfu"], measurement["mfu_basis"] = _mfu(spec, setup, attn, tokens_per_s, device_key)


def _failure(exc: BaseException, phase: Phase, dev: _Device, dist, measurement: dict) -> tuple[str, str]:
    """The status and error of a run that raised ``exc`` (not a Ctrl-C), and where it failed."""
    measurement["failed_in"] = phase.name
    if dist is not None:  # when, and whether only because another rank went away (ranks.py)
        from reportgen.measure.distributed import is_peer_failure

        measurement.update(failed_at=time.time(), peer_lost=is_peer_failure(exc))
    if dev.started:
        # how far it got: the allocator's peak up to the failure (since the warm-up's reset when
        # it failed in a timed step); not the case's peak, which the run never reached
        try:
            import torch

            measurement["peak_allocated_at_failure"] = int(torch.cuda.max_memory_allocated())
        except Exception:  # noqa: BLE001 - a broken CUDA context cannot answer
            pass
    measurement["host_peak_rss_at_failure"] = host.peak_rss()  # as far as it got, likewise
    if isinstance(exc, SetupNotSupported):
        return "error", str(exc)
    if is_oom(exc):
        return "oom", tail(str(exc))
    return "error", tail("".join(traceback.format_exception(exc)))


def _profile(request: MeasureRequest, step, before, cuda: bool, dist=None) -> dict:
    """The ``profile`` block (``profiling.py``); a failure is recorded in it, never fails the case.
    Each rank of a multi-GPU run writes its own trace (``.rank<R>`` before the suffix)."""
    from reportgen.measure.profiling import profile_steps

    path = request.profile
    if dist is not None:
        from reportgen.measure.profiling import rank_path

        path = rank_path(path, dist.rank)
    try:
        return profile_steps(step, before, request.profile_steps, path, cuda)
    except Exception as exc:  # noqa: BLE001 - the timed figures stand without a profile
        return {"trace": None, "steps": [], "error": tail(f"{type(exc).__name__}: {exc}", 1000)}


#: torchtune's ``CEWithChunkedOutputLoss`` default
LOSS_CHUNKS = 8


def chunked_loss(model, ids, mask, labels, spec):
    """``loss=chunked`` (torchtune ``CEWithChunkedOutputLoss``): the decoder's hidden states go
    through the LM head in 8 chunks of tokens, each chunk's 16-bit logits are upcast to fp32 and
    cross-entropied on its own; labels shifted as transformers' ``ForCausalLMLoss`` shifts them.
    Returns ``(loss, logits chunks)``."""
    import torch
    import torch.nn.functional as F

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = base.model(input_ids=ids, attention_mask=mask).last_hidden_state
    chunks = [base.lm_head(h) for h in hidden.chunk(LOSS_CHUNKS, dim=1)]
    cap = getattr(base.config, "final_logit_softcapping", None)
    if cap:
        chunks = [torch.tanh(c / cap) * cap for c in chunks]
    shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
    total = sum(F.cross_entropy(c.float().reshape(-1, spec.vocab_size), lab.reshape(-1), ignore_index=-100,
                                reduction="sum") for c, lab in zip(chunks, shifted.chunk(LOSS_CHUNKS, dim=1)))
    return total / (shifted != -100).sum().clamp(min=1), chunks


def _dump_snapshot(path: str) -> str | None:
    """Write the allocator's history (``torch.cuda.memory._dump_snapshot``; open the pickle at
    https://pytorch.org/memory_viz) and stop recording."""
    import torch

    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        torch.cuda.memory._dump_snapshot(path)
        return path
    except Exception:  # noqa: BLE001 - a failed snapshot must not turn a measurement into an error
        return None
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
