"""Step time: what the step's kernels cost the GPU, what dispatching them costs the host, and how
the two overlap; host-link transfers for offload and multi-GPU communication on top.

The inventory of one step (``work.py``: kernels, ATen ops, Python-level calls, matmul and attention
FLOPs, HBM bytes, per phase) is priced on both sides of the launch queue, as the kernel-level
predictors do (KernelSight-LM, arXiv 2606.28565: a roofline per kernel with a learned efficiency,
plus a host-overhead model, composed by a discrete-event scheduler; TaxBreak, arXiv 2603.12465,
decomposes the host side on H100/H200 into framework, library and launch time):

* **device** (``device_seconds``): large GEMMs at ``MATMUL_EFFICIENCY`` of the datasheet peak of the
  compute dtype (per GPU generation, ``matmul_efficiency_of``), fused attention kernels at
  ``ATTENTION_EFFICIENCY``, memory-bound kernels (elementwise ops, casts, reductions, small GEMMs,
  bitsandbytes' dequantization, the optimizer) at ``DRAM_EFFICIENCY`` of the memory bandwidth less the
  traffic the card's L2 serves (``memory_bandwidth``: ``L2_REUSE`` of it, scaled by how much of a
  micro-batch's hidden states the L2 holds), one after another on one stream, plus ``KERNEL_DEVICE_S``
  per launch;
* **host** (``host_seconds``): ``HOST_S_PER_KERNEL`` per kernel the step launches (Python to ATen,
  the dispatcher, the launch), ``HOST_S_PER_CALL`` per Python-level call around them (module calls,
  peft's LoRA wrapper, bitsandbytes' Python autograd Function, Python optimizer loops) and
  ``HOST_S_PER_AUTOCAST_KERNEL`` more per kernel launched under ``torch.autocast`` (the forward and
  checkpointing's recomputation: the Autocast dispatch key's per-op casting logic and cast cache,
  ``aten/src/ATen/autocast_mode.cpp``);
* **overlap** (``pipeline_seconds``): kernels are queued asynchronously, so the host runs ahead of the
  device; the step (synchronized at both ends, as the harness times it) is the discrete-event
  schedule of its phases (each micro-batch's forward and backward, then the optimizer), each phase
  cut into as many slices as the model has layers: a step is as long as its device time when the
  host keeps ahead, as its host time when it cannot, and in between when a phase's host time and
  device time are close.

The constants are fitted by ``scripts/calibrate.py`` to our H100 measurements (and the consumer
matmul efficiency to published tokens/s), with their leave-one-out errors (``constants.py``). A card
with a profile of its own (``reportgen profile-gpu``, ``gpu.profile``) prices its kernels with them
scaled by its measured rates over the H100 machine's (``profiled``); without one, the estimate's notes
say whose rates it borrows (``_evidence_note``).

FLOPs (Kaplan et al. 2020; Chowdhery et al. 2022 "PaLM", appendix B; Korthikanti et al. 2022 for
recomputation): a matmul with ``N`` weights costs ``2N`` FLOPs per token forward, ``2N`` for the
input gradient and ``2N`` for the weight gradient; a frozen weight (LoRA, QLoRA) needs no weight
gradient. Two counts are reported. **Model FLOPs** (for MFU) follow PaLM: ``6N + 12 L H Q T`` per
token for full fine-tuning, ``4N + 6 N_lora`` for LoRA/QLoRA, the full attention square, no
recomputation, so MFU compares with torchtitan, nanoGPT and the papers. **Hardware FLOPs** (for
HFU) are what the kernels execute: causal SDPA skips the masked half of the square (eager computes
all of it), and checkpointing's recomputed forward is included.

``TimeEstimate.parts`` keeps each term (per optimizer step): ``compute`` (GEMMs and attention),
``memory`` (memory-bound kernels), ``launch`` (the per-kernel device time), ``host`` (dispatch),
``host_exposed`` (what the host adds beyond the device's busy time), ``dequant`` (QLoRA's share of
``memory``), ``transfer``, ``compile`` (<= 0: what ``torch.compile`` fuses away, ``fusion.py``),
``dora`` (DoRA's share of ``compute``, ``memory`` and ``launch``: its kernels are in the inventory);
``step_s`` = the pipeline of device and host + transfer + compile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reportgen.estimate import constants as K
from reportgen.estimate import dora as DORA
from reportgen.estimate import params as P
from reportgen.estimate.comm import communication
from reportgen.estimate.dispatch import HostDispatch, host_dispatch
from reportgen.estimate.dtypes import BYTES, dtypes_for
from reportgen.estimate.fusion import fusion_saved_bytes_per_micro_batch
from reportgen.estimate.libraries import Libraries
from reportgen.estimate.lengths import padded_length, real_tokens_per_step
from reportgen.estimate.memory import effective_attention
from reportgen.estimate.work import StepWork, Work, dequant_bytes_per_weight, step_work
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import Attention, Method, Offload, TrainingSetup


@dataclass(frozen=True)
class TimeEstimate:
    hardware_flops_per_token: float  # executed by the kernels, recomputation included
    model_flops_per_token: float  # PaLM's definition, for MFU
    compute_s: float | None  # per optimizer step
    memory_s: float
    transfer_s: float
    step_s: float | None
    tokens_per_s: float | None
    mfu: float | None  # model FLOPs per second / datasheet peak
    hfu: float | None  # hardware FLOPs per second / datasheet peak
    bound: str | None  # compute | memory | transfer
    peak_dtype: str
    train_tokens: int
    train_hours: float | None
    train_dollars: float | None
    #: seconds per optimizer step by term (module docstring)
    parts: dict = field(default_factory=dict)
    #: what the step launches and dispatches (``work.StepWork.as_dict``), per micro-batch and phase
    work: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: the host whose dispatch the step assumes (``dispatch.HostDispatch.as_dict``)
    host_dispatch: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "notes"}


def layer_matmul_params_per_token(model: ModelSpec) -> int:
    """Weights of the decoder layers multiplied per token (MoE: the routed experts only)."""
    per_layer = 0
    for lin in model.layer_linears():
        count = model.experts_per_token if lin.count > 1 else 1
        per_layer += lin.in_features * lin.out_features * count
    return model.num_layers * per_layer


def head_matmul_params(model: ModelSpec) -> int:
    """The LM head's matmul, ``hidden x vocab`` per token, tied to the embeddings or not (a tied
    head still multiplies; the embedding lookup is not a matmul)."""
    return model.vocab_size * model.hidden_size


def matmul_params_per_token(model: ModelSpec) -> int:
    """``N`` of the FLOP counts: the decoder layers' weights used per token and the head."""
    return layer_matmul_params_per_token(model) + head_matmul_params(model)


def attention_flops_forward(model: ModelSpec, seq: int, attn: Attention | None) -> float:
    """Per token, forward: QK^T and PV, ``2 * 2 * T * n_q * d`` per layer. ``attn=None``: the full
    square (PaLM's count); a causal SDPA kernel skips the masked half, eager computes all of it."""
    causal = 0.5 if attn == Attention.sdpa else 1.0
    return 4.0 * seq * model.num_heads * model.head_dim * model.num_layers * causal


def flops_per_token(model: ModelSpec, setup: TrainingSetup, attn: Attention) -> tuple[float, float]:
    """(hardware FLOPs per token, model FLOPs per token), see the module docstring.

    Weights: full ``6N``, LoRA/QLoRA ``4N + 6 N_lora``. Attention: model FLOPs ``3 x`` the forward
    count of the full square (``12 L H Q T``); hardware FLOPs the kernel's, ``3.5 x`` for SDPA (its
    backward recomputes the scores), ``3 x`` for eager. Checkpointing adds, to the hardware count
    only, the forward of the decoder layers and their adapters: ``2 (N_layers + N_lora)`` plus the
    kernel's attention forward; not the head, which transformers does not checkpoint
    (``GradientCheckpointingLayer`` wraps decoder layers). DoRA with dropout: ``4 N_dora`` more (and
    ``2 N_dora`` recomputed), ``N_dora`` the adapted linears' weights (``dora.adapted_weight_params``)."""
    n = matmul_params_per_token(model)
    # A and B only: DoRA's magnitudes scale outputs elementwise (work.dora_combine)
    lora = model.lora_params(setup.lora_rank, setup.lora_targets) if setup.is_peft else 0
    weights = 6 * n if setup.method == Method.full else 4 * n + 6 * lora
    # DoRA with dropout runs the adapted linears' base GEMM again on the dropped-out input, each way
    # (``work.dora_combine``): ``2 N_dora`` forward, ``2 N_dora`` for its input's gradient
    redo = DORA.adapted_weight_params(model, setup) if setup.is_peft and setup.dora and setup.lora_dropout > 0 else 0
    model_flops = weights + 3 * attention_flops_forward(model, setup.seq, None)
    kernel = attention_flops_forward(model, setup.seq, attn)
    # SDPA's backward runs five GEMMs to the forward's two (FlashAttention-2 recomputes the scores),
    # eager's backward two per forward GEMM (``work.attention_core``)
    hardware = weights + 4 * redo + (3.5 if attn == Attention.sdpa else 3.0) * kernel
    if setup.grad_ckpt:
        hardware += 2 * (layer_matmul_params_per_token(model) + lora + redo) + kernel
    return hardware, model_flops


def peak_dtype(setup: TrainingSetup, gpu: GpuSpec) -> tuple[str, list[str]]:
    """The datasheet column that bounds the matmuls. fp32 runs on CUDA cores: PyTorch leaves
    ``torch.backends.cuda.matmul.allow_tf32`` off by default."""
    notes = []
    want = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16"}[setup.compute_dtype]
    if gpu.peak_flops(want) is None and want == "bf16" and gpu.peak_flops("fp32") is not None:
        notes.append(f"{gpu.name} has no bf16 tensor cores: bf16 runs at the fp32 rate or fails; use fp16-mixed")
        return "fp32", notes
    return want, notes


def dequant_bytes_per_micro_batch(model: ModelSpec, setup: TrainingSetup) -> float:
    """QLoRA dequantizes every 4-bit weight before each use, once per pass (forward, backward, and the
    recomputed forward under checkpointing), ``dequant_bytes_per_weight`` each. It is a separate
    memory-bound kernel that runs before its matmul on the same stream, so its time adds to the step
    instead of overlapping with it: QLoRA trains slower than LoRA by this traffic over the memory
    bandwidth (Dettmers et al. 2023 report QLoRA slower than LoRA; ``slowdown.qlora_slowdown``)."""
    if setup.method != Method.qlora:
        return 0.0
    passes = 2 + (1 if setup.grad_ckpt else 0)
    return passes * P.quantized_linear_params(model, setup) * dequant_bytes_per_weight(setup)


def dora_work_per_micro_batch(model: ModelSpec, setup: TrainingSetup, attn: Attention, seq: int | None = None) -> Work:
    """What DoRA adds to one micro-batch's forward and backward (the recomputed forward included), beyond
    LoRA with the same settings: the step's inventory with DoRA less the one without (``work.py``:
    ``dora_weight_work``, ``dora_combine`` and the 3 module calls per adapted linear; the magnitudes'
    optimizer work is the optimizer's)."""
    if not (setup.is_peft and setup.dora):
        return Work()
    with_dora = step_work(model, setup, attn, seq)
    plain = step_work(model, setup.model_copy(update={"dora": False}), attn, seq)
    return (with_dora.forward + with_dora.backward) + (plain.forward + plain.backward) * -1


def dora_s_per_micro_batch(model: ModelSpec, setup: TrainingSetup, attn: Attention, peak: float, eff: float,
                           bw: float, kernel_device_s: float, seq: int | None = None) -> float:
    """The device seconds DoRA adds per micro-batch (``dora_work_per_micro_batch``): its GEMM FLOPs at
    ``peak x eff``, its memory-bound bytes at ``bw`` and ``kernel_device_s`` per kernel. The step prices
    the same kernels inside the pipeline (``parts["dora"]`` only reports this share; the host's
    dispatch of them is in ``parts["host"]``).

    Llama 3.1 8B r16 all-linear, LoRA bf16-mixed, one sequence of 2048, no checkpointing: per layer
    the weight-sized forward (``12 in^2 + 6 in r + 2 r out + 38 in out + 20 out`` bytes per linear,
    11,968,126,976), the combination's 38 bytes per output value forward and 78 (+ 12 per ``out``)
    backward over LoRA's, 2048 x 43,008 values (3,347,054,592 and 6,870,786,048), 28 kernels per
    linear; the first layer's q, k and v (their input, the embedding's output, needs no gradient)
    26 bytes per value and 4 kernels fewer: 709,623,808,000 bytes and 6,260 kernels, 0.4049 s at
    2e12 B/s and 8 us a kernel (``tests/test_dora.py``), no GEMM above the ridge at rank 16."""
    w = dora_work_per_micro_batch(model, setup, attn, seq)
    return w.matmul_flops / (peak * eff) + w.bytes / bw + w.kernels * kernel_device_s


@dataclass(frozen=True)
class TimeConstants:
    """The fitted constants of the time model (``constants.py``), as one value, so that
    ``scripts/calibrate.py`` can price a step with trial values through the same functions."""

    matmul_efficiency: float
    attention_efficiency: float
    dram_efficiency: float
    l2_reuse: float
    kernel_device_s: float
    host_s_per_kernel: float
    host_s_per_call: float
    host_s_per_autocast_kernel: float

    @classmethod
    def current(cls, gpu: GpuSpec, matmul_efficiency: float | None = None, dtype: str | None = None,
                host: HostDispatch | None = None) -> "TimeConstants":
        """The constants for ``gpu``: ``constants.py``'s (the GEMM efficiency of its generation,
        ``matmul_efficiency_of``), or, with a profile of the user's card (``gpu.profile``), those scaled
        by its figures over the H100 machine's (``profiled``); the host's dispatch scaled to the host
        that runs the step (``on_host``: the profile's measured host, ``--host-cpu``, or the card's
        default host, ``dispatch.host_dispatch``, or ``host`` when the caller has it)."""
        eff = matmul_efficiency or matmul_efficiency_of(gpu.generation)[0]
        att = min(1.0, K.ATTENTION_EFFICIENCY * eff / K.MATMUL_EFFICIENCY["hopper"])  # attention_efficiency_for, inlined
        base = cls(eff, att, K.DRAM_EFFICIENCY, K.L2_REUSE, K.KERNEL_DEVICE_S, K.HOST_S_PER_KERNEL,
                   K.HOST_S_PER_CALL, K.HOST_S_PER_AUTOCAST_KERNEL)
        if gpu.profile is not None:
            base = profiled(base, gpu, dtype, keep_matmul=matmul_efficiency is not None)
        return base.on_host((host or host_dispatch(gpu)).factor)

    def on_host(self, factor: float) -> "TimeConstants":
        """These constants with the host's dispatch terms times ``factor`` (the H100 machine's host: 1;
        ``dispatch.host_dispatch``)."""
        if factor == 1.0:
            return self
        return TimeConstants(self.matmul_efficiency, self.attention_efficiency, self.dram_efficiency, self.l2_reuse,
                             self.kernel_device_s, self.host_s_per_kernel * factor, self.host_s_per_call * factor,
                             self.host_s_per_autocast_kernel * factor)


def attention_efficiency_for(matmul_efficiency: float) -> float:
    """The fused attention kernels' fraction of the peak on a card whose GEMMs reach ``matmul_efficiency``
    of it: ``ATTENTION_EFFICIENCY`` (fitted on our H100, where the GEMMs reach ``MATMUL_EFFICIENCY["hopper"]``)
    scaled by the ratio of the two GEMM efficiencies, for a profile's measured GEMM rate (``profiled``) as for
    a generation's fitted one (``TimeConstants.current``, inlined there: the bare estimate's call budget):
    FlashAttention's kernels run on the same tensor cores. Conservative off Hopper, where
    FlashAttention-2 reaches a smaller share of cuBLAS's rate than on Ampere (FlashAttention-2, arXiv
    2307.08691: up to 72 % of an A100's peak forward and backward; FlashAttention-3, arXiv 2407.08608:
    35 % of an H100's). No efficiency above 1."""
    return min(1.0, K.ATTENTION_EFFICIENCY * matmul_efficiency / K.MATMUL_EFFICIENCY["hopper"])


def matmul_efficiency_of(generation: str, fitted: dict | None = None) -> tuple[float, str]:
    """(GEMM efficiency, the generation it was fitted on) for ``generation``: its own fit in ``fitted``
    (default ``K.MATMUL_EFFICIENCY``), else the one it borrows (``K.BORROWS_FROM``, followed until a
    fitted generation; Hopper's, measured on our H100, when the chain runs out or loops)."""
    fitted = K.MATMUL_EFFICIENCY if fitted is None else fitted
    seen, gen = set(), generation
    while gen not in fitted and gen not in seen:
        seen.add(gen)
        gen = K.BORROWS_FROM.get(gen, "hopper")
    gen = gen if gen in fitted else "hopper"
    return fitted.get(gen, K.MATMUL_EFFICIENCY["hopper"]), gen


def l2_hit_fraction(gpu: GpuSpec, c: TimeConstants, working_bytes: float | None) -> float:
    """Share of memory-bound traffic the L2 cache serves: ``L2_REUSE`` (the traffic that reads what
    the previous kernel just wrote) times the chance that tensor is still in L2, ``min(1, L2 /
    working_bytes)`` (an LRU cache of L2 bytes holding a streamed tensor of ``working_bytes``).
    ``working_bytes`` None (weights streamed once, nothing produced just before): no reuse."""
    if not working_bytes or not gpu.l2_cache_bytes:
        return 0.0
    return c.l2_reuse * min(1.0, gpu.l2_cache_bytes / working_bytes)


def memory_bandwidth(gpu: GpuSpec, c: TimeConstants, working_bytes: float | None = None) -> float:
    """Bytes per second of memory-bound kernels: DRAM at ``dram_efficiency`` of the datasheet, the L2's
    share (``l2_hit_fraction``) costing no DRAM time."""
    return gpu.memory_bandwidth_gbs * 1e9 * c.dram_efficiency / (1.0 - l2_hit_fraction(gpu, c, working_bytes))


def hidden_state_bytes(model: ModelSpec, setup: TrainingSetup, length: float) -> float:
    """The tensor the step's memory-bound kernels pass one another: a micro-batch's hidden states
    (``batch x length x hidden``) in the compute dtype (``work.py`` prices the norms, residual adds,
    activations and casts on tensors of this size or the MLP's, a few times larger)."""
    return setup.batch * length * model.hidden_size * BYTES[setup.compute_dtype]


def _ratio(mine: float | None, reference: float | None) -> float | None:
    return mine / reference if mine and reference else None


def profiled(base: TimeConstants, gpu: GpuSpec, dtype: str | None, keep_matmul: bool = False) -> TimeConstants:
    """The time constants of a card with a profile (``gpu_profile.py``): the constants were fitted on the
    H100 machine whose own profile is ``K.REFERENCE_PROFILE``, so each rate the profile measured scales
    its constant by the card's figure over the reference's, the way the kernels' rates differ between
    the two machines: the GEMM and attention efficiencies by the ratio of the measured fractions of
    the datasheet peak (the H100's fitted 0.66 of peak where its GEMM benchmark reached 0.74: the
    step's GEMMs reach 89 % of the benchmark's rate, on any card), the DRAM efficiency likewise by the
    1 GiB copies' fractions of their datasheets (the L2's share stays the model's, ``l2_hit_fraction``,
    on the card's own L2 size), the device time per kernel by its ratio (the host's dispatch, per CUDA op
    queued, else per CPU op, is ``dispatch.host_dispatch``'s, applied by ``TimeConstants.current``). A figure
    the profile lacks keeps the constant. No efficiency above 1."""
    from reportgen import catalog

    prof, ref = gpu.profile, K.REFERENCE_PROFILE
    ref_gpu = catalog.load_gpu(ref["card"])
    mm, att = base.matmul_efficiency, base.attention_efficiency
    rate = prof.matmul_rate(dtype) if dtype else None
    if rate and gpu.peak_flops(dtype) and dtype in ref["matmul_tflops"] and not keep_matmul:
        r = (rate / gpu.peak_flops(dtype)) / (ref["matmul_tflops"][dtype] * 1e12 / ref_gpu.peak_flops(dtype))
        scaled = K.MATMUL_EFFICIENCY["hopper"] * r
        mm, att = min(1.0, scaled), attention_efficiency_for(scaled)
    dram = base.dram_efficiency
    if prof.copy_1gib_gbs:  # the card's own streaming copy (beyond any L2) over the H100 machine's
        card_frac = prof.copy_1gib_gbs / gpu.memory_bandwidth_gbs
        dram = min(1.0, K.DRAM_EFFICIENCY * card_frac / (ref["copy_1gib_gbs"] / ref_gpu.memory_bandwidth_gbs))
    launch = _ratio(prof.kernel_device_s, ref["kernel_device_s"]) or 1.0
    return TimeConstants(mm, att, dram, base.l2_reuse, base.kernel_device_s * launch, base.host_s_per_kernel,
                         base.host_s_per_call, base.host_s_per_autocast_kernel)


def host_link_bytes_per_s(gpu: GpuSpec) -> float:
    """Host-link bytes per second of pinned copies: a profile's measured slower direction, else the
    datasheet's figure at ``HOST_LINK_EFFICIENCY``; 0 where neither is known."""
    if gpu.profile is not None and gpu.profile.host_link_gbs:
        return gpu.profile.host_link_gbs * 1e9
    return (gpu.host_link_gbs or 0) * 1e9 * K.HOST_LINK_EFFICIENCY


def cpu_adam_params_per_s(gpu: GpuSpec) -> float:
    """Parameters per second of the host optimizer (offload): a profile's measured rate, else the
    H100 machine's (``CPU_ADAM_PARAMS_PER_S``)."""
    if gpu.profile is not None and gpu.profile.cpu_adam_params_per_s:
        return gpu.profile.cpu_adam_params_per_s
    return K.CPU_ADAM_PARAMS_PER_S


def device_seconds(w: Work, gpu: GpuSpec, dtype: str, c: TimeConstants,
                   working_bytes: float | None = None, bw: float | None = None) -> float | None:
    """GPU-busy seconds of ``w``: each kind of kernel at its own rate, one after another (module
    docstring), the memory-bound ones at ``memory_bandwidth`` for tensors of ``working_bytes`` (or at
    ``bw`` bytes/s when the caller has it); None where the card has no datasheet peak for ``dtype``."""
    peak = gpu.peak_flops(dtype)
    if not peak:
        return None
    bw = bw or memory_bandwidth(gpu, c, working_bytes)
    return (w.matmul_flops / (peak * c.matmul_efficiency) + w.attention_flops / (peak * c.attention_efficiency)
            + w.bytes / bw + w.kernels * c.kernel_device_s)


def host_seconds(w: Work, c: TimeConstants, autocast_kernels: float = 0.0) -> float:
    """Host seconds to dispatch ``w``: per kernel launched, per Python-level call, and the autocast
    dispatch key's extra per kernel launched under ``torch.autocast`` (module docstring)."""
    return w.kernels * c.host_s_per_kernel + w.calls * c.host_s_per_call + autocast_kernels * c.host_s_per_autocast_kernel


def step_phases(work: StepWork, gpu: GpuSpec, dtype: str, c: TimeConstants,
                working_bytes: float | None = None) -> list[tuple[float, float]] | None:
    """``[(host s, device s), ...]`` of the step's phases in program order: each micro-batch's forward
    and backward (their memory-bound kernels on tensors of ``working_bytes``, ``hidden_state_bytes``),
    then the optimizer step (parameters and states streamed once: no reuse). None without a datasheet
    peak."""
    out = []
    under = {"forward": work.forward.kernels, "backward": work.recompute_kernels} if work.autocast else {}
    bw = memory_bandwidth(gpu, c, working_bytes)
    bws = {"forward": bw, "backward": bw, "optimizer": memory_bandwidth(gpu, c)}
    for name in ("forward", "backward", "optimizer"):
        g = device_seconds(getattr(work, name), gpu, dtype, c, bw=bws[name])
        if g is None:
            return None
        out.append((host_seconds(getattr(work, name), c, under.get(name, 0.0)), g))
    return out[:2] * work.accum + out[2:]


def pipeline_seconds(phases: list[tuple[float, float]], slices: int) -> float:
    """The step's length when the host queues kernels asynchronously and the device runs them in order:
    ``phases`` is ``[(host seconds, device seconds), ...]`` in program order, each cut into ``slices``
    equal slices whose kernels the device starts once the host has queued them and the previous slice
    is done (a discrete-event schedule; the step starts and ends synchronized). Within a phase the
    device's end is the later of (previous end + its time) and the host's (start + one slice + the
    device's time, or end + the last slice's device time), which is that schedule in closed form."""
    host = device = 0.0
    n = max(1, slices)
    for c, g in phases:
        device = max(device + g, host + c / n + g, host + c + g / n)
        host += c
    return max(host, device)


def _no_peak(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, notes: list[str], dtype: str, executed: float,
             model_flops: float, train_tokens: int, work: StepWork) -> TimeEstimate:
    """The time estimate of a card without a datasheet peak for the dtype: FLOPs and transfers, no step time."""
    notes.append(f"{gpu.name}: no datasheet peak for {dtype}; step time not estimated")
    return TimeEstimate(hardware_flops_per_token=executed, model_flops_per_token=model_flops, compute_s=None,
                        memory_s=0.0, transfer_s=_transfer_s(model, setup, gpu, notes), step_s=None,
                        tokens_per_s=None, mfu=None, hfu=None,
                        bound=None, peak_dtype=dtype, train_tokens=train_tokens, train_hours=None,
                        train_dollars=None, parts={}, work=work.as_dict(), notes=notes)


def _exposed_transfer_s(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, notes: list[str], phases,
                        offloaded: float) -> float:
    """What a step waits for beyond its kernels: host transfers (``_transfer_s``), the part of the
    activation offload copies (``offloaded`` bytes per micro-batch, there and back) the micro-batch's
    kernels do not hide, and the collectives of several GPUs not overlapped (``comm.py``)."""
    micro = phases[0][1] + phases[1][1]
    transfer = _transfer_s(model, setup, gpu, notes, backward_s=phases[1][1])
    if offloaded:
        link = host_link_bytes_per_s(gpu)
        copies = 2 * offloaded / link if link else 0.0
        transfer += setup.accum * max(0.0, copies - micro)
    if setup.gpus > 1:  # collectives over the real link, overlapped (comm.py)
        comm = communication(model, setup, gpu, micro)
        transfer += comm.exposed_s
        notes += comm.notes
    return transfer


def _bound(by: dict[str, float], host_s: float, busy: float, kernels: float, notes: list[str]) -> str:
    """What bounds the step: the host when its dispatch outlasts the device's work (said in ``notes``); else the
    larger of the device's two kinds of kernel time, or the exposed transfers when they are larger still."""
    if host_s > busy:
        notes.append(f"the host's dispatch of {kernels:,.0f} kernels per step ({host_s * 1e3:,.0f} ms) outlasts "
                     f"the GPU's {busy * 1e3:,.0f} ms of work: larger micro-batches cost little more per step")
        return "host"
    return max(by, key=lambda k: by[k])


def estimate_time(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, activation_bytes: int = 0,
                  logits_bytes: int = 0, train_tokens: int = 100_000_000,
                  matmul_efficiency: float | None = None, offloaded_bytes: int = 0,
                  work: StepWork | None = None, libs: Libraries | None = None) -> TimeEstimate:
    """``matmul_efficiency``: use this fraction of the peak instead of ``K.MATMUL_EFFICIENCY`` (the
    calibration script's held-out predictions). ``activation_bytes`` and ``logits_bytes`` are kept for
    callers that pass the memory terms; the inventory (``work.step_work``) counts the traffic itself.
    ``work``: price this inventory instead of the analytic one (the traced step's, ``trace/work.py``:
    the traced step time is the same model on what the real step dispatched). ``libs``: the library
    versions of a published run (``libraries.py``; None: the harness's).

    Variable-length data (``lengths.py``): the kernels process micro-batches of the padded length,
    while tokens/s, MFU and hours count real tokens only.

    Activation offloading (``offloaded_bytes`` per micro-batch) copies them to the host in the
    forward and back in the backward on a side stream (torchtune ``OffloadActivations``), so the
    copies overlap the compute: only the part of ``2 x bytes / host link`` that exceeds the device
    time adds to the step."""
    del activation_bytes, logits_bytes
    notes: list[str] = []
    attn, _ = effective_attention(model, setup)
    length = padded_length(setup)
    seq = max(8, round(length))
    at_length = setup if length == setup.seq else setup.model_copy(update={"seq": seq})
    executed, model_flops = flops_per_token(model, at_length, attn)
    dtype, dnotes = peak_dtype(setup, gpu)
    notes += dnotes
    scale = length / setup.seq
    peak = gpu.peak_flops(dtype)
    host = host_dispatch(gpu)
    consts = TimeConstants.current(gpu, matmul_efficiency, dtype, host)
    hidden = hidden_state_bytes(model, setup, length)
    eff, bw = consts.matmul_efficiency, memory_bandwidth(gpu, consts, hidden)
    work = work or step_work(model, setup, attn, seq, libs)
    if setup.gpus > 1:  # each rank runs its share of the micro-batch's work (sharding.py divides the memory)
        notes.append(f"{setup.gpus} GPUs ({setup.sharding.value}): each rank's own micro-batch; collectives in comm.py")
    tokens_mb = setup.batch * length
    fused_mb = fusion_saved_bytes_per_micro_batch(model, setup, dtypes_for(setup), tokens_mb) / bw

    real = real_tokens_per_step(setup)
    if setup.seq_mean is not None:
        notes.append(f"variable lengths (mean {setup.seq_mean:,}, longest {setup.seq:,}, padding "
                     f"{setup.padding.value}): micro-batches average {length:,.0f} tokens per row; "
                     f"{100 * real / (setup.tokens_per_step * scale):.0f}% of the computed tokens are data")
    notes += _profile_note(gpu, host)
    notes.append(host.note())
    phases = step_phases(work, gpu, dtype, consts, hidden)
    if phases is None:
        return _no_peak(model, setup, gpu, notes, dtype, executed, model_flops, train_tokens, work)
    transfer = _exposed_transfer_s(model, setup, gpu, notes, phases, offloaded_bytes * scale)
    overlapped = pipeline_seconds(phases, model.num_layers)
    total = work.total
    # math.fsum, not sum: Python 3.12 made sum() of floats compensated, so the calculator's Pyodide and
    # a 3.11 CLI would disagree in the last bit; fsum is correctly rounded on every version.
    busy = math.fsum(g for _, g in phases)
    host_s = math.fsum(c for c, _ in phases)
    compute_s = total.matmul_flops / (peak * eff) + total.attention_flops / (peak * consts.attention_efficiency)
    # the optimizer streams parameters and states once (no L2 reuse), as ``step_phases`` prices it
    memory_s = (total.bytes - work.optimizer.bytes) / bw + work.optimizer.bytes / memory_bandwidth(gpu, consts)
    dequant = setup.accum * dequant_bytes_per_micro_batch(model, setup) / bw
    parts = {"compute": compute_s, "memory": memory_s, "launch": total.kernels * consts.kernel_device_s,
             "dequant": dequant, "host": host_s, "host_exposed": overlapped - busy, "transfer": transfer,
             "compile": -setup.accum * fused_mb,
             "dora": setup.accum * dora_s_per_micro_batch(model, setup, attn, peak, eff, bw, consts.kernel_device_s,
                                                          seq)}
    step = overlapped + transfer + parts["compile"]
    tps = real / step
    mfu = model_flops * tps / (peak * setup.gpus)
    hfu = executed * (setup.tokens_per_step * scale / step) / (peak * setup.gpus)
    bound = _bound({"compute": compute_s, "memory": memory_s + parts["launch"], "transfer": transfer}, host_s, busy,
                   total.kernels, notes)
    hours = train_tokens / tps / 3600 if tps else None
    dollars = (hours * gpu.price_usd_per_hour * setup.gpus
               if hours is not None and gpu.price_usd_per_hour is not None else None)
    return TimeEstimate(hardware_flops_per_token=executed, model_flops_per_token=model_flops, compute_s=compute_s,
                        memory_s=memory_s, transfer_s=transfer, step_s=step, tokens_per_s=tps, mfu=mfu, hfu=hfu,
                        bound=bound, peak_dtype=dtype, train_tokens=train_tokens, train_hours=hours,
                        train_dollars=dollars, parts=parts, work=work.as_dict(), notes=notes,
                        host_dispatch=host.as_dict())


def generation_name(generation: str) -> str:
    """``ada-geforce`` -> "Ada GeForce" (``K.GENERATION_NAMES``)."""
    base, geforce = generation.removesuffix("-geforce"), generation.endswith("-geforce")
    return K.GENERATION_NAMES.get(base, base) + (" GeForce" if geforce else "")


def _evidence_note(gpu: GpuSpec, host: HostDispatch | None = None) -> list[str]:
    """Where the time model's rates for ``gpu`` come from when no profile is given: said, not borrowed
    silently (issue 30; ``rates_source``)."""
    if gpu.key.partition("@")[0] == K.REFERENCE_PROFILE["card"]:
        return []
    return [f"{gpu.name}: {rates_source(gpu, host)}"]


def rates_source(gpu: GpuSpec, host: HostDispatch | None = None) -> str:
    """The time model's rates for ``gpu``, in words: the GEMM efficiency is its generation's fit
    (``K.MATMUL_EVIDENCE`` names the runs) or a named generation's (``matmul_efficiency_of``); every
    other rate was fitted on one H100 machine, the memory-bound kernels' L2 share applied to this
    card's own L2 size. The GPU pages show it beside the datasheet figures."""
    if gpu.key.partition("@")[0] == K.REFERENCE_PROFILE["card"]:
        return (f"every rate fitted to our own step times on this card (GEMMs at "
                f"{K.MATMUL_EFFICIENCY['hopper']:.0%} of peak)")
    eff, source = matmul_efficiency_of(gpu.generation)
    mine = generation_name(gpu.generation)
    if source == gpu.generation:
        fit = "the GeForce cards' pooled fit" if source in K.GEFORCE_POOLED else f"{mine}'s fit"
        gemm = f"its GEMM rate ({eff:.0%} of peak) is {fit} to {K.MATMUL_EVIDENCE[source]}"
    else:
        why = K.UNFITTED_EVIDENCE.get(gpu.generation, f"no step time of a {mine} card has been measured or "
                                                          "published here")
        gemm = f"its GEMM rate is estimated from {generation_name(source)}'s ({eff:.0%} of peak): {why}"
    l2 = f"{gpu.l2_cache_bytes / 2**20:g} MB L2" if gpu.l2_cache_bytes else "no L2 figure"
    host = host or host_dispatch(gpu)
    cpu = host.cpu.name if host.cpu is not None else "the profiled host"
    return (f"{gemm}; attention at the H100's ratio of attention to GEMM rate, launches at the H100's, its "
            f"dispatch the H100 machine's scaled to {cpu} "
            f"(x{host.factor:.2f}, single-thread speed), memory-bound kernels at the H100's "
            f"DRAM efficiency with this card's {l2} (reportgen profile-gpu on the card measures them)")


def _profile_note(gpu: GpuSpec, host: HostDispatch | None = None) -> list[str]:
    """What a profile changed, for the notes (every surface says the numbers use it); without one, where
    the rates come from (``_evidence_note``)."""
    p = gpu.profile
    if p is None:
        return _evidence_note(gpu, host)
    if p.device == "cuda":
        missing = [f"the {d} GEMM rate" for d in ("bf16", "fp16") if p.matmul_rate(d) is None] + [
            name for name, value in (("memory bandwidth", p.copy_1gib_gbs), ("kernel launch", p.kernel_device_s),
                                     ("host dispatch", p.host_s_per_op)) if not value]
        lacks = (f"; it lacks {', '.join(missing)}: for {'those' if len(missing) > 1 else 'that'}, the datasheet's and the H100 "
                 "machine's constants, as without a profile") if missing else ""
        return [f"times use your card's profile ({p.source}, measured on {p.gpu_name}){lacks}"]
    return [f"times use your host's profile ({p.source}: its dispatch and host optimizer measured; the card's rates "
            "are the datasheet's, as without a profile)"]


def _transfer_s(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, notes: list[str],
                backward_s: float = 0.0) -> float:
    """Host-link traffic and host optimizer time per optimizer step, as far as they are not hidden.

    * offload=optimizer (torchao ``CPUOffloadOptimizer``, ``torchao/optim/cpu_offload.py``): each
      gradient is copied to pinned host memory on a side stream as soon as the backward has made it
      (a post-accumulate-grad hook), so the copies overlap the backward (``backward_s``: one
      micro-batch's device time); ``step()`` then runs the host optimizer parameter by parameter and
      copies each updated parameter back on the side stream while the host steps the next: the
      longer of the host step (``cpu_adam_params_per_s``) and the copies back;
    * offload=params: every layer's weights come in once per pass, gradients go out (not overlapped:
      an upper bound);
    GPU-to-GPU collectives are ``comm.py``'s (the real link, overlapped per framework).
    """
    if setup.offload == Offload.none:
        return 0.0
    link = host_link_bytes_per_s(gpu)
    if not link:
        notes.append(f"{gpu.name}: no host-link figure; transfers not estimated")
        return 0.0
    dt = dtypes_for(setup)
    trainable = P.trainable_params(model, setup)
    pbytes = P.trainable_dtype_bytes(setup, dt)
    passes = 2 + (1 if setup.grad_ckpt else 0)
    moved = 0.0
    extra = 0.0
    if setup.offload == Offload.optimizer:
        copies = trainable * pbytes / link
        return max(0.0, copies - backward_s) + max(trainable / cpu_adam_params_per_s(gpu), copies)
    if setup.offload == Offload.params:
        w = P.weights_bytes(model, setup, dt) + P.adapter_bytes(model, setup, dt)
        moved += setup.accum * passes * w / setup.gpus + trainable * pbytes
        extra += trainable / cpu_adam_params_per_s(gpu)
    return moved / link + extra
