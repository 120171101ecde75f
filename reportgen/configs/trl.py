"""A TRL ``trl sft --config`` file (``SFTConfig``/``TrainingArguments``, ``ModelConfig``,
``ScriptArguments`` keys) as a model and setup fields, with TRL 1.16.0's defaults.

What TRL 1.16.0 does with each key, from its source (``trl/scripts/sft.py`` ``main``,
``trl/trainer/utils.py`` ``get_quantization_config``/``get_peft_config``,
``trl/trainer/sft_trainer.py``, ``trl/trainer/base_config.py``):

* the model is loaded in ``ModelConfig.dtype`` (default ``float32``; ``SFTTrainer`` also
  defaults ``model_init_kwargs["dtype"]`` to float32), 4-bit with ``load_in_4bit`` (compute dtype =
  that dtype), and peft's ``LoraConfig`` gets ``lora_r``, ``lora_alpha``, ``lora_dropout`` (0.05),
  ``lora_target_modules`` (None: peft's per-architecture default), ``use_dora``;
* ``bf16`` defaults to true unless ``fp16`` (``_BaseConfig.__post_init__``), ``gradient_checkpointing``
  to true, ``max_length`` to 1024, ``per_device_train_batch_size`` to 8, ``optim`` to
  ``adamw_torch_fused``;
* no ``prepare_model_for_kbit_training``: the trainable adapters of a quantized model are cast to
  bf16 (``SFTTrainer.__init__``), and the loss runs TRL's fused LM head (``add_fused_lm_head``:
  log-probabilities in tiles, never the full logits): the setup's ``recipe`` is ``trl-sft``, which
  models both (``estimate/recipes.py``), with ``loss`` standard (the recipe's own loss).
"""

from __future__ import annotations

from reportgen.configs.common import (DTYPES, Reader, Translation, attention, checkpoint_dtype, finish, optimizer,
                                      resolve_model, trainer_eval, trainer_sharding)


def translate(r: Reader) -> Translation:
    t = Translation(tool="trl", path=str(r.path))
    resolve_model(r, "model_name_or_path", t)

    init = r.get("model_init_kwargs") or {}
    if not isinstance(init, dict):
        raise r.error("model_init_kwargs", f"must be a mapping (got {init!r})")

    method = _method(r, t)

    # ----- precision -----
    _precision(r, t, init, method)

    grpo = is_grpo(r)
    if grpo:
        _grpo(r, t)
    else:
        _batch(r, t)

    # ----- the step -----
    t.set("grad_ckpt", bool(r.boolean("gradient_checkpointing", True)), "gradient_checkpointing")
    t.set("act_offload", bool(r.boolean("activation_offloading", False)), "activation_offloading")
    t.set("compile", bool(r.boolean("torch_compile", False)), "torch_compile")
    optimizer(r, "optim", t)
    attn = r.get("attn_implementation", init.get("attn_implementation"))
    if attn is not None:
        attention(r, "attn_implementation" if r.has("attn_implementation") else "model_init_kwargs", attn, t)
    else:
        t.set("attn", "sdpa", "attn_implementation")
    if grpo:
        t.set("loss", "standard", "loss_type")
        if r.has("loss_type"):
            kind = str(r.get("loss_type"))
            if kind not in GRPO_LOSS_TYPES:  # GRPOConfig refuses another name at __post_init__
                raise r.error("loss_type", f"{kind!r} is not a TRL 1.16 GRPO loss type",
                              hint=", ".join(GRPO_LOSS_TYPES))
            t.approx("loss_type", f"{kind}: GRPO's loss aggregation; per-token tensors of batch x "
                     "completion whichever it is, no memory or time difference")
    else:
        loss_type = str(r.get("loss_type", "nll"))
        if loss_type not in ("nll", "dft", "chunked_nll"):
            raise r.error("loss_type", f"{loss_type!r} is not a TRL 1.16 loss type", hint="nll, dft")
        # the recipe: SFTTrainer's own loss (its fused LM head), adapters and optimizer (estimate/recipes.py)
        t.set("recipe", "trl-sft", "model_name_or_path")
        t.set("loss", "standard", "loss_type")
    _liger(r, t)

    # ----- several GPUs -----
    trainer_sharding(r, t)
    trainer_eval(r, t)
    return finish(r, t)


#: TRL 1.16 dropped it, older GRPO files have it (``table.py``); the prompt length without it
LEGACY_PROMPT_KEY, PROMPT_DEFAULT = "max_prompt_length", 512


def is_grpo(r: Reader) -> bool:
    """A ``trl grpo --config`` file: any key of GRPO's beyond SFT's (``keys.json`` grpo_keys)."""
    from reportgen.configs import table

    grpo = set(table.schema()["trl"].get("grpo_keys", {})) | {LEGACY_PROMPT_KEY}
    return any(k in grpo for k in r.doc)


def _grpo(r: Reader, t: Translation) -> None:
    """GRPOTrainer's batch, lengths and generation (``trl/trainer/grpo_config.py``; recipe grpo,
    ``estimate/grpo.py``). The divisibility rules are the setup's (``TrainingSetup._check_grpo``)."""
    from reportgen.configs import table

    first = next(k for k in r.doc if k in set(table.schema()["trl"]["grpo_keys"]) | {LEGACY_PROMPT_KEY})
    t.set("recipe", "grpo", first)
    batch = r.integer("per_device_train_batch_size", 8, minimum=1)
    t.set("batch", batch, "per_device_train_batch_size")
    t.set("accum", r.integer("gradient_accumulation_steps", 1, minimum=1), "gradient_accumulation_steps")
    t.set("num_generations", r.integer("num_generations", 8, minimum=1), "num_generations")
    if "max_completion_length" in r.doc and r.doc["max_completion_length"] is None:
        raise r.error("max_completion_length", "null: completions end only at EOS, the longest decides the memory",
                      hint="set max_completion_length, or pass --max-completion-length N")
    completion = r.integer("max_completion_length", 512, minimum=1)
    t.set("max_completion_length", completion, "max_completion_length")
    prompt = r.integer(LEGACY_PROMPT_KEY, PROMPT_DEFAULT, minimum=1)
    if r.has(LEGACY_PROMPT_KEY):
        t.approx(LEGACY_PROMPT_KEY, "not a key of TRL 1.16 (it truncates no prompt): read as the longest prompt")
    else:
        t.approx("max_completion_length", f"prompts taken as {PROMPT_DEFAULT} tokens (no max_prompt_length in TRL "
                 "1.16): pass --max-prompt-length N for your data's longest")
    t.set("max_prompt_length", prompt, LEGACY_PROMPT_KEY)
    t.set("seq", prompt + completion, "max_completion_length")
    gbs, spg = r.integer("generation_batch_size", None, minimum=1), r.integer("steps_per_generation", None, minimum=1)
    if gbs is not None and spg is not None:
        raise r.error("steps_per_generation", "and generation_batch_size cannot both be set (TRL GRPOConfig)")
    if gbs is not None or spg is not None:
        t.set("generation_batch_size", gbs or batch * spg, "generation_batch_size" if gbs else "steps_per_generation")
    _vllm(r, t)
    t.set("beta", float(r.number("beta", 0.0)), "beta")
    if r.integer("num_iterations", 1, minimum=1) > 1:
        t.approx("num_iterations", "> 1 not modelled: estimated as 1 (one generation and no re-scoring per step)")


def _vllm(r: Reader, t: Translation) -> None:
    """``use_vllm``/``vllm_mode`` as ``generation``, and the colocated engine's settings."""
    if not r.boolean("use_vllm", False):
        t.set("generation", "hf", "use_vllm")
        return
    mode = str(r.get("vllm_mode", "colocate"))
    if mode not in ("colocate", "server"):
        raise r.error("vllm_mode", f"must be colocate or server (got {mode!r})")
    t.set("generation", f"vllm-{mode}", "vllm_mode")
    if r.integer("vllm_tensor_parallel_size", 1, minimum=1) > 1:
        raise r.error("vllm_tensor_parallel_size", "vLLM over several GPUs is not modelled", hint="1")
    t.set("vllm_importance_sampling_correction", bool(r.boolean("vllm_importance_sampling_correction", True)),
          "vllm_importance_sampling_correction")
    if mode == "colocate":
        t.set("vllm_gpu_memory_utilization", float(r.number("vllm_gpu_memory_utilization", 0.3)),
              "vllm_gpu_memory_utilization")
        t.set("vllm_enable_sleep_mode", bool(r.boolean("vllm_enable_sleep_mode", False)), "vllm_enable_sleep_mode")
        length = r.integer("vllm_max_model_length", None, minimum=8)
        if length is not None:
            t.set("vllm_max_model_length", length, "vllm_max_model_length")


def _method(r: Reader, t: Translation) -> str:
    """Full fine-tuning, LoRA or QLoRA (``use_peft``, ``load_in_4bit``), the 4-bit type and the adapters."""
    peft = r.boolean("use_peft", False)
    four, eight = r.boolean("load_in_4bit", False), r.boolean("load_in_8bit", False)
    if four and eight:
        raise r.error("load_in_8bit", "contradicts load_in_4bit: true (a model is loaded in one of them)",
                      hint="keep load_in_4bit: true for QLoRA")
    if eight:
        raise r.error("load_in_8bit", "8-bit (LLM.int8) training is not modelled",
                      hint="use load_in_4bit: true (QLoRA) or drop it (LoRA on 16-bit weights)")
    if four and not peft:
        raise r.error("load_in_4bit", "a 4-bit model trains only through adapters: needs use_peft: true",
                      hint="add use_peft: true")
    method = "qlora" if four else "lora" if peft else "full"
    t.set("method", method, "use_peft" if not four else "load_in_4bit")
    if four:
        quant = str(r.tool_default("bnb_4bit_quant_type"))
        if quant not in ("nf4", "fp4"):
            raise r.error("bnb_4bit_quant_type", f"must be nf4 or fp4 (got {quant!r})")
        t.set("quant", quant, "bnb_4bit_quant_type")
        t.set("double_quant", bool(r.boolean("use_bnb_nested_quant", False)), "use_bnb_nested_quant")
    if peft:
        t.set("lora_rank", r.integer("lora_r", 16), "lora_r")
        t.set("lora_alpha", r.integer("lora_alpha", 32), "lora_alpha")
        t.set("lora_dropout", r.number("lora_dropout", 0.05), "lora_dropout")
        _targets(r, t)
        t.set("dora", bool(r.boolean("use_dora", False)), "use_dora")
    return method


#: TRL 1.16 ``GRPOConfig.loss_type``'s values (its help: 'grpo', 'dr_grpo', 'dapo' the default, 'bnpo', 'cispo',
#: 'sapo', 'luspo', 'vespo')
GRPO_LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")


def _batch(r: Reader, t: Translation) -> None:
    """Micro-batch, accumulation, length and padding (``packing``, ``padding_free``)."""
    t.set("batch", r.integer("per_device_train_batch_size", 8, minimum=1), "per_device_train_batch_size")
    t.set("accum", r.integer("gradient_accumulation_steps", 1, minimum=1), "gradient_accumulation_steps")
    if r.has("max_length") and r.has("max_seq_length") and r.get("max_length") != r.get("max_seq_length"):
        raise r.error("max_seq_length", f"{r.get('max_seq_length')!r} beside max_length {r.get('max_length')!r}: "
                      "max_seq_length is max_length's name before TRL 0.20, so one file gives two lengths",
                      hint="keep max_length alone")
    length_key = "max_length" if r.has("max_length") or not r.has("max_seq_length") else "max_seq_length"
    if length_key == "max_seq_length":
        t.approx("max_seq_length", "the name of max_length before TRL 0.20: read as max_length")
    if "max_length" in r.doc and r.doc["max_length"] is None:
        raise r.error("max_length", "null (no truncation): the longest sample decides the memory",
                      hint="set max_length to your longest sample, or pass --seq N")
    t.set("seq", r.integer(length_key, 1024, minimum=1), length_key)
    packing, free = r.boolean("packing", False), r.boolean("padding_free", False)
    r.get("packing_strategy")
    if packing:
        t.set("padding", "packed", "packing")
    elif free:
        t.set("padding", "packed", "padding_free")
        t.approx("padding_free", "the samples of a micro-batch flattened into one row without padding: modelled as "
                 "packed rows of max_length tokens")
    else:
        t.set("padding", "longest", "packing")


def _targets(r: Reader, t: Translation) -> None:
    value = r.get("lora_target_modules")
    if value is None:
        t.set("lora_targets", "qv", "lora_target_modules")
        t.approx("lora_target_modules", "unset: peft's default for the architecture (q_proj and v_proj for Llama, "
                 "Mistral, Qwen, Gemma), modelled as the qv preset")
        return
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise r.error("lora_target_modules", f"must be a list of module names or all-linear (got {value!r})")
    if [n.strip() for n in names] == ["all-linear"]:
        t.set("lora_targets", "all-linear", "lora_target_modules")
    else:
        t.set("lora_targets", ",".join(n.strip() for n in names), "lora_target_modules")


def _precision(r: Reader, t: Translation, init: dict, method: str) -> None:
    key = "dtype" if r.has("dtype") or not (init.get("dtype") or init.get("torch_dtype")) else "model_init_kwargs"
    raw = r.get("dtype") if key == "dtype" else (init.get("dtype") or init.get("torch_dtype"))
    raw = "float32" if raw is None else str(raw)
    if raw == "auto":
        raw = checkpoint_dtype(t.model)
        t.approx(key, f"auto: the checkpoint's dtype, {raw}")
    weights = DTYPES.get(raw)
    if weights is None:
        raise r.error(key, f"{raw!r} is not a dtype", hint="float32, bfloat16, float16 or auto")
    bf16 = r.boolean("bf16")
    fp16 = bool(r.boolean("fp16", False))
    if bf16 is None:
        bf16 = not fp16  # SFTConfig: bf16 defaults to true unless fp16 is set
    if bf16 and fp16:
        raise r.error("fp16", "contradicts bf16: true (one autocast dtype)", hint="keep one of bf16 and fp16")
    amp = "bf16" if bf16 else "fp16" if fp16 else None
    if weights == "fp16" and method == "full":
        raise r.error(key, "fp16 weights cannot be trained with fp16 loss scaling (transformers refuses to unscale "
                      "fp16 gradients) and pure fp16 is not modelled", hint="dtype: float32 with fp16: true")
    if weights == "bf16" and amp == "fp16":
        raise r.error("fp16", f"contradicts {key} {raw}: fp16 autocast over bf16 weights",
                      hint="bf16: true with bfloat16 weights, or dtype: float32 with fp16: true")
    if method == "full":
        precision = {("fp32", "bf16"): "bf16-mixed", ("fp32", "fp16"): "fp16-mixed", ("fp32", None): "fp32",
                     ("bf16", "bf16"): "bf16", ("bf16", None): "bf16"}[(weights, amp)]
        t.set("precision", precision, key)
        return
    if amp is None:
        t.set("precision", "fp32" if weights == "fp32" else "bf16", key)
        if weights != "fp32":
            t.approx(key, f"{raw} weights without autocast: modelled as pure bf16 (adapters in bf16)")
        return
    t.set("precision", f"{amp}-mixed", "bf16" if amp == "bf16" else "fp16")
    if method == "lora":
        t.set("frozen_dtype", "fp32" if weights == "fp32" else "compute", key)
    else:  # QLoRA: no prepare_model_for_kbit_training in TRL 1.16; the unquantized weights are in `weights`
        t.set("kbit_prep", "peft" if weights == "fp32" else "none", key)
        t.approx(key, f"QLoRA with {raw} weights: embeddings, norms and head in {raw} "
                 + ("(as peft's prepare_model_for_kbit_training leaves them, kbit_prep peft)" if weights == "fp32"
                    else "(kbit_prep none)") + "; TRL casts the adapters to bf16 (recipe trl-sft)")


def _liger(r: Reader, t: Translation) -> None:
    """``use_liger_kernel``: Liger's RMSNorm, RoPE and SwiGLU (``kernels: liger``; TRL keeps its own fused LM
    head), unless ``liger_kernel_config`` turns one of them off (``rope``, ``rms_norm``, ``swiglu``: False),
    then transformers' modules, an upper bound."""
    on = bool(r.boolean("use_liger_kernel", False))
    config = r.get("liger_kernel_config")
    if config is not None and not isinstance(config, dict):
        raise r.error("liger_kernel_config", f"must be a mapping of Liger's kernels to true/false (got {config!r})",
                      hint="liger_kernel_config: {rope: true, rms_norm: true, swiglu: true}")
    off = [k for k in ("rope", "rms_norm", "swiglu") if (config or {}).get(k) is False]
    t.set("kernels", "liger" if on and not off else "eager", "use_liger_kernel")
    if on and off:
        t.approx("liger_kernel_config", f"{', '.join(off)} off: Liger's layer kernels modelled as transformers' "
                 "modules (an upper bound on memory and time)")
