"""An Axolotl YAML as a model and setup fields, with Axolotl 0.19.0's defaults.

What Axolotl does with each key, from its source (``axolotl/utils/schemas/`` for the keys and
defaults, ``axolotl/utils/config/__init__.py`` for the dtypes, ``axolotl/loaders/model.py`` for the
quantization and the k-bit preparation):

* ``bf16`` (default ``auto``: true on a card with bf16, else false and fp16 true) or ``bfloat16``
  load the weights in bf16, ``fp16``/``float16``/``load_in_8bit`` in fp16, otherwise fp32
  (``cfg.torch_dtype``); the Trainer runs bf16/fp16 autocast when ``bf16``/``fp16``;
* ``adapter: qlora`` with ``load_in_4bit`` quantizes with ``nf4``, double quantization on and the
  compute dtype of the weights, updated by ``bnb_config_kwargs``; ``prepare_model_for_kbit_training``
  runs for 4/8-bit adapters unless FSDP or ZeRO-3 shards the model, and then Axolotl casts the norms and
  the embedding and head back to the load dtype (``_configure_embedding_dtypes``), so the step holds
  them in 16 bit;
* ``micro_batch_size`` 1, ``gradient_accumulation_steps`` 1, ``sequence_len`` 512,
  ``lora_dropout`` 0.0, ``gradient_checkpointing`` false, ``optimizer`` adamw_torch_fused.
"""

from __future__ import annotations

from reportgen.configs.common import (Reader, Translation, attention, deepspeed, finish, fsdp_words, optimizer,
                                      resolve_model)

_ATTN_FLAGS = (("flash_attention", "sdpa", "FlashAttention-2: modelled as SDPA's flash kernel (the same O(seq) "
                "memory)"), ("sdp_attention", "sdpa", None), ("flex_attention", "sdpa", "modelled as SDPA"),
               ("xformers_attention", "sdpa", "modelled as SDPA"), ("eager_attention", "eager", None))


def translate(r: Reader, bf16_capable: bool = True) -> Translation:
    """An Axolotl config as a setup, read in this order (the order of the translation's lines): the
    model, the method and quantization, precision, batch and length, the step's memory savers, the
    loss, and the several-GPU settings."""
    t = Translation(tool="axolotl", path=str(r.path))
    resolve_model(r, "base_model", t)
    method = _method(r, t)
    _precision(r, t, method, bf16_capable)
    _kbit_prep(r, t, method)
    _fp32_norms(r)
    _batch(r, t)
    _eval(r, t)
    _step(r, t)
    _loss(r, t)
    _kernels(r, t)
    _gpus(r, t)
    return finish(r, t)


def _eval(r: Reader, t: Translation) -> None:
    """Evaluation during training: a validation split (``val_set_size`` > 0) or ``test_datasets`` makes Axolotl
    evaluate unless ``eval_strategy: no``, on ``eval_batch_size`` samples at a time, which defaults to
    ``micro_batch_size`` (``axolotl/utils/config/__init__.py`` ``normalize_config``)."""
    split = r.get("val_set_size", 0)
    if isinstance(split, bool) or not isinstance(split, (int, float)) or split < 0:
        raise r.error("val_set_size", f"must be a share (below 1) or a count of samples (got {split!r})")
    if not (split > 0 or r.has("test_datasets")) or r.get("eval_strategy") == "no":
        return
    key = "eval_batch_size" if r.has("eval_batch_size") else "val_set_size" if split > 0 else "test_datasets"
    t.set("eval_batch", r.integer("eval_batch_size", t.values["batch"], minimum=1), key)


def _method(r: Reader, t: Translation) -> str:
    """``adapter``, ``load_in_4bit``/``load_in_8bit``, the 4-bit quantization and the LoRA settings;
    returns the method."""
    adapter = r.get("adapter")
    if adapter in ("", None):
        adapter = None
    elif adapter not in ("lora", "qlora"):
        raise r.error("adapter", f"{adapter!r} is not modelled", hint="lora, qlora, or no adapter (full fine-tuning)")
    four, eight = r.boolean("load_in_4bit", False), r.boolean("load_in_8bit", False)
    if four and eight:
        raise r.error("load_in_8bit", "contradicts load_in_4bit: true (a model is loaded in one of them)")
    if eight:
        raise r.error("load_in_8bit", "8-bit (LLM.int8) LoRA is not modelled",
                      hint="adapter: qlora with load_in_4bit: true, or adapter: lora on 16-bit weights")
    if adapter == "qlora" and not four:
        raise r.error("adapter", "qlora needs load_in_4bit: true (Axolotl quantizes only then)",
                      hint="add load_in_4bit: true")
    if four and adapter != "qlora":
        raise r.error("load_in_4bit", f"4-bit weights need adapter: qlora (adapter is {adapter!r})",
                      hint="set adapter: qlora")
    method = adapter or "full"
    t.set("method", method, "adapter")
    if method == "qlora":
        kwargs = r.get("bnb_config_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise r.error("bnb_config_kwargs", f"must be a mapping (got {kwargs!r})")
        quant = str(kwargs.get("bnb_4bit_quant_type", "nf4"))
        if quant not in ("nf4", "fp4"):
            raise r.error("bnb_config_kwargs", f"bnb_4bit_quant_type must be nf4 or fp4 (got {quant!r})")
        t.set("quant", quant, "bnb_config_kwargs")
        double = r.as_boolean("bnb_config_kwargs", kwargs.get("bnb_4bit_use_double_quant", True), strings=False)
        t.set("double_quant", double, "bnb_config_kwargs")
    if adapter:
        rank, alpha = r.integer("lora_r"), r.integer("lora_alpha")
        if rank is None:
            raise r.error("lora_r", "an adapter needs its rank", hint="e.g. lora_r: 16")
        t.set("lora_rank", rank, "lora_r")
        if alpha is not None:
            t.set("lora_alpha", alpha, "lora_alpha")
        t.set("lora_dropout", r.number("lora_dropout", 0.0), "lora_dropout")
        _targets(r, t)
        t.set("dora", bool(r.boolean("peft_use_dora", False)), "peft_use_dora")
    return method


def _kbit_prep(r: Reader, t: Translation, method: str) -> None:
    """QLoRA under mixed precision: what the step holds of the unquantized weights. Axolotl
    (``axolotl/loaders/model.py`` ``_configure_embedding_dtypes``; the same code in 0.9's
    ``utils/models.py``) runs peft's ``prepare_model_for_kbit_training`` (every parameter that is not
    4-bit upcast to fp32) unless FSDP or ZeRO-3 shards the model, then, for any adapter
    (``needs_fa2_dtype``) or with Cut Cross-Entropy, ``_convert_embedding_modules_dtype`` casts every
    module with "norm" in its name and the embedding and head (``get_linear_embedding_layers``:
    ``embed_tokens``, ``lm_head``) back to ``cfg.torch_dtype``: the step holds them in 16 bit, as
    without the preparation (``kbit_prep none``). Unless ``embeddings_skip_upcast``, the embedding and
    head are fp32 for a moment while the model loads: said, not in the load phase's figure."""
    if method == "qlora" and t.values["precision"].endswith("-mixed"):
        t.set("kbit_prep", "none", "adapter")
        if not r.boolean("embeddings_skip_upcast", False):
            t.approx("embeddings_skip_upcast", "false: while the model loads, Axolotl holds the embedding and head in "
                     "fp32 for a moment (4 bytes a weight, not the 2 the load phase counts); true avoids it")


def _fp32_norms(r: Reader) -> None:
    """``fp32_norms: true`` keeps the norms' weights in fp32 under FSDP2 (``utils/fp32_norms.py``), their outputs
    in the 16-bit dtype (``MixedPrecisionPolicy(output_dtype=...)``): a few weights, not modelled. Axolotl
    refuses it without an ``fsdp_config`` of ``fsdp_version: 2`` (``utils/schemas/config.py``
    ``check_fp32_norms``), and so does the reader."""
    if not r.boolean("fp32_norms", False):
        return
    fsdp = r.get("fsdp_config")
    version = r.get("fsdp_version", fsdp.get("fsdp_version") if isinstance(fsdp, dict) else None)
    if not fsdp or str(version) != "2":
        raise r.error("fp32_norms", "Axolotl accepts it only with FSDP2 (check_fp32_norms)",
                      hint="fsdp_version: 2\nfsdp_config:\n  ...   (or remove fp32_norms)")


def _batch(r: Reader, t: Translation) -> None:
    """Micro-batch, accumulation, sequence length and padding."""
    t.set("batch", r.integer("micro_batch_size", 1, minimum=1), "micro_batch_size")
    accum = r.integer("gradient_accumulation_steps", minimum=1)
    if accum is None and r.has("batch_size"):
        total = r.integer("batch_size", minimum=1)
        if total % t.values["batch"]:
            raise r.error("batch_size", f"{total} is not a multiple of micro_batch_size {t.values['batch']}")
        t.set("accum", total // t.values["batch"], "batch_size")
    else:
        t.set("accum", accum or 1, "gradient_accumulation_steps")
    t.set("seq", r.integer("sequence_len", 512, minimum=1), "sequence_len")
    if r.boolean("sample_packing", False):
        t.set("padding", "packed", "sample_packing")
    elif r.boolean("batch_flattening", False):
        t.set("padding", "packed", "batch_flattening")
        t.approx("batch_flattening", "samples flattened into one row without padding: modelled as packed rows of "
                 "sequence_len tokens")
    elif r.boolean("pad_to_sequence_len", False):
        t.set("padding", "max", "pad_to_sequence_len")
    else:
        t.set("padding", "longest", "sample_packing")


def _step(r: Reader, t: Translation) -> None:
    """Checkpointing, activation offload, ``torch.compile``, the optimizer and the attention."""
    ckpt = r.get("gradient_checkpointing", False)
    if ckpt not in (True, False, "offload", "offload_disk"):
        raise r.error("gradient_checkpointing", f"must be true, false, offload or offload_disk (got {ckpt!r})")
    if ckpt == "offload_disk":
        raise r.error("gradient_checkpointing", "offload_disk (checkpoints on disk) is not modelled",
                      hint="offload (to host RAM) or true")
    t.set("grad_ckpt", bool(ckpt), "gradient_checkpointing")
    offload = bool(r.boolean("activation_offloading", False)) or ckpt == "offload"
    t.set("act_offload", offload, "activation_offloading" if r.has("activation_offloading") else
          "gradient_checkpointing")
    if ckpt == "offload":
        t.approx("gradient_checkpointing", "offload: the checkpointed layer inputs offloaded to host RAM, modelled as "
                 "checkpointing with activation offloading")
    compile_ = r.get("torch_compile", False)
    if compile_ != "auto":  # Axolotl: bool | "auto"; pydantic reads the string "true" as true
        compile_ = r.as_boolean("torch_compile", compile_)
    t.set("compile", compile_ in (True, "auto"), "torch_compile")
    if compile_ == "auto":
        t.approx("torch_compile", "auto: read as true")
    optimizer(r, "optimizer", t)
    t.set("recipe", "trainer", "base_model")  # Axolotl's trainers are transformers' Trainer (estimate/recipes.py)
    _attention(r, t)


def _plugins(r: Reader) -> list[str]:
    """The ``plugins`` list of class paths, checked."""
    plugins = r.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise r.error("plugins", f"must be a list of plugin class paths (got {plugins!r})",
                      hint="plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin")
    return plugins


def _liger_plugin(r: Reader) -> bool:
    """Whether Liger's plugin is listed: its keys (``LigerArgs``) act only then."""
    return any("integrations.liger" in p for p in _plugins(r))


def _loss(r: Reader, t: Translation) -> None:
    """Liger's fused linear cross-entropy or Cut Cross-Entropy (a plugin: listing it turns it on, its
    ``cut_cross_entropy`` key defaulting to true, ``integrations/cut_cross_entropy/args.py``), else the
    standard loss."""
    liger = bool(r.boolean("liger_fused_linear_cross_entropy", False))
    cce = r.get("cut_cross_entropy", True)
    cce_on = bool(r.as_boolean("cut_cross_entropy", cce)) and any("cut_cross_entropy" in p for p in _plugins(r))
    if liger and cce_on:
        raise r.error("cut_cross_entropy", "contradicts liger_fused_linear_cross_entropy: one fused loss at a time")
    if liger and not _liger_plugin(r):
        t.approx("liger_fused_linear_cross_entropy", "acts only with Liger's plugin (plugins: - "
                 "axolotl.integrations.liger.LigerPlugin), which is not listed: the standard loss")
        liger = False
    if liger:
        t.set("loss", "fused", "liger_fused_linear_cross_entropy")
    elif cce_on:
        t.set("loss", "fused", "cut_cross_entropy")
        t.approx("cut_cross_entropy", "Cut Cross-Entropy never forms the full logits: modelled as loss fused (Liger's "
                 "chunked linear + cross-entropy)")
    else:
        t.set("loss", "standard", "liger_fused_linear_cross_entropy")


def _kernels(r: Reader, t: Translation) -> None:
    """Liger's layer kernels (``kernels: liger``) when its plugin is listed and all three keys are on
    (``liger_swiglu``: the deprecated name of ``liger_glu_activation``, ``integrations/liger/args.py``);
    some of them: modelled as transformers' modules, which save and move more (an upper bound); without
    the plugin the keys do nothing."""
    if r.get("liger_swiglu") is not None and r.get("liger_glu_activation") is not None:
        raise r.error("liger_swiglu", "is the deprecated name of liger_glu_activation: set one of them",
                      hint="liger_glu_activation: true")
    glu = "liger_swiglu" if r.get("liger_swiglu") is not None else "liger_glu_activation"
    keys = ("liger_rms_norm", glu, "liger_rope")
    on = [k for k in keys if r.boolean(k, False)]
    plugin = _liger_plugin(r)
    t.set("kernels", "liger" if plugin and len(on) == len(keys) else "eager", on[0] if on else "liger_rms_norm")
    if on and not plugin:
        t.approx(on[0], "Liger's keys act only with its plugin (plugins: - axolotl.integrations.liger.LigerPlugin), "
                 "which is not listed: transformers' modules")
    elif on and len(on) < len(keys):
        t.approx(on[0], f"only {', '.join(on)} of Liger's three layer kernels: modelled as transformers' modules "
                 "(an upper bound on memory and time)")


def _gpus(r: Reader, t: Translation) -> None:
    """FSDP (``fsdp`` words or ``fsdp_config``) or DeepSpeed, never both."""
    if r.get("fsdp"):  # r.get, not r.doc: a key read is reported as honoured, not as ignored
        fsdp_words(r, "fsdp", r.doc["fsdp"], t)
    if r.has("fsdp_config"):
        _fsdp_config(r, t)
    if r.get("deepspeed") is not None:
        if t.sharding_key:
            raise r.error("deepspeed", f"contradicts {t.sharding_key}: a run uses FSDP or DeepSpeed, not both")
        deepspeed(r, "deepspeed", r.doc["deepspeed"], t)


def _targets(r: Reader, t: Translation) -> None:
    modules = r.get("lora_target_modules")
    linear = r.boolean("lora_target_linear", False)
    if modules is not None and (not isinstance(modules, (list, str)) or
                                not all(isinstance(m, str) and m.strip() for m in
                                        ([modules] if isinstance(modules, str) else modules))):
        raise r.error("lora_target_modules", f"must be a list of module names (got {modules!r})")
    names = [modules] if isinstance(modules, str) else list(modules or [])
    if linear:
        t.set("lora_targets", ",".join(["all-linear", *names]) if names else "all-linear", "lora_target_linear")
    elif names:
        t.set("lora_targets", ",".join(n.strip() for n in names), "lora_target_modules")
    else:
        raise r.error("lora_target_modules", "an adapter needs its target modules",
                      hint="lora_target_linear: true, or lora_target_modules: [q_proj, v_proj]")


def _precision(r: Reader, t: Translation, method: str, bf16_capable: bool) -> None:
    bf16 = r.get("bf16", "auto")
    fp16 = r.boolean("fp16")
    if bf16 == "auto":
        bf16 = bf16_capable
        if not bf16_capable and fp16 is None:
            fp16 = True
        t.approx("bf16", "auto: " + ("true (the card has bf16)" if bf16_capable else "false and fp16 true (the card "
                                     "has no bf16)"))
    elif bf16 not in (True, False):
        raise r.error("bf16", f"must be true, false or auto (got {bf16!r})")
    if bf16:
        if fp16:  # said, not listed as honoured: the file's fp16 changes nothing
            t.approx("fp16", "true beside bf16: Axolotl drops it (`if cfg.bf16: cfg.fp16 = False`), bf16 trains")
        fp16 = False  # Axolotl: `if cfg.bf16: cfg.fp16 = False`
    load_bf16 = bf16 or bool(r.boolean("bfloat16", False))
    load_fp16 = not load_bf16 and (bool(fp16) or bool(r.boolean("float16", False)))
    key = "bf16" if bf16 or r.has("bf16") else "fp16" if fp16 else "bf16"
    if method == "full":
        if load_bf16:
            t.set("precision", "bf16", key)
        elif load_fp16:
            if not fp16:
                raise r.error("float16", "pure fp16 training is not modelled", hint="fp16: true or bf16: true")
            t.set("precision", "fp16-mixed", "fp16")
            t.approx("fp16", "Axolotl loads full fine-tuning weights in fp16; modelled with fp32 master weights "
                     "(fp16-mixed)")
        else:
            t.set("precision", "fp32", key)
        return
    if bf16:
        t.set("precision", "bf16-mixed", key)
    elif fp16:
        t.set("precision", "fp16-mixed", "fp16")
    elif load_bf16:
        t.set("precision", "bf16", "bfloat16")
    elif load_fp16:
        raise r.error("float16", "pure fp16 training is not modelled", hint="fp16: true or bf16: true")
    else:
        t.set("precision", "fp32", key)


def _attention(r: Reader, t: Translation) -> None:
    chosen = [(k, v, note) for k, v, note in _ATTN_FLAGS if r.boolean(k, False)]
    if r.has("attn_implementation"):
        if chosen:
            raise r.error("attn_implementation", f"contradicts {chosen[0][0]}: true (one attention implementation)")
        attention(r, "attn_implementation", r.get("attn_implementation"), t)
        return
    if len(chosen) > 1:
        raise r.error(chosen[1][0], f"contradicts {chosen[0][0]}: true (one attention implementation)")
    if chosen:
        key, value, note = chosen[0]
        t.set("attn", value, key)
        if note:
            t.approx(key, note)
    else:
        t.set("attn", "sdpa", "sdp_attention")


def _fsdp_config(r: Reader, t: Translation) -> None:
    cfg = r.get("fsdp_config")
    if not isinstance(cfg, dict):
        raise r.error("fsdp_config", f"must be a mapping (got {cfg!r})")

    def _get(name):
        return cfg.get(name, cfg.get("fsdp_" + name))

    if not t.sharding_key:
        reshard = _get("reshard_after_forward")
        t.set("sharding", "shard-grad-op" if reshard is False else "fsdp", "fsdp_config")
        t.sharding_key = "fsdp_config"
    # accelerate reads the value as str_to_bool does: true, "true" (Axolotl passes it through the environment)
    if r.as_boolean("fsdp_config", _get("offload_params")) is True:
        t.set("offload", "params", "fsdp_config")
