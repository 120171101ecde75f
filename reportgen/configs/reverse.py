"""A setup as the TRL, Axolotl, LLaMA-Factory and torchtune keys that run it: the translators (``trl.py``,
``axolotl.py``, ``llamafactory.py``, ``torchtune.py``) read backwards, so that reading the keys back gives
the same setup (``tests/test_configs.py`` checks the round trip). What a tool cannot express (TRL 1.16 always runs its fused LM head;
Axolotl loads full fine-tuning weights in bf16) is said in the notes instead of silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reportgen.setup import TrainingSetup

#: setup optimizer -> transformers' optimizer name (``common.OPTIMIZERS`` read backwards)
OPTIM_NAMES = {"adamw": "adamw_torch_fused", "adamw-8bit": "adamw_bnb_8bit", "paged-adamw-8bit": "paged_adamw_8bit",
               "paged-adamw": "paged_adamw_32bit", "sgd": "sgd", "adafactor": "adafactor"}
_FSDP_WORDS = {"fsdp": "full_shard", "shard-grad-op": "shard_grad_op", "hybrid-shard": "hybrid_shard",
               "no-shard": "no_shard"}
_LIGER = "axolotl.integrations.liger.LigerPlugin"


@dataclass
class Keys:
    """One tool's keys for a setup (in the order a config file lists them) and what they cannot say."""

    keys: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.keys, sort_keys=False, default_flow_style=False, width=100).rstrip()


def hub_id(model: str) -> str:
    """A catalog model's Hub id (its config.json's ``_name_or_path``), else the name as given."""
    from reportgen.configs.common import hub_of

    return hub_of(model)


def _targets(model: str, targets: str) -> list[str] | str:
    """``all-linear``, or the module names peft matches (a preset or short names resolved for this model)."""
    if targets == "all-linear":
        return "all-linear"
    from reportgen import catalog

    sel = catalog.load_model(model).lora_selection(targets)
    return sorted(sel.linears) + (["lm_head"] if sel.head else []) + (["embed_tokens"] if sel.embed else [])


def _launch(s: TrainingSetup, k: Keys) -> None:
    if s.gpus > 1:
        k.notes.append(f"launch on {s.gpus} GPUs: accelerate launch --num_processes {s.gpus} (or torchrun "
                       f"--nproc_per_node {s.gpus})")


def _deepspeed(s: TrainingSetup) -> dict:
    zero: dict = {"stage": int(s.sharding.value[-1])}
    if s.offload.value == "optimizer":
        zero["offload_optimizer"] = {"device": "cpu"}
    elif s.offload.value == "params":
        zero["offload_param"] = {"device": "cpu"}
    return {"zero_optimization": zero}


def _trainer_sharding(s: TrainingSetup, k: Keys, tool: str) -> None:
    """transformers' ``TrainingArguments`` keys for several GPUs (``common.trainer_sharding`` read backwards:
    TRL's and LLaMA-Factory's files hold them alike), and the launch note."""
    if s.sharding.value in _FSDP_WORDS:
        k.keys["fsdp"] = _FSDP_WORDS[s.sharding.value] + " auto_wrap" + (" offload" if s.offload.value == "params" else "")
    elif s.sharding.value.startswith("zero"):
        k.keys["deepspeed"] = _deepspeed(s)
    elif s.offload.value != "none":
        k.notes.append(f"offload {s.offload.value} on one GPU (torchao's CPUOffloadOptimizer) has no {tool} key")
    _launch(s, k)


def trl_keys(model: str, setup: TrainingSetup | dict) -> Keys:
    """The ``trl sft --config`` keys (TRL 1.16.0) that run ``setup`` on ``model``."""
    s = TrainingSetup.model_validate(setup)
    k = Keys()
    d = k.keys
    d["model_name_or_path"] = hub_id(model)
    m, p = s.method.value, s.precision.value
    if m == "full":
        d["dtype"] = "bfloat16" if p == "bf16" else "float32"
    elif m == "lora":
        d["dtype"] = "float32" if s.frozen_dtype.value == "fp32" or p == "fp32" else \
            "bfloat16" if p in ("bf16", "bf16-mixed") else "float16"
    else:
        d["dtype"] = "float32" if s.kbit.value in ("peft", "trl") or p == "fp32" else \
            "float16" if p == "fp16-mixed" else "bfloat16"
        if s.frozen_dtype.value == "fp32":
            k.notes.append("QLoRA's unquantized weights follow dtype: float32 is peft's preparation (kbit_prep peft), "
                           "frozen_dtype has no key of its own")
        if s.kbit.value == "trl":
            k.notes.append("kbit_prep trl (older TRL's bf16 cast of embeddings and head) is not TRL 1.16's: "
                           "dtype float32 is the closest")
    d["bf16"] = p == "bf16-mixed" or (m == "full" and p == "bf16")
    if s.is_peft and p == "bf16":
        k.notes.append("pure bf16 adapters: peft keeps them in fp32 (autocast_adapter_dtype) on bf16 weights")
    if p == "fp16-mixed":
        d["fp16"] = True
    if s.is_peft:
        d["use_peft"] = True
        if m == "qlora":
            d.update(load_in_4bit=True, bnb_4bit_quant_type=s.quant.value, use_bnb_nested_quant=s.double_quant)
        d.update(lora_r=s.lora_rank, lora_alpha=s.lora_alpha, lora_dropout=s.lora_dropout,
                 lora_target_modules=_targets(model, s.lora_targets))
        if s.dora:
            d["use_dora"] = True
    d["per_device_train_batch_size"] = s.batch
    d["gradient_accumulation_steps"] = s.accum
    d["max_length"] = s.seq
    if s.padding.value == "packed":
        d["packing"] = True
    elif s.padding.value == "max":
        k.notes.append("padding every micro-batch to max_length has no SFTConfig key (TRL pads to the longest "
                       "sample); packing: true is the closest")
    d["gradient_checkpointing"] = s.grad_ckpt
    d["optim"] = OPTIM_NAMES[s.optimizer.value]
    d["attn_implementation"] = s.attn.value
    if s.act_offload:
        d["activation_offloading"] = True
    if s.compile:
        d["torch_compile"] = True
    if s.kernels.value == "liger":
        d["use_liger_kernel"] = True
    if s.loss.value != "standard" or s.recipe.value != "trl-sft":
        k.notes.append("TRL 1.16's SFTTrainer computes the loss with its own fused LM head (recipe trl-sft): these "
                       f"keys run that recipe, not this setup's (recipe {s.recipe.value}, loss {s.loss.value})")
    _trainer_sharding(s, k, "TRL")
    _unsaid(s, k)
    return k


def grpo_keys(model: str, setup: TrainingSetup | dict) -> Keys:
    """The ``trl grpo --config`` keys (TRL 1.16.0 ``GRPOConfig``) that run a recipe grpo ``setup`` on ``model``:
    ``trl_keys``' model, adapter and trainer keys, with ``trl.py``'s ``_grpo``/``_vllm`` read backwards in place
    of SFT's ``max_length`` and packing. TRL 1.16 has no prompt-length key (``trl.LEGACY_PROMPT_KEY``): the
    prompt length is said in the notes, and read back as ``trl.PROMPT_DEFAULT`` unless ``--max-prompt-length``
    gives it."""
    from reportgen.configs.trl import PROMPT_DEFAULT

    s = TrainingSetup.model_validate(setup)
    if s.recipe.value != "grpo":
        raise ValueError(f"grpo_keys: recipe {s.recipe.value}, not grpo")
    base = trl_keys(model, s)
    keys = {k: v for k, v in base.keys.items() if k not in ("max_length", "packing")}
    k = Keys(notes=[n for n in base.notes if "SFTTrainer computes the loss" not in n and "max_length" not in n])
    at = list(keys).index("per_device_train_batch_size")
    grpo: dict = {"num_generations": s.num_generations, "max_completion_length": s.max_completion_length}
    if s.generation_batch_size is not None:
        grpo["generation_batch_size"] = s.generation_batch_size
    if s.beta:
        grpo["beta"] = s.beta
    if s.generation.value != "hf":
        grpo.update(use_vllm=True, vllm_mode=s.generation.value.removeprefix("vllm-"))
        if not s.vllm_importance_sampling_correction:
            grpo["vllm_importance_sampling_correction"] = False
    if s.generation.value == "vllm-colocate":
        grpo["vllm_gpu_memory_utilization"] = s.vllm_gpu_memory_utilization
        if s.vllm_enable_sleep_mode:
            grpo["vllm_enable_sleep_mode"] = True
        if s.vllm_max_model_length is not None:
            grpo["vllm_max_model_length"] = s.vllm_max_model_length
    items = list(keys.items())
    k.keys = dict(items[:at + 2] + list(grpo.items()) + items[at + 2:])
    if s.prompt_length != PROMPT_DEFAULT:
        k.notes.append(f"prompts of up to {s.prompt_length:,} tokens: TRL 1.16 has no key for it (truncate or filter "
                       f"the dataset's prompts); `reportgen estimate --from` takes {PROMPT_DEFAULT} unless "
                       f"--max-prompt-length {s.prompt_length} is given")
    return k


def axolotl_keys(model: str, setup: TrainingSetup | dict) -> Keys:
    """The Axolotl (0.19.0) YAML keys that run ``setup`` on ``model``."""
    s = TrainingSetup.model_validate(setup)
    k = Keys()
    d = k.keys
    d["base_model"] = hub_id(model)
    if s.recipe.value == "trl-sft":
        k.notes.append("Axolotl trains with transformers' Trainer (recipe trainer), not TRL's SFTTrainer (recipe "
                       "trl-sft): its loss is the model's own, or the fused one of its Liger/CCE keys")
    m, p = s.method.value, s.precision.value
    if s.is_peft:
        d["adapter"] = m
        if m == "qlora":
            d["load_in_4bit"] = True
            if s.quant.value != "nf4" or not s.double_quant:
                d["bnb_config_kwargs"] = {"bnb_4bit_quant_type": s.quant.value,
                                          "bnb_4bit_use_double_quant": s.double_quant}
        d.update(lora_r=s.lora_rank, lora_alpha=s.lora_alpha, lora_dropout=s.lora_dropout)
        targets = _targets(model, s.lora_targets)
        if targets == "all-linear":
            d["lora_target_linear"] = True
        else:
            d["lora_target_modules"] = targets
        if s.dora:
            d["peft_use_dora"] = True
        if s.frozen_dtype.value == "fp32":
            k.notes.append("fp32 frozen weights: Axolotl loads them in the training dtype")
        if m == "qlora" and s.precision.value.endswith("-mixed") and s.kbit.value != "none":
            k.notes.append(f"kbit_prep {s.kbit.value}: Axolotl casts the norms, embedding and head back to the load "
                           "dtype after prepare_model_for_kbit_training (kbit_prep none)")
    if p in ("bf16", "bf16-mixed"):
        d["bf16"] = True
        if m == "full" and p == "bf16-mixed":
            k.notes.append("fp32 master weights: Axolotl loads full fine-tuning weights in bf16 (pure bf16)")
        if m != "full" and p == "bf16":
            k.notes.append("pure bf16 adapters: Axolotl trains them in fp32 under bf16 autocast")
    else:
        d["bf16"] = False
        d["fp16"] = p == "fp16-mixed"
    d["micro_batch_size"] = s.batch
    d["gradient_accumulation_steps"] = s.accum
    d["sequence_len"] = s.seq
    if s.padding.value == "packed":
        d["sample_packing"] = True
    elif s.padding.value == "max":
        d["pad_to_sequence_len"] = True
    d["gradient_checkpointing"] = s.grad_ckpt
    if s.act_offload:
        d["activation_offloading"] = True
    d["optimizer"] = OPTIM_NAMES[s.optimizer.value]
    d["sdp_attention" if s.attn.value == "sdpa" else "eager_attention"] = True
    if s.loss.value == "fused" or s.kernels.value == "liger":
        d["plugins"] = [_LIGER]
    if s.kernels.value == "liger":
        d.update(liger_rope=True, liger_rms_norm=True, liger_glu_activation=True)
    if s.loss.value == "fused":
        d["liger_fused_linear_cross_entropy"] = True
    elif s.loss.value == "chunked":
        k.notes.append("loss chunked (torchtune's) has no Axolotl key; liger_fused_linear_cross_entropy is the "
                       "fused loss")
    if s.compile:
        d["torch_compile"] = True
    if s.sharding.value in _FSDP_WORDS:
        d["fsdp"] = [_FSDP_WORDS[s.sharding.value], "auto_wrap"] + (["offload"] if s.offload.value == "params" else [])
    elif s.sharding.value.startswith("zero"):
        d["deepspeed"] = _deepspeed(s)
    elif s.offload.value != "none":
        k.notes.append(f"offload {s.offload.value} on one GPU (torchao's CPUOffloadOptimizer) has no Axolotl key")
    _launch(s, k)
    _unsaid(s, k)
    return k


#: the setup's attention -> LLaMA-Factory's ``flash_attn`` (``llamafactory.ATTENTION`` read backwards)
LF_ATTENTION = {"sdpa": "sdpa", "eager": "disabled"}


def llamafactory_keys(model: str, setup: TrainingSetup | dict) -> Keys:
    """The ``llamafactory-cli train`` YAML keys (LLaMA-Factory 0.9.5) that run ``setup`` on ``model``.
    LLaMA-Factory loads the checkpoint in its own dtype and runs no k-bit preparation
    (``llamafactory.py``), so what needs either is said in the notes."""
    from reportgen.configs.common import DTYPES, checkpoint_dtype

    s = TrainingSetup.model_validate(setup)
    k = Keys()
    d = k.keys
    d.update(model_name_or_path=hub_id(model), stage="sft", do_train=True)
    if s.recipe.value != "trainer":
        k.notes.append(f"LLaMA-Factory trains with transformers' Seq2SeqTrainer (recipe trainer), not recipe "
                       f"{s.recipe.value}")
    weights = DTYPES.get(checkpoint_dtype(model), "fp32")
    m, p = s.method.value, s.precision.value
    d["finetuning_type"] = "full" if m == "full" else "lora"
    if m == "qlora":
        d.update(quantization_bit=4, quantization_type=s.quant.value, double_quantization=s.double_quant)
        if s.kbit.value != ("none" if weights != "fp32" else "peft"):
            k.notes.append(f"kbit_prep {s.kbit.value}: LLaMA-Factory runs no k-bit preparation (the unquantized "
                           "weights stay in the checkpoint's dtype)")
    if s.is_peft:
        targets = _targets(model, s.lora_targets)
        d.update(lora_rank=s.lora_rank, lora_alpha=s.lora_alpha, lora_dropout=s.lora_dropout,
                 lora_target="all" if targets == "all-linear" else ",".join(targets))
        if s.dora:
            d["use_dora"] = True
        if s.frozen_dtype.value == "fp32" and weights != "fp32":
            k.notes.append(f"fp32 frozen weights: LLaMA-Factory loads the checkpoint in its {weights}")
    if p == "bf16":
        d["pure_bf16"] = True
    elif p.endswith("-mixed"):
        d[p.split("-")[0]] = True
    elif m != "full" and weights != "fp32":
        d["bf16"] = True
        k.notes.append(f"fp32 adapters over the checkpoint's {weights} weights without autocast is not LLaMA-Factory's: "
                       "bf16 autocast is the closest")
    d.update(per_device_train_batch_size=s.batch, gradient_accumulation_steps=s.accum, cutoff_len=s.seq)
    if s.padding.value == "packed":
        d["packing"] = True
    elif s.padding.value == "max":
        k.notes.append("padding every micro-batch to cutoff_len has no LLaMA-Factory key; packing: true is the closest")
    if not s.grad_ckpt:
        d["disable_gradient_checkpointing"] = True
    d["flash_attn"] = LF_ATTENTION[s.attn.value]
    d["optim"] = OPTIM_NAMES[s.optimizer.value]
    if s.loss.value == "fused" or s.kernels.value == "liger":
        d["enable_liger_kernel"] = True
    if s.loss.value == "chunked":
        k.notes.append("loss chunked (torchtune's) has no LLaMA-Factory key; enable_liger_kernel is the fused loss")
    elif (s.loss.value == "fused") != (s.kernels.value == "liger"):
        k.notes.append("enable_liger_kernel turns on Liger's layer kernels and its fused loss together (kernels "
                       f"liger, loss fused): LLaMA-Factory has no key for kernels {s.kernels.value} with loss "
                       f"{s.loss.value}")
    if s.compile:
        d["torch_compile"] = True
    if s.act_offload:
        k.notes.append("activation offloading has no LLaMA-Factory key")
    _trainer_sharding(s, k, "LLaMA-Factory")
    _unsaid(s, k)
    return k


#: the setup's optimizer -> torchtune's ``optimizer._component_`` (``torchtune.OPTIMIZERS`` read backwards)
TT_OPTIMIZERS = {"adamw": "torch.optim.AdamW", "adamw-8bit": "bitsandbytes.optim.AdamW8bit",
                 "paged-adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit", "paged-adamw": "bitsandbytes.optim.PagedAdamW",
                 "sgd": "torch.optim.SGD"}
TT_LOSSES = {"chunked": "torchtune.modules.loss.CEWithChunkedOutputLoss", "standard": "torch.nn.CrossEntropyLoss"}
#: the catalog's module names -> torchtune's attention module names
TT_ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}


def _tt_builder(model: str, method: str) -> str | None:
    """The torchtune builder of the catalog model's shapes (``torchtune.CATALOG`` read backwards), LoRA's or
    QLoRA's for those methods."""
    from reportgen.configs import table
    from reportgen.configs.torchtune import CATALOG, SAME_SHAPES

    base = next((b for b, m in CATALOG.items() if m == model and b not in SAME_SHAPES), None)
    if base is None:
        return None
    name = {"full": "", "lora": "lora_", "qlora": "qlora_"}[method] + base
    return next((b for b in table.schema()["torchtune"]["builders"] if b.rsplit(".", 1)[1] == name), None)


def _tt_model(model: str, s: TrainingSetup, k: Keys) -> dict:
    builder = _tt_builder(model, s.method.value)
    section: dict = {"_component_": builder or f"(no torchtune builder for {model})"}
    if builder is None:
        k.notes.append(f"torchtune has no builder of {model}'s shapes: name yours under model._component_")
    if not s.is_peft:
        return section
    from reportgen import catalog

    sel = catalog.load_model(model).lora_selection(s.lora_targets)
    mlp = {n for n in sel.linears if n not in TT_ATTN}
    if mlp and len(mlp) != 3:
        k.notes.append(f"adapters on {', '.join(sorted(mlp))} alone: torchtune's apply_lora_to_mlp takes all three")
    if sel.embed:
        k.notes.append("adapters on the embeddings have no torchtune key")
    section.update(lora_attn_modules=[TT_ATTN[n] for n in TT_ATTN if n in sel.linears], apply_lora_to_mlp=bool(mlp),
                   apply_lora_to_output=sel.head, lora_rank=s.lora_rank, lora_alpha=s.lora_alpha,
                   lora_dropout=s.lora_dropout)
    if s.dora:
        section["use_dora"] = True
    if s.method.value == "qlora" and (s.quant.value != "nf4" or not s.double_quant or s.quant_head):
        k.notes.append("torchtune's QLoRA is torchao's NF4 with its scalers quantized again (double quantization), "
                       "the head in the model dtype")
    return section


def torchtune_keys(model: str, setup: TrainingSetup | dict) -> Keys:
    """A torchtune 0.6.1 ``tune run`` config's keys that run ``setup`` on ``model`` (with the LoRA or full
    fine-tuning recipe, single-device or distributed); the tokenizer's and checkpointer's paths are the
    user's to add."""
    s = TrainingSetup.model_validate(setup)
    k = Keys()
    d = k.keys
    d["model"] = _tt_model(model, s, k)
    d["tokenizer"] = {"max_seq_len": s.seq}
    d["dataset"] = {"packed": s.padding.value == "packed"}
    if s.padding.value == "max":
        k.notes.append("padding every batch to max_seq_len has no torchtune key (its collate pads to the longest)")
    p = s.precision.value
    d["dtype"] = "fp32" if p == "fp32" else "bf16"
    if p.endswith("-mixed") or s.frozen_dtype.value == "fp32":
        k.notes.append("torchtune trains without autocast: dtype bf16 is pure bf16 (precision bf16)")
    d.update(batch_size=s.batch, gradient_accumulation_steps=s.accum)
    d["loss"] = {"_component_": TT_LOSSES.get(s.loss.value, TT_LOSSES["chunked"])}
    if s.loss.value == "fused":
        k.notes.append("a fused linear cross-entropy has no torchtune key; CEWithChunkedOutputLoss is the closest")
    opt = TT_OPTIMIZERS.get(s.optimizer.value, "torch.optim.AdamW")
    if s.optimizer.value not in TT_OPTIMIZERS:
        k.notes.append(f"optimizer {s.optimizer.value}: not one torchtune's configs name; AdamW written")
    single_offload = s.offload.value == "optimizer" and s.sharding.value == "none"
    d["optimizer"] = ({"_component_": "torchao.optim.CPUOffloadOptimizer", "optimizer_class": opt}
                      if single_offload else {"_component_": opt})
    d["enable_activation_checkpointing"] = s.grad_ckpt
    d["enable_activation_offloading"] = s.act_offload
    if s.act_offload and not s.grad_ckpt:
        k.notes.append("torchtune offloads activations only with checkpointing on")
    d["compile"] = s.compile
    if not s.is_peft:
        d["optimizer_in_bwd"] = s.optimizer_in_backward
    _tt_unsaid(s, k)
    if s.sharding.value in ("fsdp", "shard-grad-op"):
        d["fsdp_cpu_offload"] = s.offload.value == "params"
        if s.sharding.value == "shard-grad-op":
            d["fsdp_reshard_after_forward"] = False
    k.notes.append("add tokenizer._component_/path, dataset._component_ and the checkpointer section for your "
                   "checkpoint")
    return k


def _tt_unsaid(s: TrainingSetup, k: Keys) -> None:
    """What torchtune's recipes do not run."""
    if s.attn.value != "sdpa":
        k.notes.append("torchtune's attention is SDPA: eager has no key")
    if s.recipe.value != "loop" or s.keep_outputs.value != "none":
        k.notes.append("torchtune's recipes run their own loop (recipe loop, outputs freed before backward)")
    if s.is_peft and s.optimizer_in_backward:
        k.notes.append("optimizer_in_bwd is the full fine-tuning recipes' key")
    if s.sharding.value not in ("none", "fsdp", "shard-grad-op"):
        k.notes.append(f"sharding {s.sharding.value}: torchtune's distributed recipes shard with FSDP2")
    if s.offload.value == "optimizer" and s.sharding.value != "none":
        k.notes.append("offloading the optimizer beside FSDP has no torchtune key (fsdp_cpu_offload offloads the "
                       "parameters)")
    if s.kbit_prep not in (None,) and s.kbit.value != "none":
        k.notes.append(f"kbit_prep {s.kbit.value}: torchtune prepares nothing for 4-bit training")
    if s.gpus > 1:
        k.notes.append(f"launch on {s.gpus} GPUs: tune run --nproc_per_node {s.gpus} "
                       f"{'lora' if s.is_peft else 'full'}_finetune_distributed --config FILE")


def _unsaid(s: TrainingSetup, k: Keys) -> None:
    """Setup fields neither tool has a key for."""
    if s.optimizer_in_backward:
        k.notes.append("optimizer in backward (torchtune's optimizer_in_bwd) has no key")
    if s.keep_outputs.value != "none":
        k.notes.append("keeping the outputs past backward is not the Trainer's loop")
    if s.quant_head:
        k.notes.append("a 4-bit LM head has no key (transformers leaves the head in 16 bit)")
    if s.sharding.value == "ddp":
        pass  # the launcher's default: no key
