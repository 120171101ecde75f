"""Peak GPU memory of one training step, from the memory terms and a timeline of the step.

A plain sum of all terms overstates the peak: activations are freed layer by layer during the
backward pass while gradients appear layer by layer, and autocast's weight copies die with the
layer's backward. This module walks the moments where the peak can fall and takes the largest:

1. ``forward-end``: at the loss, all saved activations, all autocast copies and the loss's
   forward tensors (``logits.py``) are live.
2. ``loss-backward``: the cross-entropy backward's fp32 ``tokens x vocab`` tensors.
3. ``backward-top`` / ``backward-bottom``: the first and the last decoder layer's backward, with
   the gradients produced so far, that layer's recomputed activations under checkpointing, and
   the backward's working tensors.
4. ``optimizer-step``: all gradients, the optimizer states and the optimizer's temporaries.

Steady state is assumed (the harness resets the peak after warm-up): optimizer states exist
from the first ``step()`` on; ``zero_grad(set_to_none=True)`` frees gradients after each step,
but gradient accumulation keeps them during the next micro-batches' forward passes.

Recipe choices that move tensors between these moments:

* ``keep_outputs``: a loop that holds the model's output keeps its logits (``logits.kept_output_bytes``)
  after the loss: through the backward and the optimizer step (``step``), or into the next step's
  forward until the new output is returned (``next-step``). In the latter case the previous
  step's autograd graph stays referenced, so tensors an autograd Function stored as plain ``ctx``
  attributes survive its backward: bitsandbytes <= 0.43.1 keeps each 4-bit linear's input that way
  (``libraries.py``), so the previous step's copies add to the next forward (``forward-return``).
  PyTorch's docs: save tensors with ``save_for_backward``, "as opposed to directly on ctx", or they
  outlive the backward.
* ``optimizer_in_backward`` (torchtune ``optimizer_in_bwd``, ``register_post_accumulate_grad_hook``):
  each parameter is stepped as soon as its gradient is complete and the gradient is freed, so at
  most one layer's gradients exist at a time and the optimizer step holds none.
* ``act_offload`` (torchtune ``OffloadActivations``): saved tensors move to pinned host memory as
  they are saved and come back one layer ahead of the backward; the GPU holds the layer being
  computed and the one in transfer, the host the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reportgen.estimate import activations as act
from reportgen.estimate import constants as K
from reportgen.estimate import dora as DORA
from reportgen.estimate import host as HOST
from reportgen.estimate import liger as LG
from reportgen.estimate import params as P
from reportgen.estimate import recipes as RC
from reportgen.estimate import sharding as SH
from reportgen.estimate.sharding import full_shard_gathered_bytes as fsdp_gathered_bytes  # noqa: F401 (re-export)
from reportgen.estimate.dtypes import Dtypes, dtypes_for
from reportgen.estimate.libraries import CURRENT, Libraries
from reportgen.estimate.logits import LogitsMemory, kept_output_bytes, liger_head_note, loss_logits_memory
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import Attention, KbitPrep, Kernels, Loss, Method, Offload, Optimizer, Sharding, TrainingSetup


#: keys of ``MemoryEstimate.as_dict()`` that are totals or side figures, not memory terms
TOTALS = ("peak_allocated", "peak_reserved", "device_total", "host_ram", "cache_released")


@dataclass(frozen=True)
class MemoryEstimate:
    terms: dict[str, int]  # one key per term, bytes on one GPU
    peak_allocated: int
    peak_reserved: int
    device_total: int
    peak_phase: str
    phases: dict[str, int]  # allocated bytes at each moment of the timeline
    host_ram: int  # bytes of host RAM one GPU process's step keeps (``host_terms`` summed)
    notes: list[str] = field(default_factory=list)
    offloaded_activations: int = 0  # bytes act_offload moves to the host each micro-batch
    cache_released: int = 0  # cached free bytes the allocator must release to stay within the card
    #: what the cached-free model (``cached_free_bytes``) read, by name (``scripts/calibrate.py`` fits it)
    cache_inputs: dict = field(default_factory=dict)
    #: ``max_memory_reserved`` counted from the first step instead of after warm-up steps
    #: (``allocator_limited_reserved``): differs only for a step that releases its cache
    reserved_from_first_step: int = 0
    #: the step's host RAM per GPU process, term by term (``host.step_host_terms``)
    host_terms: dict = field(default_factory=dict)

    @property
    def card_demand(self) -> int:
        """What the step asks of the card: ``device_total`` with the cached blocks the allocator would
        keep (before it releases any to stay within the card). Paged optimizer states are not in it
        (``device_total`` leaves them out, and they may spill to host RAM). ``fits``, the verdict,
        the searches and the walks compare this."""
        return self.device_total + self.cache_released

    def as_dict(self) -> dict:
        return {**self.terms, "peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "device_total": self.device_total, "host_ram": self.host_ram, "cache_released": self.cache_released}


def effective_attention(model: ModelSpec, setup: TrainingSetup) -> tuple[Attention, str | None]:
    """transformers refuses SDPA for attention soft-capping (``sdpa_attention_forward``):
    Gemma 2 trains with eager attention unless FlashAttention-2 is installed."""
    if model.attn_logit_softcapping and setup.attn == Attention.sdpa:
        return Attention.eager, (f"{model.name}: attention soft-capping is not supported by SDPA in "
                                 "transformers; estimated with eager attention")
    return setup.attn, None


def cublas_workspace_bytes(gpu: GpuSpec) -> int:
    """cuBLAS workspaces allocated through PyTorch's caching allocator (``constants.py``)."""
    per = K.CUBLAS_WORKSPACE_HOPPER if gpu.is_hopper_or_newer else K.CUBLAS_WORKSPACE_OTHER
    return K.CUBLAS_HANDLES * per


def layer_param_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """Bytes of one decoder layer's trainable parameters (= its gradients)."""
    if setup.method == Method.full:
        per = sum(lin.params for lin in model.layer_linears()) + model.norm_params_per_layer
        return per * dt.base
    return P.lora_params(model, setup) // model.num_layers * dt.adapter


def largest_quantized_linear(model: ModelSpec) -> int:
    return max(lin.in_features * lin.out_features for lin in model.layer_linears() if lin.count == 1)


def dequant_transient_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, libs: Libraries) -> int:
    """QLoRA's matmul dequantizes its 4-bit weight into a full-size temporary
    (``MatMul4Bit``: ``F.dequantize_4bit(B, quant_state).to(A.dtype)``), the largest of them at a time.
    ``dequantize_4bit`` returns the dtype the weight was quantized from; transformers quantizes from
    the compute dtype, so ``.to`` is a no-op (2 bytes per weight); Lightning Fabric quantizes from
    fp16 (``_Linear4bit``: ``weight.to(..., dtype=torch.half)``), so under bf16 a second, bf16 copy
    exists at the same time (4 bytes per weight). With ``quant_head`` the head is the largest."""
    if setup.method != Method.qlora:
        return 0
    largest = max(largest_quantized_linear(model),
                  model.vocab_size * model.hidden_size if P.head_quantized(model, setup) else 0)
    per = dt.compute + (2 if libs.lightning is not None and dt.compute == 2 and setup.compute_dtype == "bf16" else 0)
    return largest * per


def backward_working_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, attn: Attention) -> int:
    """Tensors alive only inside one layer's backward: the incoming and outgoing gradient of the
    residual stream, the MLP's intermediate gradients (gate, up, product: three ``T x I``), and the
    attention kernel's gradients: SDPA's dq, dk, dv plus FlashAttention-2's fp32 dq accumulator (k and
    v at all heads where transformers repeated them); eager's fp32 and 16-bit gradients of the
    ``s x s`` probabilities; the math path's two ``s x s`` gradients in the input dtype. Under
    autocast, the 16-bit gradient of the largest weight before it is added to the fp32 ``.grad``."""
    t = setup.batch * setup.seq
    h, i, c = model.hidden_size, model.intermediate_size * max(1, model.experts_per_token), dt.compute
    nq, nkv, hd = model.num_heads, model.num_kv_heads, model.head_dim
    liger_on = setup.kernels is Kernels.liger and model.model_type in LG.LIGER_MODEL_TYPES
    mlp_grads = LG.MLP_BACKWARD_GRADIENTS if liger_on else 3
    work = t * (2 * dt.stream * h + mlp_grads * c * i)
    if setup.is_peft and model.num_experts:
        # the gradient of one merged expert tensor (act.expert_wrapper_bytes) at a time: down's, then
        # gate_up's, each freed before the next
        lora = model.lora_selection(setup.lora_targets).linears
        work += max((lin.weight_params * c for lin in model.layer_linears() if lin.count > 1 and lin.name in lora),
                    default=0)
    if attn == Attention.sdpa and act.sdpa_kernel(model, setup, c) == "math":
        # the math path's backward: the gradient of the probabilities and the softmax backward's
        # output, two ``s x s`` tensors per head in the input dtype, then dq, dk, dv at all heads
        work += setup.batch * nq * setup.seq * setup.seq * 2 * c + t * c * hd * 3 * nq
    elif attn == Attention.sdpa:
        kv = nq if act.sdpa_kv_repeated(model, act.sdpa_masked_layers(model, setup) > 0, setup) else nkv
        work += t * (c * hd * (nq + 2 * kv) + 4 * nq * hd)
    else:
        work += setup.batch * nq * setup.seq * setup.seq * (4 + c)
    if dt.master_copy:
        work += largest_quantized_linear(model) * c
    return work


def root_param_bytes(model: ModelSpec, dt: Dtypes) -> int:
    """The parameters outside the decoder layers, which FSDP puts in the root unit when only the
    layers are wrapped (fsdp_qlora's transformer_auto_wrap_policy, the usual recipe): the
    embeddings, the head unless tied, the final norm, gathered in the compute dtype."""
    return (model.embedding_params + model.head_params + model.hidden_size) * dt.compute


def fsdp_stream_pool_bytes(layer_bytes: int) -> int:
    """Reserved, not allocated: all-gather buffers are allocated on FSDP's unshard stream, whose
    freed blocks the compute stream cannot reuse (CUDACachingAllocator pools blocks per stream), and
    the rate limiter lets two freed-but-pending buffers stay in flight before an all-gather waits
    (``_FreeEventQueue._max_num_inflight_all_gathers = 2``): the unshard stream's pool holds up to
    four layers' buffers while two are allocated, so two more are reserved."""
    return 2 * layer_bytes


#: the inputs of ``cached_free_bytes`` scaled by a fitted share, with the constant that scales each
CACHE_SHARES = {"working": "CACHED_WORKING_SETS", "scores": "CACHED_SCORES", "head_block": "CACHED_HEAD_BLOCK",
                "stateless": "CACHED_STATELESS", "grad_excess": "CACHED_GRAD_EXCESS"}
#: inputs counted whole: segments the allocator must add after the allocated peak
CACHE_EXACT = ("embed_grad_segment", "optimizer_segments")


def cached_free_bytes(inputs: dict[str, int]) -> int:
    """Reserved, not allocated: the free blocks the caching allocator keeps at the step's peak and the
    segments it must add after it. Found in the allocator simulation of the traced steps
    (``trace/allocator.py``, PyTorch's ``CUDACachingAllocator.cpp`` rules), by listing the free blocks
    at the simulated peak and the ``cudaMalloc`` calls after it. ``inputs`` (``cache_inputs``):

    * ``working``: the largest per-layer set of temporaries (forward, backward, or under checkpointing
      the forward of a layer whose activations are then dropped): its blocks are freed before the
      loss, whose tensors are larger, and stay cached;
    * ``scores``: eager attention's or the math path's ``s x s`` block per layer (the probabilities'
      blocks are freed and refilled layer by layer, and a set stays free);
    * ``head_block``: the 16-bit ``lm_head`` output, freed once the loss has its fp32 copy and too
      small for the loss's fp32 ``tokens x vocab`` tensors, so cached at the loss-backward peak;
    * ``stateless``: full fine-tuning whose optimizer keeps no state in the allocator (SGD, paged or
      factored states, torchao's CPU offload): the blocks that ``zero_grad`` frees, the gradients too
      large for any activation block (or, when every gradient fits one, one of the loss's fp32
      blocks), which an optimizer's first ``zeros_like`` states would have taken, stay free while the
      next step's activations, smaller, go elsewhere (the simulation lists them free at the peak);
    * ``grad_excess``: full fine-tuning's weight gradients larger than any activation block, beyond
      what the loss's three fp32 blocks can hold (they go to new segments or to blocks the next
      forward splits);
    * ``embed_grad_segment`` (whole): full fine-tuning's ``vocab x hidden`` embedding gradient
      (``embedding_dense_backward``, tied or not) at the end of the backward, a new segment unless the
      freed 16-bit head block holds it;
    * ``optimizer_segments`` (whole): transformers' Adafactor upcasts a 16-bit parameter and its
      gradient and builds full-size fp32 updates (``optimization.py`` ``Adafactor.step``:
      ``grad.float()``, ``p.float()``, ``grad**2 + eps``, ``r_factor * c_factor``, ``-update``: four fp32
      copies of the largest tensor at once, two for fp32 parameters); only the loss's fp32 blocks can
      hold them (one of the three is split by the first gradients of the backward), the rest are new
      segments.

    The shares (``constants.CACHED_*``) are fitted to the allocator simulation of every traced case by
    ``scripts/calibrate.py``; ``tests/test_reserved.py`` pins a worked example."""
    shares = sum(getattr(K, const) * inputs.get(name, 0) for name, const in CACHE_SHARES.items())
    return int(shares) + sum(inputs.get(name, 0) for name in CACHE_EXACT)


def cache_inputs(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, attn: Attention, full_on_device: bool,
                 working: int, logits_standard: bool) -> dict[str, int]:
    """The sizes ``cached_free_bytes`` reads (see there). ``working``: the largest per-layer
    temporaries; ``full_on_device``: full fine-tuning with whole parameters and gradients on this GPU
    (no sharding); ``logits_standard``: the loss materialises ``tokens x vocab`` logits (not fused or
    chunked)."""
    t, v = setup.batch * setup.seq, model.vocab_size
    kernel = act.sdpa_kernel(model, setup, dt.compute) if attn == Attention.sdpa else "eager"
    sq = setup.batch * model.num_heads * setup.seq * setup.seq
    scores = sq * 4 if kernel == "eager" else sq * dt.compute if kernel == "math" else 0
    head_block = t * v * dt.compute if logits_standard and dt.compute == 2 else 0
    loss_block = t * v * 4 if logits_standard else 0
    stateless = full_on_device and (setup.offload == Offload.optimizer or setup.optimizer in (
        Optimizer.sgd, Optimizer.paged_adamw_8bit, Optimizer.paged_adamw, Optimizer.adafactor))
    g = P.trainable_dtype_bytes(setup, dt) if full_on_device else 0
    embed_grad = v * model.hidden_size * g
    act_block = t * model.intermediate_size * dt.compute  # the largest activation tensor of a layer
    oversized = sum(lin.weight_params * g for lin in model.layer_linears() if lin.weight_params * g > act_block)
    opt_segments = 0
    if setup.optimizer == Optimizer.adafactor and not setup.optimizer_in_backward:
        largest = 4 * max(math.prod(shape) for shape, _ in P.trainable_shapes(model, setup))
        copies = adafactor_copies(setup, dt)
        free_blocks = (2 if full_on_device else 3) if loss_block >= largest else 0
        if largest > act_block:
            opt_segments = max(0, copies - free_blocks) * largest
    return {"working": working, "scores": scores, "head_block": head_block,
            "stateless": max(loss_block, oversized * model.num_layers) if stateless else 0,
            "grad_excess": max(0, oversized * model.num_layers - 3 * loss_block),
            "embed_grad_segment": embed_grad if embed_grad > head_block else 0,
            "optimizer_segments": opt_segments}


def allocator_limited_reserved(peak: int, reserved: int, gpu: GpuSpec, working: int = 0) -> tuple[int, int]:
    """``(reserved, released)``: the caching allocator never reserves more than the card gives it.
    When ``cudaMalloc`` fails it frees every cached segment that holds no live tensor and retries
    (``CUDACachingAllocator.cpp`` ``malloc``: ``release_cached_blocks`` then ``alloc_block``; the
    trace's limited replay does the same, ``trace/result.py``). That happens in the first steps, and
    the steps after it run in the segments that are left and the few they add: the free blocks the
    unlimited steady state would keep (the head block, the loss's blocks) are gone, and what stays
    cached is parts of segments that also hold live tensors, ``constants.CACHED_AFTER_RELEASE``
    working sets. So such a step reserves the allocated peak and those fragments (at most the card
    less the CUDA context); ``released`` is what it gives back against the unlimited figure. A step
    whose allocated peak alone passes the card does not fit and is left as is.

    That is ``max_memory_reserved`` after warm-up steps (``reset_peak_memory_stats`` once the first
    steps ran, as the measuring harness does: measured 73.36 GiB for Llama-3.1-8B LoRA at 4 x 8,192
    tokens on an H100 whose unlimited cache would pass 80 GB). A loop that resets the peak before its
    first step (fsdp_qlora's ``train.py``) also sees the level the first steps reached before the
    release, the card less the context (``MemoryEstimate.reserved_from_first_step``)."""
    usable = gpu.memory_bytes - cuda_context_bytes(gpu)
    if reserved <= usable or peak > usable:
        return reserved, 0
    limited = min(usable, peak + int(K.CACHED_AFTER_RELEASE * working) + K.ALLOCATOR_SEGMENTS_BYTES)
    return limited, reserved - limited


def cuda_context_bytes(gpu: GpuSpec) -> int:
    """The CUDA context of a training process on ``gpu``: ``CUDA_CONTEXT_BYTES`` (fitted on the H100
    machine), moved by what a profile of the user's card measured beyond the H100 machine's own profile
    (``REFERENCE_PROFILE``): the context's size is set by the card (the local-memory reservation scales
    with its threads) and the driver, while the kernels a training step loads on top are the same."""
    mine = gpu.profile.cuda_context_bytes if gpu.profile is not None else None
    if not mine:
        return K.CUDA_CONTEXT_BYTES
    return max(0, K.CUDA_CONTEXT_BYTES + mine - K.REFERENCE_PROFILE["cuda_context_bytes"])


def process_device_bytes(reserved: int, gpu: GpuSpec | None = None) -> int:
    """``device_total``: the device memory NVML reports for the process (``nvmlDeviceGetComputeRunningProcesses``
    ``usedGpuMemory``, what ``nvidia-smi`` lists per process): the caching allocator's reserved
    segments and the CUDA context (``constants.CUDA_CONTEXT_BYTES``). CUDA managed memory
    (``cudaMallocManaged``: bitsandbytes' paged optimizer states) is not in that figure, even while
    its pages are resident on the GPU (the device-wide ``used`` figure counts them): measured on an
    H100, the paged-AdamW-8bit step's ``device_used - peak_reserved`` is 758 MiB, the same as every
    other step's (``results/validation``, Llama-3.2-1B full bf16); reported for NVML's per-process
    figure in nvtop issue #213 and pynvml issue #63 (cudaMallocManaged of 60 GB: ~5 GB per process)."""
    return reserved + (cuda_context_bytes(gpu) if gpu is not None else K.CUDA_CONTEXT_BYTES)


def sdpa_mask_bytes(model: ModelSpec, setup: TrainingSetup, attn: Attention) -> int:
    """The boolean attention masks transformers builds for SDPA (``masking_utils.sdpa_mask``), one
    ``(batch, 1, seq, seq)`` tensor of one byte per element per kind of layer that needs one
    (``activations.sdpa_masked_layers``: a padded batch, a sliding window shorter than the sequence;
    Gemma 3 with padding builds one for its full and one for its sliding layers). They are locals of
    the model's forward, shared by its layers, and die when it returns: SDPA keeps its own additive
    copy per layer (counted with the layer's activations), not the boolean mask. So they count only
    while the forward runs. Eager attention builds its float mask whatever the padding; its
    saved-tensor inventory in ``activations.py`` covers what eager keeps."""
    masked = act.sdpa_masked_layers(model, setup)
    if attn != Attention.sdpa or not masked:
        return 0
    padded = setup.seq_mean is not None and setup.padding.value != "packed"
    sliding = bool(model.sliding_window) and setup.seq >= model.sliding_window and model.sliding_layers > 0
    kinds = int(sliding) + int(padded and (not sliding or model.sliding_layers < model.num_layers))
    return kinds * setup.batch * setup.seq * setup.seq


def adafactor_copies(setup: TrainingSetup, dt: Dtypes) -> int:
    """fp32 tensors of a parameter's size that transformers' ``Adafactor.step`` holds at once
    (``optimization.py``): for a 16-bit parameter ``grad.float()`` and ``p.float()`` (new tensors) and,
    at each of its steps, two full-size updates (``grad**2`` and ``+ eps``; the old and the new
    ``update`` around ``_approx_sq_grad``; ``update`` and ``-update``): four; for an fp32 parameter the
    two casts return the tensors themselves: two."""
    return 4 if P.trainable_dtype_bytes(setup, dt) == 2 else 2


def optimizer_temp_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """Temporaries of ``optimizer.step()``: none for fused AdamW (one kernel updates in place,
    ``torch/optim/adamw.py`` ``_fused_adamw``), bitsandbytes 8-bit (in-place blockwise kernel) and
    foreach SGD (in-place ``_foreach_add_``). transformers' Adafactor: ``adafactor_copies`` fp32
    copies of the largest trainable tensor (the step goes parameter by parameter). The reportgen
    trace of Llama-3.2-3B full bf16 with Adafactor peaks there: 17.91 GiB, four copies of the
    1.47 GiB tied embedding over the bf16 weights and gradients."""
    if setup.optimizer != Optimizer.adafactor:
        return 0
    largest = max(math.prod(shape) for shape, _ in P.trainable_shapes(model, setup))
    return adafactor_copies(setup, dt) * 4 * largest


def _experts_note(setup: TrainingSetup) -> str:
    """What QLoRA does with a mixture of experts' weights (``dtypes.py``'s ``base``): bitsandbytes does
    not quantize them (3-D ``nn.Parameter`` tensors, not ``nn.Linear``), and the k-bit preparation's
    cast of every parameter that is not 4-bit to fp32 (peft ``prepare_model_for_kbit_training``;
    TRL's, before its cast back) takes them to fp32 too: twice the 16-bit bytes, often most of the model."""
    head = "MoE experts are 3-D parameters in transformers >= 5, which bitsandbytes does not quantize"
    if setup.kbit in (KbitPrep.peft, KbitPrep.trl):
        return (f"{head}; the k-bit preparation ({setup.kbit.value}) casts them to fp32 with every other parameter "
                "that is not 4-bit, so they weigh 4 bytes each: --kbit-prep none keeps them 16-bit")
    return f"{head}: they stay 16-bit"


def setup_notes(model: ModelSpec, setup: TrainingSetup, attention_note: str | None) -> list[str]:
    """What the estimate says about the setup before any figure: an attention fallback, and where
    peft or bitsandbytes treat a part of the model otherwise than the formulas assume."""
    notes: list[str] = []
    if attention_note:
        notes.append(attention_note)
    if model.num_experts and setup.method == Method.qlora:
        notes.append(_experts_note(setup))
    if setup.is_peft and setup.dora and (model.lora_selection(setup.lora_targets).head
                                         or model.lora_selection(setup.lora_targets).embed):
        notes.append("DoRA on lm_head/embed_tokens: their magnitudes are counted, not the V x h norm work "
                     "and outputs DoRA adds there")
    if DORA.experts_refused(model, setup):
        notes.append("DoRA on MoE experts: peft's ParamWrapper refuses use_dora; the experts are counted as "
                     "plain LoRA")
    if model.num_experts and setup.is_peft and any(
            lin.name in model.lora_selection(setup.lora_targets).linears for lin in model.layer_linears()
            if lin.count > 1 or lin.name == "router"):
        notes.append("MoE experts with LoRA all-linear (peft ParamWrapper): adapter activations are approximate")
    if setup.kernels is Kernels.liger:
        notes.append(LG.note(model))
    if setup.method is Method.full and setup.loss is Loss.fused:
        notes.append(liger_head_note(model, setup.batch * setup.seq))
    return notes


@dataclass(frozen=True)
class ParameterBytes:
    """The parameter-side terms of the whole model (``params.py``), before sharding and offload."""

    weights: int
    quant: int
    adapters: int
    grads: int
    states: int
    states_managed: int  # paged optimizer states, in CUDA managed memory
    g_layer: int  # one decoder layer's gradients
    g_head: int  # the head's (or tied embedding's) gradient under full fine-tuning


def parameter_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> ParameterBytes:
    """The whole model's weights, quantization constants, adapters, gradients and optimizer states
    (``params.py``), one layer's gradients and the head's."""
    weights = P.weights_bytes(model, setup, dt)
    quant = P.quant_constants_bytes(model, setup)
    adapters = P.adapter_bytes(model, setup, dt)
    grads = P.gradient_bytes(model, setup, dt)
    states, states_managed = P.optimizer_state_bytes(model, setup, dt)
    g_layer = layer_param_bytes(model, setup, dt)
    g_head = model.vocab_size * model.hidden_size * dt.base if setup.method == Method.full else 0
    return ParameterBytes(weights, quant, adapters, grads, states, states_managed, g_layer, g_head)


@dataclass(frozen=True)
class DevicePlacement:
    """Where the parameter-side bytes live once sharded and offloaded: per GPU (``w_dev``, ``g_dev``,
    ``s_dev``), on the host, and what FSDP all-gathers for the forward and backward."""

    w_dev: int
    g_dev: int
    s_dev: int
    host: int
    gathered_bytes: int  # FSDP: parameters all-gathered for the forward and backward (not the optimizer step)
    ddp_buckets: int
    workspace: int
    layer_weight_bytes: int  # one decoder layer's weights as FSDP gathers them


def device_placement(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, gpu: GpuSpec, place: SH.Placement,
                     pb: ParameterBytes) -> DevicePlacement:
    """Sharding and offload applied to the parameter-side terms (``sharding.py``)."""
    weights, quant, adapters, grads, states = pb.weights, pb.quant, pb.adapters, pb.grads, pb.states
    fsdp = place.sharded_params
    host = 0
    gathered_bytes = 0  # FSDP: parameters all-gathered for the forward and backward (not the optimizer step)
    # FSDP gathers a layer in the compute dtype (MixedPrecisionPolicy(param_dtype=...)), so mixed
    # precision needs no autocast copies of its own
    layer_params = sum(lin.params for lin in model.layer_linears())
    gather = SH.gather_dtype_bytes(setup, dt.compute)  # fp32 under Lightning's FSDP bf16-mixed
    layer_weight_bytes = layer_params // 2 if setup.method == Method.qlora else layer_params * gather
    root_bytes = root_param_bytes(model, dt) * gather // dt.compute
    # bitsandbytes' quantization state is a Python attribute of each 4-bit weight, not a parameter:
    # FSDP neither flattens nor shards nor offloads it (fsdp_qlora keeps it on every GPU)
    w_dev, g_dev, s_dev = weights + quant + adapters, grads // place.grads, states // place.states
    largest_matrix = model.vocab_size * model.hidden_size * dt.compute  # the embedding or head matrix
    if fsdp:
        g = place.params
        w_dev = (weights + adapters) // g + quant
        if setup.sharding == Sharding.shard_grad_op:
            gathered_bytes = SH.shard_grad_op_gathered_bytes(layer_weight_bytes, model.num_layers, root_bytes, g)
        elif setup.sharding == Sharding.zero3:
            gathered_bytes = SH.zero3_gathered_bytes(layer_weight_bytes, largest_matrix, dt.compute)
        else:
            gathered_bytes = fsdp_gathered_bytes(layer_weight_bytes, root_bytes, g)
    if setup.offload == Offload.optimizer:
        # torchao CPUOffloadOptimizer / ZeRO-Offload: states (and an fp32 copy of trainable params) on the host
        host += s_dev + P.trainable_params(model, setup) * 4 // place.states
        s_dev = 0
    elif setup.offload == Offload.params:
        # FSDP CPUOffload(offload_params=True) / ZeRO-3 offload_param: parameters, gradients and
        # states on the host; the GPU holds the all-gathered layers in flight, the whole root unit
        # (embeddings, head) from the first forward to the end of the backward, and the 4-bit
        # quantization state
        host += w_dev - (quant if fsdp else 0) + g_dev + s_dev
        w_dev, g_dev, s_dev = quant, 0, 0
        if setup.sharding == Sharding.shard_grad_op:
            gathered_bytes = model.num_layers * layer_weight_bytes + root_bytes
        elif setup.sharding == Sharding.zero3:
            gathered_bytes = SH.zero3_gathered_bytes(layer_weight_bytes, largest_matrix, dt.compute)
        else:
            gathered_bytes = 2 * layer_weight_bytes + root_bytes
    ddp_buckets = SH.ddp_bucket_bytes(grads) if setup.sharding == Sharding.ddp else 0
    if setup.sharding in (Sharding.zero2, Sharding.zero3):
        ddp_buckets = SH.zero_reduce_bucket_bytes(P.trainable_params(model, setup),
                                                  P.trainable_dtype_bytes(setup, dt))
    workspace = cublas_workspace_bytes(gpu)
    return DevicePlacement(w_dev, g_dev, s_dev, host, gathered_bytes, ddp_buckets, workspace, layer_weight_bytes)


@dataclass(frozen=True)
class StepActivations:
    """What the forward saves and the loss makes, per micro-batch (unchanged by data-parallel
    sharding): ``activations.py`` and ``logits.py`` put on the step's timeline."""

    mask: int  # SDPA's materialized mask: alive during the forward only
    fixed: int
    stack: int  # the saved activations of all layers on the GPU (two layers with activation offload)
    recompute: int  # one layer's recomputed activations under checkpointing
    bottom_layer: int
    lm: LogitsMemory
    kept: int
    held_prev: int
    offloaded: int  # activations moved to the host
    fused_head: bool  # TRL's fused LM head computes the loss (recipes.py): no logits, no head module


def step_activations(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, attn: Attention,
                     libs: Libraries) -> StepActivations:
    """The saved activations of all layers (``activations.py``), the loss's tensors and the kept
    outputs (``logits.py``), with activation offload moving all but two layers to the host."""
    tokens = setup.batch * setup.seq
    trl_head = RC.fused_head(setup)  # TRL's fused LM head computes the loss (recipes.py)
    mask = sdpa_mask_bytes(model, setup, attn)  # alive during the forward only
    fixed = act.fixed_activations(model, setup, dt, head_module=not trl_head)
    stack = act.all_layers(model, setup, dt, attn=attn)
    # with checkpointing, each layer's backward first recomputes its full activations
    recompute = act.layer_activations(model, setup, dt, attn=attn).bytes if setup.grad_ckpt else 0
    if recompute and setup.kernels is Kernels.liger and model.model_type in LG.LIGER_MODEL_TYPES:
        # Liger's pre-norm saves the layer's input, which the checkpoint holds already
        recompute -= act.checkpointed_layer(model, setup, dt, first_layer=False)
    bottom_layer = act.checkpointed_layer(model, setup, dt) if setup.grad_ckpt else act.layer_activations(
        model, setup, dt, first_layer=True, attn=attn).bytes
    lm = RC.trl_head_memory(model, setup, dt, tokens) if trl_head else loss_logits_memory(
        model, dt, tokens, setup.loss.value)
    kept = 0 if setup.keep_outputs.value == "none" else kept_output_bytes(
        model, dt, tokens, libs.returned_logits_fp32, setup.loss.value == "fused")
    # the previous step's 4-bit inputs held on ctx (a kept graph; with checkpointing no graph holds them)
    held_prev = offloaded = 0
    if setup.keep_outputs.value == "next-step" and dt.quant_holds_input and not setup.grad_ckpt:
        held_prev = act.held_4bit_inputs(model, setup, dt)
    if setup.act_offload:
        # on the GPU: the layer being computed and the one in transfer; the rest on the host
        per_layer = act.checkpointed_layer(model, setup, dt) if setup.grad_ckpt else act.layer_activations(
            model, setup, dt, attn=attn).bytes
        offloaded = max(0, stack - 2 * per_layer)
        stack = min(stack, 2 * per_layer)
    return StepActivations(mask, fixed, stack, recompute, bottom_layer, lm, kept, held_prev, offloaded, trl_head)


@dataclass(frozen=True)
class Timeline:
    """The allocated bytes at each moment of the step where the peak can fall (the module's list),
    and the figures of it the breakdown shows."""

    phases: dict[str, int]
    copies_fwd: int  # autocast copies cached until the autocast region ends
    g_dev: int  # the gradients held per GPU (one layer's when stepped in the backward)
    fwd_work: int
    bwd_work: int
    dora_fwd: int


def timeline(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, attn: Attention, libs: Libraries,
             place: SH.Placement, gathered: bool, pb: ParameterBytes, dev: DevicePlacement,
             a: StepActivations) -> Timeline:
    """The step's moments, each the sum of what is live then (``gathered``: FSDP gathers the layers
    in the compute dtype, so they need no autocast copies; false when it gathers them in fp32 under
    autocast, ``sharding.gather_dtype_bytes``)."""
    g_head, g_layer = pb.g_head, pb.g_layer
    w_dev, g_dev, s_dev, gathered_bytes = dev.w_dev, dev.g_dev, dev.s_dev, dev.gathered_bytes
    workspace, ddp_buckets = dev.workspace, dev.ddp_buckets
    mask, fixed, stack, recompute, lm = a.mask, a.fixed, a.stack, a.recompute, a.lm
    bottom_layer, kept, held_prev = a.bottom_layer, a.kept, a.held_prev
    tokens = setup.batch * setup.seq
    trl_head = a.fused_head
    c_layer = 0 if gathered and setup.method == Method.full else P.autocast_copy_bytes_per_layer(model, setup, dt)
    # a frozen fp32 head's 16-bit copy: saved by the head's matmul, freed by its backward (in the loss
    # backward), so it is not held during the layers' backward
    # (TRL's fused head casts the weight one vocabulary chunk at a time instead: in ``lm``)
    h_cast = 0 if gathered or trl_head else P.frozen_head_cast_bytes(model, setup, dt)
    c_head = 0 if gathered or trl_head else P.autocast_copy_bytes_head(model, setup, dt) + h_cast
    # frozen fp32 weights' copies are saved by their matmuls, not cached: gone with checkpointing
    f_layer = 0 if gathered else P.frozen_cast_bytes_per_layer(model, dt)
    f_held = 0 if setup.grad_ckpt else model.num_layers * f_layer
    copies_fwd = model.num_layers * c_layer + c_head + f_held  # all cached until the autocast region ends
    copies_held = (0 if setup.grad_ckpt else model.num_layers * c_layer) + c_head + f_held
    c_layer += f_layer  # one layer's copies again while its backward runs
    dequant = dequant_transient_bytes(model, setup, dt, libs)
    fwd_work = tokens * dt.compute * model.intermediate_size + dequant
    # DoRA: each adapted linear's forward forms W + scale B A (and its identity input) and frees them
    # when it returns (dora.py); the largest one of the last layer, again in a recomputed forward
    dora_fwd = DORA.layer_forward_transient_bytes(model, setup, dt)
    bwd_work = backward_working_bytes(model, setup, dt, attn) + dequant
    opt_temp = optimizer_temp_bytes(model, setup, dt)
    shard = place.grads  # the gradients' divisor (the head's and the embedding's gradients too)
    g_in_base = g_dev if setup.accum > 1 else 0
    if setup.optimizer_in_backward:  # stepped and freed in each gradient's hook (accum is 1)
        g_head, g_dev = min(g_head, g_dev), g_layer
    base = w_dev + s_dev + workspace + ddp_buckets + g_in_base
    g_embed = g_head if not model.tie_word_embeddings else 0  # the input embedding's own gradient
    # gradients present during the first / last layer's backward (already in ``base`` with accumulation)
    g_top = 0 if g_in_base else (max(g_head // shard, g_layer) if setup.optimizer_in_backward
                                 else g_head // shard + g_layer)
    g_bottom = 0 if g_in_base else g_layer if setup.optimizer_in_backward else g_dev - g_embed // shard
    after_fwd = kept if setup.keep_outputs.value == "step" else 0  # outputs held past the loss
    g_opt = 0 if (g_in_base or setup.optimizer_in_backward) else g_dev
    phases = {
        # the last layer's forward: its MLP intermediate and the dequantized 4-bit weight, freed after
        # their matmuls, before the logits exist (reportgen trace: qlora_dequant_at_loss)
        # (a frozen fp32 head's 16-bit copy is made by the head's forward, after the last layer)
        # DoRA's transient comes after the base matmul has freed its dequantized weight
        "forward-last-layer": base + gathered_bytes + mask + stack + copies_fwd - h_cast
        + (fwd_work - dequant + max(dequant, dora_fwd) if dora_fwd else fwd_work),
        "forward-end": base + gathered_bytes + fixed + stack + copies_fwd + lm.forward_live,
        "loss-backward": base + gathered_bytes + fixed + stack + copies_held + lm.backward_live + after_fwd,
        "backward-top": base + gathered_bytes + fixed + stack + copies_held - h_cast + recompute
        + (c_layer if setup.grad_ckpt else 0) + g_top + bwd_work + after_fwd,
        "backward-bottom": base + gathered_bytes + bottom_layer + recompute + c_layer + g_bottom + bwd_work
        + after_fwd,
        "optimizer-step": base + g_opt + opt_temp + after_fwd,
    }
    if dora_fwd and setup.grad_ckpt:
        # the top layer's recomputed forward, before its gradients exist
        phases["backward-recompute"] = (base + gathered_bytes + fixed + stack + copies_held - h_cast + recompute
                                        + c_layer + dora_fwd + after_fwd)
    if setup.method == Method.full and model.tie_word_embeddings:
        # the tied weight's two gradients meet at the embedding's backward: the head's, waiting in
        # the autograd engine's input buffer since the loss backward, and embedding_dense_backward's,
        # summed in place (torch/csrc/autograd/input_buffer.cpp); reportgen trace: tied_embedding_grad
        phases["embedding-backward"] = base + (0 if g_in_base else g_dev) + g_head // shard
    if setup.keep_outputs.value == "next-step":
        # the new logits are returned while the previous step's are still held (and its ctx tensors)
        head_out = model.vocab_size * dt.compute if dt.compute != 4 else 0
        phases["forward-return"] = (base + gathered_bytes + fixed + stack + copies_fwd + fwd_work + kept + held_prev
                                    + tokens * (head_out + 4 * model.vocab_size))
    return Timeline(phases, copies_fwd, g_dev, fwd_work, bwd_work, dora_fwd)


def working_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, attn: Attention, tl: Timeline,
                  recompute: int) -> int:
    """The largest per-layer temporaries (the optimizer's are in ``optimizer_segments``; attention's
    s x s blocks in ``scores``); a checkpointed layer's forward drops all its activations."""
    bwd_work, fwd_work, dora_fwd = tl.bwd_work, tl.fwd_work, tl.dora_fwd
    attn_sq = setup.batch * model.num_heads * setup.seq * setup.seq
    kernel = act.sdpa_kernel(model, setup, dt.compute) if attn == Attention.sdpa else "eager"
    bwd_scores = (attn_sq * (4 + dt.compute) if kernel == "eager" else 2 * attn_sq * dt.compute if kernel == "math"
                  else 0)
    return max(bwd_work - bwd_scores, fwd_work + dora_fwd + (recompute if setup.grad_ckpt else 0))


def reserved_memory(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, gpu: GpuSpec, attn: Attention,
                    place: SH.Placement, gathered: bool, phases: dict[str, int], peak: int, working: int,
                    layer_weight_bytes: int, fused_head: bool) -> tuple[int, int, dict[str, int]]:
    """``(reserved, released, cache inputs)``: the caching allocator's reserve over the allocated
    ``peak`` of the ``phases`` (``cached_free_bytes``), its segments, FSDP's stream pool
    (``gathered``: FSDP gathers the layers), and what it releases when the card cannot hold it
    (``allocator_limited_reserved``). ``fused_head``: TRL's fused LM head makes the loss, so the
    standard loss's cached block does not arise (``StepActivations.fused_head``)."""
    cache = cache_inputs(model, setup, dt, attn, setup.method == Method.full and not place.sharded_params
                         and place.grads == 1, working, setup.loss.value == "standard" and not fused_head)
    # the segments added after the loss (the embedding's gradient, Adafactor's copies) are counted in
    # cached_free_bytes whole, on top of the step before them; where they make the allocated peak
    # themselves (phases 'embedding-backward', 'optimizer-step'), that peak already holds them
    before = max(v for k, v in phases.items() if k not in ("embedding-backward", "optimizer-step"))
    reserved = max(peak, before + cached_free_bytes(cache)) + K.ALLOCATOR_SEGMENTS_BYTES
    if gathered and setup.sharding != Sharding.zero3:
        reserved += fsdp_stream_pool_bytes(layer_weight_bytes)
    reserved, released = allocator_limited_reserved(peak, reserved, gpu, working)
    return reserved, released, cache


def estimate_memory(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec,
                    libs: Libraries = CURRENT) -> MemoryEstimate:
    """The step's peak for the library versions the harness runs, or older ones (``libraries.py``).

    In three steps: the parameter-side terms placed on the GPUs and the host (``device_placement``),
    the step's timeline of allocated bytes (``timeline``), and the allocator's reserve over its peak
    (``reserved_memory``)."""
    LG.check(model, setup)
    dt = dtypes_for(setup, libs)
    attn, note = effective_attention(model, setup)
    notes = setup_notes(model, setup, note)
    place = SH.placement(setup)  # divisors of parameters, gradients, optimizer states (sharding.py)
    pb = parameter_bytes(model, setup, dt)
    dev = device_placement(model, setup, dt, gpu, place, pb)
    a = step_activations(model, setup, dt, attn, libs)
    host_terms = HOST.step_host_terms(model, setup, dt, pb.states, place, dev.host, a.offloaded)
    host = sum(host_terms.values())
    gathered = SH.gathers_layers(setup)
    tl = timeline(model, setup, dt, attn, libs, place, gathered and SH.gather_dtype_bytes(setup, dt.compute)
                  == dt.compute, pb, dev, a)
    phases = tl.phases
    phase = max(phases, key=phases.__getitem__)  # the first of the largest, in the timeline's order
    peak = phases[phase]

    working = working_bytes(model, setup, dt, attn, tl, a.recompute)
    logits = max(a.lm.forward_live, a.lm.backward_live)
    reserved, released, cache = reserved_memory(model, setup, dt, gpu, attn, place, gathered, phases, peak, working,
                                                dev.layer_weight_bytes, a.fused_head)
    if released:
        notes.append(f"the allocator would cache {released / 2**30:.1f} GiB more than {gpu.key} can hold: it "
                     "releases its cached blocks and retries (slower; fragmentation can still run out), and "
                     "reserves little more than the allocated peak afterwards")
    device_total = process_device_bytes(reserved, gpu)
    if pb.states_managed:
        notes.append("paged optimizer states live in CUDA managed memory: not in peak_allocated/peak_reserved "
                     "nor in nvidia-smi's per-process figure (device_total); they use the card while it has "
                     "room and page to host RAM when it runs out")
    if setup.offload != Offload.none:
        notes.append(f"offload={setup.offload.value}: host RAM needed {host / 2**30:.1f} GiB")

    on_host = setup.offload == Offload.params
    terms = {
        "weights": 0 if on_host else pb.weights // place.params,
        "quant_constants": 0 if on_host else pb.quant // place.params,
        "lora_adapters": 0 if on_host else pb.adapters // place.params,
        "gradients": tl.g_dev + dev.ddp_buckets,
        "optimizer": dev.s_dev,
        "optimizer_paged": pb.states_managed // place.states,
        "autocast_copies": tl.copies_fwd,
        "activations": a.fixed + a.stack,
        "kept_outputs": a.kept + a.held_prev,
        "logits": logits,
        "transient": working,
        "fsdp_unsharded": dev.gathered_bytes,
        "cublas_workspace": dev.workspace,
        "cuda_context": cuda_context_bytes(gpu),
    }
    return MemoryEstimate(terms=terms, peak_allocated=peak, peak_reserved=reserved, device_total=device_total,
                          peak_phase=phase, phases=phases, host_ram=host, notes=notes,
                          offloaded_activations=a.offloaded, cache_released=released, cache_inputs=cache,
                          host_terms=host_terms,
                          reserved_from_first_step=reserved if not released else gpu.memory_bytes - cuda_context_bytes(gpu))
