"""An ``accelerate launch --config_file FILE`` config beside a training config (``--launch FILE``): how many
processes, and whether accelerate runs them as DDP, FSDP or DeepSpeed. LLaMA-Factory runs FSDP this way
(``accelerate launch --config_file examples/accelerate/fsdp_config.yaml src/train.py config.yaml``); TRL and Axolotl
runs are launched the same way.

What accelerate 1.15 does with the file, from its source:

* ``commands/config/config_args.py`` ``ClusterConfig``: the keys a file may hold (another key is refused by
  accelerate); ``commands/launch.py`` ``_validate_launch_command`` copies each section's keys to the launcher's
  options, ``fsdp_config.offload_params`` as ``fsdp_offload_params`` (the ``fsdp_`` prefix added where missing);
* ``utils/launch.py`` ``prepare_multi_gpu_env`` passes them to the processes as ``FSDP_*`` / ``ACCELERATE_*``
  environment variables; ``utils/dataclasses.py`` ``FullyShardedDataParallelPlugin.__post_init__`` reads them:
  ``fsdp_sharding_strategy`` FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD(_ZERO2), NO_SHARD (or 1-5) for FSDP1,
  ``fsdp_reshard_after_forward`` (true: every parameter gathered again in backward; false: kept from forward to
  backward) for FSDP2, ``fsdp_offload_params`` (CPUOffload of the parameters), ``fsdp_cpu_ram_efficient_loading``
  (rank 0 loads the checkpoint, the others receive it), ``fsdp_activation_checkpointing``; ``DeepSpeedPlugin``:
  ``zero_stage`` (default 2), ``offload_optimizer_device``, ``offload_param_device`` or a ``deepspeed_config_file``;
* transformers' ``Trainer`` (``create_accelerator_and_postprocess``) shards with the plugin accelerate made, and
  ``TrainingArguments.__post_init__`` takes the mixed precision from ``ACCELERATE_MIXED_PRECISION`` only where
  the training config sets neither ``bf16`` nor ``fp16``.

The number of GPUs is ``num_processes``; a ``--gpus`` flag overrides it, as flags override the files. A key that
contradicts the training config (FSDP in one, DeepSpeed in the other; ZeRO-2 in one, ZeRO-3 in the other; fp16 in
one, bf16 in the other) is an error naming both files. Torch-free: the calculator ships it.
"""

from __future__ import annotations

from pathlib import Path

from reportgen import yamlfile
from reportgen.configs.common import ConfigError, Reader, Translation, finish, key_lines
from reportgen.errors import UserError

LAUNCH_FILE = yamlfile.Kind(noun="launch file", what_it_holds="an accelerate config is a mapping of a few dozen keys "
                            "(distributed_type, num_processes, fsdp_config, ...)",
                            example="the file `accelerate launch --config_file` takes (`accelerate config` writes one)",
                            repeated_key="write each key once: accelerate would read only the last one")
#: the sections whose keys accelerate copies to its options, and the prefix it adds where a key lacks it
SECTIONS = {"fsdp_config": "fsdp_", "deepspeed_config": "", "dynamo_config": "dynamo_", "fp8_config": "fp8_",
            "megatron_lm_config": "", "mpirun_config": "", "parallelism_config": ""}
#: ``fsdp_sharding_strategy`` (FSDP1; ``FSDP_SHARDING_STRATEGY``'s names, or their 1-based index) -> sharding
FSDP1 = {"FULL_SHARD": "fsdp", "SHARD_GRAD_OP": "shard-grad-op", "NO_SHARD": "no-shard", "HYBRID_SHARD": "hybrid-shard",
         "HYBRID_SHARD_ZERO2": "hybrid-shard"}
_FSDP1_INDEX = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
#: the training tools launched with accelerate (torchtune runs ``tune run``, unsloth one process)
TOOLS = ("trl", "axolotl", "llamafactory")


def read(path: Path, tool: str) -> tuple[Reader, str | None]:
    """The launch file as a flat mapping (``fsdp_config.fsdp_offload_params``), each key with its line; a name
    LLaMA-Factory's examples use (``examples/accelerate/fsdp_config.yaml``) that is not here is its shipped file."""
    from reportgen.configs import shipped

    label = None
    if not path.is_file() and tool == "llamafactory" and (found := shipped.find(tool, str(path))):
        rel, text = found
        label = shipped.label(tool, rel)
    try:
        node, doc = yamlfile.parse(path, text, LAUNCH_FILE) if label else yamlfile.load(path, LAUNCH_FILE)
    except UserError as exc:
        raise ConfigError(f"--launch: {exc.message}", hint=exc.hint) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: an accelerate config is a mapping of keys to values, not "
                          f"{'an empty file' if doc is None else 'a ' + type(doc).__name__}",
                          hint="e.g. distributed_type: FSDP, num_processes: 2, fsdp_config: {...}")
    flat, lines = _flatten(path, doc, node)
    return Reader(path, flat, lines, "accelerate"), label


def _flatten(path: Path, doc: dict, node) -> tuple[dict, dict]:
    """The sections' keys as ``section.key`` with the prefix accelerate adds (``SECTIONS``), each with its line."""
    lines = key_lines(node)
    flat = {}
    for key, value in doc.items():
        key = str(key)
        if key in SECTIONS and isinstance(value, dict):
            for k, v in value.items():
                name = f"{key}.{k if str(k).startswith(SECTIONS[key]) else SECTIONS[key] + str(k)}"
                flat[name], lines[name] = v, lines.get(f"{key}.{k}", lines[key])  # a key YAML read as a bool
        elif key in SECTIONS and value not in (None, {}):
            raise ConfigError(f"{path}:{lines[key]}: {key}: must be a mapping of its keys (got {value!r})")
        elif key not in SECTIONS:
            flat[key] = value
    return flat, lines


def apply(path: Path, t: Translation) -> Translation:
    """The training config's translation ``t`` with the launch file's processes and sharding; the launch file's
    own report (honoured, approximated, ignored, unknown keys) rides along as ``t.launch``."""
    if t.tool not in TOOLS:
        raise ConfigError(f"--launch {path}: {t.path} is a {t.tool} config, not run by accelerate launch",
                          hint="torchtune runs tune run (give --gpus N); unsloth trains on one GPU")
    r, shipped_label = read(Path(path), t.tool)
    lt = Translation(tool="accelerate", path=str(path))
    if shipped_label:
        lt.read_from.append(("--launch", f"{shipped_label}: {path} is not in the working directory (LLaMA-Factory's "
                                          "example runs from its repository's root)"))
    kind = _distributed(r, lt)
    if kind == "FSDP":
        _fsdp(r, lt)
    elif kind == "DEEPSPEED":
        _deepspeed(r, lt)
    _others(r, lt)
    finish(r, lt)
    _merge(r, lt, t, kind)
    t.launch = lt
    return t


def _refuse_unknown(r: Reader) -> None:
    """A top-level key ``ClusterConfig`` lacks: accelerate refuses the file (``from_yaml_file``: "had unknown
    keys"); a section's unknown key is a warning (the launcher sets it as an option nobody reads)."""
    import difflib

    from reportgen.configs import table

    known = table.known_keys("accelerate")
    for key in r.doc:
        if "." not in key and key not in known:
            close = difflib.get_close_matches(key, [k for k in known if "." not in k], n=2, cutoff=0.75)
            raise r.error(key, "not a key of an accelerate config: accelerate refuses the file",
                          hint=(f"did you mean {' or '.join(close)}? " if close else "") + "the keys are ClusterConfig's "
                          "(accelerate/commands/config/config_args.py)")


def _distributed(r: Reader, lt: Translation) -> str:
    """``compute_environment``, ``distributed_type``, ``num_processes``, ``use_cpu``: the processes and how they
    share the model."""
    _refuse_unknown(r)
    env = str(r.get("compute_environment", "LOCAL_MACHINE"))
    if env != "LOCAL_MACHINE":
        raise r.error("compute_environment", f"{env!r}: only a local machine's launch is modelled",
                      hint="compute_environment: LOCAL_MACHINE")
    if r.boolean("use_cpu", False):
        raise r.error("use_cpu", "training on the CPU is not modelled", hint="use_cpu: false")
    kind = r.get("distributed_type")
    if kind is False:  # YAML reads a bare NO as false; accelerate's DistributedType(False) fails
        raise r.error("distributed_type", "NO unquoted is YAML's false, which accelerate refuses",
                      hint="distributed_type: 'NO' (quoted, as accelerate config writes it)")
    if kind is None:  # accelerate: "A `distributed_type` must be specified in the config file."
        raise ConfigError(f"{r.path}: distributed_type is missing (accelerate requires it)",
                          hint="distributed_type: MULTI_GPU (DDP), FSDP or DEEPSPEED")
    if kind not in ("NO", "MULTI_GPU", "FSDP", "DEEPSPEED"):
        from reportgen.configs import table

        known = table.schema()["accelerate"]["distributed_types"]
        raise r.error("distributed_type", f"{kind!r} is " + ("not modelled" if kind in known else
                      "not one of accelerate's DistributedType values"), hint="NO, MULTI_GPU, FSDP or DEEPSPEED")
    if kind in ("NO", "MULTI_GPU"):  # FSDP's and DeepSpeed's sharding: their sections (_fsdp, _deepspeed)
        lt.set("sharding", "none" if kind == "NO" else "ddp", "distributed_type")
    if kind == "NO":
        lt.set("gpus", 1, "distributed_type")
        return kind
    n = r.get("num_processes")
    if n is None or n == -1:
        raise ConfigError(f"{r.where('num_processes') if r.has('num_processes') else r.path}: num_processes: not "
                          "set: accelerate would start one process per GPU of the machine",
                          hint="write num_processes: N (the GPUs of every node together), or pass --gpus N")
    lt.set("gpus", r.integer("num_processes", minimum=1), "num_processes")
    if lt.values["gpus"] < 2:
        raise r.error("num_processes", f"{kind} over one process is not modelled (a sharded run needs 2 or more GPUs)",
                      hint="num_processes: 2 or more, or distributed_type: NO")
    _machines(r, lt.values["gpus"])
    return kind


def _machines(r: Reader, gpus: int) -> None:
    """``num_machines``: the estimate places ranks ``NODE_GPUS`` to a node (``setup.NODE_GPUS``), so a launch over
    more machines (fewer processes a node: its collectives cross the network sooner) is refused, not priced as
    one machine's NVLink."""
    from reportgen.setup import NODE_GPUS

    if not r.has("num_machines"):
        return
    machines, nodes = r.integer("num_machines", minimum=1), -(-gpus // NODE_GPUS)
    if machines != nodes:
        raise r.error("num_machines", f"{machines} for {gpus} processes ({gpus / machines:g} a machine): reportgen "
                      f"places ranks {NODE_GPUS} to a machine, {nodes} machine(s) for {gpus}; a run spread thinner "
                      "is not modelled", hint=f"num_machines: {nodes}")


def _fsdp(r: Reader, lt: Translation) -> None:
    """``fsdp_config``: FSDP1's ``fsdp_sharding_strategy`` or FSDP2's ``fsdp_reshard_after_forward``, CPU offload,
    loading, activation checkpointing and the saved state dict."""
    version = str(r.get("fsdp_config.fsdp_version", 1))
    if version not in ("1", "2"):
        raise r.error("fsdp_config.fsdp_version", f"must be 1 or 2 (got {version!r})")
    if version == "2":  # fully_shard's reshard_after_forward, a bool (accelerate refuses FSDP1's names here)
        key = "fsdp_config.fsdp_reshard_after_forward"
        lt.set("sharding", "fsdp" if r.boolean(key, True) else "shard-grad-op", key)
    else:
        key = "fsdp_config.fsdp_sharding_strategy"
        # the launcher always passes FSDP_SHARDING_STRATEGY (default FULL_SHARD, utils/launch.py), which FSDP1 uses
        value = r.get(key, "FULL_SHARD")
        name = str(value).upper()
        if name.isdigit() and 1 <= int(name) <= len(_FSDP1_INDEX):
            name = _FSDP1_INDEX[int(name) - 1]
        if name not in FSDP1:
            raise r.error(key, f"{value!r} is not an FSDP sharding strategy", hint=", ".join(FSDP1))
        lt.set("sharding", FSDP1[name], key if r.has(key) else "distributed_type")
    if r.boolean("fsdp_config.fsdp_offload_params", False):
        lt.set("offload", "params", "fsdp_config.fsdp_offload_params")
    # true (accelerate's default) is the setup's default load under FSDP (cpu-rank0); NO_SHARD loads as DDP does
    if not r.boolean("fsdp_config.fsdp_cpu_ram_efficient_loading", True) and lt.values["sharding"] != "no-shard":
        lt.set("load", "cpu", "fsdp_config.fsdp_cpu_ram_efficient_loading")
    if r.boolean("fsdp_config.fsdp_activation_checkpointing", False):
        lt.set("grad_ckpt", True, "fsdp_config.fsdp_activation_checkpointing")
        if r.boolean("fsdp_config.fsdp_activation_checkpointing_offload", False):
            lt.set("act_offload", True, "fsdp_config.fsdp_activation_checkpointing_offload")
    state = str(r.get("fsdp_config.fsdp_state_dict_type", "FULL_STATE_DICT")).upper()
    if state not in ("FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT"):
        raise r.error("fsdp_config.fsdp_state_dict_type", f"{state!r} is not an FSDP state dict type",
                      hint="FULL_STATE_DICT or SHARDED_STATE_DICT")
    if state != "FULL_STATE_DICT":  # FULL_STATE_DICT is the setup's default save of an FSDP full fine-tune
        lt.set("save", "fsdp-sharded", "fsdp_config.fsdp_state_dict_type")
    prefetch = r.get("fsdp_config.fsdp_backward_prefetch")
    if prefetch not in (None, "BACKWARD_PRE"):
        lt.approx("fsdp_config.fsdp_backward_prefetch", f"{prefetch}: modelled as BACKWARD_PRE (two layers gathered "
                  "in backward; fewer with this policy, so the estimate errs high)")
    wrap = r.get("fsdp_config.fsdp_auto_wrap_policy")
    if wrap not in (None, "TRANSFORMER_BASED_WRAP"):
        lt.not_modelled.append(("fsdp_config.fsdp_auto_wrap_policy", f"{wrap}: reportgen's FSDP wraps each decoder "
                                "layer (TRANSFORMER_BASED_WRAP); other units gather other amounts at once"))


def _deepspeed(r: Reader, lt: Translation) -> None:
    """``deepspeed_config``: a ``deepspeed_config_file`` (read as the training configs' ``deepspeed``), or
    ``zero_stage`` (accelerate's default 2) with ``offload_optimizer_device`` / ``offload_param_device``."""
    from reportgen.configs.common import deepspeed

    file_key = "deepspeed_config.deepspeed_config_file"
    if r.has(file_key):
        given = [k for k in ("zero_stage", "offload_optimizer_device", "offload_param_device")
                 if r.has(f"deepspeed_config.{k}")]
        if given:  # accelerate's DeepSpeedPlugin refuses both
            raise r.error(f"deepspeed_config.{given[0]}", f"contradicts {file_key}: the DeepSpeed file holds it",
                          hint=f"drop {given[0]}, or {file_key}")
        deepspeed(r, file_key, r.get(file_key), lt)
        return
    stage = r.integer("deepspeed_config.zero_stage", 2)
    zero = {"stage": stage}
    for part in ("optimizer", "param"):
        device = r.get(f"deepspeed_config.offload_{part}_device", "none")
        if device not in ("none", "cpu", "nvme"):
            raise r.error(f"deepspeed_config.offload_{part}_device", f"must be none, cpu or nvme (got {device!r})")
        zero[f"offload_{part}"] = {"device": device}
    key = "deepspeed_config.zero_stage" if r.has("deepspeed_config.zero_stage") else "distributed_type"
    deepspeed(r, key, {"zero_optimization": zero}, lt)


def _others(r: Reader, lt: Translation) -> None:
    """``mixed_precision`` (checked against the training config in ``_merge``), ``dynamo_config``, and sections
    of what is not modelled."""
    mp = r.get("mixed_precision")
    if mp not in (None, False) and str(mp) not in ("no", "fp16", "bf16"):
        raise r.error("mixed_precision", f"{mp!r}: " + ("fp8 training is not modelled" if str(mp) == "fp8" else
                      "must be no, fp16 or bf16"), hint="mixed_precision: bf16 (or fp16, or 'no')")
    backend = r.get("dynamo_config.dynamo_backend")
    if backend is not None and str(backend).upper() != "NO":
        lt.set("compile", True, "dynamo_config.dynamo_backend")
        if str(backend).upper() != "INDUCTOR":
            lt.approx("dynamo_config.dynamo_backend", f"{backend}: modelled as torch.compile's inductor")
    if any(k.startswith(("parallelism_config.", "megatron_lm_config.")) for k in r.doc):
        key = next(k for k in r.doc if k.startswith(("parallelism_config.", "megatron_lm_config.")))
        raise r.error(key, "tensor, context or pipeline parallelism is not modelled",
                      hint="drop the section (data parallel only)")


def _is_deepspeed(key: str | None) -> bool:
    return bool(key) and "deepspeed" in key


def _merge(r: Reader, lt: Translation, t: Translation, kind: str) -> None:
    """The launch file's fields into the training config's translation, refusing what contradicts it."""
    mine = lt.where("distributed_type")
    if t.sharding_key:
        theirs = f"{t.where(t.sharding_key)}: {t.sharding_key}"
        if kind == "NO":
            raise ConfigError(f"{mine}: distributed_type: NO runs one process; {theirs} shards over several GPUs",
                              hint=f"distributed_type: {'DEEPSPEED' if _is_deepspeed(t.sharding_key) else 'FSDP'} "
                              "with num_processes: N, or drop the sharding from the training config")
        if kind in ("FSDP", "DEEPSPEED") and (kind == "DEEPSPEED") != _is_deepspeed(t.sharding_key):
            ours = "FSDP" if kind == "FSDP" else "DeepSpeed"
            raise ConfigError(f"{mine}: distributed_type: {kind} contradicts {theirs} "
                              f"({'DeepSpeed' if ours == 'FSDP' else 'FSDP'}): a run uses FSDP or DeepSpeed, not both",
                              hint=f"drop {t.sharding_key} from {t.path}, or launch with distributed_type: "
                              f"{'DEEPSPEED' if ours == 'FSDP' else 'FSDP'}")
        for name in ("sharding", "offload") if kind != "MULTI_GPU" else ():
            a, b = lt.values.get(name, "none"), t.values.get(name, "none")
            if a != b:
                raise ConfigError(f"{lt.where(lt.sources.get(name, 'distributed_type'))}: "
                                  f"{lt.sources.get(name, 'distributed_type')}: {name} {a} contradicts {theirs} "
                                  f"({name} {b})", hint=f"make the two files agree, or drop {t.sharding_key}")
    elif kind in ("FSDP", "DEEPSPEED"):
        _take(lt, t, ("sharding", "offload"))
        t.sharding_key = lt.sources["sharding"]
        if "save" in lt.values and lt.values["sharding"] != "no-shard" and t.values.get("method") == "full":
            # LoRA saves its adapters whatever the state dict type
            _take(lt, t, ("save",))
    _take(lt, t, ("gpus", "load", "grad_ckpt", "act_offload", "compile"))
    _precision(r, t)


def _take(lt: Translation, t: Translation, names: tuple[str, ...]) -> None:
    for name in names:
        if name in lt.values:
            t.values[name] = lt.values[name]
            t.sources[name] = lt.sources[name]
            t.elsewhere[lt.sources[name]] = lt.where(lt.sources[name])


def _precision(r: Reader, t: Translation) -> None:
    """``mixed_precision`` against the training config: transformers' ``TrainingArguments`` reads it
    (``ACCELERATE_MIXED_PRECISION``) only where the training config sets neither bf16 nor fp16, and then
    autocasts to it (``t.autocast_unset``: the training config's reader applies it); where the training
    config set one, a different launch precision is an error naming both files."""
    mp = str(r.get("mixed_precision") or "no")  # a bare no is YAML's false: the same
    if mp == "no":
        return
    if t.autocast_unset is not None:
        t.autocast_unset(mp, "mixed_precision")
        t.elsewhere["mixed_precision"] = r.where("mixed_precision")
        return
    precision = str(t.values.get("precision", ""))
    trains = "bf16" if precision.startswith("bf16") else "fp16" if precision.startswith("fp16") else "no"
    if trains == mp:
        return
    key = t.sources.get("precision", "bf16")
    if trains == "no":
        raise ConfigError(f"{r.where('mixed_precision')}: mixed_precision: {mp} makes transformers' Trainer autocast "
                          f"to {mp}, but {t.where(key)}: {t.path} trains in fp32 (neither bf16 nor fp16)",
                          hint=f"write {mp}: true in {t.path} (reportgen reads the precision from the training "
                          "config), or mixed_precision: 'no'")
    raise ConfigError(f"{r.where('mixed_precision')}: mixed_precision: {mp} contradicts {t.where(key)}: {key} "
                      f"({trains}); the training config's wins in transformers' TrainingArguments",
                      hint=f"make them agree: mixed_precision: {trains}")
