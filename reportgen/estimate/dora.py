"""DoRA (weight-decomposed LoRA, Liu et al. 2024; peft ``LoraConfig(use_dora=True)``): what it adds
to LoRA's memory and time, term by term.

Source: peft 0.21 ``tuners/lora/dora.py`` ``DoraLinearLayer`` and ``tuners/lora/variants.py``
``DoraLinearVariant``. For every adapted ``nn.Linear`` (or bitsandbytes ``Linear4bit``) peft adds a
trainable magnitude vector ``m`` of ``out_features`` values, initialised to the row norms of ``W``,
in the adapter dtype, and each forward computes::

    lora_weight = lora_B(lora_A(eye(in))).T           # get_lora_weight: the product B A, via an identity
    W = dequantize_module_weight(base).to(x.dtype)    # the dequantized weight for 4-bit
    norm = linalg.norm(W + scale * lora_weight.detach(), dim=1).detach()
    out = base_out + (m / norm - 1) * base_out + (m / norm) * lora_B(lora_A(x)) * scale

where ``x`` is the adapter's input (cast to the adapter dtype by ``Linear.forward``'s
``_cast_input_dtype``; left as it is by peft's 4-bit layer under autocast). What autograd keeps:

* the two ``mul`` by ``m / norm`` save their other operand for ``m``'s gradient: the base output
  and the LoRA output, ``tokens x out`` each (``saved_bytes_per_token``), and three ``out`` vectors
  (``m / norm``, ``m / norm - 1`` and the ``norm`` the ``div`` keeps: ``saved_constant_bytes``);
* the norm is detached, so ``lora_weight``'s graph (its ``eye`` input and its 16-bit cast) and the
  full-size ``W + scale B A`` are freed when the layer's forward returns: a forward transient of a
  few ``out x in`` matrices (``forward_transient_bytes``), again in the recomputed forward under
  checkpointing;
* with ``lora_dropout > 0`` the base output is recomputed from the dropped-out input,
  ``F.linear(dropout(x), W)``, whose input gradient keeps ``W`` in the matmul's dtype.

This module holds the memory terms; the kernels, FLOPs and bytes DoRA adds to a step (its time) are
counted with the rest of the step's inventory, ``work.dora_weight_work`` and ``work.dora_combine``.
"""

from __future__ import annotations

from reportgen.estimate.dtypes import Dtypes
from reportgen.model import Linear, ModelSpec
from reportgen.setup import TrainingSetup


def adapted_linears(model: ModelSpec, setup: TrainingSetup) -> list[Linear]:
    """The decoder linears that get a DoRA magnitude: the adapted ``nn.Linear`` ones. MoE experts
    (``count > 1``) go through peft's ``ParamWrapper``, which refuses ``use_dora``."""
    if not (setup.is_peft and setup.dora):
        return []
    sel = model.lora_selection(setup.lora_targets)
    return [lin for lin in model.layer_linears() if lin.name in sel.linears and lin.count == 1]


def experts_refused(model: ModelSpec, setup: TrainingSetup) -> bool:
    """peft raises for DoRA on MoE experts (``ParamWrapper``: "does not work with use_dora=True")."""
    if not (setup.is_peft and setup.dora):
        return False
    sel = model.lora_selection(setup.lora_targets)
    return any(lin.count > 1 and lin.name in sel.linears for lin in model.layer_linears())


def magnitude_params(model: ModelSpec, setup: TrainingSetup) -> int:
    """Trainable magnitudes: ``out_features`` per adapted linear per layer (``DoraLinearLayer.
    update_layer``: ``nn.Parameter(weight_norm)``, one norm per output row), ``V`` for a DoRA head,
    ``h`` for DoRA embeddings (``DoraEmbeddingLayer``: norms of ``W.T``'s rows).
    Llama 3.1 8B all-linear: 32 x (4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096) = 1,376,256."""
    if not (setup.is_peft and setup.dora):
        return 0
    sel = model.lora_selection(setup.lora_targets)
    layers = model.num_layers * sum(lin.out_features for lin in adapted_linears(model, setup))
    return layers + (model.vocab_size if sel.head else 0) + (model.hidden_size if sel.embed else 0)


def magnitude_shapes(model: ModelSpec, setup: TrainingSetup) -> list[tuple[tuple[int, ...], int]]:
    """(shape, how many) of the magnitude vectors, for the optimizer's per-tensor rules."""
    if not (setup.is_peft and setup.dora):
        return []
    sel = model.lora_selection(setup.lora_targets)
    out = [((lin.out_features,), model.num_layers) for lin in adapted_linears(model, setup)]
    if sel.head:
        out.append(((model.vocab_size,), 1))
    if sel.embed:
        out.append(((model.hidden_size,), 1))
    return out


def input_bytes(model: ModelSpec, lin: Linear, dt: Dtypes) -> int:
    """The dtype of a linear's input, as ``activations.layer_activations`` has it: the residual
    stream for the projections reading it, the attention output (compute dtype) for the output
    projection, the MLP product for the down projection (the stream's dtype behind a 4-bit layer,
    which returns its input's dtype)."""
    if lin.name == model.attn_out_name:
        return dt.compute
    if lin.name == model.mlp_out_name:
        return dt.stream if dt.quantized else dt.compute
    return dt.stream


def dora_input_bytes(model: ModelSpec, lin: Linear, dt: Dtypes) -> int:
    """The dtype DoRA works in (``x.dtype`` in ``DoraLinearLayer.forward``): the adapter dtype, to
    which ``Linear.forward`` casts ``x``; peft's 4-bit layer casts only without autocast
    (``bnb.py``: ``requires_conversion = not torch.is_autocast_enabled()``)."""
    if dt.quantized and dt.autocast:
        return input_bytes(model, lin, dt)
    return dt.adapter


def saved_bytes_per_token(lin: Linear, in_bytes: int, dt: Dtypes) -> int:
    """Per token, what the DoRA combination saves for one adapted linear: the base output
    (``(m/norm - 1) * base_result``) and the LoRA output (``m/norm * lora_result``), ``out`` values
    each. The base output is the compute dtype from an ``nn.Linear`` under autocast, the input's
    dtype from a 4-bit layer (bitsandbytes returns its input's dtype; peft ``.clone()``s it) and
    the storage dtype without autocast; the LoRA output is ``lora_B``'s, the compute dtype under
    autocast, else the adapter dtype. With dropout the recomputed ``F.linear`` returns the compute
    dtype under autocast, ``x``'s dtype otherwise.
    ``in_bytes``: the linear's input dtype. Llama 3.1 8B, LoRA bf16-mixed, gate_proj: 14336 x (2 + 2)
    = 57,344 bytes per token."""
    lora_out = dt.compute if dt.autocast else dt.adapter
    if dt.lora_dropout:
        base_out = dt.compute if dt.autocast else dt.adapter  # x is in the adapter dtype without autocast
    elif dt.quantized:
        base_out = in_bytes
    else:
        base_out = dt.compute if dt.autocast else dt.base
    return lin.out_features * (base_out + lora_out)


def saved_constant_bytes(model: ModelSpec, lin: Linear, dt: Dtypes, input_grad: bool) -> int:
    """Per adapted linear, what does not scale with tokens: the ``div`` keeps ``norm`` (in ``x``'s
    dtype) and the two ``mul`` keep ``m/norm - 1`` (when the base output needs a gradient) and
    ``m/norm`` (the adapter dtype), ``3 x out x 4`` bytes under LoRA bf16-mixed; with dropout, the
    recomputed ``F.linear(dropout(x), W.to(x.dtype))`` keeps the weight for its input's gradient
    (``out x in`` in the compute dtype under autocast, a new copy; without autocast a copy only
    when ``W``'s dtype is not ``x``'s, and none when the input needs no gradient)."""
    # the norm is in x's dtype (``.to(weight.dtype)``, the weight cast to x's dtype), m/norm promotes
    # to m's; a frozen base reading an input that needs no gradient (LoRA's first layer) gives an
    # output that needs none, so ``m/norm - 1`` is then not saved
    x_b = dora_input_bytes(model, lin, dt)
    vectors = lin.out_features * (x_b + (2 if input_grad else 1) * dt.adapter)
    if not (dt.lora_dropout and input_grad):
        return vectors
    if dt.autocast:
        copy = dt.compute
    else:
        copy = x_b if (dt.quantized or dt.base != x_b) else 0
    return vectors + lin.weight_params * copy


def forward_transient_bytes(model: ModelSpec, lin: Linear, dt: Dtypes, rank: int, tokens: int) -> int:
    """The largest live set of one adapted linear's DoRA forward beyond the saved tensors, the larger
    of two moments (``DoraLinearLayer.forward``), plus ``x``'s adapter-dtype cast when it is a new
    tensor (``tokens x in``):

    * ``lora_B(lora_A(eye))`` (``get_lora_weight``): the ``in x in`` identity in the adapter dtype,
      its 16-bit cast under autocast (saved by ``lora_A``), ``lora_A``'s ``in x r`` and ``lora_B``'s
      ``in x out`` outputs;
    * the norm (``get_weight_norm``): the identity's saved cast (or the identity), ``in x r``, the
      product ``lora_weight`` (cast to ``x``'s dtype), the weight cast to ``x``'s dtype (a new tensor
      when its dtype differs, always for 4-bit: ``dequantize_4bit``), ``scale * lora_weight`` and
      the sum, ``out x in`` each.

    Llama 3.1 8B, LoRA r16 bf16-mixed, down_proj (in 14336, out 4096): identity 14336^2 x 4 =
    822,083,584, its cast 411,041,792, 14336 x 16 x 2 = 458,752, B out 14336 x 4096 x 2 =
    117,440,512: 1,351,024,640 (the norm moment: 411,041,792 + 458,752 + 4 x 4096 x 14336 x 4 =
    1,351,024,640), plus x's fp32 cast 512 x 14336 x 4 = 29,360,128 at seq 512."""
    a, c = dt.adapter, dt.compute
    i, o = lin.in_features, lin.out_features
    mm_out = c if dt.autocast else a
    eye_cast = i * i * c if dt.autocast and a != c else 0
    eye_kept = eye_cast or i * i * a
    eye_moment = i * i * a + eye_cast + i * rank * mm_out + i * o * mm_out
    x_b = dora_input_bytes(model, lin, dt)
    weight_new = dt.quantized or dt.base != x_b
    norm_moment = (eye_kept + i * rank * mm_out + o * i * x_b + (o * i * x_b if weight_new else 0)
                   + 2 * o * i * x_b)
    x_in = input_bytes(model, lin, dt)
    cast = tokens * i * a if not (dt.quantized and dt.autocast) and x_in != a else 0
    return max(eye_moment, norm_moment) + cast


def layer_forward_transient_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """The largest ``forward_transient_bytes`` over a layer's adapted linears (one runs at a time),
    net of what that linear saves only after it (with dropout, its weight copy: the layer's saved
    tensors, which the memory timeline counts whole, do not hold it yet)."""
    tokens = setup.batch * setup.seq
    return max((forward_transient_bytes(model, lin, dt, setup.lora_rank, tokens)
                - (saved_constant_bytes(model, lin, dt, True) - saved_constant_bytes(model, lin, dt, False)
                   if dt.lora_dropout else 0)
                for lin in adapted_linears(model, setup)), default=0)


def adapted_weight_params(model: ModelSpec, setup: TrainingSetup) -> int:
    """Weights DoRA reads in full each forward (its ``W``): ``sum(out x in)`` over adapted linears, per
    token the FLOPs/2 of the base GEMM that DoRA with dropout runs again (``time.flops_per_token``)."""
    return model.num_layers * sum(lin.weight_params for lin in adapted_linears(model, setup))
