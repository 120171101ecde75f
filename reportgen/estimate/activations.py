"""Activation memory: the tensors autograd saves for the backward pass, tensor by tensor.

Instead of the usual ``sbh(34 + 5as/h)`` rule of thumb (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models"), which describes Megatron's GPT layer,
this module lists what the Hugging Face implementations really save, op by op, for the model's
architecture (RMSNorm, SwiGLU/GeGLU, grouped-query attention, MoE), the setup's dtypes, which
weights are trainable, and the attention kernel:

* RMSNorm (``modeling_llama.LlamaRMSNorm``): ``x.to(fp32)`` (saved by ``pow`` and the ``mul``),
  ``rsqrt`` (fp32, one per token) and, only when the norm weight is trainable, the normalised
  tensor that ``weight * x`` needs for the weight gradient.
* ``F.linear`` saves its input only when its weight needs a gradient. Under autocast every call
  casts its fp32 input itself, so consumers of one fp32 tensor each save their own 16-bit copy.
* peft LoRA (``tuners/lora/layer.py`` ``Linear.forward``): ``x`` is cast to the adapter dtype
  (not in peft's 4-bit layers under autocast), optionally dropped out (own copy and mask per
  adapter), ``lora_A`` saves that input, ``lora_B`` saves the rank-``r`` output of ``lora_A``.
* SDPA (flash / memory-efficient kernels, ``enable_gqa`` as transformers passes it without a
  padding mask): q, k, v at their own head counts, the output and the fp32 logsumexp.
  Eager: q, k and v repeated to all heads, the fp32 softmax and its cast, i.e. O(s^2) per head.
* SwiGLU: gate output (saved by SiLU), SiLU output and up output (saved by the product), and the
  product when ``down_proj`` is trainable.

The inventory is checked tensor by tensor against ``torch.autograd.graph.saved_tensors_hooks``
on tiny configs of every family (``tests/test_activations_vs_torch.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from reportgen.estimate.dtypes import Dtypes
from reportgen.model import Linear, ModelSpec
from reportgen.setup import Attention, TrainingSetup


@dataclass(frozen=True)
class LayerActivations:
    """Bytes saved for backward by one decoder layer, for one micro-batch."""

    per_token: int  # bytes per token (batch * seq tokens)
    per_seq_sq: int  # bytes per batch row per seq^2 (eager attention scores)
    constant: int  # bytes independent of batch and sequence
    batch: int
    seq: int

    @property
    def bytes(self) -> int:
        return (self.per_token * self.batch * self.seq + self.per_seq_sq * self.batch * self.seq * self.seq
                + self.constant)


def _norm(h: int, dt: Dtypes, needs_input_grad: bool, gemma: bool = False) -> int:
    """Bytes per token that one RMSNorm saves.

    ``x.float()`` (4h) and ``rsqrt`` (4) are saved when the input needs a gradient; the
    normalised tensor (stream dtype, fp32 for Gemma's ``_norm``) only when the weight is trainable.
    """
    saved = 0
    if needs_input_grad:
        saved += 4 * h + 4
    if dt.trainable_base:
        saved += (4 if gemma else dt.stream) * h
    return saved


def _norm_const(h: int, gemma: bool) -> int:
    """Per-norm bytes that do not scale with tokens: Gemma's ``output * (1.0 + weight.float())``
    saves the fp32 ``1 + weight`` vector."""
    return 4 * h if gemma else 0


def _linear_group(width: int, in_bytes: int, consumers: list[Linear], lora: set[str], dt: Dtypes,
                  rank: int, shared_saved: bool = False, input_grad: bool = True) -> int:
    """Bytes per token that linears reading the same input tensor save.

    ``width``: input features; ``in_bytes``: the input's dtype; ``shared_saved``: the input tensor
    is already saved by another op (e.g. SDPA's output feeding ``o_proj``); ``input_grad``: the
    input requires a gradient (not in the first layer of LoRA without checkpointing).
    """
    saved = 0
    shared = shared_saved
    for lin in consumers:
        if dt.trainable_base or (dt.quant_holds_input and input_grad):
            # a trainable weight needs its input; so did bitsandbytes <= 0.43.1's 4-bit matmul,
            # which casts to its compute dtype first (``libraries.py``)
            if in_bytes != dt.compute and (dt.autocast or dt.quant_holds_input):
                saved += dt.compute * width  # autocast (or bnb) casts the input per call
            elif not shared:
                saved += in_bytes * width
                shared = True
        if lin.name in lora:
            kept, shared = _adapter_input(width, in_bytes, dt, shared, input_grad)
            # lora_A output, saved by lora_B
            saved += kept + (dt.compute if dt.autocast else dt.adapter) * rank * lin.count
    return saved


#: CUDA's fused dropout (``native_dropout``) keeps a bool mask for backward
DROPOUT_MASK_BYTES = 1


def _adapter_input(width: int, in_bytes: int, dt: Dtypes, shared: bool, input_grad: bool) -> tuple[int, bool]:
    """Bytes per token one LoRA adapter keeps of its input, and whether ``x`` itself is now saved.

    peft computes ``lora_B(lora_A(dropout(x)))`` (``tuners/lora/layer.py`` ``Linear.forward``):

    * ``x`` is first cast to the adapter dtype (fp32 under mixed precision: a new tensor), except
      in peft's bitsandbytes layers under autocast (``tuners/lora/bnb.py``: ``requires_conversion
      = not torch.is_autocast_enabled()``), where ``x`` goes in as it is.
    * ``lora_dropout > 0``: each adapter drops its own copy of ``x`` (a new tensor) and keeps the
      mask (``DROPOUT_MASK_BYTES``) when ``x`` requires a gradient.
    * ``lora_A`` saves its input; under autocast a tensor of another dtype is first cast to 16 bit
      (a new copy per adapter), one already in 16 bit is passed through, so adapters reading the
      same 16-bit ``x`` without dropout all save that one tensor.
    """
    converts = not (dt.quantized and dt.autocast)
    x_bytes = dt.adapter if converts else in_bytes
    new = x_bytes != in_bytes
    kept = 0
    if dt.lora_dropout:
        new = True
        if input_grad:
            kept += DROPOUT_MASK_BYTES * width
    if dt.autocast and x_bytes != dt.compute:
        return kept + dt.compute * width, shared
    if new:
        return kept + x_bytes * width, shared
    if shared:
        return kept, shared
    return kept + in_bytes * width, True


def layer_activations(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, first_layer: bool = False,
                      attn: Attention | None = None) -> LayerActivations:
    """Saved bytes of one decoder layer without checkpointing.

    ``first_layer``: the layer reading the embedding output, which needs no gradient when the
    embedding is frozen and input gradients are not enabled (LoRA without checkpointing).
    """
    h, c = model.hidden_size, dt.compute
    attn = attn or setup.attn
    rank = setup.lora_rank
    lora = {lin.name for lin in model.layer_linears() if setup.is_peft and setup.lora_targets.value in lin.lora_sets}
    lins = {lin.name: lin for lin in model.layer_linears()}
    input_grad = not (first_layer and setup.is_peft and not setup.grad_ckpt)
    gemma = model.family == "gemma2"
    norm_out = 2 if gemma and dt.stream == 2 else dt.stream  # Gemma's type_as(x) keeps x's dtype

    per_token = 0
    per_sq = 0
    # --- attention block ---------------------------------------------------------------------
    per_token += _norm(h, dt, input_grad, gemma)
    qkv = [lins["qkv_proj"]] if model.family == "phi3" else [lins["q_proj"], lins["k_proj"], lins["v_proj"]]
    per_token += _linear_group(h, norm_out, qkv, lora, dt, rank, input_grad=input_grad)

    nq, nkv, hd = model.num_heads, model.num_kv_heads, model.head_dim
    if attn == Attention.sdpa:
        # q, k, v (GQA heads kept), output, logsumexp (fp32 per query head)
        per_token += c * hd * (nq + 2 * nkv) + c * nq * hd + 4 * nq
        o_shared = True
        if model.family == "phi3":
            # value_states is a slice of qkv_proj's fused output and is not rotated: the view SDPA
            # saves keeps the whole (q, k, v) output alive (modeling_phi3 ``Phi3Attention``, with
            # use_cache=False as in training, where no KV cache copies v out). Eager's matmul
            # saves a contiguous copy instead.
            per_token += c * hd * (nq + nkv)
    else:
        kv_heads = nkv if nkv == nq else nq  # repeat_kv materialises all heads
        # matmul(q, k^T) saves q only if k needs a gradient and k only if q does; in the first
        # layer of a LoRA model without input gradients that depends on which projections have
        # adapters. matmul(p, v) saves the probabilities only if v needs a gradient.
        q_req, k_req, v_req = (True, True, True) if input_grad else _qkv_requires_grad(model, lora)
        per_token += c * hd * ((nq if k_req else 0) + (kv_heads if q_req else 0) + kv_heads)
        per_sq += 4 * nq + (0 if c == 4 or not v_req else c * nq)  # softmax(fp32) and its cast
        if model.attn_logit_softcapping:
            per_sq += c * nq  # tanh output (Gemma 2 soft-capping)
        o_shared = False  # transpose().contiguous() is a new tensor
    per_token += _linear_group(model.q_dim, c, [lins["o_proj"]], lora, dt, rank, shared_saved=o_shared)

    if gemma:  # post_attention_layernorm on the attention output, then pre_feedforward_layernorm
        per_token += _norm(h, dt, True, gemma) + _norm(h, dt, True, gemma)
    else:
        per_token += _norm(h, dt, True)

    # --- MLP block -----------------------------------------------------------------------------
    i = model.intermediate_size
    if model.num_experts:
        per_token += _moe(model, dt)
    else:
        up = [lins["gate_up_proj"]] if model.family == "phi3" else [lins["gate_proj"], lins["up_proj"]]
        per_token += _linear_group(h, norm_out, up, lora, dt, rank)
        per_token += 3 * c * i  # gate (or gate_up storage), act output, up
        per_token += _linear_group(i, c, [lins["down_proj"]], lora, dt, rank)
    if gemma:
        per_token += _norm(h, dt, True, gemma)  # post_feedforward_layernorm
    const = _norm_const(h, gemma) * model.norms_per_layer + 4 * model.num_experts  # + MoE int32 offsets
    if gemma and not input_grad:
        const -= _norm_const(h, gemma)  # the first norm's input needs no gradient: nothing saved
    return LayerActivations(per_token=per_token, per_seq_sq=per_sq, constant=const, batch=setup.batch,
                            seq=setup.seq)


def _qkv_requires_grad(model: ModelSpec, lora: set[str]) -> tuple[bool, bool, bool]:
    if model.family == "phi3":
        return ("qkv_proj" in lora,) * 3
    return ("q_proj" in lora, "k_proj" in lora, "v_proj" in lora)


def _moe(model: ModelSpec, dt: Dtypes) -> int:
    """Mixtral's sparse MoE block, per token (transformers >= 5, ``integrations/moe.py``).

    Router: its input (when trainable; shared with the norm output otherwise), the fp32 softmax,
    the top-k indices (int64), the renormalisation sum and the top-k weights (fp32).
    Experts run through a grouped matmul on the tokens sorted by expert, a custom autograd op that
    autocast leaves alone (experts compute in the stream dtype). Per routed token: three int64
    index tensors (sort order and inverse), the routing weight (fp32), the ``gate_up`` output
    (saved by the activation and the product), the activation output, the expert output (saved by
    the routing-weight multiply) and, when the experts are trainable, the gathered input and the
    product fed to ``down``.
    """
    h, i, k, e = model.hidden_size, model.intermediate_size, model.experts_per_token, model.num_experts
    x = dt.stream
    saved = 4 * e + 8 * k + 4 + 4 * k
    if dt.trainable_base:  # the router's input (its own 16-bit copy under autocast)
        saved += (dt.compute if dt.autocast and x != dt.compute else x) * h
    per_route = 3 * 8 + 4 + x * (2 * i + i + h)
    if dt.trainable_base:
        per_route += x * (h + i)
    return saved + k * per_route


def fixed_activations(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """Saved tensors outside the decoder layers, excluding the loss (see ``logits.py``).

    Embedding backward saves the int64 token ids when the embedding is trainable; the final norm
    saves like any RMSNorm; ``lm_head`` saves its input when trainable; RoPE's cos/sin are shared.
    """
    t = setup.batch * setup.seq
    h = model.hidden_size
    saved = 0
    if dt.trainable_base:
        saved += 8 * t  # input ids
    gemma = model.family == "gemma2"
    saved += _norm(h, dt, True, gemma) * t + _norm_const(h, gemma)
    if gemma and dt.trainable_base:
        saved += dt.stream  # the embedding scale (sqrt(h) as a tensor) saved by the multiply
    if dt.trainable_base:  # lm_head input
        saved += (dt.compute if dt.autocast and dt.stream != dt.compute else dt.stream) * h * t
    if not setup.grad_ckpt:
        # RoPE cos and sin, (1, seq, head_dim) each, in the stream dtype, shared by all layers
        # (with checkpointing they are inputs of the checkpointed layers, not saved tensors)
        saved += 2 * setup.seq * model.head_dim * dt.stream
    return saved


def checkpointed_layer(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """With (non-reentrant) activation checkpointing a layer keeps only its input hidden states
    (``torch.utils.checkpoint``; transformers ``GradientCheckpointingLayer``)."""
    return dt.stream * model.hidden_size * setup.batch * setup.seq


def all_layers(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, attn: Attention | None = None) -> int:
    """Bytes all decoder layers hold for backward at the end of the forward pass."""
    if setup.grad_ckpt:
        return model.num_layers * checkpointed_layer(model, setup, dt)
    first = layer_activations(model, setup, dt, first_layer=True, attn=attn).bytes
    rest = layer_activations(model, setup, dt, attn=attn).bytes
    return first + (model.num_layers - 1) * rest
