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

Run: ``python scripts/config_keys.py AXOLOTL_WHEEL``, or ``python scripts/config_keys.py --only-llamafactory
LLAMAFACTORY_WHEEL TRANSFORMERS_WHEEL`` to rewrite LLaMA-Factory's section alone.
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


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "--only-llamafactory":
        data = json.loads(OUT.read_text())
        data["llamafactory"] = llamafactory_keys(Path(argv[1]), Path(argv[2]))
        OUT.write_text(json.dumps(data, indent=0, sort_keys=True, separators=(",", ":")) + "\n")
        print(f"wrote {OUT}: LLaMA-Factory {data['llamafactory']['version']} ({len(data['llamafactory']['keys'])} keys)")
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    data = {**json.loads(OUT.read_text()), "trl": trl_keys(), "axolotl": axolotl_keys(Path(argv[0]))}
    OUT.write_text(json.dumps(data, indent=0, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}: TRL {data['trl']['version']} ({len(data['trl']['keys'])} keys), "
          f"Axolotl {data['axolotl']['version']} ({len(data['axolotl']['keys'])} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
