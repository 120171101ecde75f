"""Step time: FLOPs per token by technique, a roofline against compute and memory bandwidth, and
host-link transfers for offload and multi-GPU communication.

FLOPs (Kaplan et al. 2020; Chowdhery et al. 2022 "PaLM", appendix B; Korthikanti et al. 2022 for
recomputation):
* a matmul with ``N`` weights costs ``2N`` FLOPs per token forward, ``2N`` for the input gradient
  and ``2N`` for the weight gradient, so full fine-tuning costs ``6N`` per token; a frozen weight
  (LoRA, QLoRA) needs no weight gradient: ``4N``; adapters add ``6 N_lora``;
* attention scores and the weighted sum cost ``4 T n_heads d_head`` per token and layer forward
  (``T`` the sequence length) and twice that backward;
* activation checkpointing (transformers checkpoints each decoder layer, not the LM head) adds one
  more forward pass of the decoder layers.

Two counts are reported. **Model FLOPs** (for MFU) follow PaLM: ``6N + 12 L H Q T`` per token for
full fine-tuning (``H`` query heads of width ``Q``, ``L`` layers), the full attention square
whatever the kernel, no recomputation, so MFU compares with torchtitan, nanoGPT and the papers; for
LoRA/QLoRA the same definition counts ``4N + 6 N_lora`` for the weights (a frozen weight has no
weight gradient to compute). **Hardware FLOPs** (for HFU and the step time) are what the kernels
execute: causal SDPA/flash kernels skip the masked half of the square (eager computes all of it),
and checkpointing's recomputed forward is included.

Step time per micro-batch is the larger of compute time (hardware FLOPs at ``MATMUL_EFFICIENCY``
of the datasheet peak) and memory time (bytes moved at ``BANDWIDTH_EFFICIENCY``), plus fixed
overheads; QLoRA's dequantization kernels add their memory time; the optimizer step adds its
memory time; ``torch.compile`` takes off the time of the elementwise traffic it fuses away
(``fusion.py``); offload adds transfer time over the host link (not overlapped, so an upper bound);
data-parallel collectives add what compute does not hide (``comm.py``: the real GPU-to-GPU link,
each framework's overlap). ``TimeEstimate.parts`` keeps each of these, so a measured step
time can be taken apart term by term (``scripts/calibrate.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reportgen.estimate import constants as K
from reportgen.estimate import dora as DORA
from reportgen.estimate import params as P
from reportgen.estimate.comm import communication
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.fusion import fusion_saved_bytes_per_micro_batch
from reportgen.estimate.lengths import padded_length, real_tokens_per_step
from reportgen.estimate.memory import effective_attention
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
    #: seconds per optimizer step by term: compute, memory (the micro-batches' HBM traffic), dequant,
    #: optimizer, transfer, overhead, compile (<= 0: the elementwise traffic torch.compile fuses away,
    #: ``fusion.py``), dora (DoRA's per-forward B A product and weight norms, ``dora.py``); the step is
    #: accum-weighted max(compute, memory) + the rest
    parts: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

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

    Weights: full ``6N``, LoRA/QLoRA ``4N + 6 N_lora``. Attention: ``3 x`` the forward count
    (forward + backward). Model FLOPs take the full square (``12 L H Q T``); hardware FLOPs the
    kernel's. Checkpointing adds, to the hardware count only, the forward of the decoder layers and
    their adapters: ``2 (N_layers + N_lora)`` plus the kernel's attention forward; not the head,
    which transformers does not checkpoint (``GradientCheckpointingLayer`` wraps decoder layers)."""
    n = matmul_params_per_token(model)
    # A and B only: DoRA's magnitudes scale outputs elementwise (their work is in dora_s_per_micro_batch)
    lora = model.lora_params(setup.lora_rank, setup.lora_targets) if setup.is_peft else 0
    weights = 6 * n if setup.method == Method.full else 4 * n + 6 * lora
    model_flops = weights + 3 * attention_flops_forward(model, setup.seq, None)
    kernel = attention_flops_forward(model, setup.seq, attn)
    hardware = weights + 3 * kernel
    if setup.grad_ckpt:
        hardware += 2 * (layer_matmul_params_per_token(model) + lora) + kernel
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


def bytes_moved_per_micro_batch(model: ModelSpec, setup: TrainingSetup, activation_bytes: int,
                                logits_bytes: int) -> float:
    """HBM traffic of one micro-batch: every weight is read once per pass (forward, backward,
    recompute), in the compute dtype; QLoRA dequantizes each 4-bit weight per pass (read 0.5 B,
    write and read back 2 B); saved activations are written once and read once; the loss's
    ``tokens x vocab`` tensors are written and read."""
    dt = dtypes_for(setup)
    passes = 2 + (1 if setup.grad_ckpt else 0)
    if setup.method == Method.qlora:
        q = P.quantized_linear_params(model, setup)
        w = 2 * q + (model.total_params - q) * dt.compute  # the matmuls read the dequantized copies
    else:
        w = model.total_params * dt.compute
    return passes * w + 2 * activation_bytes + 2 * logits_bytes


def dequant_bytes_per_weight(setup: TrainingSetup) -> float:
    """HBM bytes bitsandbytes' dequantization moves per 4-bit weight per pass (forward, backward,
    recompute), traced from its code: ``bnb.matmul_4bit`` -> ``MatMul4Bit`` calls
    ``F.dequantize_4bit(B, quant_state)`` in ``forward`` and again in ``backward`` (for ``grad_A``),
    and the result feeds a plain ``torch.matmul``/``F.linear`` (``bitsandbytes/autograd/_functions.py``;
    CUDA's ``gemm_4bit`` takes the same ``_dequant_linear_fallback`` for training shapes).

    * ``dequantize_4bit`` reads the packed weight, 0.5 B, and its fp32 absmax, 4 B per block of 64
      (``blocksize=64``), and writes the weight in the compute dtype, 2 B for bf16/fp16:
      ``2.5 + 4/64 = 2.5625``;
    * with double quantization (``quant_state.nested``) it first rebuilds the fp32 absmax:
      ``dequantize_blockwise`` reads the uint8 absmax (1 B per 64 weights) and the fp32 second-level
      constants (4 B per 256 blocks) and writes the fp32 absmax (4 B per 64 weights):
      ``+ 1/64 + 4/(64 x 256) + 4/64``, 2.6409 B in all.

    The matmul's own read of the dequantized copy is in ``bytes_moved_per_micro_batch``: it overlaps
    with the matmul as a LoRA weight read does."""
    per = 0.5 + 4 / P.BNB_4BIT_BLOCKSIZE + dtypes_for(setup).compute
    if setup.double_quant:
        per += (1 + 4 / P.BNB_NESTED_BLOCKSIZE + 4) / P.BNB_4BIT_BLOCKSIZE
    return per


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


def dora_s_per_micro_batch(model: ModelSpec, setup: TrainingSetup, peak: float, eff: float, bw: float) -> float:
    """DoRA's weight-sized work per micro-batch, independent of its tokens (``dora.py``): each forward
    (and the recomputed one under checkpointing) forms ``B A`` through ``lora_B(lora_A(eye))`` at the
    matmul rate (``dora.extra_flops_per_forward``), runs the memory-bound casts, sum and norm of
    ``W + scale B A`` (``dora.extra_bytes_per_forward``) and, for QLoRA, dequantizes each adapted
    4-bit weight once more (``dequant_bytes_per_weight``; peft ``dequantize_module_weight``)."""
    if not (setup.is_peft and setup.dora):
        return 0.0
    passes = 2 if setup.grad_ckpt else 1
    flops = DORA.extra_flops_per_forward(model, setup)
    moved = DORA.extra_bytes_per_forward(model, setup, dtypes_for(setup))
    if setup.method == Method.qlora:
        moved += DORA.adapted_weight_params(model, setup) * dequant_bytes_per_weight(setup)
    return passes * (flops / (peak * eff) + moved / bw)


def optimizer_bytes_moved(model: ModelSpec, setup: TrainingSetup) -> float:
    """A fused AdamW step reads parameter, gradient and both states and writes parameter and states."""
    dt = dtypes_for(setup)
    trainable = P.trainable_params(model, setup)
    pbytes = P.trainable_dtype_bytes(setup, dt)
    state, managed = P.optimizer_state_bytes(model, setup, dt)
    return trainable * 3 * pbytes + 2 * (state + managed)


def estimate_time(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, activation_bytes: int,
                  logits_bytes: int, train_tokens: int = 100_000_000,
                  matmul_efficiency: float | None = None, offloaded_bytes: int = 0) -> TimeEstimate:
    """``matmul_efficiency``: use this fraction of the peak instead of ``K.MATMUL_EFFICIENCY`` (the
    calibration script's held-out predictions).

    Variable-length data (``lengths.py``): the kernels process micro-batches of the padded length
    (FLOPs, attention and the activations' traffic scale with it), while tokens/s, MFU and hours
    count real tokens only; ``activation_bytes`` and ``logits_bytes`` are the memory terms at
    ``seq`` (the longest micro-batch) and are scaled to the padded length here.

    Activation offloading (``offloaded_bytes`` per micro-batch) copies them to the host in the
    forward and back in the backward on a side stream (torchtune ``OffloadActivations``), so the
    copies overlap the compute: only the part of ``2 x bytes / host link`` that exceeds the compute
    time adds to the step."""
    notes: list[str] = []
    attn, _ = effective_attention(model, setup)
    length = padded_length(setup)
    at_length = setup if length == setup.seq else setup.model_copy(update={"seq": max(8, round(length))})
    executed, model_flops = flops_per_token(model, at_length, attn)
    dtype, dnotes = peak_dtype(setup, gpu)
    notes += dnotes
    tokens_mb = setup.batch * length
    scale = length / setup.seq
    peak = gpu.peak_flops(dtype)
    eff = matmul_efficiency or K.MATMUL_EFFICIENCY["consumer" if gpu.is_consumer else "datacenter"]
    bw = gpu.memory_bandwidth_gbs * 1e9 * K.BANDWIDTH_EFFICIENCY

    mem_mb = bytes_moved_per_micro_batch(model, setup, int(activation_bytes * scale), int(logits_bytes * scale)) / bw
    dequant_mb = dequant_bytes_per_micro_batch(model, setup) / bw
    mem_opt = optimizer_bytes_moved(model, setup) / bw
    fused_mb = fusion_saved_bytes_per_micro_batch(model, setup, dtypes_for(setup), tokens_mb) / bw
    comp_mb = executed * tokens_mb / (peak * eff) if peak else None

    transfer = _transfer_s(model, setup, gpu, notes)
    if offloaded_bytes and comp_mb is not None:
        link = (gpu.host_link_gbs or 0) * 1e9 * K.HOST_LINK_EFFICIENCY
        copies = 2 * offloaded_bytes * scale / link if link else 0.0
        transfer += setup.accum * max(0.0, copies - comp_mb)
    if setup.gpus > 1 and comp_mb is not None:  # collectives over the real link, overlapped (comm.py)
        comm = communication(model, setup, gpu, max(comp_mb, mem_mb) + dequant_mb)
        transfer += comm.exposed_s
        notes += comm.notes
    memory_s = setup.accum * (mem_mb + dequant_mb) + mem_opt
    parts = {"compute": None if comp_mb is None else setup.accum * comp_mb, "memory": setup.accum * mem_mb,
             "dequant": setup.accum * dequant_mb, "optimizer": mem_opt, "transfer": transfer,
             "overhead": setup.accum * K.MICRO_BATCH_OVERHEAD_S + K.STEP_OVERHEAD_S,
             "compile": -setup.accum * fused_mb,
             "dora": setup.accum * dora_s_per_micro_batch(model, setup, peak, eff, bw) if peak else 0.0}
    real = real_tokens_per_step(setup)
    if setup.seq_mean is not None:
        notes.append(f"variable lengths (mean {setup.seq_mean:,}, longest {setup.seq:,}, padding "
                     f"{setup.padding.value}): micro-batches average {length:,.0f} tokens per row; "
                     f"{100 * real / (setup.tokens_per_step * scale):.0f}% of the computed tokens are data")
    if comp_mb is None:
        notes.append(f"{gpu.name}: no datasheet peak for {dtype}; step time not estimated")
        step = tps = mfu = hfu = None
        bound = None
        compute_s = None
    else:
        compute_s = setup.accum * comp_mb
        step = (setup.accum * max(comp_mb, mem_mb) + parts["dequant"] + parts["optimizer"] + parts["transfer"]
                + parts["overhead"] + parts["compile"] + parts["dora"])
        tps = real / step
        mfu = model_flops * tps / (peak * setup.gpus)
        hfu = executed * (setup.tokens_per_step * scale / step) / (peak * setup.gpus)
        by = {"compute": compute_s, "memory": memory_s, "transfer": transfer}
        bound = max(by, key=lambda k: by[k])
    hours = train_tokens / tps / 3600 if tps else None
    dollars = (hours * gpu.price_usd_per_hour * setup.gpus
               if hours is not None and gpu.price_usd_per_hour is not None else None)
    return TimeEstimate(hardware_flops_per_token=executed, model_flops_per_token=model_flops, compute_s=compute_s,
                        memory_s=memory_s, transfer_s=transfer, step_s=step, tokens_per_s=tps, mfu=mfu, hfu=hfu,
                        bound=bound, peak_dtype=dtype, train_tokens=train_tokens, train_hours=hours,
                        train_dollars=dollars, parts=parts, notes=notes)


def _transfer_s(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, notes: list[str]) -> float:
    """Host-link traffic per optimizer step (not overlapped with compute: an upper bound).

    * offload=optimizer: gradients to the host and updated parameters back, plus the CPU Adam step;
    * offload=params: every layer's weights come in once per pass, gradients go out;
    GPU-to-GPU collectives are ``comm.py``'s (the real link, overlapped per framework).
    """
    if setup.offload == Offload.none:
        return 0.0
    link = (gpu.host_link_gbs or 0) * 1e9 * K.HOST_LINK_EFFICIENCY
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
        moved += 2 * trainable * pbytes
        extra += trainable / K.CPU_ADAM_PARAMS_PER_S
    elif setup.offload == Offload.params:
        w = P.weights_bytes(model, setup, dt) + P.adapter_bytes(model, setup, dt)
        moved += setup.accum * passes * w / setup.gpus + trainable * pbytes
        extra += trainable / K.CPU_ADAM_PARAMS_PER_S
    return moved / link + extra
