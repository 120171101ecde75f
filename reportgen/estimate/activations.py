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
  padding mask): q, k, v at their own head counts, the output and the fp32 logsumexp. fp32 inputs
  of a grouped-query model take the math path (``sdpa_kernel``): the scaled q, k and v repeated
  to all heads and the ``s x s`` probabilities.
  Eager: q, k and v repeated to all heads, the fp32 softmax and its cast, i.e. O(s^2) per head.
* SwiGLU: gate output (saved by SiLU), SiLU output and up output (saved by the product), and the
  product when ``down_proj`` is trainable. GeGLU (Gemma's ``gelu_pytorch_tanh``) saves the same.
* ``kernels: liger`` (``liger.py``): Liger's RMSNorm saves its input and the fp32 ``rstd``, its
  SwiGLU the gate and up outputs only.

Family by family (``model.py`` ``FAMILIES``), the layer differs in the ops of ``ops.py``:

* Gemma, Gemma 2, Gemma 3: ``GemmaRMSNorm`` keeps the fp32 normalised tensor and ``1 + weight``;
  the embedding output is multiplied by ``sqrt(hidden_size)``. Gemma 2 and 3 add post-attention,
  pre- and post-feedforward norms; Gemma 3 and Qwen3 normalise q and k per head (``q_norm``,
  ``k_norm``); Gemma 3 keeps one RoPE table per layer type.
* OLMo 2: no pre-norms; q/k norms over the whole projection width, norms after attention and MLP;
  RoPE's cos/sin stay fp32 (``Olmo2RotaryEmbedding`` does not cast them).
* Phi-2: one ``nn.LayerNorm`` feeds attention and MLP in parallel, ``gelu_new`` MLP, dropout on
  both outputs, RoPE on ``partial_rotary_factor`` of each head.
* Qwen3-MoE: Mixtral's expert path with its own router (``_moe``).

The inventory is checked tensor by tensor against ``torch.autograd.graph.saved_tensors_hooks``
on tiny configs of every family (``tests/test_activations_vs_torch.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from reportgen.estimate import dora, fusion, liger, ops
from reportgen.estimate.dtypes import Dtypes
from reportgen.model import FP32_WEIGHTED_NORM, GEMMA_NORM, Linear, ModelSpec
from reportgen.setup import Attention, Kernels, Modeling, TrainingSetup


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


def _norm(model: ModelSpec, width: int, in_bytes: int, dt: Dtypes, input_grad: bool, rows: int = 1,
          lg: bool = False) -> int:
    """Bytes per token one of the model's RMSNorms saves (``ops.rms_norm``; ``lg``: Liger's,
    ``liger.rms_norm_saved``)."""
    if lg:
        return liger.rms_norm_saved(width, in_bytes, rows, input_grad or dt.trainable_base)
    return ops.rms_norm(width, in_bytes, rows, dt, input_grad, model.family in FP32_WEIGHTED_NORM)


def _norm_const(model: ModelSpec, width: int) -> int:
    """Per-norm bytes that do not scale with tokens (Gemma's ``1 + weight``, ``ops.gemma_norm_const``)."""
    return ops.gemma_norm_const(width) if model.family in GEMMA_NORM else 0


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
            if dt.dora and lin.count == 1:  # DoRA's base and LoRA outputs, kept for the magnitude's gradient
                saved += dora.saved_bytes_per_token(lin, in_bytes, dt)
    return saved


DROPOUT_MASK_BYTES = ops.DROPOUT_MASK_BYTES


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
                      attn: Attention | None = None, masked: bool | None = None) -> LayerActivations:
    """Saved bytes of one decoder layer without checkpointing.

    The layer in the order its forward saves: the attention block's input (``_attention_input``),
    the q/k norms, the attention core (``_attention_core``), o_proj, and from the attention output
    on the norms and the MLP (``_mlp_block``); then DoRA's constants and what ``torch.compile`` saves
    less.

    ``first_layer``: the layer reading the embedding output, which needs no gradient when the
    embedding is frozen and input gradients are not enabled (LoRA without checkpointing).
    ``masked``: whether its SDPA call gets an attention mask (default: whether any layer's does,
    ``sdpa_masked_layers``).
    """
    if masked is None:
        masked = sdpa_masked_layers(model, setup) > 0
    attn = attn or setup.attn
    rank = setup.lora_rank
    lora = set(model.lora_selection(setup.lora_targets).linears) if setup.is_peft else set()
    lins = {lin.name: lin for lin in model.layer_linears()}
    input_grad = not (first_layer and setup.is_peft and not setup.grad_ckpt)
    q_req, k_req, v_req = (True, True, True) if input_grad else _qkv_requires_grad(model, lora)

    lg = setup.kernels is Kernels.liger and model.model_type in liger.LIGER_MODEL_TYPES
    per_token, const, fc1_out = _attention_input(model, dt, lins, lora, rank, input_grad, lg)
    t, k = _qk_norms(model, dt, q_req, k_req)  # Liger leaves Qwen3's q/k norms (liger.QWEN3_NOTE)
    per_token, const = per_token + t, const + k
    t, per_sq, o_shared = _attention_core(model, setup, dt, attn, masked, q_req, k_req, v_req)
    per_token += t
    per_token += _linear_group(model.q_dim, dt.compute, [lins[model.attn_out_name]], lora, dt, rank,
                               shared_saved=o_shared, input_grad=q_req or k_req or v_req)
    if model.resid_dropout:  # the attention output requires a gradient (v or o_proj is trained)
        per_token += ops.dropout_mask(model.hidden_size)
    # does the residual stream need a gradient after the attention block? Always, except in the
    # first layer of LoRA when no attention projection has an adapter
    stream_grad = input_grad or q_req or k_req or v_req or model.attn_out_name in lora
    t, k = _mlp_block(model, dt, lins, lora, rank, input_grad, stream_grad, fc1_out, lg)
    per_token, const = per_token + t, const + k
    for lin in dora.adapted_linears(model, setup):  # DoRA's norm vectors (and dropout's weight copies)
        grad = input_grad or lin.name not in model.attn_in_names()
        const += dora.saved_constant_bytes(model, lin, dt, grad)
    if setup.compile:  # Inductor's partitioner saves less than eager (fusion.py)
        per_token -= fusion.saved_bytes_per_token(model, dt, input_grad)
    return LayerActivations(per_token=per_token, per_seq_sq=per_sq, constant=const, batch=setup.batch,
                            seq=setup.seq)


def _attention_input(model: ModelSpec, dt: Dtypes, lins: dict[str, Linear], lora: set[str], rank: int,
                     input_grad: bool, lg: bool = False) -> tuple[int, int, int]:
    """``(per token, constant, fc1's output dtype)``: the attention block's pre-norm and the inputs
    its projections save (Phi-2: one LayerNorm feeds attention and ``fc1``)."""
    h, c, fam = model.hidden_size, dt.compute, model.family
    per_token = 0
    const = 0
    fc1_out = c
    if fam == "phi":  # one LayerNorm feeds attention and MLP (PhiDecoderLayer, parallel block)
        attn_in = dt.stream
        if input_grad:
            ln_token, ln_const, attn_in = ops.layer_norm(h, dt)
            per_token, const = per_token + ln_token, const + ln_const
        elif dt.autocast:
            attn_in = 4
        mlp_in_lins = [lins[n] for n in model.mlp_in_names()]
        per_token += _linear_group(h, attn_in, [lins[n] for n in model.attn_in_names()] + mlp_in_lins, lora, dt,
                                   rank, input_grad=input_grad)
        # bitsandbytes' Linear4bit returns its input's dtype (``.to(inp_dtype)``): fp32 from the
        # fp32 LayerNorm output under autocast, where an nn.Linear returns the compute dtype
        fc1_out = attn_in if dt.quantized else c
    else:
        if fam != "olmo2":  # Olmo2DecoderLayer has no pre-norms: q, k, v read the residual stream
            per_token += _norm(model, h, dt.stream, dt, input_grad, lg=lg)
            const += _norm_const(model, h) if input_grad else 0
        per_token += _linear_group(h, dt.stream, [lins[n] for n in model.attn_in_names()], lora, dt, rank,
                                   input_grad=input_grad)
    return per_token, const, fc1_out


def _qk_norms(model: ModelSpec, dt: Dtypes, q_req: bool, k_req: bool) -> tuple[int, int]:
    """``(per token, constant)`` of the q/k norms (Qwen3, Qwen3-MoE and Gemma 3 per head; OLMo 2
    over the whole width)."""
    per_token = const = 0
    nq, nkv, hd = model.num_heads, model.num_kv_heads, model.head_dim
    if model.qk_norm_widths:
        per_head = model.family != "olmo2"
        qk_dt = dt.stream if dt.quantized else dt.compute  # a 4-bit q/k projection returns its input's dtype
        for req, heads in ((q_req, nq), (k_req, nkv)):
            per_token += _norm(model, heads * hd, qk_dt, dt, req, rows=heads if per_head else 1)
            const += _norm_const(model, hd) if req else 0  # Gemma 3: 1 + weight over head_dim
    return per_token, const


def _attention_core(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, attn: Attention, masked: bool,
                    q_req: bool, k_req: bool, v_req: bool) -> tuple[int, int, bool]:
    """``(per token, per seq^2, whether o_proj's saved input is the core's own output)`` of the
    attention core: SDPA's kernels or eager attention."""
    c, fam = dt.compute, model.family
    nq, nkv, hd = model.num_heads, model.num_kv_heads, model.head_dim
    per_token = per_sq = 0
    if attn == Attention.sdpa and not (q_req or k_req or v_req):
        # first layer of LoRA with no adapter on q, k or v: SDPA's inputs need no gradient, so it
        # records no backward node and saves nothing
        o_shared = False
    elif attn == Attention.sdpa and sdpa_kernel(model, setup, c, masked) == "math":
        # the math path (``attention.cpp`` ``_scaled_dot_product_attention_math``): ``q * scale`` (saved
        # by matmul(q, k^T) when k needs a gradient), ``repeat_interleave(k) * scale`` and
        # ``repeat_interleave(v)`` at all query heads (new tensors; saved when q, resp. the
        # probabilities, need a gradient) and the softmax's output in the input dtype (saved by the
        # softmax and by matmul(p, v)); its output is not saved, so o_proj saves its own copy
        score_grad = q_req or k_req
        per_token += c * hd * nq * (int(k_req) + int(q_req) + int(score_grad))
        per_sq += c * nq
        o_shared = False
    elif attn == Attention.sdpa:
        # q, k, v (GQA heads kept unless transformers repeated them, ``sdpa_kv_repeated``), output,
        # logsumexp (fp32 per query head)
        kv_heads = nq if sdpa_kv_repeated(model, masked, setup) else nkv
        per_token += c * hd * (nq + 2 * kv_heads) + c * nq * hd + 4 * nq
        if masked:
            # SDPA turns the boolean mask into an additive one in the query's dtype at every call
            # (``attention.cpp`` ``scaled_dot_product_attention``: ``convert_boolean_attn_mask``), a new
            # (batch, 1, seq, seq) tensor per layer that the memory-efficient kernel keeps as its
            # ``attn_bias`` for the backward (``_scaled_dot_product_efficient_attention``)
            per_sq += c
        # FlashAttention's output follows the query's memory layout (``mha_fwd``: ``empty_like(q)`` of
        # the transposed query, ``cuda/flash_attn/flash_api.cpp``; its meta function does the same).
        # An elementwise RoPE keeps the projection's (batch, seq, heads, dim) layout, so
        # ``transpose(1, 2).contiguous()`` before o_proj is a no-op and o_proj saves SDPA's own
        # output; Phi's and Phi-3's RoPE ends in ``torch.cat`` and hands SDPA a (batch, heads, seq,
        # dim) query, so the transpose copies and o_proj saves the copy. The memory-efficient kernel
        # (fp32 inputs, or a padding mask) always writes (batch, seq, heads, dim): no copy.
        o_shared = not (fam in ROPE_BY_CAT and sdpa_kernel(model, setup, c, masked) == "flash")
        if fam == "phi3" and not (dt.quantized and dt.stream != c):
            # value_states is a slice of qkv_proj's fused output and is not rotated: the view SDPA
            # saves keeps the whole (q, k, v) output alive (modeling_phi3 ``Phi3Attention``, with
            # use_cache=False as in training, where no KV cache copies v out). Eager's matmul
            # saves a contiguous copy instead. A 4-bit qkv_proj reading an fp32 stream (QLoRA prepared
            # by peft) returns fp32, and autocast's cast for SDPA is a new tensor: no view kept.
            per_token += c * hd * (nq + nkv)
    else:
        kv_heads = nkv if nkv == nq else nq  # repeat_kv materialises all heads
        # matmul(q, k^T) saves q only if k needs a gradient and k only if q does; in the first
        # layer of a LoRA model without input gradients that depends on which projections have
        # adapters. matmul(p, v) saves the probabilities only if v needs a gradient.
        per_token += c * hd * ((nq if k_req else 0) + (kv_heads if q_req else 0) + kv_heads)
        per_sq += 4 * nq + (0 if c == 4 or not v_req else c * nq)  # softmax(fp32) and its cast
        if model.attn_logit_softcapping:
            per_sq += c * nq  # tanh output (Gemma 2 soft-capping)
        o_shared = False  # transpose().contiguous() is a new tensor
    return per_token, per_sq, o_shared


def _mlp_block(model: ModelSpec, dt: Dtypes, lins: dict[str, Linear], lora: set[str], rank: int,
               input_grad: bool, stream_grad: bool, fc1_out: int, lg: bool = False) -> tuple[int, int]:
    """``(per token, constant)`` from the attention output on: the norms between attention and MLP,
    the MLP (dense, MoE or Phi-2's), the norm after it and MoE's offsets."""
    h, c, fam = model.hidden_size, dt.compute, model.family
    four_norms = fam in ("gemma2", "gemma3")
    per_token = const = 0
    # --- between attention and MLP ------------------------------------------------------------
    if four_norms:  # post_attention_layernorm on the attention output, then pre_feedforward_layernorm
        per_token += 2 * _norm(model, h, dt.stream, dt, True)
        const += 2 * _norm_const(model, h)
    elif fam == "olmo2":  # post_attention_layernorm on the attention output
        per_token += _norm(model, h, c, dt, True)
    elif fam != "phi":  # post_attention_layernorm: the MLP's pre-norm
        per_token += _norm(model, h, dt.stream, dt, stream_grad, lg=lg)
        const += _norm_const(model, h) if stream_grad else 0

    # --- MLP block -----------------------------------------------------------------------------
    i = model.intermediate_size
    if model.num_experts:
        per_token += _moe(model, dt)
        const += expert_wrapper_bytes(model, lora, dt)
    elif fam == "phi":
        per_token += _phi_mlp(model, dt, lins, lora, rank, input_grad, fc1_out)
    else:
        up = [lins[n] for n in model.mlp_in_names()]
        per_token += _linear_group(h, dt.stream, up, lora, dt, rank, input_grad=stream_grad)
        # the activation's inputs need a gradient unless the stream does not and gate/up are frozen
        mlp_grad = stream_grad or any(lin.name in lora for lin in up)
        # bitsandbytes' Linear4bit returns its input's dtype (``.to(inp_dtype)``): fp32 gate/up outputs
        # from an fp32 stream (QLoRA prepared by peft or TRL), where an nn.Linear under autocast
        # returns the compute dtype; the activation and the product then run in fp32
        mlp_dt = dt.stream if dt.quantized else c
        if mlp_grad:  # gate (or gate_up storage), act output, up; Liger's SwiGLU keeps no act output
            per_token += liger.swiglu_saved(i, mlp_dt) if lg else 3 * mlp_dt * i
        per_token += _linear_group(i, mlp_dt, [lins[model.mlp_out_name]], lora, dt, rank, input_grad=mlp_grad)
    if four_norms or fam == "olmo2":  # post_feedforward_layernorm on the MLP output
        per_token += _norm(model, h, c, dt, True)
        const += _norm_const(model, h)
    const += 4 * model.num_experts  # MoE int32 offsets
    return per_token, const


def _phi_mlp(model: ModelSpec, dt: Dtypes, lins: dict[str, Linear], lora: set[str], rank: int,
             input_grad: bool, fc1_out: int) -> int:
    """Phi-2's ``PhiMLP``, ``fc2(gelu_new(fc1(x)))``, and the dropout of its output; ``fc1``'s input
    (the shared LayerNorm output) is counted with the attention projections, ``fc1_out`` is its
    output's dtype. In the first layer of a LoRA model without input gradients, ``fc1``'s output
    requires a gradient only if ``fc1`` has an adapter; otherwise the MLP saves nothing."""
    if not (input_grad or "fc1" in lora):
        return 0
    act, act_out = ops.gelu_new(model.intermediate_size, fc1_out, dt)
    saved = act + _linear_group(model.intermediate_size, act_out, [lins["fc2"]], lora, dt, rank)
    return saved + (ops.dropout_mask(model.hidden_size) if model.resid_dropout else 0)


#: families whose ``apply_rotary_pos_emb`` ends in ``torch.cat([rotated, passed], dim=-1)`` (partial
#: rotary; transformers ``modeling_phi3``, ``modeling_phi``): the rotated query is a new tensor in
#: (batch, heads, seq, dim) order (``reportgen trace``: an ``aten.clone`` of the attention output)
ROPE_BY_CAT = ("phi", "phi3")


def sdpa_masked_layers(model: ModelSpec, setup: TrainingSetup) -> int:
    """Decoder layers whose SDPA call gets an explicit attention mask. transformers passes none, and
    lets SDPA apply ``is_causal``, only when nothing is padded and no sliding window cuts the
    sequence (``masking_utils._ignore_causal_mask_sdpa``: not when ``kv_length >= local_attention_size``);
    otherwise ``sdpa_mask`` materialises a boolean (batch, 1, seq, seq) mask. So a padded batch
    masks every layer, and a sequence at least as long as the sliding window masks the
    sliding-window layers (Phi-3 mini: window 2,047, every layer; Gemma 3: five layers in six).
    Packed data (no padding, ``position_ids`` restart) passes no mask here."""
    if setup.modeling is Modeling.torchtune:  # no mask on its padded batches (recipes.py)
        return 0
    if setup.seq_mean is not None and setup.padding.value != "packed":
        return model.num_layers
    if model.sliding_window and setup.seq >= model.sliding_window:
        return model.sliding_layers
    return 0


def sdpa_kv_repeated(model: ModelSpec, masked: bool, setup: TrainingSetup | None = None) -> bool:
    """transformers hands SDPA k and v repeated to all query heads (``repeat_kv``, new tensors) instead
    of passing ``enable_gqa`` when there is a mask or a head dimension above 256
    (``integrations/sdpa_attention.py`` ``use_gqa_in_sdpa``); torchtune's attention always does
    (``modules/attention.py`` ``MultiHeadAttention.forward``, ``recipes.py``)."""
    return model.num_kv_heads != model.num_heads and (masked or model.head_dim > 256 or (
        setup is not None and setup.modeling is Modeling.torchtune))


def sdpa_kernel(model: ModelSpec, setup: TrainingSetup, c: int, masked: bool | None = None) -> str:
    """The kernel CUDA's SDPA takes on sm80+ for the inputs transformers passes, as ``trace/kernels.py``
    ``sdpa_backend`` (``sdp_utils.cpp`` ``select_sdp_backend``, torch 2.11, the harness's):

    * ``flash``: 16-bit inputs, no attention mask (``sdpa_masked_layers``), head dimension at most
      256; grouped-query attention through
      ``enable_gqa``, which transformers passes when there is no mask
      (``integrations/sdpa_attention.py`` ``use_gqa_in_sdpa``; with a mask it repeats k and v to
      all heads first, ``repeat_kv``);
    * ``math``: fp32 inputs of a grouped-query model without a mask: flash takes 16-bit only and the
      memory-efficient kernel refuses k/v with fewer heads than q
      (``check_batch_size_and_num_heads_dense<false>``), so the composite
      ``_scaled_dot_product_attention_math`` runs and autograd keeps its ``s x s`` probabilities
      (``attention.cpp``). Measured: Llama-3.2-1B LoRA fp32 at 2,048 tokens allocates 21.74 GiB,
      8.4 GiB more than the memory-efficient kernel would (``results/validation``);
    * ``efficient``: everything else (fp32 without grouped-query attention, or a layer with a mask:
      a padded batch or a sliding window shorter than the sequence, ``sdpa_masked_layers``).

    ``masked``: whether this layer's call has a mask (default: whether any layer's has).
    """
    if masked is None:
        masked = sdpa_masked_layers(model, setup) > 0
    if c == 2 and not masked and model.head_dim <= 256:
        return "flash"
    if c == 4 and model.num_kv_heads != model.num_heads and not sdpa_kv_repeated(model, masked, setup):
        return "math"  # k and v at fewer heads than q (repeated ones, transformers' or torchtune's, go efficient)
    return "efficient"


def flash_attention(model: ModelSpec, setup: TrainingSetup, c: int) -> bool:
    """CUDA's SDPA takes the FlashAttention kernel (``sdpa_kernel``)."""
    return sdpa_kernel(model, setup, c) == "flash"


def _qkv_requires_grad(model: ModelSpec, lora: set[str]) -> tuple[bool, bool, bool]:
    if model.family == "phi3":
        return ("qkv_proj" in lora,) * 3
    return ("q_proj" in lora, "k_proj" in lora, "v_proj" in lora)


def expert_wrapper_bytes(model: ModelSpec, lora: set[str], dt: Dtypes) -> int:
    """LoRA on transformers >= 5 MoE experts (3-D parameters) goes through peft's ``ParamWrapper``
    (``tuners/lora/layer.py``), which forms each wrapped tensor's merged weight ``W + B A`` with
    ``torch.baddbmm`` before the grouped matmul, and autograd keeps it for the backward: per layer
    the full expert weights, ``E x out x in`` in the experts' dtype (Mixtral 8x7B: 8 x (28,672 +
    14,336) x 4,096 x 2 bytes = 2.62 GiB). Found by ``reportgen trace`` (peft_expert_wrapper)."""
    # in the experts' storage dtype (fp32 once prepare_model_for_kbit_training has upcast them)
    return sum(lin.weight_params for lin in model.layer_linears() if lin.count > 1 and lin.name in lora) * dt.base


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

    Qwen3-MoE (``Qwen3MoeTopKRouter``) differs in the router only: the sum and the renormalised
    top-k weights are kept only with ``norm_topk_prob``, and the weights are cast back to the
    router logits' dtype (the compute dtype) before the experts, so each route keeps a 16-bit
    weight under autocast where Mixtral keeps an fp32 one.
    """
    h, i, k, e = model.hidden_size, model.intermediate_size, model.experts_per_token, model.num_experts
    x = dt.stream
    saved = 4 * e + 8 * k + (4 + 4 * k if model.norm_topk_prob else 0)
    if dt.trainable_base:  # the router's input (its own 16-bit copy under autocast)
        saved += (dt.compute if dt.autocast and x != dt.compute else x) * h
    weight = dt.compute if model.family == "qwen3_moe" else 4
    per_route = 3 * 8 + weight + x * (2 * i + i + h)
    if dt.trainable_base:
        per_route += x * (h + i)
    return saved + k * per_route


def fixed_activations(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, head_module: bool = True) -> int:
    """Saved tensors outside the decoder layers, excluding the loss (see ``logits.py``).
    ``head_module=False``: the loss never calls ``lm_head`` (TRL's fused LM head, ``recipes.py``,
    which saves its own copy of the head's input).

    Embedding backward saves the int64 token ids when the embedding is trainable; Gemma's scaled
    embedding (``GemmaTextScaledWordEmbedding``: ``embedding * embed_scale``) saves the 0-d scale;
    the final norm saves like the layers' norms (Phi-2: ``final_layernorm``, a LayerNorm);
    ``lm_head`` saves its input when trainable; RoPE's cos/sin are shared by all layers.
    """
    t = setup.batch * setup.seq
    h = model.hidden_size
    saved = 0
    if dt.trainable_base:
        saved += 8 * t  # input ids
    if model.family in GEMMA_NORM and dt.trainable_base:
        saved += dt.stream  # the embedding scale (sqrt(h) as a tensor) saved by the multiply
    if model.layer_norm_kind == "layer":
        ln_token, ln_const, head_in = ops.layer_norm(h, dt)
        saved += ln_token * t + ln_const
    else:
        lg = setup.kernels is Kernels.liger and model.model_type in liger.LIGER_MODEL_TYPES
        saved += _norm(model, h, dt.stream, dt, True, lg=lg) * t + _norm_const(model, h)
        head_in = dt.stream
    if dt.trainable_base and head_module:  # lm_head input
        saved += (dt.compute if dt.autocast and head_in != dt.compute else head_in) * h * t
    elif dt.quant_holds_input and setup.quant_head and not model.tie_word_embeddings:
        # a 4-bit head under bitsandbytes <= 0.43.1 keeps its input like the other 4-bit linears
        saved += dt.compute * h * t
    sel = model.lora_selection(setup.lora_targets) if setup.is_peft else None
    a_out = dt.compute if dt.autocast else dt.adapter  # lora_A's output, saved by lora_B
    if sel is not None and sel.head:
        # peft Linear on lm_head: lora_A keeps its (cast) input, lora_B the rank-r output
        kept, _ = _adapter_input(h, head_in, dt, shared=False, input_grad=True)
        saved += (kept + a_out * setup.lora_rank) * t
    if sel is not None and sel.embed:
        # peft Embedding: F.embedding(ids, lora_embedding_A.T) keeps the int64 ids for A's gradient;
        # ``after_A @ lora_embedding_B.T`` keeps after_A (cast to 16 bit under autocast)
        saved += (8 + a_out * setup.lora_rank) * t
    if not setup.grad_ckpt:
        # RoPE cos and sin, (1, seq, rotary_dim) each, shared by all layers of a type (Gemma 3 has
        # one table per layer type), in the stream dtype; OLMo 2 keeps them fp32. With
        # checkpointing they are inputs of the checkpointed layers, not saved tensors.
        rope_bytes = 4 if model.family == "olmo2" else dt.stream
        saved += model.rope_tables * 2 * setup.seq * model.rotary_dim * rope_bytes
    return saved


def held_4bit_inputs(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """Bytes of the distinct tensors bitsandbytes <= 0.43.1 keeps on ``ctx`` for one micro-batch:
    every 4-bit linear's input that requires a gradient (``ctx.tensors = (A, B)``, ``libraries.py``),
    one tensor per group of linears reading the same input: per layer the attention input, the
    attention output (``o_proj``/``dense`` input), the MLP input unless shared with attention (Phi-2's
    parallel block) and the MLP output projection's input; the head's input with ``quant_head``. In
    the first layer of LoRA without checkpointing the attention input needs no gradient. While a
    training loop keeps the step's graph referenced (``keep_outputs``) these outlive its backward."""
    if not dt.quant_holds_input:
        return 0
    t = setup.batch * setup.seq
    groups = [model.hidden_size, model.q_dim]  # attention input, attention output
    if model.family != "phi":
        groups.append(model.hidden_size)  # the MLP's input (after the post-attention norm)
    groups.append(model.intermediate_size)  # the MLP output projection's input
    per_layer = sum(groups) * dt.compute
    embed = setup.is_peft and model.lora_selection(setup.lora_targets).embed
    first_free = setup.is_peft and not setup.grad_ckpt and not embed
    total = model.num_layers * per_layer - (model.hidden_size * dt.compute if first_free else 0)
    if setup.quant_head and not model.tie_word_embeddings:
        total += model.hidden_size * dt.compute
    return total * t


def layer_input_bytes(model: ModelSpec, dt: Dtypes, first_layer: bool = True) -> int:
    """Bytes per element of a decoder layer's input hidden states: the stream dtype, except Phi-2
    under QLoRA with autocast after the first layer. There ``fc2`` (a bitsandbytes ``Linear4bit``,
    which returns its input's dtype) reads ``gelu_new``'s fp32 output (``ops.gelu_new``), so the
    residual sum ``attn + mlp + residual`` (``PhiDecoderLayer``) is fp32 from the first layer on."""
    if not first_layer and model.family == "phi" and dt.quantized and dt.autocast:
        return 4
    return dt.stream


def checkpointed_layer(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, first_layer: bool = True) -> int:
    """With (non-reentrant) activation checkpointing a layer keeps only its input hidden states
    (``torch.utils.checkpoint``; transformers ``GradientCheckpointingLayer``)."""
    return layer_input_bytes(model, dt, first_layer) * model.hidden_size * setup.batch * setup.seq


def all_layers(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, attn: Attention | None = None) -> int:
    """Bytes all decoder layers hold for backward at the end of the forward pass."""
    if setup.grad_ckpt:
        return checkpointed_layer(model, setup, dt) + (model.num_layers - 1) * checkpointed_layer(
            model, setup, dt, first_layer=False)
    # LoRA on the embeddings makes the first layer's input require a gradient like every other's
    embed = setup.is_peft and model.lora_selection(setup.lora_targets).embed
    # layers with an attention mask (sdpa_masked_layers) save more; the first layer is one of them
    # whenever any is (Gemma 3's full-attention layers are every sixth from the sixth)
    masked = sdpa_masked_layers(model, setup)
    first = layer_activations(model, setup, dt, first_layer=not embed, attn=attn, masked=masked > 0).bytes
    rest_masked = max(masked - 1, 0)
    rest_plain = model.num_layers - 1 - rest_masked
    total = first
    if rest_masked:
        total += rest_masked * layer_activations(model, setup, dt, attn=attn, masked=True).bytes
    if rest_plain:
        total += rest_plain * layer_activations(model, setup, dt, attn=attn, masked=False).bytes
    return total
