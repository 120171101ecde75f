"""Parameter-side memory terms: weights, adapters, quantization constants, gradients, optimizer
states and autocast's weight copies. Every function returns bytes for ONE GPU before sharding.
"""

from __future__ import annotations

import math

from reportgen.estimate import dora
from reportgen.estimate import recipes as RC
from reportgen.estimate.dtypes import Dtypes
from reportgen.model import ModelSpec
from reportgen.setup import Method, Modeling, Optimizer, TrainingSetup

#: bitsandbytes 4-bit blocksize (``bitsandbytes/functional.py`` ``quantize_4bit`` default, CUDA)
BNB_4BIT_BLOCKSIZE = 64
#: double quantization groups 256 first-level absmax values (``quantize_4bit(compress_statistics=True)``
#: -> ``quantize_blockwise(absmax, blocksize=256)``)
BNB_NESTED_BLOCKSIZE = 256
#: bitsandbytes 8-bit optimizers: blockwise state quantization with 256-value blocks and fp32
#: absmax per block (``bitsandbytes/optim/optimizer.py`` ``Optimizer8bit.init_state``)
BNB_OPT_BLOCKSIZE = 256
#: tensors with fewer elements keep 32-bit states (``min_8bit_size`` default)
BNB_MIN_8BIT_SIZE = 4096
#: paged optimizers allocate a state in managed memory only from this many elements
#: (``Optimizer8bit.get_state_buffer``: ``p.numel() < 1e5`` -> ordinary tensor)
BNB_PAGED_MIN_SIZE = 100_000


def head_quantized(model: ModelSpec, setup: TrainingSetup | None) -> bool:
    """``quant_head`` on an untied head (a head tied to the embeddings is the embedding matrix,
    which bitsandbytes' linear replacement does not touch)."""
    return bool(setup is not None and setup.quant_head and not model.tie_word_embeddings)


def quantized_linear_params(model: ModelSpec, setup: TrainingSetup | None = None) -> int:
    """Weights bitsandbytes 4-bit quantizes: every ``nn.Linear`` in the decoder layers (transformers
    keeps ``lm_head`` unquantized, ``get_keys_to_not_convert``; Lightning Fabric's
    ``BitsandbytesPrecision`` converts every ``nn.Linear``, the head included: ``quant_head``).
    Biases stay in 16 bit. MoE experts are 3-D ``nn.Parameter`` tensors in transformers >= 5
    (``MixtralExperts``), which ``replace_with_bnb_linear`` does not touch (it converts ``nn.Linear``
    only): they stay 16-bit."""
    layers = model.num_layers * sum(lin.weight_params for lin in model.layer_linears() if lin.count == 1)
    return layers + (model.vocab_size * model.hidden_size if head_quantized(model, setup) else 0)


def weights_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """Base model weights as stored on the GPU.

    full / lora: ``P x bytes(base dtype)``. qlora: the packed 4-bit linears (two values per byte,
    ``Params4bit``) plus everything else (embeddings, norms, head, biases) in the base dtype, the
    embeddings and an unquantized head in their own dtype where the recipe gives them one
    (``dtypes.py``: TRL's cast back to bf16). torchtune's model adds its RoPE caches (buffers,
    ``recipes.rope_cache_bytes``).
    """
    embed = model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings else 2)
    q = quantized_linear_params(model, setup) if setup.method == Method.qlora else 0
    if head_quantized(model, setup):
        embed -= model.vocab_size * model.hidden_size  # the head is among the 4-bit weights
    return q // 2 + (model.total_params - q - embed) * dt.base + embed * dt.embed_bytes + vision_weights_bytes(
        model, setup, dt) + (RC.rope_cache_bytes(model, setup) if setup.modeling is not Modeling.transformers else 0)


def vision_weights_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """A multimodal checkpoint's vision tower and projector (``vision.py``): loaded with the model in
    the base dtype, its ``nn.Linear`` weights 4-bit under QLoRA like the decoder's. It does not run on
    text batches, so it has no activations, and no gradients or optimizer states even when trainable
    (a parameter without a gradient gets no AdamW state: ``torch.optim.AdamW`` skips ``grad is None``)."""
    vis = model.vision
    if vis is None:
        return 0
    q = vis.linear_weight_params if setup.method == Method.qlora else 0
    return q // 2 + (vis.params - q) * dt.base


def vision_lora_params(model: ModelSpec, setup: TrainingSetup) -> int:
    """LoRA adapters peft puts on a vision tower's linears (``vision.py``): weights only, never a
    gradient (the tower does not run on text)."""
    if model.vision is None or not setup.is_peft:
        return 0
    sel = model.lora_selection(setup.lora_targets)
    return model.vision.lora_params(setup.lora_rank, sel.linears, setup.lora_targets == "all-linear")


def quant_constants_bytes(model: ModelSpec, setup: TrainingSetup) -> int:
    """bitsandbytes 4-bit quantization state per quantized weight (``QuantState``).

    Without double quantization: one fp32 absmax per 64 weights (0.5 bit/param). With it
    (Dettmers et al. 2023, QLoRA section 3): the absmax values are quantized to 8 bit in blocks of
    256 with fp32 second-level constants, an fp32 offset and a 256-entry fp32 code (0.127 bit/param).
    """
    if setup.method != Method.qlora:
        return 0
    total = 0
    for lin in model.layer_linears():
        if lin.count > 1:  # MoE experts stay 16-bit (see quantized_linear_params)
            continue
        n = lin.in_features * lin.out_features
        blocks = math.ceil(n / BNB_4BIT_BLOCKSIZE)
        code = 16 * 4  # the 16-value NF4/FP4 code book, fp32
        if setup.double_quant:
            nested = math.ceil(blocks / BNB_NESTED_BLOCKSIZE)
            total += blocks + nested * 4 + 4 + 256 * 4 + code
        else:
            total += blocks * 4 + code
    vision = sum(n * _constants(a * b, setup) for _, a, b, n, _ in model.vision.linears()) if model.vision else 0
    if head_quantized(model, setup):
        blocks = math.ceil(model.vocab_size * model.hidden_size / BNB_4BIT_BLOCKSIZE)
        nested = math.ceil(blocks / BNB_NESTED_BLOCKSIZE)
        head = (blocks + nested * 4 + 4 + 256 * 4 if setup.double_quant else blocks * 4) + 16 * 4
        return total * model.num_layers + head + vision
    return total * model.num_layers + vision


def _constants(n: int, setup: TrainingSetup) -> int:
    """``quant_constants_bytes`` of one quantized weight of ``n`` values."""
    blocks = math.ceil(n / BNB_4BIT_BLOCKSIZE)
    if setup.double_quant:
        return blocks + math.ceil(blocks / BNB_NESTED_BLOCKSIZE) * 4 + 4 + 256 * 4 + 16 * 4
    return blocks * 4 + 16 * 4


def lora_params(model: ModelSpec, setup: TrainingSetup) -> int:
    """Adapter parameters: LoRA's ``A`` and ``B`` (``ModelSpec.lora_params``) and, with DoRA, the
    magnitude vectors (``dora.magnitude_params``)."""
    if not setup.is_peft:
        return 0
    return model.lora_params(setup.lora_rank, setup.lora_targets) + dora.magnitude_params(model, setup)


def targeted(model: ModelSpec, setup: TrainingSetup):
    """The ``LoraSelection`` of a PEFT setup (``ModelSpec.lora_selection``), None for full fine-tuning."""
    return model.lora_selection(setup.lora_targets) if setup.is_peft else None


def trainable_params(model: ModelSpec, setup: TrainingSetup) -> int:
    return model.total_params if setup.method == Method.full else lora_params(model, setup)


def adapter_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """LoRA A and B matrices, fp32 unless pure bf16 (peft ``autocast_adapter_dtype``); a vision
    tower's too (``vision_lora_params``)."""
    return (lora_params(model, setup) + vision_lora_params(model, setup)) * dt.adapter


def trainable_dtype_bytes(setup: TrainingSetup, dt: Dtypes) -> int:
    return dt.base if setup.method == Method.full else dt.adapter


def gradient_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """One gradient per trainable parameter, in the parameter's dtype: under autocast the gradient
    of an fp32 master weight is fp32, 4 bytes (PyTorch AMP; the reference notes: "Gradients take
    4 bytes in reality"). Frozen weights get none."""
    return trainable_params(model, setup) * trainable_dtype_bytes(setup, dt)


def optimizer_state_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> tuple[int, int]:
    """Optimizer states as ``(torch-allocated bytes, bytes in CUDA managed memory)``.

    * ``adamw``: exp_avg and exp_avg_sq in the parameter dtype (``torch.optim.AdamW``
      ``_init_group``: ``zeros_like(p)``), so 8 bytes/param for fp32 master weights, 4 for pure bf16.
    * ``adamw-8bit``: two uint8 states plus one fp32 absmax per 256 values each (bitsandbytes
      blockwise 8-bit optimizers, Dettmers et al. 2022); tensors under 4096 elements keep fp32 states.
    * ``paged-adamw-8bit``: the same bytes, but states of tensors with at least 1e5 elements live in
      CUDA managed memory that ``torch.cuda.memory_allocated`` does not count.
    * ``paged-adamw``: bitsandbytes ``PagedAdamW`` (``optim_bits=32``): two fp32 states per parameter
      whatever its dtype (``Optimizer2State.init_state``: ``dtype = torch.float32`` for 32 bits), in
      managed memory from 1e5 elements on (``get_state_buffer``). litgpt trains QLoRA with it.
    * ``sgd``: ``torch.optim.SGD`` without momentum (HF Trainer ``optim=sgd``): no state.
    * ``adafactor``: transformers' Adafactor, factored second moment only (``beta1=None``): a row and
      a column vector (fp32) per matrix, a full fp32 vector per 1-D parameter (Shazeer & Stern 2018).
    """
    shapes = trainable_shapes(model, setup)
    pbytes = trainable_dtype_bytes(setup, dt)
    opt = setup.optimizer
    torch_bytes = managed = 0
    for shape, count in shapes:
        n = math.prod(shape)
        if opt == Optimizer.adamw:
            torch_bytes += count * 2 * n * pbytes
        elif opt in (Optimizer.adamw_8bit, Optimizer.paged_adamw_8bit):
            if n < BNB_MIN_8BIT_SIZE:
                torch_bytes += count * 2 * n * 4
                continue
            absmax = 2 * math.ceil(n / BNB_OPT_BLOCKSIZE) * 4
            if opt == Optimizer.paged_adamw_8bit and n >= BNB_PAGED_MIN_SIZE:
                managed += count * 2 * n
            else:
                torch_bytes += count * 2 * n
            torch_bytes += count * absmax
        elif opt == Optimizer.paged_adamw:
            if n >= BNB_PAGED_MIN_SIZE:
                managed += count * 2 * n * 4
            else:
                torch_bytes += count * 2 * n * 4
        elif opt == Optimizer.adafactor:
            if len(shape) >= 2:
                torch_bytes += count * (shape[0] + shape[1]) * 4
            else:
                torch_bytes += count * n * 4
    if opt in (Optimizer.adamw_8bit, Optimizer.paged_adamw_8bit):
        torch_bytes += 2 * 256 * 4  # qmap1/qmap2 dynamic quantization maps, shared
    return torch_bytes, managed


def trainable_shapes(model: ModelSpec, setup: TrainingSetup) -> list[tuple[tuple[int, ...], int]]:
    """(shape, how many) of every trainable parameter tensor."""
    h, layers = model.hidden_size, model.num_layers
    if setup.is_peft:
        r = setup.lora_rank
        sel = targeted(model, setup)
        out = []
        for lin in model.layer_linears():
            if lin.name in sel.linears:
                rr = lin.lora_rank(r)
                out += [((rr, lin.in_features), layers * lin.count), ((lin.out_features, rr), layers * lin.count)]
        if sel.head:  # peft Linear on lm_head: A r x h, B V x r
            out += [((r, h), 1), ((model.vocab_size, r), 1)]
        if sel.embed:  # peft Embedding: lora_embedding_A r x V, lora_embedding_B h x r
            out += [((r, model.vocab_size), 1), ((h, r), 1)]
        return out + dora.magnitude_shapes(model, setup)
    out = [((model.vocab_size, h), 1)] + model.norm_shapes()
    if not model.tie_word_embeddings:
        out.append(((model.vocab_size, h), 1))
    if model.lm_head_bias:
        out.append(((model.vocab_size,), 1))
    for lin in model.layer_linears():
        shape = (lin.out_features, lin.in_features) if lin.count == 1 else (lin.count, lin.out_features, lin.in_features)
        out.append((shape, layers))
        if lin.bias:
            out.append(((lin.out_features,), layers * lin.count))
    return out


def autocast_copy_bytes_per_layer(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """16-bit copies autocast makes of fp32 weights for one layer's matmuls.

    autocast caches the cast of each fp32 leaf weight that requires grad for the whole forward pass
    (``autocast_mode.cpp`` ``cached_cast``) and each cast is saved for the backward pass, so the
    copies live until that layer's backward (until the forward's end with checkpointing).
    Full fine-tuning: every linear weight and bias; LoRA: the fp32 adapters.
    """
    if not dt.autocast:
        return 0
    if setup.method == Method.full:
        # weights only: bias casts are cached too but not saved, and the MoE grouped matmul of
        # transformers >= 5 is a custom op autocast leaves in fp32
        return sum(lin.weight_params for lin in model.layer_linears() if lin.count == 1) * dt.compute
    if dt.adapter == 2 and setup.compute_dtype == "bf16":
        return 0  # bf16 adapters (TRL's cast, recipes.py) under bf16 autocast: nothing to cast
    r = setup.lora_rank
    sel = targeted(model, setup)
    return sum(lin.lora_rank(r) * (lin.in_features + lin.out_features) * lin.count
               for lin in model.layer_linears() if lin.name in sel.linears) * dt.compute


def frozen_cast_bytes_per_layer(model: ModelSpec, dt: Dtypes) -> int:
    """LoRA on fp32 frozen weights under autocast (``frozen_dtype=fp32``): autocast casts each frozen
    weight per use without caching it (``autocast_mode.cpp`` caches only weights that require grad)
    and the matmul saves that 16-bit copy to compute its input's gradient, so one layer's copies
    live from its forward to its backward: ``sum(weight params of the layer's linears) x compute``.
    Grouped MoE experts run outside autocast (no copy)."""
    if not dt.frozen_cast:
        return 0
    return sum(lin.weight_params for lin in model.layer_linears() if lin.count == 1) * dt.compute


def frozen_head_cast_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """A frozen fp32 LM head (or tied embedding) under autocast: its 16-bit copy, made per forward
    and saved by the head's matmul for the input gradient until the loss backward (peft's
    ``prepare_model_for_kbit_training`` upcast, or ``frozen_dtype=fp32``): ``V x h x compute``."""
    if not dt.head_cast or head_quantized(model, setup):
        return 0
    return model.vocab_size * model.hidden_size * dt.compute


def autocast_copy_bytes_head(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """The head's (or tied embedding's) 16-bit copy under mixed-precision full fine-tuning; with
    LoRA, the fp32 adapters on the head (``A`` and ``B``: ``r (h + V)``) and the embeddings'
    ``lora_embedding_B`` (``h x r``, the matmul operand; ``lora_embedding_A`` is read by
    ``F.embedding``, which autocast does not cast)."""
    if not dt.autocast:
        return 0
    if setup.method == Method.full:
        return model.vocab_size * model.hidden_size * dt.compute
    sel = targeted(model, setup)
    r, h, v = setup.lora_rank, model.hidden_size, model.vocab_size
    return (sel.head * r * (h + v) + sel.embed * h * r) * dt.compute
