"""unsloth's arguments as a model and setup fields, with unsloth 2026.10.9's defaults (``keys.json``, read from its
wheel by ``scripts/config_keys.py``).

unsloth is a Python script, not a config file; reportgen reads its arguments from a small YAML file whose top-level
sections are named after the calls whose keyword arguments they hold::

    FastLanguageModel.from_pretrained:   # or from_pretrained:
      model_name: unsloth/Meta-Llama-3.1-8B-bnb-4bit
      max_seq_length: 2048
      load_in_4bit: true
    FastLanguageModel.get_peft_model:    # or get_peft_model:
      r: 16
      use_gradient_checkpointing: unsloth
    SFTConfig:                           # or TrainingArguments: TRL's keys, as unsloth's notebooks pass them
      per_device_train_batch_size: 2
      optim: adamw_8bit

Its keys are named ``from_pretrained.KEY``, ``get_peft_model.KEY`` and ``SFTConfig.KEY``. What unsloth 2026.10.9 does
with each, from its source (``unsloth`` and ``unsloth_zoo`` 2026.10.9):

* ``models/loader.py`` ``FastLanguageModel.from_pretrained``: ``load_in_4bit`` defaults to true; ``load_in_16bit``
  asks for LoRA on 16-bit weights, ``full_finetuning`` for full fine-tuning (``load_in_8bit``, ``load_in_fp8``: not
  modelled, refused); ``models/llama.py`` builds ``BitsAndBytesConfig(bnb_4bit_use_double_quant=True,
  bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype, llm_int8_skip_modules=SKIP_QUANTIZATION_MODULES)``
  (``unsloth_zoo/peft_utils.py``: ``lm_head`` among them: quant_head false); ``dtype`` null is bfloat16 where the
  card has it, float16 otherwise (``llama.py``: ``torch.float16 if not SUPPORTS_BFLOAT16 else torch.bfloat16``);
* ``get_peft_model`` calls its own ``prepare_model_for_kbit_training`` (``_utils.py``), which is
  ``unsloth_zoo/training_utils.py`` ``prepare_model_for_training(float32_mixed_precision=True)``: only the LoRA
  parameters are upcast to float32, the other weights stay in ``dtype`` (kbit_prep none, frozen_dtype compute);
  ``use_gradient_checkpointing="unsloth"`` (the default) is ``unsloth_zoo/gradient_checkpointing.py``
  ``Unsloth_Offloaded_Gradient_Checkpointer``: each layer's input checkpoint moved to host RAM;
* ``models/rl.py`` patches TRL's ``SFTTrainer``: its ``replacements`` change TRL's defaults (batch 4,
  accumulation 2, ``adamw_8bit``); the autocast dtype follows the model's dtype (an fp16 model with ``bf16`` or a
  bf16 model with ``fp16`` raises ``TypeError``); full fine-tuning of a bf16 model is pure bf16 unless
  ``float32_mixed_precision``; the length is the model's ``max_seq_length``, or ``max_length`` where that is set
  below it; ``trainer.py`` auto-enables padding-free batching unless ``packing`` or ``padding_free: false``;
* ``llama.py`` ``CausalLM_fast_forward`` computes the loss in the model's forward with
  ``unsloth_zoo/fused_losses/cross_entropy_loss.py`` ``unsloth_fused_ce_loss`` (chunks of the logits, never all of
  them): loss fused on recipe trainer (transformers' Trainer under TRL's SFTTrainer), approximated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reportgen.configs import table
from reportgen.configs.common import (DTYPES, ConfigError, Reader, Translation, finish, hub_of, optimizer, resolve_model,
                                      trainer_sharding)

#: the file's section names -> the prefix of its keys
SECTIONS = {"FastLanguageModel.from_pretrained": "from_pretrained", "from_pretrained": "from_pretrained",
            "FastLanguageModel.get_peft_model": "get_peft_model", "get_peft_model": "get_peft_model",
            "SFTConfig": "SFTConfig", "TrainingArguments": "SFTConfig"}
FP, PEFT, TRAINER = "from_pretrained.", "get_peft_model.", "SFTConfig."
#: get_peft_model's default target modules, every linear of a Llama-like decoder layer (keys.json)
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: checkpoints unsloth's mapper names whose shapes are another catalog model's (same layers, heads, vocabulary)
SAME_SHAPES = {"llama-3-8b": "llama-3.1-8b", "llama-3-70b": "llama-3.1-70b"}
_QUANT_SUFFIXES = ("-unsloth-bnb-4bit", "-bnb-4bit")


def is_unsloth(doc: dict) -> bool:
    return any(k in SECTIONS for k in doc)


def flatten(doc: dict, lines: dict[str, int], path: Path) -> tuple[dict, dict[str, int]]:
    """The sections' keys as ``from_pretrained.KEY``, ``get_peft_model.KEY``, ``SFTConfig.KEY`` with their lines; a
    top-level key that is no section stays as it is (an unknown key)."""
    flat: dict[str, Any] = {}
    flat_lines: dict[str, int] = {}
    seen: dict[str, str] = {}
    for name, value in doc.items():
        if name not in SECTIONS and isinstance(value, dict):  # a mapping where a call's arguments go: a misspelled call
            import difflib

            close = difflib.get_close_matches(name, list(SECTIONS), n=1, cutoff=0.6)
            where = f"{path}:{lines[name]}" if name in lines else str(path)
            raise ConfigError(f"{where}: {name}: not a call whose arguments reportgen reads"
                              + (f"; did you mean {close[0]}?" if close else ""),
                              hint="sections: " + ", ".join(SECTIONS))
        if name not in SECTIONS:
            flat[name] = value
            flat_lines[name] = lines.get(name, 0)
            continue
        prefix = SECTIONS[name]
        where = f"{path}:{lines[name]}" if name in lines else str(path)
        if prefix in seen:
            raise ConfigError(f"{where}: {name}: the same call as {seen[prefix]}: write its arguments once")
        seen[prefix] = name
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {name}: must be a mapping of the call's keyword arguments (got {value!r})",
                              hint=f"{name}:\n  key: value")
        for k, v in value.items():
            flat[f"{prefix}.{k}"] = v
            flat_lines[f"{prefix}.{k}"] = lines.get(f"{name}.{k}", lines.get(name, 0))
        flat_lines.setdefault(prefix, lines.get(name, 0))
    return flat, {k: v for k, v in flat_lines.items() if v}


class _Section(Reader):
    """The trainer section read with TRL's key names (so ``configs/common.py``'s TRL readers apply), errors and
    defaults named as the file has them (``SFTConfig.KEY``, unsloth's trainer defaults)."""

    def __init__(self, r: Reader, prefix: str):
        n = len(prefix)
        super().__init__(r.path, {k[n:]: v for k, v in r.doc.items() if k.startswith(prefix)},
                         {k[n:]: v for k, v in r._lines.items() if k.startswith(prefix)}, r.tool)
        self.prefix, self.outer = prefix, r

    def get(self, key: str, default: Any = None) -> Any:
        self.outer.read.add(self.prefix + key)
        return super().get(key, default)

    def tool_default(self, key: str) -> Any:
        return self.get(key, table.default(self.tool, self.prefix + key))

    def error(self, key: str, message: str, hint: str | None = None) -> ConfigError:
        return ConfigError(f"{self.where(key)}: {self.prefix}{key}: {message}", hint=hint)


def translate(r: Reader, bf16_capable: bool = True) -> Translation:
    t = Translation(tool="unsloth", path=str(r.path))
    _model(r, t)
    method = _method(r, t)
    trainer = _Section(r, TRAINER)
    _precision(r, trainer, t, method, bf16_capable)
    _checkpointing(r, t, method)
    _batch(r, trainer, t)
    sub = Translation(tool="unsloth", path=t.path)
    optimizer(trainer, "optim", sub)
    trainer_sharding(trainer, sub)
    for name, value in sub.values.items():
        t.set(name, value, TRAINER + sub.sources[name])
    t.sharding_key = TRAINER + sub.sharding_key if sub.sharding_key else None
    t.set("attn", "sdpa", FP + "model_name")
    t.set("recipe", "trainer", FP + "model_name")
    t.set("loss", "fused", FP + "model_name")
    t.approx(FP + "model_name", "unsloth's trainer is TRL's SFTTrainer on transformers' Trainer, its model's forward "
             "computing the loss with unsloth_fused_ce_loss (unsloth/models/llama.py: chunks of the logits, never "
             "all of them): modelled as recipe trainer with loss fused; unsloth's own Triton kernels (RMSNorm, RoPE, "
             "SwiGLU, LoRA MLP) are not modelled")
    return finish(r, t)


def _stem(repo_id: str) -> str:
    """A Hub id's name, lower case, without its organisation, a ``Meta-`` prefix, unsloth's 4-bit suffixes and an
    -Instruct/-it/-chat variant (``configs/common.py``)."""
    from reportgen.configs.common import _stem as variant_stem

    name = repo_id.strip().lower().rsplit("/", 1)[-1]
    for suffix in _QUANT_SUFFIXES:
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    name = name[len("meta-"):] if name.startswith("meta-") else name
    return variant_stem(name)


def _catalog_model(hub_id: str) -> str | None:
    from reportgen import catalog

    ids = catalog.catalog_ids()
    exact = {k.lower(): v for k, v in ids.items()}.get(hub_id.lower())
    if exact:
        return exact
    stems: dict[str, str] = {}
    for hub, name in ids.items():
        stems.setdefault(_stem(hub), name)
    stem = _stem(hub_id)
    return stems.get(stem) or SAME_SHAPES.get(stem)


def _model(r: Reader, t: Translation) -> None:
    """``model_name``: unsloth's repos (its ``mapper.py``: a re-upload or a 4-bit copy of another checkpoint) as the
    catalog model of that checkpoint's shapes; any other id or path as the other readers resolve it."""
    key = FP + "model_name"
    value = r.tool_default(key)
    if not isinstance(value, str) or not value.strip():
        raise r.error(key, f"must be a model id or path (got {value!r})")
    value = value.strip()
    if not value.lower().startswith("unsloth/"):
        resolve_model(r, key, t)
        return
    models = table.schema()["unsloth"]["models"]
    lower = value.lower()
    original = models.get(lower) or next((models[lower[: -len(s)]] for s in _QUANT_SUFFIXES
                                          if lower.endswith(s) and lower[: -len(s)] in models), None)
    name = _catalog_model(original or value)
    if name is None:
        was = f" (a copy of {original})" if original else ""
        t.model_missing = (f"{r.where(key)}: {key}: {value}{was}: reportgen has no catalog model of its "
                           "architecture")
        return
    t.model = name
    if (original or "").lower() != hub_of(name).lower():
        t.approx(key, f"{value}{f' (a copy of {original})' if original else ''} has the shapes of the catalog's "
                 f"{name} ({hub_of(name)})")


def _method(r: Reader, t: Translation) -> str:
    """Full fine-tuning, LoRA or QLoRA (``full_finetuning``, ``load_in_4bit``, ``load_in_16bit``) and the adapters."""
    for key, what in ((FP + "load_in_8bit", "8-bit (LLM.int8) LoRA"), (FP + "load_in_fp8", "fp8 LoRA")):
        if r.get(key) not in (None, False):
            raise r.error(key, f"{what} is not modelled", hint="load_in_4bit: true (QLoRA), load_in_16bit: true "
                          "(LoRA) or full_finetuning: true")
    full = bool(r.as_boolean(FP + "full_finetuning", r.get(FP + "full_finetuning", False), strings=False))
    sixteen = bool(r.as_boolean(FP + "load_in_16bit", r.get(FP + "load_in_16bit", False), strings=False))
    four = r.as_boolean(FP + "load_in_4bit", r.tool_default(FP + "load_in_4bit"), strings=False)
    if sixteen and r.has(FP + "load_in_4bit") and four:
        raise r.error(FP + "load_in_16bit", "contradicts load_in_4bit: true (unsloth loads in one of them)",
                      hint="keep load_in_4bit: true for QLoRA, or load_in_16bit: true for LoRA")
    method = "full" if full else "lora" if sixteen or not four else "qlora"
    source = FP + ("full_finetuning" if full else "load_in_16bit" if sixteen else "load_in_4bit")
    t.set("method", method, source)
    if method == "full":
        return method
    if not any(k.startswith(PEFT) for k in r.doc) and "get_peft_model" not in r._lines:
        what = f"{source.split('.')[1]}{'' if source in r.doc else ' (unsloth default true)'}: a " + (
            "4-bit" if method == "qlora" else "16-bit LoRA")
        raise r.error(source if source in r.doc else "from_pretrained", f"{what} model trains only through the "
                      "adapters get_peft_model adds, and the file has no get_peft_model section",
                      hint="add FastLanguageModel.get_peft_model: {r: 16}, or full_finetuning: true")
    if method == "qlora":
        t.set("quant", "nf4", source)
        t.set("double_quant", True, source)
        if str(r.get(FP + "model_name", "")).lower().endswith("bnb-4bit"):
            t.approx(source, "a pre-quantized -bnb-4bit repo loads with the quantization_config of its own "
                     "config.json (unsloth/models/llama.py merges only its skip list into it): modelled as unsloth's "
                     "BitsAndBytesConfig, NF4 with double quantization, lm_head in 16 bit")
    _adapters(r, t)
    return method


def _adapters(r: Reader, t: Translation) -> None:
    rank = r.integer(PEFT + "r", table.default("unsloth", PEFT + "r"), minimum=1)
    t.set("lora_rank", rank, PEFT + "r")
    alpha = r.number(PEFT + "lora_alpha", table.default("unsloth", PEFT + "lora_alpha"))
    t.set("lora_alpha", max(1, round(alpha)), PEFT + "lora_alpha")
    if alpha != round(alpha):
        t.approx(PEFT + "lora_alpha", f"{alpha:g}: scaling only, read as {max(1, round(alpha))}")
    dropout = r.number(PEFT + "lora_dropout", 0.0)
    if not 0 <= dropout < 1:
        raise r.error(PEFT + "lora_dropout", f"must be at least 0 and below 1 (got {dropout:g})")
    t.set("lora_dropout", dropout, PEFT + "lora_dropout")
    key = PEFT + "target_modules"
    value = r.tool_default(key)
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise r.error(key, f"must be a list of module names or all-linear (got {value!r})")
    names = [n.strip() for n in names]
    whole = set(names) == set(ALL_LINEAR) or names == ["all-linear"]
    t.set("lora_targets", "all-linear" if whole else ",".join(names), key)
    bias = r.get(PEFT + "bias", "none")
    if bias != "none":
        t.approx(PEFT + "bias", f"{bias!r}: the adapted layers' biases train too: not modelled (a vector per layer)")


def _dtype(r: Reader, bf16_capable: bool) -> str:
    """``dtype``: null is bfloat16 where the card has it, float16 otherwise (``unsloth/models/llama.py``)."""
    key = FP + "dtype"
    raw = r.get(key)
    if raw is None:
        return "bf16" if bf16_capable else "fp16"
    name = str(raw).removeprefix("torch.")
    if name not in DTYPES or isinstance(raw, bool):
        raise r.error(key, f"{raw!r} is not a dtype", hint="null, bfloat16, float16 or float32")
    return DTYPES[name]


def _precision(r: Reader, trainer: _Section, t: Translation, method: str, bf16_capable: bool) -> None:
    """The model's dtype and the autocast unsloth's patched trainer chooses for it (``unsloth/models/rl.py``)."""
    key = FP + "dtype"
    weights = _dtype(r, bf16_capable)
    bf16, fp16 = bool(trainer.boolean("bf16")), bool(trainer.boolean("fp16"))
    if bf16 and fp16:
        raise trainer.error("fp16", "contradicts bf16: true (one autocast dtype)", hint="keep one of bf16 and fp16")
    if (weights, bf16, fp16) in (("fp16", True, False), ("bf16", False, True)):
        which = "bf16" if bf16 else "fp16"
        raise trainer.error(which, f"a {weights} model with {which} autocast: unsloth raises TypeError "
                            "(unsloth/models/rl.py)", hint=f"{'fp16' if bf16 else 'bf16'}: true, or leave both out")
    if weights == "fp32":
        t.set("precision", "fp32", key)
        if method != "full":
            t.approx(key, "float32 weights: unsloth picks the autocast from the card; modelled as fp32 throughout")
        return
    if method == "full":
        f32 = r.boolean(FP + "float32_mixed_precision")
        pure = weights == "bf16" and not f32
        t.set("precision", "bf16" if pure else f"{weights}-mixed", FP + "float32_mixed_precision" if f32 else key)
        return
    t.set("precision", f"{weights}-mixed", key)  # the LoRA parameters upcast to fp32 (training_utils.py)
    if method == "lora":
        t.set("frozen_dtype", "compute", key)
    else:
        t.set("kbit_prep", "none", key)


def _checkpointing(r: Reader, t: Translation, method: str) -> None:
    """``use_gradient_checkpointing``: get_peft_model's for LoRA, from_pretrained's for full fine-tuning."""
    key = (FP if method == "full" else PEFT) + "use_gradient_checkpointing"
    value = r.tool_default(key)
    if value not in (True, False, "unsloth"):
        raise r.error(key, f"must be true, false or unsloth (got {value!r}; unsloth_zoo asserts it)",
                      hint="unsloth: checkpoints offloaded to host RAM; true: checkpoints on the GPU")
    t.set("grad_ckpt", value is not False, key)
    t.set("act_offload", value == "unsloth", key)
    if value == "unsloth":
        t.approx(key, "unsloth's offloaded checkpointing (unsloth_zoo/gradient_checkpointing.py "
                 "Unsloth_Offloaded_Gradient_Checkpointer: each layer's input moved to host RAM, brought back for the "
                 "recomputation): modelled as checkpointing with activation offload")


def _batch(r: Reader, trainer: _Section, t: Translation) -> None:
    """Micro-batch, accumulation (unsloth's defaults 4 and 2), the length (``rl.py``: the model's ``max_seq_length``,
    or ``max_length`` where set below it) and padding-free batching (``trainer.py``: on unless asked off)."""
    t.set("batch", trainer.integer("per_device_train_batch_size", table.default("unsloth", TRAINER +
          "per_device_train_batch_size"), minimum=1), TRAINER + "per_device_train_batch_size")
    t.set("accum", trainer.integer("gradient_accumulation_steps", table.default("unsloth", TRAINER +
          "gradient_accumulation_steps"), minimum=1), TRAINER + "gradient_accumulation_steps")
    seq = r.integer(FP + "max_seq_length", table.default("unsloth", FP + "max_seq_length"), minimum=8)
    source = FP + "max_seq_length"
    trl_default = table.default("trl", "max_length")
    for name in ("max_length", "max_seq_length"):
        given = trainer.integer(name, None, minimum=1)
        if given is not None and given != trl_default and given < seq:
            seq, source = given, TRAINER + name
    t.set("seq", seq, source)
    packing, free = trainer.boolean("packing", False), trainer.boolean("padding_free")
    if packing:
        t.set("padding", "packed", TRAINER + "packing")
    elif free is False:
        t.set("padding", "longest", TRAINER + "padding_free")
    else:
        key = TRAINER + ("padding_free" if free else "packing")
        t.set("padding", "packed", key)
        t.approx(key, "unsloth's trainer turns padding-free batching on unless packing or padding_free: false "
                 "(unsloth/trainer.py): the micro-batch's samples in one row without padding, modelled as packed rows "
                 "of max_seq_length tokens")
