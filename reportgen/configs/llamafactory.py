"""A LLaMA-Factory ``llamafactory-cli train`` config as a model and setup fields, with LLaMA-Factory 0.9.5's
defaults (``keys.json``, read from its wheel by ``scripts/config_keys.py``).

What LLaMA-Factory 0.9.5 does with each key, from its source:

* ``model/loader.py`` loads the model with ``torch_dtype="auto"`` (the checkpoint's dtype, whatever
  ``bf16`` says), 4-bit through bitsandbytes when ``quantization_bit: 4`` (``model_utils/quantization.py``:
  ``quantization_type`` nf4 by default, ``double_quantization`` on by default, compute and storage dtype
  the compute dtype), and no ``prepare_model_for_kbit_training``;
* ``model/adapter.py`` ``init_adapter`` casts the trainable parameters to float32 unless ``pure_bf16``
  (full fine-tuning: fp32 master weights; LoRA: fp32 adapters over the checkpoint's frozen weights);
* ``hparams/parser.py``: the compute dtype is bf16 with ``bf16`` or ``pure_bf16``, fp16 with ``fp16``;
  ``packing`` defaults to true for ``stage: pt`` only; ``hparams/data_args.py``: ``neat_packing`` packs too;
* ``model_utils/checkpointing.py`` ``prepare_model_for_training``: gradient checkpointing is on unless
  ``disable_gradient_checkpointing``;
* ``hparams/finetuning_args.py``: ``finetuning_type`` lora by default, ``lora_rank`` 8, ``lora_alpha``
  twice the rank, ``lora_dropout`` 0, ``lora_target`` all (every linear layer);
* ``model_utils/liger_kernel.py``: ``enable_liger_kernel`` patches the model with Liger's RMSNorm, RoPE
  and SwiGLU kernels (``kernels: liger``) and for ``stage: sft`` or ``pt`` also fuses the LM head with
  the cross-entropy (``fused_linear_cross_entropy``, since the logits are not needed), for the model types
  it lists (``LIGER_MODEL_TYPES``), nothing for the others;
* the trainer is transformers' ``Seq2SeqTrainer`` (``CustomSeq2SeqTrainer``): recipe ``trainer``.
"""

from __future__ import annotations

from reportgen.configs.common import (DTYPES, Reader, Translation, checkpoint_dtype, finish, optimizer, resolve_model,
                                      trainer_eval, trainer_sharding)

#: LLaMA-Factory's ``flash_attn`` values (``AttentionFunction``) -> the setup's attention
ATTENTION = {"auto": "sdpa", "sdpa": "sdpa", "fa2": "sdpa", "fa3": "sdpa", "disabled": "eager"}


def translate(r: Reader) -> Translation:
    t = Translation(tool="llamafactory", path=str(r.path))
    resolve_model(r, "model_name_or_path", t)
    _stage(r)
    method = _method(r, t)
    _precision(r, t, method)
    t.set("batch", r.integer("per_device_train_batch_size", 8, minimum=1), "per_device_train_batch_size")
    t.set("accum", r.integer("gradient_accumulation_steps", 1, minimum=1), "gradient_accumulation_steps")
    t.set("seq", r.integer("cutoff_len", 2048, minimum=1), "cutoff_len")
    packed = r.boolean("packing")
    if packed is None:
        packed = str(r.get("stage", "sft")) == "pt"
    if r.boolean("neat_packing", False):
        t.set("padding", "packed", "neat_packing")
        t.approx("neat_packing", "packed rows whose samples do not attend to each other: modelled as packed")
    else:
        t.set("padding", "packed" if packed else "longest", "packing")
    t.set("grad_ckpt", not r.boolean("disable_gradient_checkpointing", False), "disable_gradient_checkpointing")
    if r.boolean("use_unsloth_gc", False):
        t.approx("use_unsloth_gc", "unsloth's checkpointing offloads the checkpoints to host RAM: modelled as "
                 "checkpointing on the GPU")
    _attention(r, t)
    optimizer(r, "optim", t)
    t.set("compile", bool(r.boolean("torch_compile", False)), "torch_compile")
    t.set("recipe", "trainer", "model_name_or_path")
    _liger(r, t)
    if r.boolean("use_unsloth", False):
        t.approx("use_unsloth", "unsloth's own kernels and LoRA are not modelled: estimated as the Hugging Face step")
    trainer_sharding(r, t)
    trainer_eval(r, t)
    return finish(r, t)


#: the model types LLaMA-Factory 0.9.5's ``apply_liger_kernel`` patches (``model_utils/liger_kernel.py``); for any
#: other it logs "Current model does not support liger kernel." and patches nothing
LIGER_MODEL_TYPES = frozenset({
    "gemma", "gemma2", "gemma3", "gemma3_text", "glm", "glm4", "glm4v", "granite", "llama", "llava", "mistral",
    "mixtral", "mllama", "olmo2", "paligemma", "phi3", "qwen2", "qwen2_vl", "qwen2_5_vl", "qwen3", "qwen3_moe",
    "qwen3_next", "qwen3_5", "gpt_oss"})


def _liger(r: Reader, t: Translation) -> None:
    """``enable_liger_kernel``: Liger's layer kernels and fused loss, for the model types LLaMA-Factory patches;
    a model it does not patch keeps transformers' modules and loss (known once the file names its model)."""
    from reportgen import catalog

    liger = bool(r.boolean("enable_liger_kernel", False))
    model_type = catalog.load_model(t.model).model_type if liger and t.model else None
    if model_type is not None and model_type not in LIGER_MODEL_TYPES:
        t.approx("enable_liger_kernel", f"LLaMA-Factory 0.9.5 does not patch model type {model_type!r} (it logs "
                 "'Current model does not support liger kernel.'): transformers' modules and loss")
        liger = False
    t.set("loss", "fused" if liger else "standard", "enable_liger_kernel")
    t.set("kernels", "liger" if liger else "eager", "enable_liger_kernel")


def _stage(r: Reader) -> None:
    stage = str(r.get("stage", "sft"))
    if stage not in ("sft", "pt"):
        raise r.error("stage", f"{stage!r}: reward modelling and preference training (rm, ppo, dpo, kto) are not "
                      "modelled", hint="stage: sft or pt")
    for key in ("use_galore", "use_apollo", "use_badam", "use_llama_pro"):
        if r.boolean(key, False):
            raise r.error(key, "this way of training a subset of the weights is not modelled",
                          hint=f"drop {key}, or estimate LoRA instead (finetuning_type: lora)")


def _method(r: Reader, t: Translation) -> str:
    """Full fine-tuning, LoRA or QLoRA (``finetuning_type``, ``quantization_bit``) and the adapters."""
    kind = str(r.get("finetuning_type", "lora"))
    if kind not in ("lora", "full"):
        if kind in ("freeze", "oft"):  # LLaMA-Factory's FinetuningArguments: lora, oft, freeze, full
            raise r.error("finetuning_type", f"{kind!r} ({'freezing layers' if kind == 'freeze' else 'OFT'}) is not "
                          "modelled", hint="lora or full")
        import difflib

        close = difflib.get_close_matches(kind, ["lora", "full", "freeze", "oft"], n=1, cutoff=0.5)
        raise r.error("finetuning_type", f"{kind!r} is not one of LLaMA-Factory's lora, oft, freeze, full"
                      + (f"; did you mean {close[0]}?" if close else ""), hint="lora or full")
    bits = r.integer("quantization_bit")
    if bits not in (None, 4):
        raise r.error("quantization_bit", f"{bits}-bit training is not modelled", hint="4 (QLoRA) or leave it out")
    if bits == 4 and kind != "lora":
        raise r.error("quantization_bit", "a 4-bit model trains only through adapters (LLaMA-Factory refuses it too)",
                      hint="finetuning_type: lora")
    if bits == 4 and str(r.get("quantization_method", "bnb")) != "bnb":
        raise r.error("quantization_method", "only bitsandbytes 4-bit (bnb) is modelled", hint="quantization_method: bnb")
    method = "qlora" if bits == 4 else kind
    t.set("method", method, "quantization_bit" if bits == 4 else "finetuning_type")
    if method == "qlora":
        quant = str(r.get("quantization_type", "nf4"))
        if quant not in ("nf4", "fp4"):
            raise r.error("quantization_type", f"must be nf4 or fp4 (got {quant!r})")
        t.set("quant", quant, "quantization_type")
        t.set("double_quant", bool(r.boolean("double_quantization", True)), "double_quantization")
    if method != "full":
        rank = r.integer("lora_rank", 8, minimum=1)
        t.set("lora_rank", rank, "lora_rank")
        t.set("lora_alpha", r.integer("lora_alpha", 2 * rank), "lora_alpha")
        t.set("lora_dropout", r.number("lora_dropout", 0.0), "lora_dropout")
        _targets(r, t)
        t.set("dora", bool(r.boolean("use_dora", False)), "use_dora")
    return method


def _targets(r: Reader, t: Translation) -> None:
    """``lora_target``: ``all`` (every linear layer but the head) or comma-separated module names."""
    value = r.get("lora_target", "all")
    parts = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else None
    names = [n.strip() for n in parts if isinstance(n, str)] if parts else []
    if not names or len(names) != len(parts) or not all(names):
        raise r.error("lora_target", f"must be all or comma-separated module names (got {value!r})")
    t.set("lora_targets", "all-linear" if names == ["all"] else ",".join(names), "lora_target")


def _precision(r: Reader, t: Translation, method: str) -> None:
    """The checkpoint's weights (``torch_dtype="auto"``), fp32 trainable parameters unless ``pure_bf16``, and
    the autocast dtype of ``bf16`` / ``fp16``. With neither, transformers' ``TrainingArguments`` autocasts to
    what ``accelerate launch`` put in ``ACCELERATE_MIXED_PRECISION`` (``training_args.py``: the environment's
    value unless bf16 or fp16 is set), so a launch file's ``mixed_precision`` decides (``t.autocast_unset``,
    ``launch.py``); without one, fp32 adapters over 16-bit weights without autocast are not modelled."""
    weights = DTYPES.get(checkpoint_dtype(t.model), "fp32")
    bf16, fp16 = bool(r.boolean("bf16", False)), bool(r.boolean("fp16", False))
    if bf16 and fp16:
        raise r.error("fp16", "contradicts bf16: true (one autocast dtype)", hint="keep one of bf16 and fp16")
    if r.boolean("pure_bf16", False):
        t.set("precision", "bf16", "pure_bf16")
        return
    if bf16 or fp16:
        _autocast(t, method, weights, "bf16" if bf16 else "fp16", "bf16" if bf16 else "fp16")
        return
    t.autocast_unset = lambda amp, key: _autocast(t, method, weights, amp, key)
    if method == "full" or weights == "fp32":
        t.set("precision", "fp32", "bf16")
        return
    t.needs["precision"] = ("bf16", f"neither bf16 nor fp16: adapters in fp32 over the checkpoint's {weights} weights "
                            "without autocast is not modelled", "bf16: true (or fp16: true on a card without bf16, or "
                            "an accelerate launch file with mixed_precision: bf16)")


def _autocast(t: Translation, method: str, weights: str, amp: str, key: str) -> None:
    """``amp`` autocast (set by ``key``) over the fp32 trainable parameters LLaMA-Factory keeps."""
    t.values["precision"], t.sources["precision"] = f"{amp}-mixed", key
    t.needs.pop("precision", None)
    if method == "lora":
        t.set("frozen_dtype", "fp32" if weights == "fp32" else "compute", key)
        if weights not in ("fp32", amp):
            t.approx(key, f"{amp} autocast over the checkpoint's {weights} frozen weights: modelled as {amp} weights")
    elif method == "qlora":  # no prepare_model_for_kbit_training: the unquantized weights stay in the checkpoint's
        t.set("kbit_prep", "none" if weights != "fp32" else "peft", key)


def _attention(r: Reader, t: Translation) -> None:
    value = str(r.get("flash_attn", "auto"))
    if value not in ATTENTION:
        raise r.error("flash_attn", f"{value!r} is not a LLaMA-Factory attention", hint="auto, sdpa, fa2, disabled")
    t.set("attn", ATTENTION[value], "flash_attn")
    if value in ("fa2", "fa3"):
        t.approx("flash_attn", "FlashAttention: modelled as SDPA's flash kernel (the same O(seq) memory)")
