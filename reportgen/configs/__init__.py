"""TRL, Axolotl, LLaMA-Factory, torchtune and unsloth configs in: a config file as reportgen's model and ``TrainingSetup``.

``translate_file(path)`` reads a TRL ``trl sft --config`` file, an Axolotl YAML, a LLaMA-Factory
``llamafactory-cli train`` YAML, a torchtune ``tune run`` recipe config or unsloth's arguments as YAML (which one is
told by its keys: torchtune's by its ``_component_`` sections, unsloth's by its sections named after its calls,
``FastLanguageModel.from_pretrained``, ``get_peft_model``, ``SFTConfig``), ``setup_from(translation, explicit)``
builds the setup with the flags a user gave beside the file overriding it. ``table.py`` lists what
becomes of every key; ``reverse.py`` writes a setup as TRL's and Axolotl's keys. Torch-free: the calculator runs it under Pyodide.
"""

from __future__ import annotations

from enum import Enum

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from reportgen.configs.common import ConfigError, Reader, Translation, read_file

__all__ = ["ConfigError", "Translation", "translate_file", "setup_from", "detect"]

#: keys only one of the tools has, which tell them apart
_TRL_MARKS = ("model_name_or_path", "per_device_train_batch_size", "use_peft", "max_length", "max_seq_length",
              "optim", "dataset_name")
_AXOLOTL_MARKS = ("base_model", "adapter", "micro_batch_size", "sequence_len", "sample_packing",
                  "lora_target_linear")


#: LLaMA-Factory's own keys: its files share model_name_or_path and per_device_train_batch_size with TRL
#: (such a file was once estimated as a TRL config: a full fine-tune at 1,024 tokens for a QLoRA file), so
#: any of these makes it LLaMA-Factory's
_LLAMAFACTORY_MARKS = ("finetuning_type", "quantization_bit", "cutoff_len", "lora_target", "template", "stage",
                       "pure_bf16", "use_unsloth", "neat_packing", "dataset_dir", "flash_attn")


@lru_cache(maxsize=None)
def _only(tool: str) -> frozenset[str]:
    """The keys of ``tool``'s schema that no other tool's has (``keys.json``)."""
    from reportgen.configs import table

    schema = table.schema()
    # torchtune's files are told by their _component_ sections, never by a key's name; accelerate's launch file is
    # never a training config
    others = set().union(*(set(table.known_keys(k)) for k in schema if k not in (tool, "torchtune", "accelerate")))
    return frozenset(set(table.known_keys(tool)) - others)


def _is_torchtune(doc: dict) -> bool:
    """torchtune's configs name their components (``model: {_component_: torchtune.models...}``); no other tool's
    has a ``_component_`` key."""
    return "_component_" in doc or any(isinstance(v, dict) and "_component_" in v for v in doc.values()) or any(
        isinstance(v, list) and any(isinstance(d, dict) and "_component_" in d for d in v) for v in doc.values())


def detect(doc: dict, path: Path) -> str:
    from reportgen.configs import unsloth

    if unsloth.is_unsloth(doc):
        return "unsloth"
    if _is_torchtune(doc):
        if "_component_" in doc:
            raise ConfigError(f"{path}: _component_ at the top: a torchtune component, not a recipe's config",
                              hint="a tune run config has sections such as model: {_component_: torchtune.models...}")
        return "torchtune"
    trl = [k for k in _TRL_MARKS if k in doc]
    axo = [k for k in _AXOLOTL_MARKS if k in doc]
    lf = [k for k in doc if k in _LLAMAFACTORY_MARKS or k in _only("llamafactory")]
    if lf and not axo:
        only_trl = [k for k in doc if k in _only("trl")]
        if only_trl:
            raise ConfigError(f"{path}: has LLaMA-Factory keys ({', '.join(lf[:4])}) and TRL keys "
                              f"({', '.join(only_trl[:4])})",
                              hint="a config is for one tool: LLaMA-Factory names the rank lora_rank, TRL lora_r")
        return "llamafactory"
    if trl and not axo:
        return "trl"
    if axo and not trl:
        return "axolotl"
    if trl and axo:
        raise ConfigError(f"{path}: has TRL keys ({', '.join(trl)}) and Axolotl keys ({', '.join(axo)})",
                          hint="a config is for one tool: TRL names the model model_name_or_path, Axolotl base_model")
    raise ConfigError(f"{path}: neither a TRL, an Axolotl, a LLaMA-Factory, a torchtune nor an unsloth config: it has "
                      f"none of {', '.join(_TRL_MARKS)} (TRL), {', '.join(_AXOLOTL_MARKS)} (Axolotl), "
                      f"{', '.join(_LLAMAFACTORY_MARKS)} (LLaMA-Factory), a section's _component_ (torchtune) or a "
                      "FastLanguageModel.from_pretrained section (unsloth)",
                      hint="TRL: model_name_or_path: meta-llama/Llama-3.2-1B; Axolotl: base_model: ...; torchtune: "
                           "model: {_component_: torchtune.models.llama3_2.lora_llama3_2_1b, ...}; unsloth: "
                           "FastLanguageModel.from_pretrained: {model_name: unsloth/Llama-3.2-1B-Instruct, ...}")


def translate_file(path: str | Path, bf16_capable: bool = True) -> Translation:
    """The file's model and setup fields and what became of each key; ``bf16_capable``: whether the
    card has bf16 (Axolotl's ``bf16: auto`` asks it). Raises ``ConfigError``."""
    from reportgen.configs import axolotl, llamafactory, torchtune, trl, unsloth

    path = Path(path)
    doc, lines = read_file(path)
    tool = detect(doc, path)
    if tool == "unsloth":
        flat, flat_lines = unsloth.flatten(doc, lines, path)
        return unsloth.translate(Reader(path, flat, flat_lines, tool), bf16_capable=bf16_capable)
    if tool == "torchtune":
        return torchtune.translate(Reader(path, torchtune.flatten(doc), lines, tool))
    r = Reader(path, doc, lines, tool)
    if tool == "llamafactory":
        return llamafactory.translate(r)
    return trl.translate(r) if tool == "trl" else axolotl.translate(r, bf16_capable=bf16_capable)


def _flag(field: str, value: str = "") -> str:
    return "--" + field.replace("_", "-") + (f" {value}" if value else "")


def setup_from(t: Translation, explicit: dict[str, Any] | None = None, model: str | None = None,
               option: Callable[..., str] = _flag):
    """The ``TrainingSetup`` of a translation, the ``explicit`` fields (flags given beside the file)
    overriding the file's. The number of GPUs is not in a config (the launcher sets it): a file
    with an FSDP or DeepSpeed section needs ``gpus`` among the explicit fields, and explicit
    ``gpus`` above 1 without such a section is DDP, as ``accelerate launch``/``torchrun`` run it.
    ``option(field, value)`` names a field as the caller's user sets it (a flag; a sweep: a grid key)."""
    from reportgen.setup import SetupError, TrainingSetup

    explicit = {k: v for k, v in (explicit or {}).items() if v is not None}
    values = dict(t.values)
    sources = dict(t.sources)
    gpus = explicit.get("gpus", values.get("gpus", 1))  # a launch file's num_processes (launch.py)
    if "sharding" not in explicit:
        if t.sharding_key and gpus == 1:
            raise ConfigError(f"{t.elsewhere.get(t.sharding_key, t.path)}: {t.sharding_key}: shards over several GPUs; "
                              "the number of GPUs is the launcher's, not the file's",
                              hint=f"give {option('gpus', 'N')} (N > 1), or {option('sharding', 'none')} to "
                              "estimate one GPU")
        if not t.sharding_key and gpus > 1:
            values["sharding"] = t.multi_gpu
    elif explicit["sharding"] == "none" and gpus == 1:
        values.pop("offload", None) if sources.get("offload") == t.sharding_key else None
    for name, (key, why, hint) in t.needs.items():
        if name not in explicit:
            kind = TrainingSetup.model_fields[name].annotation
            value = "|".join(v.value for v in kind) if isinstance(kind, type) and issubclass(kind, Enum) else "N"
            raise ConfigError(f"{t.where(key)}: {key}: {why}", hint=f"{hint}, or pass {option(name, value)}")
    values.update(explicit)
    if values.get("recipe") == "grpo" and "seq" not in explicit and values.get("max_prompt_length"):
        # a GRPO row is prompt + completion (estimate/grpo.py): a flag changing either moves seq
        values["seq"] = values["max_prompt_length"] + values.get("max_completion_length", 512)
    if "method" in explicit:  # --method beside the file overrides it: the file's fields of its own method go too
        from reportgen.setup import METHOD_FIELDS

        for name, methods in METHOD_FIELDS.items():
            if name not in explicit and str(values["method"]) not in methods:
                values.pop(name, None)
    try:
        setup = TrainingSetup(**values)
    except SetupError as exc:
        key = sources.get(exc.field) if exc.field not in explicit else None
        if key:
            raise ConfigError(f"{t.where(key)}: {key}: {exc.message}") from None
        flag = option(exc.field) if exc.field else "setup"
        raise ConfigError(f"{flag} (with {t.path}): {exc.message}") from None
    model = model or t.model
    if setup.is_peft and model and "lora_targets" not in explicit:
        from reportgen import catalog
        from reportgen.errors import UserError

        spec = catalog.load_model(model)
        try:
            spec.lora_selection(setup.lora_targets)
        except UserError as exc:
            key = sources.get("lora_targets", "lora_target_modules")
            raise ConfigError(f"{t.where(key)}: {key}: {exc.message}", hint=exc.hint) from None
    return setup
