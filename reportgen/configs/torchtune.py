"""A torchtune ``tune run`` config (a recipe's YAML: ``_component_`` sections) as a model and setup fields,
with torchtune 0.6.1's keys and defaults (``keys.json``, read from its wheel by ``scripts/config_keys.py``).

The file's sections are read as ``section.key`` (``model.lora_rank``, ``loss._component_``); a value that is
exactly one OmegaConf interpolation of another key (``${tokenizer.max_seq_len}``) is read as that key's value,
and any other interpolation (a resolver, ``${oc.env:X}``, or text around it) in a key that sets the setup is
refused. What torchtune 0.6.1 does with each key, from its source (the wheel ships the recipes):

* the four fine-tuning recipes (``recipes/lora_finetune_single_device.py``, ``lora_finetune_distributed.py``,
  ``full_finetune_single_device.py``, ``full_finetune_distributed.py``) build the model under
  ``training.set_default_dtype(self._dtype)`` and train without autocast: ``dtype: bf16`` is pure bf16 (precision
  bf16; ``validate_expected_param_dtype`` checks the LoRA adapters are in that dtype too), ``fp32`` is fp32, and
  ``fp16`` is refused by each recipe (``ValueError``); ``training/precision.py`` ``get_dtype``: null is fp32;
* the model: a builder a catalog model has the shapes of (``CATALOG``); another builder is the config.json of the
  HF checkpoint ``FullModelHFCheckpointer`` loads into it (``checkpointer.checkpoint_dir``), where that folder is
  on this machine, else ``--model`` (the refusal names the Hub id torchtune's own configs download for it); the
  llama3_2_vision builders (a ``DeepFusionModel``: image encoder and fusion layers) are refused;
* which recipe: a LoRA builder (``lora_*``/``qlora_*``, with ``lora_rank``) runs a LoRA recipe, any other builder
  a full one; a key only the distributed recipes read (``fsdp_cpu_offload``, ``fsdp_reshard_after_forward``,
  ``custom_sharded_layers``, ``ac_mode``, ``tensor_parallel_dim``, ...) makes it a distributed run, which shards
  with FSDP2 (``training.shard_model``, ``fully_shard``): the number of GPUs is ``tune run --nproc_per_node``'s
  (``--gpus``), and ``--gpus N`` over a single-device file is estimated as the distributed recipe, FSDP (torchtune
  has no DDP recipe). ``fsdp_cpu_offload`` offloads the parameters (``CPUOffloadPolicy``);
  ``fsdp_reshard_after_forward: false`` is SHARD_GRAD_OP (the recipes' docstrings say so);
* ``models/*/_component_builders.py``: ``quantize_base`` (the ``qlora_*`` builders are
  ``partial(lora_*, quantize_base=True)``) makes every base linear of the decoder layers a torchao ``NF4Tensor``
  (``FrozenNF4Linear``, ``LoRALinear``'s ``to_nf4``), while the output projection stays in the model dtype
  ("quantize_base is not applied to final output_proj currently"): quant nf4, quant_head false; torchao's
  ``to_nf4`` (``torchao/dtypes/nf4tensor.py``, v0.10.0: ``block_size=64, scaler_block_size=256``,
  ``double_quantize_scalers``) always quantizes its scalers to int8 again: modelled as bitsandbytes' NF4 with double
  quantization. Nothing is prepared for k-bit training (kbit_prep none);
* LoRA targets: ``lora_attn_modules`` (q_proj, k_proj, v_proj, output_proj), ``apply_lora_to_mlp`` (w1, w2, w3:
  gate, down, up), ``apply_lora_to_output`` (the head). The phi3 and phi4 builders (``models/phi3/
  _component_builders.py`` ``lora_phi3``, which ``phi4/_model_builders.py`` builds on) keep q_proj, k_proj, v_proj
  and the MLP's w1, w2, w3 apart, while the HF Phi-3 model they load (transformers ``models/phi3/modeling_phi3.py``:
  ``Phi3Attention.qkv_proj``, ``Phi3MLP.gate_up_proj``, ``down_proj``) fuses them: q, k or v is read as its
  ``qkv_proj`` (``model.py`` ``lora_selection``) and ``apply_lora_to_mlp`` as ``gate_up_proj`` and ``down_proj``
  (approximated: one adapter per fused module, not one per torchtune projection); the builders' defaults are rank 8, alpha 16, dropout 0,
  no DoRA (``_model_builders.py``), but the LoRA recipes read ``model.lora_rank``, ``lora_alpha``,
  ``lora_attn_modules`` and ``apply_lora_to_mlp`` without a default (``cfg_model.lora_rank``): a file without
  them stops the recipe, and is refused here;
* ``enable_activation_checkpointing`` (default false) checkpoints every ``TransformerSelfAttentionLayer``;
  ``enable_activation_offloading`` (default false) offloads the saved activations and needs checkpointing
  (each recipe raises ``RuntimeError`` without it); ``compile`` compiles each layer and the loss
  (``training.compile_loss``: ``CEWithChunkedOutputLoss.apply_compile_strategy`` compiles each chunk's
  cross-entropy, which then keeps no fp32 log-softmax: loss chunked-compiled, ``estimate/logits.py``);
* the loss: ``modules/loss/ce_chunked_output_loss.py`` ``CEWithChunkedOutputLoss`` (the model writes its
  logits in ``num_output_chunks`` chunks, upcast one at a time: loss chunked); ``torch.nn.CrossEntropyLoss`` over
  ``TransformerDecoder.unembed``'s ``.float()`` logits: loss standard; the training loop frees the logits before
  backward (``del logits``) and steps the optimizer after it (or in it, ``optimizer_in_bwd``: full recipes):
  recipe loop, keep_outputs none;
* ``dataset.packed`` packs rows of ``tokenizer.max_seq_len`` tokens (``datasets/_packed.py``); unpacked batches
  are padded to their longest sample (the recipes' ``collate_fn`` default, ``padded_collate_sft``); the
  tokenizer's ``max_seq_len`` truncates, and null (torchtune's own configs' default) leaves the longest sample
  to the data: then ``--seq`` must be given;
* the recipes do not read attention settings: torchtune's attention is SDPA (attn sdpa); the model is
  torchtune's own ``TransformerDecoder`` (modeling torchtune: k and v copied to every head, no mask on padded
  batches, fp32 RoPE caches; ``estimate/recipes.py``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from reportgen.configs import table
from reportgen.configs.common import Reader, Translation, finish

#: torchtune builders (after ``lora_``/``qlora_``) whose shapes are a catalog model's; the approximated ones are
#: another checkpoint of the same shapes (``tests/test_configs_torchtune.py`` checks the shapes against keys.json)
CATALOG = {"llama2_7b": "llama-2-7b", "llama2_13b": "llama-2-13b", "llama2_70b": "llama-2-70b",
           "llama3_1_8b": "llama-3.1-8b", "llama3_1_70b": "llama-3.1-70b", "llama3_2_1b": "llama-3.2-1b",
           "llama3_2_3b": "llama-3.2-3b", "llama3_8b": "llama-3.1-8b", "llama3_70b": "llama-3.1-70b", "llama3_3_70b": "llama-3.1-70b",
           "gemma_2b": "gemma-2b", "gemma_7b": "gemma-7b", "gemma2_9b": "gemma-2-9b",
           "qwen2_5_7b_base": "qwen2.5-7b", "qwen2_5_7b_instruct": "qwen2.5-7b", "qwen2_5_14b_base": "qwen2.5-14b",
           "qwen2_5_14b_instruct": "qwen2.5-14b", "qwen2_7b": "qwen2.5-7b", "phi3_mini": "phi-3-mini",
           "phi4_14b": "phi-4"}
#: the same shapes under another checkpoint's name
SAME_SHAPES = {"llama3_8b": "Llama 3 8B", "llama3_70b": "Llama 3 70B", "llama3_3_70b": "Llama 3.3 70B",
               "qwen2_5_7b_instruct": "Qwen2.5 7B Instruct",
               "qwen2_5_14b_instruct": "Qwen2.5 14B Instruct", "qwen2_7b": "Qwen2 7B"}
#: torchtune's module names -> the setup's lora_targets names
ATTN = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "output_proj": "o"}
#: the builders' packages whose HF model fuses q/k/v and gate/up (phi4's builders call phi3's component builders)
FUSED = ("torchtune.models.phi3.", "torchtune.models.phi4.")
LOSSES = {"torchtune.modules.loss.CEWithChunkedOutputLoss": "chunked", "torch.nn.CrossEntropyLoss": "standard"}
OPTIMIZERS = {"torch.optim.AdamW": "adamw", "torch.optim.Adam": "adamw", "torch.optim.SGD": "sgd",
              "bitsandbytes.optim.AdamW": "adamw", "bitsandbytes.optim.PagedAdamW": "paged-adamw",
              "bitsandbytes.optim.PagedAdamW32bit": "paged-adamw", "bitsandbytes.optim.AdamW8bit": "adamw-8bit",
              "bitsandbytes.optim.PagedAdamW8bit": "paged-adamw-8bit", "torchao.optim.AdamW8bit": "adamw-8bit",
              "torchao.prototype.low_bit_optim.AdamW8bit": "adamw-8bit"}
#: builders of a vision-language model (``models/llama3_2_vision/_model_builders.py`` returns a ``DeepFusionModel``,
#: the only ``modules/model_fusion`` model among torchtune 0.6.1's builders)
VISION = ("torchtune.models.llama3_2_vision.",)
HF_CHECKPOINTER = "torchtune.training.FullModelHFCheckpointer"
#: a builder's literal shapes (keys.json ``shapes``) -> the config.json field and the ModelSpec attribute
SHAPES = {"vocab_size": ("vocab_size", "vocab_size"), "num_layers": ("num_hidden_layers", "num_layers"),
          "embed_dim": ("hidden_size", "hidden_size"), "num_heads": ("num_attention_heads", "num_heads"),
          "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
          "intermediate_dim": ("intermediate_size", "intermediate_size")}
CPU_OFFLOAD = ("torchao.optim.CPUOffloadOptimizer", "torchao.prototype.low_bit_optim.CPUOffloadOptimizer")
#: keys only the distributed recipes read (keys.json "recipes")
DISTRIBUTED = ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "custom_sharded_layers", "ac_mode", "ac_option",
               "tensor_parallel_dim", "tensor_parallel_plan")
#: keys of torchtune's other recipes (knowledge distillation, DPO, PPO, QAT): not a fine-tuning run reportgen models
OTHER_RECIPES = {"teacher_model": "knowledge distillation (knowledge_distillation_*.py)",
                 "kd_loss": "knowledge distillation (knowledge_distillation_*.py)",
                 "ref_policy_checkpointer": "PPO (ppo_full_finetune_single_device.py)",
                 "reward_and_value_model": "PPO (ppo_full_finetune_single_device.py)",
                 "quantizer": "quantization-aware training (qat_distributed.py)"}
_INTERPOLATION = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")


def flatten(doc: dict) -> dict:
    """A torchtune config's sections as ``section.key`` (one level: the components' arguments), each value that
    is exactly ``${other.key}`` replaced by that key's value, as OmegaConf resolves it."""
    flat: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, dict) and v:
            flat.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            flat[k] = v
    for key, value in list(flat.items()):
        seen = {key}
        while isinstance(value, str) and _INTERPOLATION.fullmatch(value.strip()):
            ref = _INTERPOLATION.fullmatch(value.strip()).group(1)
            if ref in seen or ref not in flat:
                break
            seen.add(ref)
            value = flat[ref]
        flat[key] = value
    return flat


def _plain(r: Reader, key: str) -> None:
    value = r.doc.get(key)
    if isinstance(value, str) and "${" in value:
        raise r.error(key, f"{value!r}: an OmegaConf interpolation reportgen does not resolve (only ${{key}} of a "
                      "key in this file)", hint="write the value itself")


def translate(r: Reader) -> Translation:
    t = Translation(tool="torchtune", path=str(r.path), multi_gpu="fsdp")
    for key in r.doc:
        if key.split(".")[0] in OTHER_RECIPES:
            raise r.error(key, f"a {OTHER_RECIPES[key.split('.')[0]]} config: not a fine-tuning run reportgen models",
                          hint="estimate the fine-tuning recipe's config (lora_finetune_*, full_finetune_*)")
    for key in ("model._component_", "loss._component_", "optimizer._component_", "dtype", "batch_size",
                "gradient_accumulation_steps", "tokenizer.max_seq_len", "dataset.packed", "compile",
                "enable_activation_checkpointing", "enable_activation_offloading", "optimizer_in_bwd",
                "fsdp_cpu_offload", "fsdp_reshard_after_forward"):
        _plain(r, key)
    builder = _model(r, t)
    lora = "lora_rank" in table.schema()["torchtune"]["builders"][builder]
    method = _method(r, t, builder) if lora else "full"
    if not lora:
        t.set("method", "full", "model._component_")
    _precision(r, t, method)
    t.set("batch", _required_int(r, "batch_size"), "batch_size")
    t.set("accum", _required_int(r, "gradient_accumulation_steps"), "gradient_accumulation_steps")
    _length(r, t)
    ckpt = bool(r.boolean("enable_activation_checkpointing", False))
    offload = bool(r.boolean("enable_activation_offloading", False))
    if offload and not ckpt:
        raise r.error("enable_activation_offloading", "needs enable_activation_checkpointing: true (torchtune's "
                      "recipes raise RuntimeError without it)", hint="enable_activation_checkpointing: true")
    t.set("grad_ckpt", ckpt, "enable_activation_checkpointing")
    t.set("act_offload", offload, "enable_activation_offloading")
    t.set("compile", bool(r.boolean("compile", False)), "compile")
    if not lora:
        t.set("optimizer_in_backward", bool(r.boolean("optimizer_in_bwd", False)), "optimizer_in_bwd")
    t.set("attn", "sdpa", "model._component_")
    t.set("recipe", "loop", "model._component_")
    t.set("modeling", "torchtune", "model._component_")
    _loss(r, t)
    _optimizer(r, t)
    _distributed(r, t)
    return finish(r, t)


def _model(r: Reader, t: Translation) -> str:
    """The builder (``model._component_``) and the catalog model of its shapes."""
    key = "model._component_"
    value = r.get(key)
    builders = table.schema()["torchtune"]["builders"]
    if not isinstance(value, str) or not value.strip():
        raise r.error(key if key in r.doc else "model", "a torchtune config names its model builder here (e.g. "
                      f"torchtune.models.llama3_1.lora_llama3_1_8b; got {value!r})")
    value = value.strip()
    if value not in builders:
        import difflib

        close = difflib.get_close_matches(value, list(builders), n=2, cutoff=0.8)
        raise r.error(key, f"{value!r} is not a model builder of torchtune {table.version('torchtune')}",
                      hint=("did you mean " + " or ".join(close) + "? " if close else "")
                      + "or pass --model ORG/NAME (a Hub id or config.json) with --method")
    name = value.rsplit(".", 1)[1]
    base = re.sub(r"^q?lora_", "", name)
    if value.startswith(VISION):
        raise r.error(key, f"{name}: a vision-language model (torchtune's DeepFusionModel: a CLIP image encoder and "
                      "fusion cross-attention layers, trained per decoder_trainable/encoder_trainable/"
                      "fusion_trainable): not modelled, with or without --model",
                      hint="estimate a text model's config (e.g. torchtune's llama3_1 or llama3_2 builders)")
    positions = table.schema()["torchtune"]["shapes"].get(value, {}).get("max_seq_len")
    if positions:  # its RoPE caches are built at the builder's max_seq_len (estimate/recipes.py)
        t.set("rope_positions", positions, key)
    if base not in CATALOG:  # its HF checkpoint's config.json, or --model beside the file (flags.py refuses without)
        _checkpoint_model(r, t, name, f"{value.rsplit('.', 1)[0]}.{base}")
        return value
    t.model = CATALOG[base]
    if base in SAME_SHAPES:
        t.approx(key, f"{SAME_SHAPES[base]} has the shapes of the catalog's {t.model}")
    return value


def _checkpoint_model(r: Reader, t: Translation, name: str, plain: str) -> None:
    """A builder no catalog model stands for: the HF checkpoint torchtune loads into it, where it is on this machine
    (``FullModelHFCheckpointer`` reads ``checkpoint_dir/config.json``, relative to the working directory:
    ``training/checkpointing/_checkpointer.py``), its shapes checked against the builder's (keys.json ``shapes``);
    otherwise the refusal names the Hub ids torchtune's own configs download for the builder (keys.json ``downloads``,
    their ``tune download`` line) for ``--model``."""
    key, folder = "checkpointer.checkpoint_dir", r.doc.get("checkpointer.checkpoint_dir")  # read only where used
    config = Path(folder.strip()) / "config.json" if isinstance(folder, str) and folder.strip() else None
    if r.doc.get("checkpointer._component_") == HF_CHECKPOINTER and config is not None and config.is_file():
        r.get(key)
        from reportgen import catalog
        from reportgen.errors import UserError

        try:
            spec = catalog.load_model(str(config))
        except UserError as exc:
            raise r.error(key, f"{config}: {exc.message}", hint=exc.hint) from None
        shapes = table.schema()["torchtune"]["shapes"].get(plain, {})
        for ours, (theirs, field) in SHAPES.items():
            if shapes.get(ours) is not None and shapes[ours] != getattr(spec, field):
                raise r.error(key, f"{config} has {theirs} {getattr(spec, field)}, but {name} builds {ours} "
                              f"{shapes[ours]}: torchtune cannot load this checkpoint into it",
                              hint="point checkpoint_dir at the builder's checkpoint, or pass --model")
        t.model = str(config)
        relative = "" if config.is_absolute() else " (relative to the working directory, as torchtune opens it)"
        t.read_from.append((key, f"{config}{relative}: {name} has no catalog model, its checkpoint's config is read"))
        return
    hubs = table.schema()["torchtune"].get("downloads", {}).get(plain, [])
    then = (f"; torchtune's own configs train {' or '.join(hubs)} with it: pass --model {hubs[0]} (or its local "
            "config.json)" if hubs else "")
    t.model_missing = (f"{r.where('model._component_')}: model._component_: {name}: reportgen has no catalog model "
                       f"with this builder's shapes, and no {key}/config.json of a FullModelHFCheckpointer on this "
                       f"machine{then}")


def _method(r: Reader, t: Translation, builder: str) -> str:
    """LoRA or QLoRA (``quantize_base``) and the adapters, with the builder's defaults where the file is silent."""
    defaults = table.schema()["torchtune"]["builders"][builder]
    for key in ("model.lora_rank", "model.lora_alpha", "model.lora_attn_modules", "model.apply_lora_to_mlp"):
        if not r.has(key):
            raise r.error(key if key in r.doc else "model", f"{key.split('.')[1]} is missing: torchtune's LoRA recipes "
                          f"read cfg.model.{key.split('.')[1]} without a default and stop without it",
                          hint=f"add {key.split('.')[1]} under model")
    quantized = bool(r.boolean("model.quantize_base", defaults.get("quantize_base", False)))
    method = "qlora" if quantized else "lora"
    t.set("method", method, "model.quantize_base" if r.has("model.quantize_base") else "model._component_")
    t.set("lora_rank", r.integer("model.lora_rank", minimum=1), "model.lora_rank")
    alpha = r.number("model.lora_alpha")
    t.set("lora_alpha", max(1, round(alpha)), "model.lora_alpha")
    if alpha != round(alpha):
        t.approx("model.lora_alpha", f"{alpha:g}: scaling only, read as {round(alpha)}")
    t.set("lora_dropout", r.number("model.lora_dropout", defaults.get("lora_dropout", 0.0)), "model.lora_dropout")
    if r.boolean("model.use_dora", defaults.get("use_dora", False)):
        t.set("dora", True, "model.use_dora")
    _targets(r, t, builder.startswith(FUSED))
    if method == "qlora":
        t.set("quant", "nf4", "model.quantize_base")
        t.set("double_quant", True, "model.quantize_base")
        t.set("kbit_prep", "none", "model.quantize_base")
        t.approx("model._component_" if not r.has("model.quantize_base") else "model.quantize_base",
                 "torchao's NF4 (blocks of 64, scalers quantized to int8 in blocks of 256): modelled as bitsandbytes' "
                 "NF4 with double quantization; the output projection stays in the model dtype")
    return method


def _targets(r: Reader, t: Translation, fused: bool) -> None:
    """The adapters as the HF model's modules: a phi builder's MLP is the fused gate_up_proj and down_proj."""
    key = "model.lora_attn_modules"
    value = r.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) and v in ATTN for v in value):
        raise r.error(key, f"must be a list of q_proj, k_proj, v_proj, output_proj (got {value!r})")
    mlp = r.as_boolean("model.apply_lora_to_mlp", r.get("model.apply_lora_to_mlp"), strings=False)
    head = r.boolean("model.apply_lora_to_output", False)
    names = [ATTN[m] for m in ATTN if m in value]
    if mlp:
        names += ["gate_up", "down"] if fused else ["gate", "up", "down"]
    if len(names) == len(ATTN) + (2 if fused else 3):
        names = ["all-linear"]
    if not names:
        raise r.error(key, "no adapters: an empty lora_attn_modules without apply_lora_to_mlp trains nothing",
                      hint="e.g. lora_attn_modules: [q_proj, v_proj]")
    t.set("lora_targets", ",".join(names + (["lm_head"] if head else [])), key)
    if fused and (set(value) & {"q_proj", "k_proj", "v_proj"} or mlp):
        t.approx(key, "torchtune's Phi builders keep q_proj, k_proj, v_proj and the MLP's w1, w2, w3 apart; the HF "
                 "model's adapters sit on its fused qkv_proj and gate_up_proj")


def _precision(r: Reader, t: Translation, method: str) -> None:
    key = "dtype"
    if key not in r.doc:
        raise r.error(key, "is missing: torchtune's recipes read cfg.dtype without a default", hint="dtype: bf16")
    value = r.get(key)
    if value is None or value == "fp32":
        t.set("precision", "fp32", key)
    elif value == "bf16":
        t.set("precision", "bf16", key)
    elif value == "fp16":
        raise r.error(key, "fp16 is refused by torchtune's fine-tuning recipes (no gradient scaling)",
                      hint="dtype: bf16, or fp32 on a card without bf16")
    else:
        raise r.error(key, f"must be bf16 or fp32 (got {value!r})")


def _required_int(r: Reader, key: str) -> int:
    if key not in r.doc:
        raise r.error(key, "is missing: torchtune's recipes read it without a default", hint=f"add {key}: N")
    return r.integer(key, minimum=1)


def _length(r: Reader, t: Translation) -> None:
    length = r.integer("tokenizer.max_seq_len", minimum=1)
    packed = r.get("dataset.packed", False) if "dataset" not in r.doc else _packed_list(r)
    packed = r.as_boolean("dataset.packed", packed, strings=False)
    if length is None:
        where = "tokenizer.max_seq_len" if "tokenizer.max_seq_len" in r.doc else "tokenizer"
        why = ("null: the tokenizer does not truncate, and the longest sample decides the memory"
               if "tokenizer.max_seq_len" in r.doc else "not set (the tokenizer's default null does not truncate)")
        t.needs["seq"] = (where, why, "set tokenizer.max_seq_len to your longest sample")
    else:
        t.set("seq", length, "tokenizer.max_seq_len")
    t.set("padding", "packed" if packed else "longest", "dataset.packed")


def _packed_list(r: Reader) -> bool:
    """``dataset`` as a list (a ``ConcatDataset``, ``datasets/_concat.py``: packed when each is, a mix refused)."""
    value = r.get("dataset")
    if not isinstance(value, list) or not all(isinstance(d, dict) for d in value):
        raise r.error("dataset", f"must be a dataset component or a list of them (got {value!r})")
    flags = [r.as_boolean("dataset", d.get("packed", False), strings=False) for d in value]
    if any(flags) and not all(flags):
        raise r.error("dataset", "packed and unpacked datasets together (torchtune's ConcatDataset refuses the mix)")
    return all(flags) and bool(flags)


def _loss(r: Reader, t: Translation) -> None:
    key = "loss._component_"
    value = r.get(key)
    if not isinstance(value, str) or value not in LOSSES:
        what = ("a preference or RL loss (DPO, PPO)" if isinstance(value, str) and ".rlhf." in value
                else "no loss section: the recipe instantiates cfg.loss, which the file must give" if value is None
                else f"{value!r} is not modelled")
        raise r.error(key if key in r.doc else "loss", what, hint="torchtune.modules.loss.CEWithChunkedOutputLoss or "
                      "torch.nn.CrossEntropyLoss")
    loss = LOSSES[value]
    if loss == "chunked" and r.boolean("compile", False):
        t.set("loss", "chunked-compiled", key)  # compile: true compiles the loss too (training.compile_loss)
        return
    t.set("loss", loss, key)


def _optimizer(r: Reader, t: Translation) -> None:
    key = "optimizer._component_"
    value = r.get(key)
    if value in CPU_OFFLOAD:
        inner = r.get("optimizer.optimizer_class", "torch.optim.AdamW")
        t.set("offload", "optimizer", key)
        value = inner if isinstance(inner, str) else None
        key = "optimizer.optimizer_class" if r.has("optimizer.optimizer_class") else key
    if not isinstance(value, str) or value not in OPTIMIZERS:
        raise r.error(key if key in r.doc else "optimizer", f"{value!r} is not modelled",
                      hint="modelled: " + ", ".join(list(OPTIMIZERS) + list(CPU_OFFLOAD)))
    t.set("optimizer", OPTIMIZERS[value], key)
    if value in ("torch.optim.Adam", "bitsandbytes.optim.AdamW"):
        t.approx(key, f"{value}: the same states as torch's AdamW")
    elif value.startswith("torchao"):
        t.approx(key, f"{value}: torchao's 8-bit states, modelled as bitsandbytes' 8-bit AdamW")
    momentum = r.number("optimizer.momentum", 0.0) if value == "torch.optim.SGD" else 0.0
    if momentum:
        raise r.error("optimizer.momentum", "SGD with momentum keeps a buffer per parameter: not modelled (reportgen's "
                      "sgd has no momentum)", hint="momentum: 0, or estimate with AdamW")


def _distributed(r: Reader, t: Translation) -> None:
    """The distributed recipes' keys: FSDP2 full sharding, CPU offload, SHARD_GRAD_OP, tensor parallelism."""
    present = [k for k in DISTRIBUTED if k in r.doc]
    if not present:
        return
    if (r.integer("tensor_parallel_dim", 1, minimum=1) or 1) > 1:
        raise r.error("tensor_parallel_dim", "tensor parallelism is not modelled", hint="tensor_parallel_dim: 1")
    t.sharding_key = present[0]
    reshard = r.boolean("fsdp_reshard_after_forward", True)
    t.set("sharding", "fsdp" if reshard is not False else "shard-grad-op",
          "fsdp_reshard_after_forward" if r.has("fsdp_reshard_after_forward") else present[0])
    if r.boolean("fsdp_cpu_offload", False):
        t.set("offload", "params", "fsdp_cpu_offload")
