"""Write ``reportgen/configs/keys.json``: every key a TRL ``trl sft --config`` file and an Axolotl
YAML may hold, with the tool's default (``{"keys": {name: default}}``, null where the default is not a plain
value), read from the tools themselves.

* TRL: the fields of the four dataclasses ``trl sft`` parses its config into (and, as ``grpo_keys``,
  those ``trl grpo`` adds: ``GRPOScriptArguments`` and ``GRPOConfig``)
  (``trl/scripts/sft.py`` ``make_parser``: ``ScriptArguments``, ``SFTConfig`` (which extends
  transformers' ``TrainingArguments``), ``ModelConfig``, ``DatasetMixtureConfig``), from the
  installed, pinned trl and transformers (``pip install trl==1.16.0``).
* Axolotl: the fields of ``AxolotlInputConfig`` and of every class it extends
  (``axolotl/utils/schemas/``), plus the plugins' arguments (``axolotl/integrations/*/args.py``),
  read from the published wheel's source with ``ast`` (installing axolotl pulls a CUDA stack):
  ``pip download axolotl==0.19.0 --no-deps`` and pass the wheel.

* LLaMA-Factory: the fields of the five dataclasses ``llamafactory-cli train`` parses a config into
  (``llamafactory/hparams/parser.py`` ``_TRAIN_ARGS``: ``ModelArguments``, ``DataArguments``,
  ``TrainingArguments``, ``FinetuningArguments``, ``GeneratingArguments``, with every class they
  extend), read from the published wheel with ``ast`` (``pip download llamafactory==0.9.5 --no-deps``),
  and its ``TrainingArguments``' base, transformers' ``Seq2SeqTrainingArguments``, likewise from the
  newest transformers it accepts (``transformers!=4.52.0,!=4.57.0,<=5.6.0,>=4.55.0``:
  ``pip download transformers==5.6.0 --no-deps``).

* torchtune: the keys its four fine-tuning recipes read (``recipes/lora_finetune_single_device.py``,
  ``lora_finetune_distributed.py``, ``full_finetune_single_device.py``, ``full_finetune_distributed.py``, which
  the wheel ships): every ``cfg.get("key", default)`` with its default and every ``cfg.key`` the recipe reads
  without one (a required key, default null), read with ``ast``; each section's ``_component_`` and the
  arguments of the components torchtune ships for it: the model builders (``torchtune/models/*/_model_builders.py``,
  with their defaults and, for the plain builders, the literal shapes they pass: ``vocab_size``, ``num_layers``,
  ...), tokenizers, datasets (``torchtune/datasets/``), losses (``torchtune/modules/loss/``), checkpointers,
  metric loggers, LR schedulers and the profiler (``torchtune/training/``); an optimizer's arguments are
  ``torch.optim``'s (the installed torch, by ``inspect``: torch is not in the wheel); ``downloads``: the Hub ids the
  wheel's shipped configs (``recipes/configs/**.yaml``) download for each builder (their ``tune download`` line).
  ``pip download torchtune==0.6.1 --no-deps``.

* unsloth: the keyword arguments of ``FastLanguageModel.from_pretrained`` (``unsloth/models/loader.py``) and of
  ``FastLlamaModel.get_peft_model`` (``unsloth/models/llama.py``; ``FastLanguageModel.get_peft_model`` wraps it with
  ``functools.wraps``), with their literal defaults (a module-level constant such as ``_DEFAULT_TARGET_MODULES``
  resolved), read with ``ast`` from the published wheel (``pip download unsloth==2026.10.9 --no-deps``), and its
  ``unsloth/models/mapper.py`` ``__INT_TO_FLOAT_MAPPER`` as ``models``: every ``unsloth/...`` repo it names ->
  the original checkpoint's Hub id. The trainer section's keys are TRL's (the ``trl`` entry); the defaults unsloth's
  patched configs put in place of TRL's (``unsloth/models/rl.py`` ``replacements``) are ``trainer_defaults``.

* accelerate: the keys of an ``accelerate launch --config_file`` YAML (``accelerate/commands/config/config_args.py``:
  the fields of ``ClusterConfig`` and ``BaseConfig``; each section's keys are the launcher's options it copies them
  to, ``accelerate/commands/launch.py`` ``launch_command_parser``: ``fsdp_config`` -> the ``--fsdp_*`` options,
  ``deepspeed_config`` -> the DeepSpeed group's, ``dynamo_config`` -> ``--dynamo_*``, ...), with the launcher's
  defaults, read with ``ast`` from the installed, pinned accelerate (``constraints.txt``), as ``section.key``;
  ``DistributedType``'s values and ``--mixed_precision``'s choices beside them.

Run: ``python scripts/config_keys.py AXOLOTL_WHEEL``, ``python scripts/config_keys.py --only-llamafactory
LLAMAFACTORY_WHEEL TRANSFORMERS_WHEEL`` ``python scripts/config_keys.py --only-torchtune TORCHTUNE_WHEEL`` or
``python scripts/config_keys.py --only-unsloth UNSLOTH_WHEEL`` or ``python scripts/config_keys.py --only-accelerate``
to rewrite one tool's section alone (the others are kept byte for byte).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import sys
import zipfile
from enum import Enum
from importlib import metadata
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "reportgen" / "configs" / "keys.json"


def _jsonable(value):
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float, bool)) for v in value):
        return list(value)
    return None


def trl_keys() -> dict:
    from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, SFTConfig

    keys: dict[str, dict] = {}
    for cls in (ScriptArguments, SFTConfig, ModelConfig, DatasetMixtureConfig):
        for f in dataclasses.fields(cls):
            if not f.init or f.name.startswith("_"):
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            keys.setdefault(f.name, _jsonable(default))
    return {"version": metadata.version("trl"), "transformers": metadata.version("transformers"),
            "keys": dict(sorted(keys.items())), "grpo_keys": trl_grpo_keys(keys)}


def trl_grpo_keys(sft: dict) -> dict:
    """The keys a ``trl grpo --config`` file has beyond an SFT file's (``trl/scripts/grpo.py``
    ``make_parser``: ``GRPOScriptArguments``, ``GRPOConfig``, ``ModelConfig``, ``DatasetMixtureConfig``),
    with GRPO's defaults; a file holding any of them is read as GRPO (``reportgen/configs/trl.py``)."""
    from trl import GRPOConfig
    from trl.scripts.grpo import GRPOScriptArguments

    keys: dict[str, object] = {}
    for cls in (GRPOScriptArguments, GRPOConfig):
        for f in dataclasses.fields(cls):
            if f.init and not f.name.startswith("_") and f.name not in sft:
                keys.setdefault(f.name, _jsonable(f.default if f.default is not dataclasses.MISSING else None))
    return dict(sorted(keys.items()))


def _classes(sources: dict[str, str]) -> dict[str, ast.ClassDef]:
    out = {}
    for text in sources.values():
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, node)
    return out


def _default(value):
    """The default of a field's right-hand side: pydantic's ``Field(default)`` or ``Field(default=...)``,
    a dataclass ``field(default=...)`` (``default_factory``: None), or the value itself."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") in ("Field", "field"):
        return value.args[0] if value.args else next((k.value for k in value.keywords if k.arg == "default"), None)
    return value


def _fields(cls: ast.ClassDef, classes: dict[str, ast.ClassDef], seen: set[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else None
        if name and name in classes and name not in seen:
            seen.add(name)
            out.update(_fields(classes[name], classes, seen))
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id != "model_config":
            default = None
            value = _default(stmt.value)
            try:
                default = ast.literal_eval(value) if value is not None else None
            except ValueError:
                default = None
            out[stmt.target.id] = _jsonable(default)
    return out


def axolotl_keys(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        schemas = {n: z.read(n).decode() for n in z.namelist()
                   if n.startswith("axolotl/utils/schemas/") and n.endswith(".py")}
        plugins = {n: z.read(n).decode() for n in z.namelist()
                   if re.fullmatch(r"axolotl/integrations/[^/]+/args\.py", n)}
    version = re.search(r"axolotl-([0-9][^-]*)-", wheel.name).group(1)
    classes = _classes(schemas)
    keys = dict(_fields(classes["AxolotlInputConfig"], classes, set()))
    for name, text in sorted(plugins.items()):
        pclasses = _classes({name: text})
        for cls in pclasses.values():
            if any(getattr(b, "id", "") == "BaseModel" for b in cls.bases):
                for k, v in _fields(cls, pclasses, set()).items():
                    keys.setdefault(k, v)
    return {"version": version, "keys": dict(sorted(keys.items()))}


def llamafactory_keys(wheel: Path, transformers_wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        hparams = {n: z.read(n).decode() for n in z.namelist()
                   if n.startswith("llamafactory/hparams/") and n.endswith(".py")}
    with zipfile.ZipFile(transformers_wheel) as z:
        base = {n: z.read(n).decode() for n in ("transformers/training_args.py",
                                                "transformers/training_args_seq2seq.py")}
    version = re.search(r"llamafactory-([0-9][^-]*)-", wheel.name).group(1)
    tf_version = re.search(r"transformers-([0-9][^-]*)-", transformers_wheel.name).group(1)
    tf_classes = _classes(base)
    keys = {k: v for k, v in _fields(tf_classes["Seq2SeqTrainingArguments"], tf_classes, set()).items()
            if not k.startswith("_")}
    # transformers 5.6 computes optim's default (``default_optim``): adamw_torch_fused from torch 2.8 on
    keys["optim"] = keys.get("optim") or "adamw_torch_fused"
    classes = _classes(hparams)
    for name in ("ModelArguments", "DataArguments", "TrainingArguments", "FinetuningArguments", "GeneratingArguments"):
        keys.update(_fields(classes[name], classes, {"Seq2SeqTrainingArguments", "BaseTrainingArguments"}))
    return {"version": version, "transformers": tf_version, "keys": dict(sorted(keys.items()))}


#: the fine-tuning recipes a torchtune config for ``tune run`` names, and the sections they instantiate
TORCHTUNE_RECIPES = ("lora_finetune_single_device", "lora_finetune_distributed", "full_finetune_single_device",
                     "full_finetune_distributed")
_SHAPE_ARGS = ("vocab_size", "num_layers", "num_heads", "num_kv_heads", "embed_dim", "intermediate_dim", "max_seq_len",
               "head_dim", "tie_word_embeddings", "norm_eps", "rope_base")


def _literal(node):
    try:
        return _jsonable(ast.literal_eval(node)) if node is not None else None
    except ValueError:
        return None


def _cfg_chain(node, roots: dict[str, str]) -> list[str] | None:
    """``cfg.a.b`` (or ``cfg_model.a``, a recipe method's section argument) as ``["a", "b"]``."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in roots:
        return ([roots[node.id]] if roots[node.id] else []) + names[::-1]
    return None


def recipe_keys(text: str) -> dict[str, dict]:
    """The keys a recipe reads: ``cfg.get("k", d)`` -> default d; ``cfg.k`` (required) -> null."""
    tree = ast.parse(text)
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    roots = {"cfg": "", **{f"cfg_{s}": s for s in ("model", "dataset", "optimizer", "checkpointer", "lr_scheduler",
                                                     "profiler", "tokenizer", "loss")}}
    out: dict[str, dict] = {}
    gets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            chain = _cfg_chain(node.func.value, roots)
            arg = node.args[0] if node.args else None
            key = arg.value if isinstance(arg, ast.Constant) else consts.get(getattr(arg, "id", None))
            if chain is not None and isinstance(key, str):
                gets.add(id(node.func))
                default = _literal(node.args[1]) if len(node.args) > 1 else None
                out[".".join(chain + [key])] = {"default": default, "required": False}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in gets and node.attr != "get":
            chain = _cfg_chain(node, roots)
            if chain:
                key = ".".join(chain[:2])
                out.setdefault(key, {"default": None, "required": True})
    return out


def _args(fn: ast.FunctionDef, skip: tuple = ("self",)) -> dict[str, object]:
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    out = {arg.arg: _literal(d) for arg, d in zip(pos, defaults) if arg.arg not in skip}
    out.update({arg.arg: _literal(d) for arg, d in zip(a.kwonlyargs, a.kw_defaults)})
    return out


def _public(tree: ast.Module) -> dict[str, dict]:
    """A module's public functions' arguments and its public classes' ``__init__`` arguments."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            out[node.name] = _args(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            init = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
            out[node.name] = _args(init) if init else {}
    return out


def _aliases(module: str, tree: ast.Module) -> dict[str, str]:
    """``name = other`` of a builder imported from another ``_model_builders`` (``llama3_3/_model_builders.py``:
    ``lora_llama3_3_70b = lora_llama3_1_70b``): each alias -> the builder it names."""
    imported = {a.asname or a.name: f"{n.module.removesuffix('._model_builders')}.{a.name}" for n in tree.body
                if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("._model_builders") for a in n.names}
    return {f"{module}.{t.id}": imported[n.value.id] for n in tree.body if isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Name) and n.value.id in imported for t in n.targets if isinstance(t, ast.Name)}


def _builders(module: str, text: str) -> tuple[dict, dict]:
    """A ``_model_builders.py``'s builders (arguments and defaults; ``partial(f, k=v)`` over f's) and the
    literal shapes each plain builder passes to its component builder."""
    tree = ast.parse(text)
    builders, shapes = {}, {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            builders[node.name] = _args(node)
            ret = next((n.value for n in ast.walk(node) if isinstance(n, ast.Return)), None)
            if isinstance(ret, ast.Call):
                lits = {k.arg: _literal(k.value) for k in ret.keywords if k.arg in _SHAPE_ARGS}
                if lits:
                    shapes[f"{module}.{node.name}"] = {k: v for k, v in lits.items() if v is not None}
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
              and getattr(node.value.func, "id", "") == "partial" and node.value.args):
            base = getattr(node.value.args[0], "id", None)
            if base in builders:
                for t in node.targets:
                    builders[t.id] = {**builders[base], **{k.arg: _literal(k.value) for k in node.value.keywords}}
                    if f"{module}.{base}" in shapes:
                        shapes[f"{module}.{t.id}"] = shapes[f"{module}.{base}"]
    return {f"{module}.{k}": v for k, v in builders.items()}, shapes


def _torch_optimizers() -> tuple[str, dict]:
    import inspect

    import torch

    out = {}
    for name in ("AdamW", "Adam", "SGD"):
        params = inspect.signature(getattr(torch.optim, name)).parameters
        out[f"torch.optim.{name}"] = {k: _jsonable(p.default) if p.default is not inspect.Parameter.empty else None
                                      for k, p in params.items() if k != "params"}
    return torch.__version__, out


def _downloads(configs: dict[str, str]) -> dict[str, list[str]]:
    """The Hub ids the wheel's own configs (``recipes/configs/**.yaml``) download for each model builder (their
    ``tune download ORG/NAME`` comment), keyed by the plain builder (``lora_``/``qlora_`` dropped)."""
    out: dict[str, set] = {}
    for text in configs.values():
        hub = re.search(r"tune download ([A-Za-z0-9][\w.-]*/[\w.-]+)", text)
        model = re.search(r"^model:\s*\n\s+_component_:\s*(torchtune\.models\.[\w.]+)", text, re.M)
        if hub and model:
            module, name = model.group(1).rsplit(".", 1)
            out.setdefault(f"{module}.{re.sub(r'^q?lora_', '', name)}", set()).add(hub.group(1))
    return {k: sorted(v) for k, v in sorted(out.items())}


def torchtune_keys(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        files = {n: z.read(n).decode() for n in z.namelist() if n.endswith(".py")}
        configs = {n: z.read(n).decode() for n in z.namelist() if re.fullmatch(r"recipes/configs/.+\.yaml", n)}
    version = re.search(r"torchtune-([0-9][^-]*)-", wheel.name).group(1)
    recipes = {name: recipe_keys(files[f"recipes/{name}.py"]) for name in TORCHTUNE_RECIPES}
    builders, shapes, tokenizers, aliases = {}, {}, {}, {}
    for name, text in sorted(files.items()):
        m = re.fullmatch(r"torchtune/models/([a-z0-9_]+)/_model_builders\.py", name)
        if m:
            b, s = _builders(f"torchtune.models.{m.group(1)}", text)
            for k, v in b.items():
                (tokenizers if k.endswith("tokenizer") or k.endswith("transform") else builders)[k] = v
            shapes.update({k: v for k, v in s.items() if k in builders})
            aliases.update(_aliases(f"torchtune.models.{m.group(1)}", ast.parse(text)))
    for alias, target in aliases.items():  # the aliased builder's arguments and shapes, under the alias's name
        if target in builders:
            builders[alias] = builders[target]
            if target in shapes:
                shapes[alias] = shapes[target]
    sections: dict[str, dict] = {"model": builders, "tokenizer": tokenizers}
    groups = {"dataset": r"torchtune/datasets/_[a-z_]+\.py", "loss": r"torchtune/modules/loss/[a-z_]+\.py",
              "checkpointer": r"torchtune/training/checkpointing/_checkpointer\.py",
              "metric_logger": r"torchtune/training/metric_logging\.py",
              "lr_scheduler": r"torchtune/training/lr_schedulers\.py", "profiler": r"torchtune/training/_profiler\.py"}
    for section, pattern in groups.items():
        comps = {}
        for name, text in sorted(files.items()):
            if re.fullmatch(pattern, name):
                package = "torchtune." + ".".join(name.split("/")[1:-1])
                comps.update({f"{package}.{k}": v for k, v in _public(ast.parse(text)).items()})
        sections[section] = comps
    torch_version, sections["optimizer"] = _torch_optimizers()
    keys: dict[str, object] = {}
    for reads in recipes.values():
        for k, v in reads.items():
            keys.setdefault(k, v["default"])
    for section, comps in sections.items():
        keys.setdefault(f"{section}._component_", None)
        for args in comps.values():
            for arg, default in args.items():
                if arg not in ("tokenizer", "optimizer", "num_training_steps", "last_epoch"):
                    keys.setdefault(f"{section}.{arg}", None)
    return {"version": version, "torch": torch_version, "keys": dict(sorted(keys.items())),
            "recipes": {name: sorted(reads) for name, reads in recipes.items()},
            "required": {name: sorted(k for k, v in reads.items() if v["required"]) for name, reads in recipes.items()},
            "builders": dict(sorted(builders.items())), "shapes": dict(sorted(shapes.items())),
            "downloads": _downloads(configs),
            "components": {s: sorted(c) for s, c in sections.items() if s != "model"}}


def _method_args(tree: ast.Module, cls: str, method: str, skip: tuple) -> dict[str, object]:
    """A class's method's keyword arguments and literal defaults, a default naming a module-level constant of
    ``tree`` read as that constant's value."""
    consts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            consts[node.targets[0].id] = _literal(node.value)
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(b for b in klass.body if isinstance(b, ast.FunctionDef) and b.name == method)
    out = _args(fn, skip)
    a = fn.args
    pos = a.posonlyargs + a.args
    named = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
    for arg, d in named:
        if isinstance(d, ast.Name) and d.id in consts:
            out[arg.arg] = consts[d.id]
    return out


def _unsloth_models(text: str) -> dict[str, str]:
    """``mapper.py``'s ``__INT_TO_FLOAT_MAPPER``: each ``unsloth/...`` name (lower case, as unsloth's loader looks
    it up) -> the first Hub id of another organisation among its values (the original checkpoint)."""
    tree = ast.parse(text)
    node = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "__INT_TO_FLOAT_MAPPER")
    out: dict[str, str] = {}
    for key, value in ast.literal_eval(node).items():
        names = list(value["16"] if isinstance(value, dict) else value)
        original = next((n for n in names if not n.lower().startswith("unsloth/")), None)
        if original:
            for name in [key] + names:
                if name.lower().startswith("unsloth/"):
                    out.setdefault(name.lower(), original)
    return dict(sorted(out.items()))


def _unsloth_trainer_defaults(text: str) -> dict[str, object]:
    """``unsloth/models/rl.py``'s ``replacements``: the defaults unsloth's patched TRL configs (``UnslothSFTConfig``)
    put in place of TRL's (``per_device_train_batch_size`` 4, ``optim`` adamw_8bit, ...)."""
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "replacements"
                and isinstance(node.value, ast.Dict)):
            return {k.value: _literal(v) for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant)}
    raise SystemExit("unsloth/models/rl.py: no replacements dict")


def unsloth_keys(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        files = {n: z.read(n).decode() for n in ("unsloth/models/loader.py", "unsloth/models/llama.py",
                                                 "unsloth/models/mapper.py", "unsloth/models/rl.py",
                                                 "unsloth/_version.py")}
    version = re.search(r'__version__ = "([^"]+)"', files["unsloth/_version.py"]).group(1)
    load = _method_args(ast.parse(files["unsloth/models/loader.py"]), "FastLanguageModel", "from_pretrained", ())
    peft = _method_args(ast.parse(files["unsloth/models/llama.py"]), "FastLlamaModel", "get_peft_model", ("model",))
    keys = {**{f"from_pretrained.{k}": v for k, v in load.items()}, **{f"get_peft_model.{k}": v for k, v in peft.items()}}
    return {"version": version, "keys": dict(sorted(keys.items())),
            "models": _unsloth_models(files["unsloth/models/mapper.py"]),
            "trainer_defaults": dict(sorted(_unsloth_trainer_defaults(files["unsloth/models/rl.py"]).items()))}


#: ``launch_command_parser``'s argument groups -> the config file's section whose keys the launcher copies into them
#: (``_validate_launch_command``: ``defaults.fsdp_config.x`` -> ``args.fsdp_x``, ``dynamo_config.x`` -> ``args.dynamo_x``)
ACCELERATE_SECTIONS = {"fsdp_args": "fsdp_config", "deepspeed_args": "deepspeed_config", "fp8_args": "fp8_config",
                       "megatron_lm_args": "megatron_lm_config", "mpirun_args": "mpirun_config",
                       "parallelism_config_args": "parallelism_config"}


def _launch_options(tree: ast.Module) -> tuple[dict[str, dict], list]:
    """``launch_command_parser``'s options by section (``add_argument`` on a group variable), with their defaults,
    and ``--mixed_precision``'s choices."""
    sections: dict[str, dict] = {s: {} for s in (*ACCELERATE_SECTIONS.values(), "dynamo_config")}
    precisions: list = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
                and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        name = str(node.args[0].value).lstrip("-")
        kw = {k.arg: k.value for k in node.keywords}
        group = getattr(node.func.value, "id", "")
        if name == "mixed_precision":
            precisions = _literal(kw.get("choices")) or []
        section = ACCELERATE_SECTIONS.get(group) or ("dynamo_config" if name.startswith("dynamo_") else None)
        if section:
            sections[section][name] = _literal(kw.get("default"))
    return sections, precisions


def accelerate_keys() -> dict:
    import accelerate

    root = Path(accelerate.__file__).parent
    classes = _classes({"c": (root / "commands/config/config_args.py").read_text()})
    keys = dict(_fields(classes["ClusterConfig"], classes, set()))
    sections, precisions = _launch_options(ast.parse((root / "commands/launch.py").read_text()))
    for section, options in sections.items():
        keys.update({f"{section}.{k}": v for k, v in options.items()})
    enum = _classes({"d": (root / "utils/dataclasses.py").read_text()})["DistributedType"]
    types = [n.value.value for n in enum.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)]
    return {"version": metadata.version("accelerate"), "keys": dict(sorted(keys.items())),
            "distributed_types": types, "mixed_precision": precisions}


def _write(**entries: dict) -> dict:
    """keys.json with ``entries`` (tool -> its keys) replaced and every other tool's entry as it was."""
    data = {**json.loads(OUT.read_text()), **entries}
    OUT.write_text(json.dumps(data, indent=0, sort_keys=True, separators=(",", ":")) + "\n")
    return data


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--only-unsloth":
        e = _write(unsloth=unsloth_keys(Path(argv[1])))["unsloth"]
        print(f"wrote {OUT}: unsloth {e['version']} ({len(e['keys'])} keys, {len(e['models'])} unsloth repos)")
        return 0
    if argv == ["--only-accelerate"]:
        e = _write(accelerate=accelerate_keys())["accelerate"]
        print(f"wrote {OUT}: accelerate {e['version']} ({len(e['keys'])} keys)")
        return 0
    if len(argv) == 2 and argv[0] == "--only-torchtune":
        e = _write(torchtune=torchtune_keys(Path(argv[1])))["torchtune"]
        print(f"wrote {OUT}: torchtune {e['version']} ({len(e['keys'])} keys, {len(e['builders'])} model builders)")
        return 0
    if len(argv) == 3 and argv[0] == "--only-llamafactory":
        e = _write(llamafactory=llamafactory_keys(Path(argv[1]), Path(argv[2])))["llamafactory"]
        print(f"wrote {OUT}: LLaMA-Factory {e['version']} ({len(e['keys'])} keys)")
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    data = _write(trl=trl_keys(), axolotl=axolotl_keys(Path(argv[0])))
    print(f"wrote {OUT}: TRL {data['trl']['version']} ({len(data['trl']['keys'])} keys), "
          f"Axolotl {data['axolotl']['version']} ({len(data['axolotl']['keys'])} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
