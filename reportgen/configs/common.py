"""What the TRL and Axolotl translators share: the file reader that names file, line and key in
its errors, the translation they fill in, the model look-up and the value maps both tools use
(transformers' optimizer and attention names, DeepSpeed and FSDP sections).

Torch-free and dependency-free beyond PyYAML: the site's calculator runs it under Pyodide.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reportgen import userfile, yamlfile
from reportgen.configs import table
from reportgen.errors import UserError
from reportgen.hub import parse as parse_hub_id


class ConfigError(UserError):
    """A config file reportgen cannot read as a run: names the file, line and key."""


@dataclass
class Translation:
    """A config file as reportgen's model plus setup fields, and what became of each key."""

    tool: str  # "trl" or "axolotl"
    path: str
    model: str | None = None  # a catalog name or a config.json path
    values: dict[str, Any] = field(default_factory=dict)  # setup field -> value
    sources: dict[str, str] = field(default_factory=dict)  # setup field -> the file key that set it
    honoured: list[str] = field(default_factory=list)
    approximated: list[tuple[str, str]] = field(default_factory=list)  # (key, what differs)
    ignored: list[str] = field(default_factory=list)  # bookkeeping keys, no effect on the step
    not_modelled: list[tuple[str, str]] = field(default_factory=list)  # ignored keys that change the step
    unknown: list[str] = field(default_factory=list)
    sharding_key: str | None = None  # the key that asks for several GPUs (fsdp, deepspeed)
    present: frozenset = frozenset()  # the keys the file has (the others took the tool's default)
    key_lines: dict = field(default_factory=dict)  # key -> its line in the file
    read_from: list[tuple[str, str]] = field(default_factory=list)  # (key, the file a relative path named)
    #: setup fields the file leaves to the user (field -> (key, why, hint)): refused unless given beside it
    needs: dict = field(default_factory=dict)
    #: the sharding of ``--gpus N`` when the file has no section for several GPUs (``accelerate launch`` and
    #: ``torchrun`` run DDP; torchtune's distributed recipes shard with FSDP2)
    multi_gpu: str = "ddp"
    #: why the file names no model reportgen knows, where it names one (a torchtune builder without a catalog model)
    model_missing: str = ""
    #: keys of another file that set fields here (an accelerate launch file's): key -> "path:line"
    elsewhere: dict = field(default_factory=dict)
    #: the launch file's own translation (``launch.apply``), reported after this file's keys
    launch: Any = None
    #: a config that sets neither bf16 nor fp16, read by transformers' ``TrainingArguments``: applies the
    #: autocast dtype ``accelerate launch`` puts in ``ACCELERATE_MIXED_PRECISION`` (``amp``, set by ``key``)
    #: as the file's reader would have read ``amp: true``; None where the file decided the precision itself
    autocast_unset: Any = None

    def where(self, key: str) -> str:
        if key in self.elsewhere:
            return self.elsewhere[key]
        line = self.key_lines.get(key)
        return f"{self.path}:{line}" if line else self.path

    def set(self, setup_field: str, value: Any, key: str) -> None:
        self.values[setup_field] = value
        self.sources.setdefault(setup_field, key)

    def approx(self, key: str, note: str) -> None:
        if (key, note) not in self.approximated:
            self.approximated.append((key, note))

    def lines(self) -> list[str]:
        """The report the CLI prints: each group on one line, ignored and unknown keys by name."""
        name = f"{table.TOOLS[self.tool]} {table.version(self.tool)}"
        out = [f"launch {self.path} ({name} config keys)" if self.tool == "accelerate" else
               f"from {self.path} ({name} keys): model {self.model}"]
        for key, where in self.read_from:
            out.append(f"read: {key}: {where}")
        if self.honoured:
            out.append("honoured: " + ", ".join(self.honoured))
        for key, note in self.approximated:
            default = "" if key in self.present else f" ({table.TOOLS[self.tool]}'s default)"
            out.append(f"approximated: {key}{default}: {note}")
        for key, note in self.not_modelled:
            out.append(f"warning: not modelled: {key}: {note}")
        for key in self.unknown:
            import difflib

            close = difflib.get_close_matches(key, list(table.known_keys(self.tool)), n=2, cutoff=0.75)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            out.append(f"warning: unknown key {key!r}: not a key of {name}'s config{hint}; ignored")
        if self.ignored:
            out.append("ignored (no effect on one step's memory or speed): " + ", ".join(self.ignored))
        return out + (self.launch.lines() if self.launch is not None else [])


class Reader:
    """One parsed config file: values by key, each read marked, errors with file, line and key."""

    def __init__(self, path: Path, doc: dict, lines: dict[str, int], tool: str):
        self.path, self.doc, self._lines, self.tool = path, doc, lines, tool
        self.read: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.doc and self.doc[key] is not None

    def get(self, key: str, default: Any = None) -> Any:
        """The file's value, or the tool's own default (``keys.json``) when absent or null."""
        self.read.add(key)
        if self.has(key):
            return self.doc[key]
        return default

    def tool_default(self, key: str) -> Any:
        return self.get(key, table.default(self.tool, key))

    def where(self, key: str) -> str:
        line = self._lines.get(key)
        return f"{self.path}:{line}" if line else str(self.path)

    def error(self, key: str, message: str, hint: str | None = None) -> ConfigError:
        return ConfigError(f"{self.where(key)}: {key}: {message}", hint=hint)

    def boolean(self, key: str, default: Any = None) -> bool | None:
        return self.as_boolean(key, self.get(key, default))

    def as_boolean(self, key: str, value: Any, strings: bool = True) -> bool | None:
        """``value`` (read under ``key``) as a boolean: true or false, or with ``strings`` the strings
        "true" and "false" (what pydantic's fields in Axolotl and accelerate's ``str_to_bool`` take);
        without (``BitsAndBytesConfig`` checks ``isinstance(..., bool)``) a string is refused."""
        if value is None or isinstance(value, bool):
            return value
        if strings and isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise self.error(key, f"must be true or false (got {value!r})")

    def integer(self, key: str, default: Any = None, minimum: int | None = None) -> int | None:
        """A whole number written in ASCII digits (``int("٤")`` is 4 in Python, not to a trainer), at
        least ``minimum`` when given."""
        value = self.get(key, default)
        if key in self.doc and self.doc[key] is None and default is not None:  # null: the trainer gets None
            raise self.error(key, f"is null, where the trainer takes a whole number (default {default})",
                             hint=f"write the number, or drop {key} for the default")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not re.fullmatch(r"[0-9]+", str(value)):
            least = f"{minimum} or more" if minimum is not None else "0 or more"
            raise self.error(key, f"must be a whole number, {least}, in digits (got {value!r})")
        if minimum is not None and int(value) < minimum:
            raise self.error(key, f"must be at least {minimum} (got {value!r})")
        return int(value)

    def number(self, key: str, default: Any = None) -> float | None:
        value = self.get(key, default)
        if value is None:
            return None
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        except (TypeError, ValueError):
            raise self.error(key, f"must be a number (got {value!r})") from None


CONFIG_FILE = yamlfile.Kind(noun="config file", what_it_holds="a TRL or Axolotl config is a mapping of a few dozen "
                           "keys to values", example="a config is the YAML file `trl sft --config` or axolotl takes",
                           repeated_key="write each key once: the trainer would read only the last one")


def read_file(path: str | Path) -> tuple[dict, dict[str, int]]:
    """A YAML or JSON config (JSON is YAML) as a mapping, with the line of each top-level key; read
    within ``yamlfile.py``'s limits (size, values, nesting, UTF-8, no key twice)."""
    path = Path(path)
    try:
        node, doc = yamlfile.load(path, CONFIG_FILE)
    except UserError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from None
    if not isinstance(doc, dict):
        found = "an empty file" if doc is None else f"a {type(doc).__name__}"
        raise ConfigError(f"{path}: a config is a mapping of keys to values, not {found}",
                          hint="e.g. model_name_or_path: meta-llama/Llama-3.2-1B (TRL) or base_model: ... (Axolotl)")
    return {str(k): v for k, v in doc.items()}, key_lines(node)


def key_lines(node) -> dict[str, int]:
    """The line of each top-level key of a YAML mapping's node, and of each key of a section as
    ``section.key`` (torchtune's components, accelerate's ``fsdp_config``)."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                lines[k.value] = k.start_mark.line + 1
                if isinstance(v, yaml.MappingNode):
                    for kk, _ in v.value:
                        if isinstance(kk, yaml.ScalarNode):
                            lines.setdefault(f"{k.value}.{kk.value}", kk.start_mark.line + 1)
    return lines


# ----- the model -------------------------------------------------------------------------------
_VARIANT = re.compile(r"[-_](instruct|it|chat|hf|pt|base)$", re.IGNORECASE)


def _stem(repo_id: str) -> str:
    s = repo_id.strip().lower()
    while _VARIANT.search(s):
        s = _VARIANT.sub("", s)
    return s


def resolve_model(r: Reader, key: str, t: Translation) -> None:
    """The model a config names: a local config.json or directory, a catalog name, a catalog
    model's Hub id, or (approximated) a variant of one (``-Instruct``, ``-it``, ``-chat``: the same
    shapes as its base checkpoint)."""
    from reportgen import catalog

    value = r.get(key)
    if value is None:
        return
    if not isinstance(value, str) or not value.strip():
        raise r.error(key, f"must be a model id or path (got {value!r})")
    value = value.strip()
    path = Path(value)
    relative = "" if path.is_absolute() else " (relative to the working directory, as the trainer opens it)"
    if path.is_dir() and (path / "config.json").is_file():
        t.model = str(path / "config.json")
        t.read_from.append((key, f"{path / 'config.json'}{relative}"))
    elif path.suffix == ".json" and path.is_file():
        t.model = str(path)
        t.read_from.append((key, f"{path}{relative}"))
    elif value in catalog.model_names():
        t.model = value
    else:
        ids = catalog.catalog_ids()
        exact = {k.lower(): v for k, v in ids.items()}.get(value.lower())
        if exact:
            t.model = exact
        else:
            stems = {}
            for hub, name in ids.items():
                stems.setdefault(_stem(hub), name)
            near = stems.get(_stem(value))
            if not near and parse_hub_id(value):  # any other model by its Hub id (hub.py): its config.json
                try:
                    catalog.load_model(value)
                except UserError as exc:
                    raise r.error(key, exc.message, hint=exc.hint) from None
                t.model = value
                return
            if not near:
                import difflib

                close = difflib.get_close_matches(value, list(ids), n=3, cutoff=0.5)
                raise r.error(key, f"{value!r} is not a local config.json or directory (looked in the working "
                              f"directory, {Path.cwd()}), a catalog model nor a Hub id (ORG/NAME)",
                              hint=("did you mean " + " or ".join(repr(c) for c in close) + "? " if close else "")
                              + "name a model by its Hugging Face Hub id (e.g. Qwen/Qwen3-14B), a catalog name "
                              "(reportgen models) or a path to its config.json")
            t.model = near
            t.approx(key, f"{value} has the shapes of the catalog's {near} ({hub_of(near)})")


def hub_of(name: str) -> str:
    from reportgen import catalog

    return next((hub for hub, n in catalog.catalog_ids().items() if n == name), name)


def checkpoint_dtype(model: str | None) -> str:
    """The dtype a checkpoint's config.json states (``torch_dtype``/``dtype``; float32 when none):
    what ``dtype="auto"`` loads."""
    if model is None:
        return "float32"
    from importlib import resources

    from reportgen import catalog

    try:
        if model in catalog.model_names():
            text = resources.files("reportgen.catalog").joinpath("models", f"{model}.json").read_text()
        else:
            text = Path(model).read_text()
        cfg = json.loads(text)
    except (OSError, ValueError):
        return "float32"
    return str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")


# ----- value maps both tools use ----------------------------------------------------------------
DTYPES = {"float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16",
          "half": "fp16", "float": "fp32"}

#: transformers' ``OptimizerNames`` (Trainer ``optim``, Axolotl ``optimizer``) -> setup optimizer
OPTIMIZERS = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw", "adamw_apex_fused": "adamw",
              "adamw_bnb_8bit": "adamw-8bit", "adamw_8bit": "adamw-8bit", "paged_adamw_8bit": "paged-adamw-8bit",
              "paged_adamw_32bit": "paged-adamw", "paged_adamw": "paged-adamw", "sgd": "sgd", "adafactor": "adafactor"}


def optimizer(r: Reader, key: str, t: Translation) -> None:
    value = r.tool_default(key)
    name = str(value).lower()
    if name not in OPTIMIZERS:
        raise r.error(key, f"{value!r} is not modelled",
                      hint="modelled: " + ", ".join(sorted(OPTIMIZERS)) + "; or pass --optimizer to estimate with "
                      "the closest one")
    t.set("optimizer", OPTIMIZERS[name], key)


def attention(r: Reader, key: str, value: Any, t: Translation) -> None:
    """transformers' ``attn_implementation`` values."""
    name = str(value)
    if name in ("sdpa", "eager"):
        t.set("attn", name, key)
    elif name.startswith("flash_attention") or name.startswith("kernels-community/") or "flash" in name:
        t.set("attn", "sdpa", key)
        t.approx(key, f"{name}: modelled as SDPA's flash kernel (the same O(seq) memory)")
    elif name in ("flex_attention", "paged_attention", "sdpa_paged"):
        t.set("attn", "sdpa", key)
        t.approx(key, f"{name}: modelled as SDPA")
    else:
        raise r.error(key, f"{value!r} is not an attention implementation reportgen models",
                      hint="sdpa, eager, flash_attention_2, flash_attention_3 (modelled as sdpa)")


_FSDP_MODES = {"full_shard": "fsdp", "shard_grad_op": "shard-grad-op", "hybrid_shard": "hybrid-shard",
               "hybrid_shard_zero2": "hybrid-shard", "no_shard": "no-shard"}


def fsdp_words(r: Reader, key: str, value: Any, t: Translation) -> None:
    """TrainingArguments/Axolotl ``fsdp``: a string of words or a list (``full_shard auto_wrap offload``)."""
    words = value.split() if isinstance(value, str) else value if isinstance(value, list) else None
    if words is None or not all(isinstance(w, str) for w in words):
        raise r.error(key, f"must be FSDP's words, e.g. 'full_shard auto_wrap' (got {value!r})")
    modes = [w for w in words if w in _FSDP_MODES]
    unknown = [w for w in words if w not in _FSDP_MODES and w not in ("offload", "auto_wrap")]
    if unknown:
        raise r.error(key, f"unknown FSDP option {unknown[0]!r}",
                      hint="full_shard, shard_grad_op, hybrid_shard, no_shard, offload, auto_wrap")
    if len(modes) > 1:
        raise r.error(key, f"contradictory sharding strategies {', '.join(modes)}: choose one")
    if not modes and "offload" not in words:
        return
    t.set("sharding", _FSDP_MODES[modes[0]] if modes else "fsdp", key)
    if "offload" in words:
        t.set("offload", "params", key)
    t.sharding_key = key


def deepspeed(r: Reader, key: str, value: Any, t: Translation) -> None:
    """A DeepSpeed config (a JSON path, or an inline mapping): ZeRO stage and CPU offload of the
    optimizer states or the parameters. A relative path is looked for beside the config file, then in
    the working directory (where the trainer opens it: Axolotl's examples name
    ``deepspeed_configs/zero2.json`` from the repository's root), then, where neither has it and it names one
    of the files LLaMA-Factory or Axolotl ship (``shipped.py``), the tool's own; the report says which was read."""
    if isinstance(value, str):
        value = _deepspeed_file(r, key, value, t)
    if not isinstance(value, dict):
        raise r.error(key, f"must be a DeepSpeed config path or mapping (got {value!r})")
    zero = value.get("zero_optimization") or {}
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):  # true == 1 in Python, not to DeepSpeed
        raise r.error(key, f"zero_optimization.stage must be 0, 1, 2 or 3 (got {stage!r})")
    t.set("sharding", "ddp" if stage == 0 else f"zero{stage}", key)
    t.sharding_key = key
    for ds_key, name in (("train_micro_batch_size_per_gpu", "batch"), ("gradient_accumulation_steps", "accum")):
        given = value.get(ds_key)  # transformers' HfTrainerDeepSpeedConfig refuses a value that differs ("auto" fills)
        if given not in (None, "auto") and name in t.values and given != t.values[name]:
            raise r.error(key, f"{ds_key} {given!r} contradicts {t.sources.get(name, name)} {t.values[name]} "
                          "(transformers refuses the mismatch)", hint=f"{ds_key}: auto")
    if value.get("tensor_parallel"):  # LLaMA-Factory's ds_z2_autotp_config.json
        t.not_modelled.append((key, "tensor_parallel (DeepSpeed AutoTP splits each layer's weights over GPUs): not "
                                    "modelled, estimated as data parallel over every GPU"))

    def _cpu(section: str) -> bool:
        s = zero.get(section) or {}
        return isinstance(s, dict) and s.get("device") in ("cpu", "nvme")

    if _cpu("offload_param"):
        if stage != 3:
            raise r.error(key, f"offload_param needs ZeRO stage 3 (got stage {stage})")
        t.set("offload", "params", key)
    elif _cpu("offload_optimizer"):
        t.set("offload", "optimizer", key)


def _deepspeed_file(r: Reader, key: str, value: str, t: Translation) -> Any:
    """The JSON a ``deepspeed`` path names, read as DeepSpeed reads it (``json.load``, not as YAML)."""
    from reportgen.configs import shipped

    path = Path(value)
    if not path.is_absolute():
        beside, here = Path(r.path).parent / path, Path.cwd() / path
        path = beside if beside.is_file() or not here.is_file() else here
    if not path.is_file() and (found := shipped.find(r.tool, value)):
        rel, text = found
        t.read_from.append((key, f"{shipped.label(r.tool, rel)}: {value} is not in the working directory nor beside "
                                 "the config file (the tool's example runs from its repository's root)"))
        return json.loads(text)
    if not Path(value).is_absolute():
        t.read_from.append((key, f"{path} ({'beside the config file' if path == beside else 'the working directory'})"))
    try:
        return json.loads(userfile.read_bytes(path, yamlfile.MAX_FILE_BYTES).decode("utf-8"))
    except userfile.TooLarge as exc:
        raise r.error(key, f"{path}: {exc.amount()}; a DeepSpeed config is read up to "
                           f"{yamlfile.MAX_FILE_BYTES:,} bytes") from None
    except OSError:
        looked = f"{Path(r.path).parent / value} and {Path.cwd() / value}" if not Path(value).is_absolute() else value
        shipped_names = ", ".join(sorted(shipped.files(r.tool))) if shipped.FOLDERS.get(r.tool) else ""
        raise r.error(key, f"cannot read the DeepSpeed config {value!r} (looked for {looked})",
                      hint="give the path relative to the config file, or the DeepSpeed settings inline"
                      + (f"; {table.TOOLS[r.tool]}'s own are read by name: {shipped_names}" if shipped_names else "")
                      ) from None
    except ValueError as exc:  # UnicodeDecodeError too
        raise r.error(key, f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise r.error(key, f"{path}: nested too deeply to read; a DeepSpeed config is a few levels of "
                           "sections") from None


def trainer_sharding(r: Reader, t: Translation) -> None:
    """transformers' ``TrainingArguments`` keys for several GPUs, as TRL and LLaMA-Factory files hold them:
    ``fsdp`` (its words) or ``deepspeed`` (a JSON path or inline settings), never both."""
    if r.get("fsdp") not in (None, "", []):
        fsdp_words(r, "fsdp", r.doc["fsdp"], t)
    if r.get("deepspeed") is not None:
        if t.sharding_key:
            raise r.error("deepspeed", f"contradicts {t.sharding_key}: a run uses FSDP or DeepSpeed, not both")
        deepspeed(r, "deepspeed", r.doc["deepspeed"], t)


#: transformers' ``IntervalStrategy`` values that evaluate during training (``"no"``, the default, does not)
EVALUATING = ("steps", "epoch")


def trainer_eval(r: Reader, t: Translation) -> None:
    """transformers' ``TrainingArguments``: with ``eval_strategy`` steps or epoch the Trainer evaluates during
    training on ``per_device_eval_batch_size`` (default 8) samples at a time, padded and truncated as the
    training ones (the run's eval phase, ``estimate/run.py``); ``"no"`` (the default) never does."""
    strategy = r.get("eval_strategy", "no")
    if strategy in (None, "no"):
        return
    if strategy not in EVALUATING:
        raise r.error("eval_strategy", f"must be no, steps or epoch (got {strategy!r})")
    t.set("eval_batch", r.integer("per_device_eval_batch_size", 8, minimum=1), "per_device_eval_batch_size"
          if r.has("per_device_eval_batch_size") else "eval_strategy")


def finish(r: Reader, t: Translation) -> Translation:
    """Sort every key of the file into honoured, approximated (the translator recorded how),
    ignored (bookkeeping), not modelled (ignored but changes the step) and unknown (a warning)."""
    approximated = {k for k, _ in t.approximated}
    t.present, t.key_lines = frozenset(r.doc), dict(r._lines)
    keys = table.known_keys(t.tool)
    for key in r.doc:
        row = table.row(t.tool, key)
        if row is not None and row.status != table.IGNORED:
            if key not in r.read:
                t.ignored.append(key)  # not used by this recipe (e.g. lora_r without use_peft)
            elif key not in approximated:
                t.honoured.append(key)
        elif row is not None:
            if row.affects and r.doc[key] not in (None, False, [], {}, ""):
                t.not_modelled.append((key, row.note))
            else:
                t.ignored.append(key)
        elif key in keys:
            t.ignored.append(key)
        else:
            t.unknown.append(key)
    return t
