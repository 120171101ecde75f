"""Build the model of one case the way ``reportgen/setup.py`` describes each recipe.

Random weights, no hub, no downloads: the Hugging Face model comes from the config with
``AutoModelForCausalLM.from_config`` and transformers' own initialisation, created directly on
the device (``with torch.device(dev)``) in the storage dtype of the recipe:

=============  ==========================  ===========================  ========================
precision      full fine-tuning weights    LoRA/QLoRA frozen base       adapters (peft)
=============  ==========================  ===========================  ========================
fp32           fp32, no autocast           fp32                         fp32
fp16-mixed     fp32 + autocast(fp16)       fp16 + autocast(fp16)        fp32 (autocast_adapter_dtype)
bf16-mixed     fp32 + autocast(bf16)       bf16 + autocast(bf16)        fp32 (autocast_adapter_dtype)
bf16           bf16, no autocast           bf16                         bf16 (autocast_adapter_dtype=False)
=============  ==========================  ===========================  ========================

QLoRA: the model is built on the ``meta`` device (no memory), every ``nn.Linear`` except the
output head is replaced by a ``bitsandbytes.nn.Linear4bit`` whose weight is quantized from a
random 16-bit tensor made on the device one layer at a time (``Params4bit(...).to(device)`` calls
``bitsandbytes.functional.quantize_4bit``; blocksize 64, NF4/FP4, double quantization per setup),
then the remaining parameters and buffers (embeddings, norms, head, rotary frequencies) are
materialised on the device in the compute dtype and initialised by transformers'
``initialize_weights``. The whole 16-bit model never exists on the device. peft's
``prepare_model_for_kbit_training`` is NOT called: it upcasts embeddings and head to fp32, which
the estimator does not model; input gradients for checkpointing are enabled directly.

``use_cache=False``: a training step needs no KV cache (HF Trainer turns it off with checkpointing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reportgen.estimate.memory import effective_attention
from reportgen.model import ModelSpec
from reportgen.setup import FrozenDtype, KbitPrep, Method, Precision, TrainingSetup

#: config.json keys that are not model hyper-parameters or would change what we build
_DROP_KEYS = ("model_type", "quantization_config", "auto_map")


def lora_target_modules(spec: ModelSpec, targets: str) -> list[str] | str:
    """peft ``target_modules`` for a ``lora_targets`` value: peft's own ``"all-linear"`` (every
    ``nn.Linear`` but the output head), or the module names ``ModelSpec.lora_selection`` picks (Phi-3
    fuses q, k and v into ``qkv_proj``; Phi-2's output projection is ``dense``), with ``lm_head`` and
    ``embed_tokens`` when named."""
    if targets == "all-linear":
        return "all-linear"
    sel = spec.lora_selection(targets)
    names = sorted(sel.linears) + (["lm_head"] if sel.head else []) + (["embed_tokens"] if sel.embed else [])
    return names


@dataclass
class Built:
    model: object
    attn_implementation: str
    storage_dtype: str
    compute_dtype: str
    adapter_dtype: str | None
    notes: list[str] = field(default_factory=list)


def _torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def storage_dtype(setup: TrainingSetup) -> str:
    """dtype the (trainable or frozen) unquantized weights are stored in (``estimate/dtypes.py``)."""
    if setup.method == Method.full:
        return "bf16" if setup.precision == Precision.bf16 else "fp32"
    if setup.precision == Precision.fp32 or setup.frozen_dtype == FrozenDtype.fp32:
        return "fp32"
    return setup.compute_dtype


def adapter_dtype(setup: TrainingSetup) -> str | None:
    if not setup.is_peft:
        return None
    return "bf16" if setup.precision == Precision.bf16 else "fp32"


def hf_config(spec: ModelSpec, attn: str):
    """A transformers config object from the catalog's (or the user's) ``config.json``."""
    from transformers import AutoConfig

    import copy

    # a deep copy: transformers completes nested dicts in place (Llama 3's rope_scaling gains
    # rope_theta), which would change the catalog's cached config and every hash made from it
    raw = {k: copy.deepcopy(v) for k, v in spec.config.items() if k not in _DROP_KEYS}
    config = AutoConfig.for_model(spec.model_type, **raw)
    config.use_cache = False
    config._attn_implementation = attn
    return config


def build(spec: ModelSpec, setup: TrainingSetup, device: str, quant_storage: str | None = None) -> Built:
    """The model of one case on ``device``. ``quant_storage`` (QLoRA only): the dtype the packed
    4-bit weights are stored in (bitsandbytes ``quant_storage``; default uint8). FSDP shards and
    all-gathers them as ordinary tensors of that dtype, so ``distributed.py`` asks for the compute
    dtype, as fsdp_qlora and transformers' ``bnb_4bit_quant_storage`` do."""
    import torch

    attn, note = effective_attention(spec, setup)
    notes = [note.replace("estimated with", "measured with")] if note else []
    store, compute = storage_dtype(setup), setup.compute_dtype
    config = hf_config(spec, attn.value)
    torch.manual_seed(0)
    if setup.method == Method.qlora:
        model = _build_quantized(config, setup, device, _torch_dtype(compute), notes,
                                 _torch_dtype(quant_storage) if quant_storage else None)
    else:
        from transformers import AutoModelForCausalLM

        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=_torch_dtype(store),
                                                     attn_implementation=attn.value)
    if setup.kbit != KbitPrep.none or (setup.method == Method.qlora and setup.frozen_dtype == FrozenDtype.fp32):
        _prepare_kbit(model, notes)
    if setup.grad_ckpt:
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:  # transformers >= 5.20 name; the old one is a deprecated alias
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if setup.loss.value == "fused":
        _fuse_cross_entropy(model, notes)
    adapter = adapter_dtype(setup)
    if setup.is_peft:
        model = _add_lora(model, spec, setup, _torch_dtype(adapter))
        if setup.grad_ckpt:
            model.enable_input_require_grads()
        if setup.kbit == KbitPrep.trl and setup.frozen_dtype != FrozenDtype.fp32:
            _trl_cast(model, _torch_dtype(compute), notes)
    model.train()
    return Built(model=model, attn_implementation=attn.value, storage_dtype=store, compute_dtype=compute,
                 adapter_dtype=adapter, notes=notes)


def _prepare_kbit(model, notes: list[str]) -> None:
    """kbit_prep peft (and trl's first half): ``peft.prepare_model_for_kbit_training`` as the Hugging
    Face QLoRA recipe calls it; its checkpointing is left to ``grad_ckpt`` (the harness enables it
    the same way for every method), so only its fp32 upcast of every parameter that is not 4-bit
    and its freezing take effect here."""
    from peft import prepare_model_for_kbit_training

    prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    notes.append("peft prepare_model_for_kbit_training: parameters that are not 4-bit upcast to fp32")


def _trl_cast(model, compute_dtype, notes: list[str]) -> None:
    """kbit_prep trl: what older TRL's ``SFTTrainer`` did after ``get_peft_model`` when ``bf16`` was
    set on a 4-bit model (``trl.trainer.utils.peft_module_casting_to_bf16``, written out here so the
    plain loop needs no TRL): norms to fp32; ``lm_head`` and ``embed_tokens`` back to bf16 when fp32.
    TRL 1.16's SFTTrainer calls neither this nor peft's preparation; ``recipe trl-sft`` runs it as
    it is (``measure/sft.py``)."""
    import torch

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm) or "norm" in name:
            module.to(torch.float32)
        elif any(x in name for x in ("lm_head", "embed_tokens", "wte", "wpe")):
            if getattr(module, "weight", None) is not None and module.weight.dtype == torch.float32:
                module.to(compute_dtype)
    notes.append("TRL SFTTrainer bf16 cast: norms fp32, embeddings and LM head back to the compute dtype")


def _fuse_cross_entropy(model, notes: list[str]) -> None:
    """loss=fused: Liger-Kernel's chunked linear + cross-entropy replaces ``lm_head`` + the fp32
    loss; every other module stays as transformers wrote it, so the pair with loss=standard
    isolates the loss (``liger_kernel.transformers._apply_liger_kernel_to_instance``)."""
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    from reportgen.measure.optimizers import SetupNotSupported

    # Liger only logs (at INFO) and returns when it has no kernels for a model type: the case would
    # then run the standard loss while recorded as fused. Check that the forward was replaced.
    _apply_liger_kernel_to_instance(model=model, fused_linear_cross_entropy=True, cross_entropy=False,
                                    rope=False, rms_norm=False, swiglu=False, geglu=False, layer_norm=False)
    if not str(getattr(model.forward, "__module__", "")).startswith("liger_kernel"):
        raise SetupNotSupported(f"loss='fused': Liger-Kernel did not patch {type(model).__name__} "
                                f"(model_type {model.config.model_type!r}); the loss would be the standard one")
    notes.append("loss: Liger-Kernel fused linear cross-entropy")


def _add_lora(model, spec: ModelSpec, setup: TrainingSetup, adapter_dtype):
    from peft import LoraConfig, get_peft_model

    targets = lora_target_modules(spec, setup.lora_targets)
    config = LoraConfig(r=setup.lora_rank, lora_alpha=setup.lora_alpha, lora_dropout=setup.lora_dropout,
                        use_dora=setup.dora, target_modules=targets, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, config, autocast_adapter_dtype=setup.precision != Precision.bf16)
    for param in model.parameters():
        # peft places adapters in the base layer's dtype when it is a float (else fp32) and upcasts
        # them to fp32 with autocast_adapter_dtype; a 4-bit base has no float dtype to follow, so
        # pin the recipe's adapter dtype explicitly
        if param.requires_grad and param.dtype != adapter_dtype:
            param.data = param.data.to(adapter_dtype)
    return model


def _build_quantized(config, setup: TrainingSetup, device: str, compute_dtype, notes: list[str],
                     quant_storage=None):
    import bitsandbytes as bnb
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=compute_dtype,
                                                 attn_implementation=config._attn_implementation)
    head = model.get_output_embeddings()
    std = float(getattr(config, "initializer_range", 0.02) or 0.02)
    quant_type = setup.quant.value
    storage = {"quant_storage": quant_storage} if quant_storage is not None else {}
    quantized = 0
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear or module is head:
            continue
        with torch.device("meta"):
            q = bnb.nn.Linear4bit(module.in_features, module.out_features, bias=module.bias is not None,
                                  compute_dtype=compute_dtype, compress_statistics=setup.double_quant,
                                  quant_type=quant_type, **storage)
        w = torch.empty(module.out_features, module.in_features, dtype=compute_dtype, device=device).normal_(0, std)
        # .to(device) on a not-yet-quantized Params4bit runs quantize_4bit on that device
        q.weight = bnb.nn.Params4bit(w, requires_grad=False, compress_statistics=setup.double_quant,
                                     quant_type=quant_type, module=q, **storage).to(device)
        del w
        if module.bias is not None:
            q.bias = nn.Parameter(torch.zeros(module.out_features, dtype=compute_dtype, device=device),
                                  requires_grad=False)
        q._is_hf_initialized = True
        model.set_submodule(name, q)
        quantized += 1
    if not quantized:
        raise RuntimeError("QLoRA: the model has no nn.Linear layers to quantize")
    _materialize(model, device)
    if any(p.ndim == 3 for n, p in model.named_parameters() if ".experts." in n):
        notes.append("MoE experts are 3-D parameters, not nn.Linear: left unquantized in the compute dtype "
                     "(the estimator does the same)")
    for param in model.parameters():
        param.requires_grad_(False)
    # what transformers' Bnb4BitHfQuantizer sets after from_pretrained(quantization_config=...): peft
    # reads it to wrap 4-bit layers in its bitsandbytes LoRA layer (tuners/lora/bnb.py), the path a
    # user's QLoRA takes, instead of the generic one
    model.is_loaded_in_4bit = True
    return model


def _materialize(model, device: str) -> None:
    """Give every parameter and buffer still on ``meta`` real (uninitialised) storage on the device,
    keeping tied parameters tied, then let transformers initialise them (normal(0, std) for
    embeddings and the head, ones for RMSNorm weights, the RoPE inverse frequencies)."""
    import bitsandbytes as bnb
    import torch
    from torch import nn

    done: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            continue
        for name, param in list(module.named_parameters(recurse=False)):
            if not param.is_meta:
                continue
            if id(param) not in done:
                done[id(param)] = nn.Parameter(torch.empty_like(param, device=device),
                                               requires_grad=param.requires_grad)
            setattr(module, name, done[id(param)])
        for name, buf in list(module.named_buffers(recurse=False)):
            if buf is not None and buf.is_meta:
                persistent = name not in module._non_persistent_buffers_set
                module.register_buffer(name, torch.empty_like(buf, device=device), persistent=persistent)
        module._is_hf_initialized = False
    model.initialize_weights()
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left and device != "meta":  # reportgen trace builds on meta on purpose
        raise RuntimeError(f"QLoRA build left tensors on the meta device: {left[:5]}")
