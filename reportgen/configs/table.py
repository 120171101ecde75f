"""The one table of what reportgen makes of each key of a TRL, Axolotl, LLaMA-Factory, torchtune or unsloth config.

Every key the translators read is a row here, with its status:

* **honoured**: the key sets a setup field (or the model) to what the tool does with it;
* **approximated**: it sets a field to the closest recipe reportgen models, and the note says what differs;
* **ignored**: it has no field; ``affects`` says whether it still changes the step's memory or speed
  (then the CLI warns that it is not modelled) or not (training bookkeeping: learning rate, logging,
  data sources, saving).

A key of the tool's schema without a row is ignored as bookkeeping (``keys.json`` lists them all,
read from the pinned tools by ``scripts/config_keys.py``); a key the schema does not have is unknown
(a warning). The CLI's report of a translation, the docs page and the guides' TRL and Axolotl keys
all read this table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

HONOURED, APPROXIMATED, IGNORED = "honoured", "approximated", "ignored"
TOOLS = {"trl": "TRL", "axolotl": "Axolotl", "llamafactory": "LLaMA-Factory", "torchtune": "torchtune",
         "unsloth": "unsloth", "accelerate": "accelerate"}


@dataclass(frozen=True)
class Row:
    tool: str  # "trl", "axolotl", "llamafactory", "torchtune" or "unsloth"
    key: str
    status: str
    fields: str  # the setup fields (or "model") it sets, comma separated; "" when ignored
    note: str
    affects: bool = True  # for an ignored key: does it change memory or speed (not modelled)?


def _r(tool, key, status, fields, note, affects=True):
    return Row(tool, key, status, fields, note, affects)


_PRECISION_TRL = ("TRL loads the weights in ModelConfig's dtype (default float32; SFTTrainer also defaults to "
                  "float32) and trains under autocast when bf16 or fp16 is set: float32 weights give fp32 master "
                  "weights (full) or fp32 frozen weights (LoRA, frozen_dtype fp32); bfloat16 weights with bf16 give "
                  "pure bf16 for full fine-tuning (precision bf16) and bf16 frozen weights for LoRA")
_OPTIM = ("transformers' optimizer names: adamw_torch, adamw_torch_fused, adamw_hf -> adamw; adamw_bnb_8bit, "
          "adamw_8bit -> adamw-8bit; paged_adamw_8bit -> paged-adamw-8bit; paged_adamw_32bit -> paged-adamw; "
          "sgd; adafactor. Any other optimizer is refused (not modelled)")
_ATTN = ("sdpa (transformers' default), eager; flash_attention_2/3 and Hub kernels are approximated by SDPA's flash "
         "kernel (the same O(seq) memory)")

ROWS: tuple[Row, ...] = (
    # ----- TRL: ModelConfig ---------------------------------------------------------------------
    _r("trl", "model_name_or_path", HONOURED, "model, recipe", "a catalog model whose config.json names this Hub id, "
       "or a local directory or config.json; an -Instruct/-it/-chat variant of a catalog model is approximated by "
       "it (same shapes); a TRL file runs SFTTrainer: recipe trl-sft"),
    _r("trl", "dtype", HONOURED, "precision, frozen_dtype, kbit_prep", _PRECISION_TRL),
    _r("trl", "model_init_kwargs", APPROXIMATED, "precision, attn", "its dtype (or torch_dtype) and "
       "attn_implementation are read like dtype and attn_implementation; its other entries are ignored"),
    _r("trl", "attn_implementation", APPROXIMATED, "attn", _ATTN),
    _r("trl", "use_peft", HONOURED, "method", "true: LoRA (QLoRA with load_in_4bit); false: full fine-tuning"),
    _r("trl", "load_in_4bit", HONOURED, "method", "bitsandbytes 4-bit base linears: QLoRA (needs use_peft)"),
    _r("trl", "load_in_8bit", HONOURED, "method", "false only: 8-bit (LLM.int8) training is not modelled, true is "
       "refused"),
    _r("trl", "bnb_4bit_quant_type", HONOURED, "quant", "nf4 or fp4"),
    _r("trl", "use_bnb_nested_quant", HONOURED, "double_quant", "double quantization of the 4-bit constants"),
    _r("trl", "bnb_4bit_quant_storage", IGNORED, "", "the storage dtype of the packed 4-bit weights: the same bytes",
       affects=False),
    _r("trl", "lora_r", HONOURED, "lora_rank", "LoRA rank"),
    _r("trl", "lora_alpha", HONOURED, "lora_alpha", "scaling only"),
    _r("trl", "lora_dropout", HONOURED, "lora_dropout", "ModelConfig's default is 0.05: each adapter keeps a "
       "dropout mask"),
    _r("trl", "lora_target_modules", APPROXIMATED, "lora_targets", "a list of module names or all-linear; unset: "
       "peft's default for the architecture (q_proj and v_proj for Llama, Mistral, Qwen, Gemma), modelled as the qv "
       "preset"),
    _r("trl", "use_dora", HONOURED, "dora", "DoRA"),
    _r("trl", "use_rslora", IGNORED, "", "changes the adapters' scaling only", affects=False),
    _r("trl", "lora_modules_to_save", IGNORED, "", "the named modules become fully trainable copies (their weights, "
       "gradients and optimizer states): not modelled"),
    _r("trl", "lora_target_parameters", IGNORED, "", "adapters on parameters (MoE experts): not modelled"),
    # ----- TRL: SFTConfig / TrainingArguments ---------------------------------------------------
    _r("trl", "bf16", HONOURED, "precision", "bf16 autocast; SFTConfig's default is true unless fp16 is set"),
    _r("trl", "fp16", HONOURED, "precision", "fp16 autocast with loss scaling"),
    _r("trl", "per_device_train_batch_size", HONOURED, "batch", "micro-batch per GPU (TrainingArguments' default 8)"),
    _r("trl", "gradient_accumulation_steps", HONOURED, "accum", "gradient accumulation"),
    _r("trl", "max_length", HONOURED, "seq", "the longest sample after truncation, or the packed length (SFTConfig's "
       "default 1024); null (no truncation) is refused: give --seq"),
    _r("trl", "max_seq_length", APPROXIMATED, "seq", "the name of max_length before TRL 0.20: read as max_length"),
    _r("trl", "packing", HONOURED, "padding", "rows of max_length tokens (padding packed); otherwise TRL's collator "
       "pads each micro-batch to its longest sample (padding longest)"),
    _r("trl", "packing_strategy", APPROXIMATED, "padding", "bfd, bfd_split, wrapped: all packed rows of max_length "
       "tokens"),
    _r("trl", "padding_free", APPROXIMATED, "padding", "the micro-batch's samples flattened into one row without "
       "padding: modelled as packed"),
    _r("trl", "pad_to_multiple_of", IGNORED, "", "rounds the padded length up (a few tokens)", affects=False),
    _r("trl", "gradient_checkpointing", HONOURED, "grad_ckpt", "SFTConfig's default is true"),
    _r("trl", "gradient_checkpointing_kwargs", IGNORED, "", "use_reentrant: the same saved tensors", affects=False),
    _r("trl", "activation_offloading", HONOURED, "act_offload", "saved activations offloaded to host RAM (TRL's "
       "context manager is torchtune's)"),
    _r("trl", "loss_type", HONOURED, "recipe, loss", "nll and dft (TRL 1.16) run TRL's fused LM head: "
       "log-probabilities, entropy and token accuracy in tiles of tokens, never the full logits (recipe trl-sft, "
       "loss standard: the recipe's own loss)"),
    _r("trl", "use_liger_kernel", HONOURED, "kernels", "TRL 1.16 applies Liger's layer kernels only (RMSNorm, RoPE, "
       "SwiGLU: kernels liger) and keeps its own fused LM head (recipe trl-sft)"),
    _r("trl", "liger_kernel_config", APPROXIMATED, "kernels", "rope, rms_norm or swiglu false: transformers' "
       "modules (an upper bound); else Liger's three layer kernels"),
    _r("trl", "label_smoothing_factor", IGNORED, "", "above 0 TRL computes the loss from the full logits: not "
       "modelled"),
    _r("trl", "optim", HONOURED, "optimizer", _OPTIM + " (TrainingArguments' default adamw_torch_fused)"),
    _r("trl", "torch_compile", HONOURED, "compile", "torch.compile"),
    _r("trl", "fsdp", HONOURED, "sharding, offload", "full_shard, shard_grad_op, hybrid_shard, no_shard; offload: "
       "parameters offloaded (offload params); the number of GPUs comes from --gpus"),
    _r("trl", "fsdp_config", IGNORED, "", "wrapping, prefetch and state-dict options: not modelled"),
    _r("trl", "deepspeed", HONOURED, "sharding, offload", "a DeepSpeed JSON (a path relative to the config file, or "
       "inline): zero_optimization.stage 1, 2, 3 and offload_optimizer / offload_param to cpu; the number of GPUs "
       "comes from --gpus"),
    _r("trl", "tf32", IGNORED, "", "TF32 for fp32 matmuls: the time model prices the autocast dtype"),
    _r("trl", "eval_strategy", HONOURED, "eval_batch", "steps or epoch: the run has an evaluation phase "
       "(estimate/run.py) on per_device_eval_batch_size samples; no (the default): none"),
    _r("trl", "per_device_eval_batch_size", HONOURED, "eval_batch", "the evaluation's micro-batch (default 8), "
       "when eval_strategy evaluates"),
    # ----- TRL GRPO (trl grpo --config: GRPOConfig, GRPOScriptArguments; keys.json grpo_keys) --------------
    _r("trl", "num_generations", HONOURED, "num_generations, recipe", "completions per prompt; any GRPO key makes "
       "the file GRPOTrainer's: recipe grpo (estimate/grpo.py)"),
    _r("trl", "max_completion_length", HONOURED, "max_completion_length, seq", "the longest completion; each row "
       "is prompt + completion (seq)"),
    _r("trl", "max_prompt_length", APPROXIMATED, "max_prompt_length, seq", "a key of TRL before 1.0 (TRL 1.16 "
       "truncates no prompt): read as the longest prompt; without it prompts are taken as 512 tokens, that "
       "key's old default"),
    _r("trl", "generation_batch_size", HONOURED, "generation_batch_size", "completions generated at once"),
    _r("trl", "steps_per_generation", HONOURED, "generation_batch_size", "generation_batch_size = "
       "per_device_train_batch_size x steps_per_generation"),
    _r("trl", "use_vllm", HONOURED, "generation", "false: transformers' generate (hf); true: vLLM (vllm_mode)"),
    _r("trl", "vllm_mode", HONOURED, "generation", "colocate (vllm-colocate) or server (vllm-server: another GPU)"),
    _r("trl", "vllm_gpu_memory_utilization", HONOURED, "vllm_gpu_memory_utilization", "vLLM's share of the card "
       "(colocate)"),
    _r("trl", "vllm_enable_sleep_mode", HONOURED, "vllm_enable_sleep_mode", "vLLM frees its pool outside "
       "generation"),
    _r("trl", "vllm_max_model_length", HONOURED, "vllm_max_model_length", "vLLM's max_model_len: its KV cache must "
       "hold one such sequence"),
    _r("trl", "vllm_importance_sampling_correction", HONOURED, "vllm_importance_sampling_correction", "true: one "
       "more forward pass to re-score vLLM's completions"),
    _r("trl", "beta", HONOURED, "beta", "> 0: a reference model scores every completion (a copy of the weights for "
       "full fine-tuning, the adapter-disabled policy for LoRA)"),
    _r("trl", "vllm_tensor_parallel_size", HONOURED, "generation", "1 only: vLLM over several GPUs is not modelled"),
    _r("trl", "num_iterations", APPROXIMATED, "recipe", "1 (the default) as TRL runs it; > 1 reuses each "
       "generation for several steps and re-scores it (fewer generations per step, one more forward): estimated "
       "as 1"),
    _r("trl", "cache_implementation", IGNORED, "", "a static or offloaded KV cache instead of DynamicCache: not "
       "modelled"),
    _r("trl", "use_transformers_continuous_batching", IGNORED, "", "transformers' paged continuous batching "
       "instead of generate: not modelled"),
    _r("trl", "cast_lm_head_to_fp32", IGNORED, "", "an fp32 LM head (fp32 log-prob tiles): not modelled"),
    _r("trl", "reward_model_name_or_path", IGNORED, "", "a reward model on the GPU: not modelled (reward "
       "functions are assumed to run on the host)"),
    _r("trl", "reward_funcs", IGNORED, "", "functions run on the host; a Hub model id among them is a reward model "
       "on the GPU: not modelled"),
    _r("trl", "temperature", IGNORED, "", "sampling only", affects=False),
    _r("trl", "top_p", IGNORED, "", "sampling only", affects=False),
    _r("trl", "top_k", IGNORED, "", "sampling only", affects=False),
    _r("trl", "mask_truncated_completions", IGNORED, "", "masks the loss only", affects=False),
    _r("trl", "scale_rewards", IGNORED, "", "reward scaling only", affects=False),
    # ----- Axolotl -----------------------------------------------------------------------------------
    _r("axolotl", "base_model", HONOURED, "model, recipe", "a catalog model whose config.json names this Hub id, or a "
       "local directory or config.json; an -Instruct/-it/-chat variant of a catalog model is approximated by it; an "
       "Axolotl file runs transformers' Trainer: recipe trainer"),
    _r("axolotl", "adapter", HONOURED, "method, kbit_prep", "lora, qlora (with load_in_4bit), or unset: full "
       "fine-tuning; QLoRA's norms, embedding and head end in the load dtype (Axolotl casts them back after "
       "prepare_model_for_kbit_training: kbit_prep none)"),
    _r("axolotl", "embeddings_skip_upcast", APPROXIMATED, "kbit_prep", "the embedding and head end in the load dtype "
       "with or without it (Axolotl casts them back after prepare_model_for_kbit_training); false holds them in fp32 "
       "for a moment while the model loads, which the load phase does not count (said in the report)"),
    _r("axolotl", "unfrozen_parameters", IGNORED, "", "regexes of weights left trainable (freeze_layers_except): "
       "their gradients and optimizer states are not modelled"),
    _r("axolotl", "lora_qkv_kernel", IGNORED, "", "Axolotl's Triton LoRA kernels (kernels/lora.py: the base and LoRA "
       "matmuls of q, k, v in one autograd function): not modelled, priced as peft's LoRA layers"),
    _r("axolotl", "lora_o_kernel", IGNORED, "", "Axolotl's Triton LoRA kernel for o_proj: not modelled, priced as "
       "peft's LoRA layer"),
    _r("axolotl", "lora_mlp_kernel", IGNORED, "", "Axolotl's Triton LoRA kernels for the MLP (the SwiGLU fused with "
       "its LoRA matmuls): not modelled, priced as peft's LoRA layers"),
    _r("axolotl", "fp32_norms", IGNORED, "", "true (FSDP2 only; refused without it, as Axolotl does): the norms' "
       "weights in fp32, their outputs in the 16-bit dtype: a few weights, not modelled", affects=False),
    _r("axolotl", "load_in_4bit", HONOURED, "method", "4-bit base linears; Axolotl quantizes only with adapter qlora"),
    _r("axolotl", "load_in_8bit", HONOURED, "method", "false only: 8-bit LoRA is not modelled, true is refused"),
    _r("axolotl", "bnb_config_kwargs", HONOURED, "quant, double_quant", "bnb_4bit_quant_type and "
       "bnb_4bit_use_double_quant over Axolotl's QLoRA defaults (nf4, double quantization on); other entries "
       "ignored"),
    _r("axolotl", "lora_r", HONOURED, "lora_rank", "LoRA rank"),
    _r("axolotl", "lora_alpha", HONOURED, "lora_alpha", "scaling only"),
    _r("axolotl", "lora_dropout", HONOURED, "lora_dropout", "Axolotl's default is 0.0"),
    _r("axolotl", "lora_target_modules", HONOURED, "lora_targets", "module names"),
    _r("axolotl", "lora_target_linear", HONOURED, "lora_targets", "true: every linear of the decoder layers "
       "(all-linear); with lora_target_modules: their union"),
    _r("axolotl", "peft_use_dora", HONOURED, "dora", "DoRA"),
    _r("axolotl", "peft_use_rslora", IGNORED, "", "changes the adapters' scaling only", affects=False),
    _r("axolotl", "lora_modules_to_save", IGNORED, "", "the named modules become fully trainable copies: not "
       "modelled"),
    _r("axolotl", "bf16", HONOURED, "precision", "Axolotl loads the weights in bf16 and trains under bf16 autocast: "
       "pure bf16 for full fine-tuning (precision bf16), bf16-mixed for LoRA/QLoRA; its default auto is read as true "
       "(every card with bf16)"),
    _r("axolotl", "fp16", APPROXIMATED, "precision", "fp16 autocast (fp16-mixed); Axolotl loads full fine-tuning "
       "weights in fp16, modelled with fp32 master weights"),
    _r("axolotl", "bfloat16", HONOURED, "precision", "load the weights in bf16 (as bf16)"),
    _r("axolotl", "float16", APPROXIMATED, "precision", "load the weights in fp16 (as fp16)"),
    _r("axolotl", "tf32", IGNORED, "", "TF32 for fp32 matmuls: the time model prices the autocast dtype"),
    _r("axolotl", "micro_batch_size", HONOURED, "batch", "micro-batch per GPU (default 1)"),
    _r("axolotl", "val_set_size", HONOURED, "eval_batch", "above 0: Axolotl evaluates on a validation split, an "
       "evaluation phase of the run (estimate/run.py) on eval_batch_size samples"),
    _r("axolotl", "test_datasets", HONOURED, "eval_batch", "an evaluation set: the run has an evaluation phase"),
    _r("axolotl", "eval_batch_size", HONOURED, "eval_batch", "the evaluation's micro-batch (default micro_batch_size)"),
    _r("axolotl", "eval_strategy", HONOURED, "eval_batch", "no: no evaluation phase even with a validation split"),
    _r("axolotl", "gradient_accumulation_steps", HONOURED, "accum", "gradient accumulation (default 1)"),
    _r("axolotl", "batch_size", HONOURED, "accum", "without gradient_accumulation_steps: batch_size / "
       "micro_batch_size steps (Axolotl's normalize_config)"),
    _r("axolotl", "sequence_len", HONOURED, "seq", "the longest sample after truncation, or the packed length "
       "(default 512)"),
    _r("axolotl", "sample_packing", HONOURED, "padding", "packed rows of sequence_len tokens"),
    _r("axolotl", "pad_to_sequence_len", HONOURED, "padding", "every micro-batch padded to sequence_len (padding "
       "max); neither: padded to its longest sample"),
    _r("axolotl", "batch_flattening", APPROXIMATED, "padding", "samples flattened into one row without padding: "
       "modelled as packed"),
    _r("axolotl", "gradient_checkpointing", HONOURED, "grad_ckpt, act_offload", "true; offload: checkpointing with "
       "the checkpoints offloaded to host RAM (act_offload, approximated); offload_disk is refused"),
    _r("axolotl", "activation_offloading", HONOURED, "act_offload", "saved activations offloaded to host RAM"),
    _r("axolotl", "flash_attention", APPROXIMATED, "attn", "FlashAttention-2: modelled as SDPA's flash kernel (the "
       "same O(seq) memory)"),
    _r("axolotl", "sdp_attention", HONOURED, "attn", "SDPA"),
    _r("axolotl", "flex_attention", APPROXIMATED, "attn", "modelled as SDPA"),
    _r("axolotl", "xformers_attention", APPROXIMATED, "attn", "modelled as SDPA"),
    _r("axolotl", "eager_attention", HONOURED, "attn", "eager attention"),
    _r("axolotl", "attn_implementation", APPROXIMATED, "attn", _ATTN),
    _r("axolotl", "liger_fused_linear_cross_entropy", HONOURED, "loss", "Liger's fused linear cross-entropy (loss "
       "fused)"),
    _r("axolotl", "cut_cross_entropy", APPROXIMATED, "loss", "Cut Cross-Entropy (its plugin listed): never the "
       "full logits, modelled as loss fused"),
    _r("axolotl", "liger_rope", HONOURED, "kernels", "with liger_rms_norm and liger_glu_activation, Liger's plugin "
       "listed: its layer kernels (kernels liger); fewer than the three: transformers' modules, an upper bound"),
    _r("axolotl", "liger_rms_norm", HONOURED, "kernels", "with liger_rope and liger_glu_activation: kernels liger"),
    _r("axolotl", "liger_glu_activation", HONOURED, "kernels", "with liger_rope and liger_rms_norm: kernels liger"),
    _r("axolotl", "liger_swiglu", HONOURED, "kernels", "the deprecated name of liger_glu_activation"),
    _r("axolotl", "liger_layer_norm", IGNORED, "", "Liger's LayerNorm kernel: not modelled"),
    _r("axolotl", "liger_cross_entropy", IGNORED, "", "Liger's cross-entropy on full logits: modelled as the "
       "standard loss"),
    _r("axolotl", "plugins", IGNORED, "", "which plugins load; their keys are read as rows of this table",
       affects=False),
    _r("axolotl", "optimizer", HONOURED, "optimizer", _OPTIM + " (Axolotl's default adamw_torch_fused)"),
    _r("axolotl", "torch_compile", HONOURED, "compile", "torch.compile (auto: read as true)"),
    _r("axolotl", "fsdp", HONOURED, "sharding, offload", "FSDP 1's list (full_shard, shard_grad_op, hybrid_shard, "
       "no_shard, offload); the number of GPUs comes from --gpus"),
    _r("axolotl", "fsdp_config", HONOURED, "sharding, offload", "an fsdp_config alone means FSDP full sharding; its "
       "offload_params (fsdp_offload_params) offloads the parameters, reshard_after_forward false is shard_grad_op; "
       "its other entries are ignored"),
    _r("axolotl", "fsdp_version", IGNORED, "", "FSDP 1 or 2: the same sharding", affects=False),
    _r("axolotl", "deepspeed", HONOURED, "sharding, offload", "a DeepSpeed JSON (a path relative to the config "
       "file, or inline): zero_optimization.stage and offload_optimizer / offload_param to cpu; the number of GPUs "
       "comes from --gpus"),
    # ----- LLaMA-Factory (llamafactory-cli train) ---------------------------------------------------------
    _r("llamafactory", "model_name_or_path", HONOURED, "model, recipe", "a catalog model whose config.json names this "
       "Hub id, or a local directory or config.json; LLaMA-Factory trains with transformers' Seq2SeqTrainer: recipe "
       "trainer"),
    _r("llamafactory", "stage", HONOURED, "padding", "sft and pt (pt packs by default); rm, ppo, dpo and kto are "
       "refused (not modelled)"),
    _r("llamafactory", "finetuning_type", HONOURED, "method", "lora (LLaMA-Factory's default) or full; freeze and "
       "oft are refused (not modelled)"),
    _r("llamafactory", "quantization_bit", HONOURED, "method", "4: QLoRA through bitsandbytes; 8 is refused (not "
       "modelled)"),
    _r("llamafactory", "quantization_method", HONOURED, "method", "bnb only (hqq, eetq are refused)"),
    _r("llamafactory", "quantization_type", HONOURED, "quant", "nf4 (default) or fp4"),
    _r("llamafactory", "double_quantization", HONOURED, "double_quant", "on by default in LLaMA-Factory"),
    _r("llamafactory", "lora_rank", HONOURED, "lora_rank", "LoRA rank (default 8)"),
    _r("llamafactory", "lora_alpha", HONOURED, "lora_alpha", "default twice the rank; scaling only"),
    _r("llamafactory", "lora_dropout", HONOURED, "lora_dropout", "default 0"),
    _r("llamafactory", "lora_target", HONOURED, "lora_targets", "all (default: every linear layer but the head) or "
       "comma-separated module names"),
    _r("llamafactory", "use_dora", HONOURED, "dora", "DoRA"),
    _r("llamafactory", "use_rslora", IGNORED, "", "changes the adapters' scaling only", affects=False),
    _r("llamafactory", "additional_target", IGNORED, "", "the named modules become fully trainable: not modelled"),
    _r("llamafactory", "bf16", HONOURED, "precision, frozen_dtype, kbit_prep", "LLaMA-Factory loads the checkpoint's "
       "dtype (torch_dtype auto) and casts the trainable parameters to fp32: bf16 autocast over fp32 master weights "
       "(full, bf16-mixed) or over the checkpoint's frozen weights (LoRA; QLoRA without "
       "prepare_model_for_kbit_training, kbit_prep none)"),
    _r("llamafactory", "fp16", HONOURED, "precision", "fp16 autocast, as bf16"),
    _r("llamafactory", "pure_bf16", HONOURED, "precision", "everything in bf16, no fp32 copy (precision bf16)"),
    _r("llamafactory", "eval_strategy", HONOURED, "eval_batch", "steps or epoch: the run has an evaluation phase "
       "(estimate/run.py) on per_device_eval_batch_size samples; no (the default): none"),
    _r("llamafactory", "per_device_eval_batch_size", HONOURED, "eval_batch", "the evaluation's micro-batch "
       "(default 8), when eval_strategy evaluates"),
    _r("llamafactory", "per_device_train_batch_size", HONOURED, "batch", "micro-batch per GPU (transformers' default "
       "8)"),
    _r("llamafactory", "gradient_accumulation_steps", HONOURED, "accum", "gradient accumulation (default 1)"),
    _r("llamafactory", "cutoff_len", HONOURED, "seq", "the longest sample after truncation, or the packed length "
       "(default 2048)"),
    _r("llamafactory", "packing", HONOURED, "padding", "packed rows of cutoff_len tokens (default: true for stage pt "
       "only); unpacked micro-batches are padded to their longest sample"),
    _r("llamafactory", "neat_packing", APPROXIMATED, "padding", "packed rows whose samples do not attend to each "
       "other: modelled as packed"),
    _r("llamafactory", "disable_gradient_checkpointing", HONOURED, "grad_ckpt", "LLaMA-Factory checkpoints every "
       "decoder layer unless this is true"),
    _r("llamafactory", "use_unsloth_gc", APPROXIMATED, "grad_ckpt", "unsloth's checkpointing (checkpoints offloaded "
       "to host RAM): modelled as checkpointing on the GPU"),
    _r("llamafactory", "flash_attn", HONOURED, "attn", "auto and sdpa: SDPA; fa2/fa3: SDPA's flash kernel (the same "
       "O(seq) memory); disabled: eager"),
    _r("llamafactory", "enable_liger_kernel", HONOURED, "loss, kernels", "Liger's RMSNorm, RoPE and SwiGLU kernels "
       "(kernels liger); for stage sft and pt Liger also fuses the LM head with the cross-entropy (loss fused); "
       "a model type LLaMA-Factory does not patch (e.g. phi) keeps transformers' modules and loss"),
    _r("llamafactory", "use_unsloth", APPROXIMATED, "recipe", "unsloth's kernels and LoRA are not modelled: estimated as "
       "the Hugging Face step"),
    _r("llamafactory", "upcast_layernorm", IGNORED, "", "norms in fp32: not modelled"),
    _r("llamafactory", "upcast_lmhead_output", IGNORED, "", "the head's output in fp32: not modelled"),
    _r("llamafactory", "use_galore", HONOURED, "method", "refused: GaLore is not modelled"),
    _r("llamafactory", "use_apollo", HONOURED, "method", "refused: APOLLO is not modelled"),
    _r("llamafactory", "use_badam", HONOURED, "method", "refused: BAdam is not modelled"),
    _r("llamafactory", "use_llama_pro", HONOURED, "method", "refused: LLaMA Pro is not modelled"),
    _r("llamafactory", "optim", HONOURED, "optimizer", _OPTIM + " (TrainingArguments' default adamw_torch_fused)"),
    _r("llamafactory", "torch_compile", HONOURED, "compile", "torch.compile"),
    _r("llamafactory", "fsdp", HONOURED, "sharding, offload", "full_shard, shard_grad_op, hybrid_shard, no_shard; "
       "offload: parameters offloaded; the number of GPUs comes from --gpus"),
    _r("llamafactory", "deepspeed", HONOURED, "sharding, offload", "a DeepSpeed JSON (LLaMA-Factory's "
       "examples/deepspeed/ds_z3_config.json, say; a path relative to the config file, or inline): "
       "zero_optimization.stage and offload_optimizer / offload_param to cpu; the number of GPUs comes from --gpus"),
    # ----- accelerate launch --config_file (--launch; sections read as section.key, launch.py) -----------------
    _r("accelerate", "distributed_type", HONOURED, "sharding", "NO: one process; MULTI_GPU: DDP (or the training "
       "config's fsdp / deepspeed); FSDP: fsdp_config; DEEPSPEED: deepspeed_config; the others (TPU, Megatron-LM, "
       "CPU) are refused; FSDP in one file and DeepSpeed in the other is an error naming both"),
    _r("accelerate", "num_processes", HONOURED, "gpus", "the GPUs of every node together (--gpus overrides it); "
       "unset or -1 (every GPU of the machine) is refused: give it"),
    _r("accelerate", "mixed_precision", HONOURED, "precision", "transformers' TrainingArguments autocasts to it where the "
       "training config sets neither bf16 nor fp16 (a LLaMA-Factory config then trains {mixed_precision}-mixed); "
       "where the config sets one it must agree; fp8 is refused"),
    _r("accelerate", "compute_environment", IGNORED, "", "LOCAL_MACHINE only (SageMaker is refused)", affects=False),
    _r("accelerate", "use_cpu", IGNORED, "", "false only: training on the CPU is refused", affects=False),
    _r("accelerate", "num_machines", HONOURED, "gpus", "num_processes counts every node's GPUs; the estimate places "
       "them 8 to a node, so num_machines must be that many nodes (a thinner spread is refused)"),
    _r("accelerate", "fsdp_config.fsdp_version", HONOURED, "sharding", "1: fsdp_sharding_strategy; 2: "
       "fsdp_reshard_after_forward (fully_shard): both are FSDP's full sharding, or SHARD_GRAD_OP"),
    _r("accelerate", "fsdp_config.fsdp_sharding_strategy", HONOURED, "sharding", "FSDP1: FULL_SHARD fsdp, "
       "SHARD_GRAD_OP shard-grad-op, NO_SHARD no-shard, HYBRID_SHARD and HYBRID_SHARD_ZERO2 hybrid-shard (or 1-5)"),
    _r("accelerate", "fsdp_config.fsdp_reshard_after_forward", HONOURED, "sharding", "FSDP2: true fsdp, false "
       "shard-grad-op (parameters kept gathered from forward to backward)"),
    _r("accelerate", "fsdp_config.fsdp_offload_params", HONOURED, "offload", "true: FSDP's CPUOffload of the "
       "parameters (offload params)"),
    _r("accelerate", "fsdp_config.fsdp_cpu_ram_efficient_loading", HONOURED, "load", "true (the default): rank 0 "
       "loads the checkpoint, the others receive it (load cpu-rank0); false: every rank loads it into host RAM (cpu)"),
    _r("accelerate", "fsdp_config.fsdp_activation_checkpointing", HONOURED, "grad_ckpt", "true: FSDP checkpoints "
       "each wrapped layer (gradient checkpointing on, whatever the training config says)"),
    _r("accelerate", "fsdp_config.fsdp_activation_checkpointing_offload", HONOURED, "act_offload", "with "
       "fsdp_activation_checkpointing: the checkpoints offloaded to host RAM"),
    _r("accelerate", "fsdp_config.fsdp_state_dict_type", HONOURED, "save", "a full fine-tune's checkpoint: "
       "FULL_STATE_DICT gathered on rank 0 (save fsdp-full), SHARDED_STATE_DICT / LOCAL_STATE_DICT each rank its "
       "shard (fsdp-sharded); LoRA saves its adapters"),
    _r("accelerate", "fsdp_config.fsdp_auto_wrap_policy", HONOURED, "sharding", "TRANSFORMER_BASED_WRAP (one FSDP unit per "
       "decoder layer, as reportgen models FSDP); SIZE_BASED_WRAP and NO_WRAP are not modelled (a warning)"),
    _r("accelerate", "fsdp_config.fsdp_transformer_layer_cls_to_wrap", IGNORED, "", "the decoder layer's class "
       "(transformers' _no_split_modules by default)", affects=False),
    _r("accelerate", "fsdp_config.fsdp_backward_prefetch", HONOURED, "sharding", "BACKWARD_PRE: the layer computing and "
       "the prefetched next gathered at once, as reportgen's FSDP (estimate/sharding.py); BACKWARD_POST and "
       "NO_PREFETCH gather less: approximated as BACKWARD_PRE (errs high)"),
    _r("accelerate", "fsdp_config.fsdp_forward_prefetch", IGNORED, "", "prefetch in forward: not modelled"),
    _r("accelerate", "fsdp_config.fsdp_use_orig_params", IGNORED, "", "flat parameters keep their views: the same "
       "bytes", affects=False),
    _r("accelerate", "fsdp_config.fsdp_sync_module_states", IGNORED, "", "rank 0's weights broadcast at start (with "
       "fsdp_cpu_ram_efficient_loading)", affects=False),
    _r("accelerate", "deepspeed_config.deepspeed_config_file", HONOURED, "sharding, offload", "a DeepSpeed JSON, "
       "read as a training config's deepspeed key (zero_optimization.stage, offload_optimizer, offload_param)"),
    _r("accelerate", "deepspeed_config.zero_stage", HONOURED, "sharding", "ZeRO stage 0-3 (accelerate's default 2)"),
    _r("accelerate", "deepspeed_config.offload_optimizer_device", HONOURED, "offload", "cpu or nvme: the optimizer "
       "states offloaded (offload optimizer)"),
    _r("accelerate", "deepspeed_config.offload_param_device", HONOURED, "offload", "cpu or nvme (ZeRO-3): the "
       "parameters offloaded (offload params)"),
    _r("accelerate", "dynamo_config.dynamo_backend", APPROXIMATED, "compile", "INDUCTOR: torch.compile; another "
       "backend is modelled as inductor; NO: none"),
    # ----- torchtune (tune run RECIPE --config FILE; sections read as section.key) ----------------------
    _r("torchtune", "model._component_", HONOURED, "model, method, recipe", "the model builder: a catalog model of "
       "its shapes (Llama 2, 3, 3.1, 3.2, 3.3, Gemma, Gemma 2 9B, Qwen2.5 7B/14B, Phi-3 mini, Phi-4; Llama 3, 3.3 and "
       "Qwen2 7B approximated by the catalog model of the same shapes), another builder its HF checkpoint's "
       "config.json (checkpointer.checkpoint_dir) or refused, naming the Hub id to pass as --model; the Llama 3.2 "
       "Vision builders (image encoder and fusion layers) refused; a lora_*/"
       "qlora_* builder runs a LoRA recipe, any other a full one; torchtune's own loop (recipe loop, logits freed "
       "before backward)"),
    _r("torchtune", "model.quantize_base", APPROXIMATED, "method, quant, double_quant, kbit_prep", "true (the "
       "qlora_* builders' default): QLoRA; every base linear of the decoder layers a torchao NF4 tensor (blocks of 64, "
       "scalers quantized again to int8), modelled as bitsandbytes' NF4 with double quantization; the output "
       "projection stays in the model dtype; nothing prepared for k-bit training (kbit_prep none)"),
    _r("torchtune", "model.lora_rank", HONOURED, "lora_rank", "LoRA rank (the LoRA recipes read it without a "
       "default: required)"),
    _r("torchtune", "model.lora_alpha", HONOURED, "lora_alpha", "scaling only (required by the LoRA recipes)"),
    _r("torchtune", "model.lora_dropout", HONOURED, "lora_dropout", "the builders' default 0.0"),
    _r("torchtune", "model.lora_attn_modules", HONOURED, "lora_targets", "q_proj, k_proj, v_proj, output_proj (q, "
       "k, v, o); with apply_lora_to_mlp every linear of the decoder layers is all-linear"),
    _r("torchtune", "model.apply_lora_to_mlp", HONOURED, "lora_targets", "w1, w2, w3 (gate, down, up); the phi3 and "
       "phi4 builders' w1, w2, w3 are the HF model's fused gate_up_proj and down_proj"),
    _r("torchtune", "checkpointer.checkpoint_dir", HONOURED, "model", "read only for a builder without a catalog "
       "model: a FullModelHFCheckpointer's folder holding config.json (as tune download leaves it) is the model, "
       "its shapes checked against the builder's"),
    _r("torchtune", "model.apply_lora_to_output", HONOURED, "lora_targets", "an adapter on the output projection "
       "(lm_head)"),
    _r("torchtune", "model.use_dora", HONOURED, "dora", "DoRA"),
    _r("torchtune", "dtype", HONOURED, "precision", "torchtune trains without autocast: bf16 is pure bf16 (weights, "
       "adapters, gradients and optimizer states; precision bf16), fp32 or null is fp32; fp16 is refused, as the "
       "recipes refuse it"),
    _r("torchtune", "batch_size", HONOURED, "batch", "micro-batch per GPU (required)"),
    _r("torchtune", "gradient_accumulation_steps", HONOURED, "accum", "gradient accumulation (required)"),
    _r("torchtune", "tokenizer.max_seq_len", HONOURED, "seq", "the tokenizer truncates to it, and packs rows of it; "
       "null (torchtune's configs' default): the longest sample decides, give --seq"),
    _r("torchtune", "dataset.packed", HONOURED, "padding", "packed rows of max_seq_len tokens; otherwise "
       "padded_collate_sft pads each batch to its longest sample"),
    _r("torchtune", "dataset", HONOURED, "padding", "a list of datasets (ConcatDataset): packed when each is"),
    _r("torchtune", "enable_activation_checkpointing", HONOURED, "grad_ckpt", "checkpoints every decoder layer "
       "(default false)"),
    _r("torchtune", "enable_activation_offloading", HONOURED, "act_offload", "saved activations offloaded to host "
       "RAM; needs checkpointing (the recipes raise without it)"),
    _r("torchtune", "compile", HONOURED, "compile", "torch.compile of each layer and the loss"),
    _r("torchtune", "optimizer_in_bwd", HONOURED, "optimizer_in_backward", "full recipes: each parameter's optimizer "
       "steps in its gradient hook (needs gradient_accumulation_steps 1); the LoRA recipes do not read it"),
    _r("torchtune", "loss._component_", HONOURED, "loss", "torchtune.modules.loss.CEWithChunkedOutputLoss: loss "
       "chunked (16-bit logits in chunks, upcast one at a time); torch.nn.CrossEntropyLoss: fp32 logits (loss "
       "standard); DPO, PPO and distillation losses are refused"),
    _r("torchtune", "loss.num_output_chunks", IGNORED, "", "the chunks of the logits: reportgen models torchtune's "
       "default 8"),
    _r("torchtune", "optimizer._component_", HONOURED, "optimizer, offload", "torch.optim.AdamW (Adam, "
       "bitsandbytes.optim.AdamW approximated by it), SGD without momentum, bitsandbytes.optim.PagedAdamW, AdamW8bit, "
       "PagedAdamW8bit, torchao's AdamW8bit (approximated by bitsandbytes'), torchao's CPUOffloadOptimizer "
       "(optimizer states on the CPU, its optimizer_class read); others refused"),
    _r("torchtune", "optimizer.optimizer_class", HONOURED, "optimizer", "the optimizer CPUOffloadOptimizer wraps "
       "(default torch.optim.AdamW)"),
    _r("torchtune", "optimizer.momentum", HONOURED, "optimizer", "SGD's momentum: 0 only (a momentum buffer is not "
       "modelled)"),
    _r("torchtune", "optimizer.fused", IGNORED, "", "the fused AdamW kernel: the same states; its speed is not "
       "modelled"),
    _r("torchtune", "fsdp_cpu_offload", HONOURED, "sharding, offload", "distributed recipes: FSDP2 with the "
       "parameters offloaded to the CPU (offload params); the number of GPUs comes from --gpus"),
    _r("torchtune", "fsdp_reshard_after_forward", HONOURED, "sharding", "distributed recipes: false keeps the "
       "parameters gathered from forward to backward (shard-grad-op); true (default) is full sharding"),
    _r("torchtune", "custom_sharded_layers", IGNORED, "", "the embeddings and output sharded as their own FSDP units "
       "(full distributed recipe): not modelled"),
    _r("torchtune", "ac_mode", IGNORED, "", "selective activation checkpointing, used when "
       "enable_activation_checkpointing is false: not modelled"),
    _r("torchtune", "ac_option", IGNORED, "", "selective checkpointing's layer interval: not modelled"),
    _r("torchtune", "tensor_parallel_dim", HONOURED, "sharding", "1 only: tensor parallelism is refused (not "
       "modelled)"),
    _r("torchtune", "tensor_parallel_plan", IGNORED, "", "tensor parallelism's plan: not modelled"),
    _r("torchtune", "collate_fn", IGNORED, "", "another collator than padded_collate_sft: not modelled"),
    _r("torchtune", "clip_grad_norm", IGNORED, "", "gradient clipping: a norm over the gradients, not modelled"),
    _r("torchtune", "profiler.enabled", IGNORED, "", "the torch profiler's trace: not modelled"),
    _r("torchtune", "low_cpu_ram", IGNORED, "", "how the checkpoint is saved: host memory only", affects=False),
    # ----- unsloth (its calls' keyword arguments as YAML sections; keys read as section.key) ---------------
    _r("unsloth", "from_pretrained.model_name", APPROXIMATED, "model, recipe, loss", "an unsloth/... repo (a "
       "re-upload or pre-quantized copy; unsloth/models/mapper.py names the original checkpoint) is the catalog model "
       "of the original's shapes (Llama 3 8B/70B: Llama 3.1's), another one refused (pass --model); any other Hub id or "
       "path as the other tools'. unsloth's trainer is TRL's SFTTrainer, its model computing the loss in chunks "
       "(unsloth_fused_ce_loss, unsloth/models/llama.py): recipe trainer with loss fused; its own Triton kernels are "
       "not modelled"),
    _r("unsloth", "from_pretrained.max_seq_length", HONOURED, "seq", "the longest sample (default 2048): unsloth's "
       "trainer truncates to it (unsloth/models/rl.py), or to SFTConfig's max_length where that is set below it"),
    _r("unsloth", "from_pretrained.dtype", HONOURED, "precision, frozen_dtype, kbit_prep", "null: bfloat16 where the "
       "card has it, float16 otherwise (unsloth/models/llama.py). LoRA/QLoRA: only the adapters are upcast to fp32 "
       "(unsloth_zoo training_utils.py prepare_model_for_training), autocast in the model's dtype (bf16-mixed, frozen "
       "weights and unquantized layers in it: kbit_prep none); float32: fp32 throughout"),
    _r("unsloth", "from_pretrained.load_in_4bit", APPROXIMATED, "method, quant, double_quant", "true (unsloth's "
       "default): QLoRA with unsloth's BitsAndBytesConfig: NF4, double quantization, lm_head kept in 16 bit "
       "(llama.py, unsloth_zoo peft_utils.py SKIP_QUANTIZATION_MODULES); a pre-quantized -bnb-4bit repo's own "
       "quantization_config is modelled as the same"),
    _r("unsloth", "from_pretrained.load_in_16bit", HONOURED, "method", "LoRA on 16-bit weights (also load_in_4bit: "
       "false)"),
    _r("unsloth", "from_pretrained.full_finetuning", HONOURED, "method, precision", "full fine-tuning: a bf16 "
       "model trains in pure bf16 (precision bf16) unless float32_mixed_precision; get_peft_model's keys are unused"),
    _r("unsloth", "from_pretrained.float32_mixed_precision", HONOURED, "precision", "full fine-tuning of a bf16 model: "
       "true keeps fp32 master weights under bf16 autocast (bf16-mixed)"),
    _r("unsloth", "from_pretrained.load_in_8bit", HONOURED, "method", "false only: 8-bit LoRA is not modelled, true "
       "is refused"),
    _r("unsloth", "from_pretrained.load_in_fp8", HONOURED, "method", "false only: fp8 LoRA is not modelled, true or "
       "block is refused"),
    _r("unsloth", "from_pretrained.use_gradient_checkpointing", APPROXIMATED, "grad_ckpt, act_offload", "full "
       "fine-tuning's checkpointing (LoRA: get_peft_model's); unsloth (default): offloaded checkpointing, modelled as "
       "checkpointing with activation offload; true: checkpointing"),
    _r("unsloth", "from_pretrained.offload_embedding", IGNORED, "", "the input embeddings kept in host RAM: not "
       "modelled"),
    _r("unsloth", "from_pretrained.unsloth_tiled_mlp", IGNORED, "", "the MLP run in tiles of tokens: not modelled"),
    _r("unsloth", "from_pretrained.fast_inference", IGNORED, "", "a vLLM engine beside the model (GRPO): not "
       "modelled for SFT"),
    _r("unsloth", "from_pretrained.gpu_memory_utilization", IGNORED, "", "vLLM's share of the card with "
       "fast_inference: not modelled"),
    _r("unsloth", "from_pretrained.qat_scheme", IGNORED, "", "quantization-aware training: not modelled"),
    _r("unsloth", "from_pretrained.rope_scaling", IGNORED, "", "RoPE scaling: the same tensors", affects=False),
    _r("unsloth", "from_pretrained.max_lora_rank", IGNORED, "", "vLLM's LoRA rank limit (fast_inference only)",
       affects=False),
    _r("unsloth", "get_peft_model.r", HONOURED, "lora_rank", "LoRA rank (default 16)"),
    _r("unsloth", "get_peft_model.lora_alpha", HONOURED, "lora_alpha", "scaling only (default 16)"),
    _r("unsloth", "get_peft_model.lora_dropout", HONOURED, "lora_dropout", "default 0 (unsloth's fast LoRA kernels "
       "want 0)"),
    _r("unsloth", "get_peft_model.target_modules", HONOURED, "lora_targets", "module names; unsloth's default, "
       "q/k/v/o and gate/up/down, is all-linear"),
    _r("unsloth", "get_peft_model.use_gradient_checkpointing", APPROXIMATED, "grad_ckpt, act_offload", "unsloth "
       "(default): unsloth_zoo's Unsloth_Offloaded_Gradient_Checkpointer moves each layer's input checkpoint to host "
       "RAM and back for the recomputation: modelled as checkpointing with activation offload (act_offload); true: "
       "checkpointing on the GPU; false: none"),
    _r("unsloth", "get_peft_model.bias", APPROXIMATED, "lora_targets", "none (default); lora_only or all also train "
       "the biases: not modelled (a vector per layer)"),
    _r("unsloth", "get_peft_model.use_rslora", IGNORED, "", "changes the adapters' scaling only", affects=False),
    _r("unsloth", "get_peft_model.modules_to_save", IGNORED, "", "the named modules become fully trainable copies: "
       "not modelled"),
    _r("unsloth", "get_peft_model.layers_to_transform", IGNORED, "", "adapters on some layers only: not modelled"),
    _r("unsloth", "get_peft_model.finetune_last_n_layers", IGNORED, "", "adapters on the last layers only: not "
       "modelled"),
    _r("unsloth", "get_peft_model.target_parameters", IGNORED, "", "adapters on parameters (MoE experts): not "
       "modelled"),
    _r("unsloth", "get_peft_model.offload_layers", IGNORED, "", "layers kept in host RAM: not modelled"),
    _r("unsloth", "get_peft_model.checkpoint_skip_layers", IGNORED, "", "layers left out of checkpointing: not "
       "modelled"),
    _r("unsloth", "get_peft_model.qat_scheme", IGNORED, "", "quantization-aware training: not modelled"),
    _r("unsloth", "SFTConfig.per_device_train_batch_size", HONOURED, "batch", "micro-batch per GPU (unsloth's "
       "SFTConfig default 4, unsloth/models/rl.py)"),
    _r("unsloth", "SFTConfig.gradient_accumulation_steps", HONOURED, "accum", "gradient accumulation (unsloth's "
       "default 2)"),
    _r("unsloth", "SFTConfig.max_length", HONOURED, "seq", "caps the model's max_seq_length where set below it (TRL's "
       "default 1024 is not taken as a cap, unsloth/models/rl.py)"),
    _r("unsloth", "SFTConfig.max_seq_length", HONOURED, "seq", "as max_length (unsloth's SFTConfig keeps the old "
       "name)"),
    _r("unsloth", "SFTConfig.packing", HONOURED, "padding", "packed rows of max_seq_length tokens"),
    _r("unsloth", "SFTConfig.padding_free", APPROXIMATED, "padding", "unsloth turns padding-free batching on unless "
       "packing or padding_free: false (unsloth/trainer.py): modelled as packed rows; false: each micro-batch padded "
       "to its longest sample"),
    _r("unsloth", "SFTConfig.bf16", HONOURED, "precision", "must agree with the model's dtype (unsloth raises "
       "TypeError otherwise); the autocast follows the dtype"),
    _r("unsloth", "SFTConfig.fp16", HONOURED, "precision", "as bf16"),
    _r("unsloth", "SFTConfig.optim", HONOURED, "optimizer", _OPTIM + " (unsloth's SFTConfig default adamw_8bit)"),
    _r("unsloth", "SFTConfig.fsdp", HONOURED, "sharding, offload", "as TRL's; the number of GPUs comes from --gpus"),
    _r("unsloth", "SFTConfig.deepspeed", HONOURED, "sharding, offload", "as TRL's; the number of GPUs comes from "
       "--gpus"),
    _r("unsloth", "SFTConfig.gradient_checkpointing", IGNORED, "", "unsloth's trainer checkpoints as the model was "
       "set up (get_peft_model's use_gradient_checkpointing wins, unsloth/models/rl.py)", affects=False),
    _r("unsloth", "SFTConfig.torch_compile", IGNORED, "", "torch.compile over unsloth's compiled model: not modelled"),
    _r("unsloth", "SFTConfig.activation_offloading", IGNORED, "", "TRL's activation offloading: not modelled with "
       "unsloth"),
    _r("unsloth", "SFTConfig.use_liger_kernel", IGNORED, "", "Liger's kernels over unsloth's: not modelled"),
)


def rows(tool: str) -> list[Row]:
    return [r for r in ROWS if r.tool == tool]


def row(tool: str, key: str) -> Row | None:
    return _index().get((tool, key))


@lru_cache(maxsize=None)
def _index() -> dict[tuple[str, str], Row]:
    return {(r.tool, r.key): r for r in ROWS}


@lru_cache(maxsize=None)
def schema() -> dict:
    """``keys.json``: each tool's version and every key of its schema with the tool's default."""
    return json.loads(resources.files(__package__).joinpath("keys.json").read_text())


def default(tool: str, key: str):
    """The tool's own default for a key (``keys.json``; TRL's GRPO keys from its ``grpo_keys``; unsloth's trainer
    section: TRL's, with the defaults unsloth's patched config puts in their place)."""
    return known_keys(tool)[key]


@lru_cache(maxsize=None)
def known_keys(tool: str) -> dict:
    """Every key of the tool's schema (TRL: SFT's and GRPO's; unsloth: its two calls' arguments, and TRL's
    ``SFTConfig`` keys as ``SFTConfig.key`` with ``trainer_defaults`` over TRL's defaults)."""
    data = schema()[tool]
    if tool == "unsloth":
        trainer = {**schema()["trl"]["keys"], **data["trainer_defaults"]}
        return {**data["keys"], **{f"SFTConfig.{k}": v for k, v in trainer.items()}}
    return {**data["keys"], **data.get("grpo_keys", {})}


def version(tool: str) -> str:
    return schema()[tool]["version"]
