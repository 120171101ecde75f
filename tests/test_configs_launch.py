"""How a run is launched (issue 33): the DeepSpeed and accelerate files LLaMA-Factory's and Axolotl's own examples name
by their path in the tool's repository, read from the copies reportgen ships when run outside a checkout
(``reportgen/configs/shipped.py``), and ``--launch FILE``, an ``accelerate launch --config_file`` YAML beside the
training config (``reportgen/configs/launch.py``): its processes and sharding honoured, a contradiction with the
training config an error naming both files, a misspelled key named with the closest one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from reportgen.cli import main
from reportgen.configs import ConfigError, launch, setup_from, shipped, table, translate_file

LF_FULL = ("model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nfinetuning_type: full\ncutoff_len: 2048\n"
           "per_device_train_batch_size: 1\nbf16: true\n")
LF_DS3 = LF_FULL + "deepspeed: examples/deepspeed/ds_z3_config.json\n"


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def _fields(setup, *names):
    return {n: getattr(getattr(setup, n), "value", getattr(setup, n)) for n in names}


# ----- the shipped DeepSpeed configs, by name --------------------------------------------------------------
@pytest.mark.parametrize("tool, head, name, sharding, offload", [
    ("llamafactory", LF_FULL, "examples/deepspeed/ds_z0_config.json", "ddp", "none"),
    ("llamafactory", LF_FULL, "examples/deepspeed/ds_z2_config.json", "zero2", "none"),
    ("llamafactory", LF_FULL, "examples/deepspeed/ds_z2_offload_config.json", "zero2", "optimizer"),
    ("llamafactory", LF_FULL, "examples/deepspeed/ds_z3_config.json", "zero3", "none"),
    ("llamafactory", LF_FULL, "examples/deepspeed/ds_z3_offload_config.json", "zero3", "params"),
    ("llamafactory", LF_FULL, "ds_z3_config.json", "zero3", "none"),  # the bare name the examples' comments list
    # Axolotl's zero2.json offloads the optimizer states to the CPU (deepspeed_configs/zero2.json, 0.19.0)
    ("axolotl", "base_model: meta-llama/Llama-3.2-1B\nbf16: true\n", "deepspeed_configs/zero2.json", "zero2",
     "optimizer"),
    ("axolotl", "base_model: meta-llama/Llama-3.2-1B\nbf16: true\n", "deepspeed_configs/zero3_bf16.json", "zero3",
     "none"),
    ("axolotl", "base_model: meta-llama/Llama-3.2-1B\nbf16: true\n",
     "./deepspeed_configs/zero3_bf16_cpuoffload_params.json", "zero3", "params"),
])
def test_a_shipped_deepspeed_config_is_read_by_name_outside_a_checkout(tmp_path, monkeypatch, tool, head, name,
                                                                       sharding, offload):
    monkeypatch.chdir(tmp_path)  # neither the working directory nor the config's folder has the file
    t = translate_file(_write(tmp_path, "train.yaml", head + f"deepspeed: {name}\n"))
    assert t.tool == tool
    assert _fields(setup_from(t, {"gpus": 4}), "sharding", "offload") == {"sharding": sharding, "offload": offload}
    rel = name.removeprefix("./") if "/" in name else f"examples/deepspeed/{name}"
    version = table.version(tool)
    assert t.read_from[0][1].startswith(f"{table.TOOLS[tool]}'s shipped {rel} ({version}): ")


def test_the_report_names_the_shipped_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "lf.yaml", LF_DS3)
    assert main(["estimate", "--from", "lf.yaml", "--gpu", "h100-sxm", "--gpus", "4", "--format", "json"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "read: deepspeed: LLaMA-Factory's shipped examples/deepspeed/ds_z3_config.json (0.9.5)" in err


def test_a_file_at_the_path_wins_over_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples" / "deepspeed").mkdir(parents=True)
    _write(tmp_path / "examples" / "deepspeed", "ds_z3_config.json", '{"zero_optimization": {"stage": 1}}')
    t = translate_file(_write(tmp_path, "lf.yaml", LF_DS3))
    assert setup_from(t, {"gpus": 2}).sharding.value == "zero1" and "shipped" not in t.read_from[0][1]


def test_other_names_and_other_tools_still_fail_naming_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"cannot read the DeepSpeed config 'examples/deepspeed/ds_z9_config.json'") \
            as exc:
        translate_file(_write(tmp_path, "lf.yaml", LF_FULL + "deepspeed: examples/deepspeed/ds_z9_config.json\n"))
    assert "examples/deepspeed/ds_z3_config.json" in exc.value.hint
    with pytest.raises(ConfigError, match="cannot read the DeepSpeed config"):  # TRL ships no DeepSpeed files
        translate_file(_write(tmp_path, "sft.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\n"
                                                    "deepspeed: examples/deepspeed/ds_z3_config.json\n"))


def test_the_shipped_files_are_the_tools_own():
    """The vendored copies (LLaMA-Factory 0.9.5's and Axolotl 0.19.0's sdists), pinned by what each holds."""
    lf, axo = shipped.files("llamafactory"), shipped.files("axolotl")
    assert {"examples/deepspeed/ds_z3_config.json", "examples/deepspeed/ds_z2_offload_config.json",
            "examples/accelerate/fsdp_config.yaml", "examples/accelerate/fsdp2_config.yaml"} <= set(lf)
    stage = {k: json.loads(v)["zero_optimization"]["stage"] for k, v in lf.items() if k.endswith(".json")}
    assert stage["examples/deepspeed/ds_z0_config.json"] == 0 and stage["examples/deepspeed/ds_z3_config.json"] == 3
    assert json.loads(axo["deepspeed_configs/zero1.json"])["zero_optimization"]["stage"] == 1
    assert len(axo) == 8 and len(lf) == 12


# ----- --launch: an accelerate config -----------------------------------------------------------------------
FSDP1 = ("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nmixed_precision: bf16\nnum_processes: 4\n"
         "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n")


def _launched(tmp_path, launch_text: str, train: str = LF_FULL, explicit=None):
    t = translate_file(_write(tmp_path, "lf.yaml", train))
    return setup_from(launch.apply(_write(tmp_path, "launch.yaml", launch_text), t), explicit)


@pytest.mark.parametrize("text, want", [
    (FSDP1, {"gpus": 4, "sharding": "fsdp", "offload": "none", "load": None, "save": None}),  # the FSDP defaults
    (FSDP1.replace("FULL_SHARD", "SHARD_GRAD_OP"), {"sharding": "shard-grad-op"}),
    (FSDP1.replace("FULL_SHARD", "2"), {"sharding": "shard-grad-op"}),  # accelerate's 1-based index
    (FSDP1.replace("FULL_SHARD", "HYBRID_SHARD"), {"sharding": "hybrid-shard"}),
    (FSDP1.replace("FULL_SHARD", "NO_SHARD"), {"sharding": "no-shard"}),
    (FSDP1 + "  fsdp_offload_params: true\n", {"offload": "params"}),
    (FSDP1 + "  offload_params: \"true\"\n", {"offload": "params"}),  # accelerate adds the fsdp_ prefix; str_to_bool
    (FSDP1 + "  fsdp_cpu_ram_efficient_loading: false\n", {"load": "cpu"}),
    (FSDP1 + "  fsdp_state_dict_type: SHARDED_STATE_DICT\n", {"save": "fsdp-sharded"}),
    (FSDP1 + "  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n", {"sharding": "shard-grad-op"}),
    (FSDP1 + "  fsdp_version: 2\n", {"sharding": "fsdp"}),  # fsdp2: reshard_after_forward true by default
    # FSDP1 shards as fsdp_sharding_strategy says (the launcher always passes it, default FULL_SHARD)
    (FSDP1.replace("  fsdp_sharding_strategy: FULL_SHARD\n", "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n"),
     {"sharding": "fsdp"}),
    ("distributed_type: MULTI_GPU\nnum_processes: 8\n", {"gpus": 8, "sharding": "ddp"}),
    ("distributed_type: 'NO'\n", {"gpus": 1, "sharding": "none"}),
    ("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 3\n  offload_param_device: cpu\n",
     {"gpus": 2, "sharding": "zero3", "offload": "params"}),
    ("distributed_type: DEEPSPEED\nnum_processes: 2\n", {"sharding": "zero2"}),  # accelerate's default stage
    ("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  offload_optimizer_device: cpu\n",
     {"sharding": "zero2", "offload": "optimizer"}),
])
def test_the_launch_file_sets_the_gpus_and_the_sharding(tmp_path, text, want):
    setup = _launched(tmp_path, text)
    assert _fields(setup, *want) == want


def test_a_deepspeed_config_file_is_read_beside_the_launch_file(tmp_path):
    _write(tmp_path, "ds.json", '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}')
    setup = _launched(tmp_path, "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                                "  deepspeed_config_file: ds.json\n")
    assert _fields(setup, "sharding", "offload") == {"sharding": "zero3", "offload": "optimizer"}


def test_fsdp_activation_checkpointing_checkpoints(tmp_path):
    train = LF_FULL + "disable_gradient_checkpointing: true\n"
    assert _launched(tmp_path, FSDP1, train).grad_ckpt is False
    assert _launched(tmp_path, FSDP1 + "  fsdp_activation_checkpointing: true\n", train).grad_ckpt is True


def test_estimate_with_a_launch_file_equals_the_same_flags(tmp_path, monkeypatch, capsys):
    """LLaMA-Factory's shipped examples/accelerate/fsdp_config_offload.yaml (2 processes, FULL_SHARD, parameters
    offloaded) is the estimate of --gpus 2 --sharding fsdp --offload params; --gpus beside it overrides
    num_processes."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "lf.yaml", LF_FULL)
    base = ["estimate", "--from", "lf.yaml", "--gpu", "h100-sxm", "--format", "json"]
    assert main(base + ["--launch", "examples/accelerate/fsdp_config_offload.yaml"]) == 0
    launched, err = capsys.readouterr()
    assert "LLaMA-Factory's shipped examples/accelerate/fsdp_config_offload.yaml (0.9.5)" in " ".join(err.split())
    assert main(base + ["--gpus", "2", "--sharding", "fsdp", "--offload", "params"]) == 0
    flags = json.loads(capsys.readouterr().out)
    launched = json.loads(launched)
    assert launched["setup"] == flags["setup"] and launched["memory"] == flags["memory"]
    assert main(base + ["--launch", "examples/accelerate/fsdp_config.yaml", "--gpus", "8"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["gpus"] == 8


def test_advise_and_sweeps_take_the_launch_file(tmp_path, monkeypatch, capsys):
    from reportgen.sweep import load_sweep

    _write(tmp_path, "lf.yaml", LF_FULL)
    _write(tmp_path, "fsdp.yaml", FSDP1)
    assert main(["advise", "--from", str(tmp_path / "lf.yaml"), "--launch", str(tmp_path / "fsdp.yaml"), "--gpu",
                 "h100-sxm", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["setup"]["gpus"] == 4
    sweep = _write(tmp_path, "s.yaml", "name: s\ngrids:\n  - from: lf.yaml\n    launch: fsdp.yaml\n    gpu: h100-sxm\n")
    (case,) = load_sweep(sweep).cases
    assert (case.setup.gpus, case.setup.sharding.value) == (4, "fsdp")
    _write(tmp_path, "t.yaml", "name: t\ngrids:\n  - model: llama-3.2-1b\n    launch: fsdp.yaml\n    gpu: h100-sxm\n")
    with pytest.raises(Exception, match="t.yaml:4: grids\\[0\\].launch: an accelerate launch file goes with"):
        load_sweep(tmp_path / "t.yaml")


def test_a_launch_precision_decides_where_the_training_config_sets_neither(tmp_path, capsys):
    """transformers' TrainingArguments autocasts to ACCELERATE_MIXED_PRECISION (what ``accelerate launch``
    sets from the file's mixed_precision) unless the config sets bf16 or fp16: LLaMA-Factory's full
    fine-tuning then trains bf16-mixed, not fp32, and its LoRA over bf16 weights (refused alone: fp32
    adapters without autocast) is bf16-mixed, the launch file's line named as the source."""
    full = _write(tmp_path, "full.yaml", LF_FULL.replace("bf16: true\n", ""))
    ddp = _write(tmp_path, "launch.yaml", "distributed_type: MULTI_GPU\nmixed_precision: bf16\nnum_processes: 2\n")
    assert setup_from(translate_file(full)).precision.value == "fp32"
    assert setup_from(launch.apply(ddp, translate_file(full))).precision.value == "bf16-mixed"
    lora = _write(tmp_path, "lora.yaml", LF_FULL.replace("bf16: true\n", "").replace("full", "lora"))
    assert main(["estimate", "--from", str(lora), "--gpu", "h100-sxm"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{lora}: bf16: neither bf16 nor fp16" in err and "or pass --precision fp32|fp16-mixed|bf16-mixed|bf16" in err
    t = launch.apply(ddp, translate_file(lora))
    assert _fields(setup_from(t), "precision", "frozen_dtype", "gpus") == {
        "precision": "bf16-mixed", "frozen_dtype": "compute", "gpus": 2}
    assert t.where(t.sources["precision"]) == f"{ddp}:2"
    fp16 = _write(tmp_path, "fp16.yaml", "distributed_type: 'NO'\nmixed_precision: fp16\n")
    assert setup_from(launch.apply(fp16, translate_file(lora))).precision.value == "fp16-mixed"


# ----- what contradicts the training config, and bad launch files -----------------------------------------
CONTRADICTIONS = [
    (LF_DS3, FSDP1, "launch.yaml:2: distributed_type: FSDP contradicts {lf}:7: deepspeed (DeepSpeed): a run uses FSDP "
     "or DeepSpeed, not both"),
    (LF_FULL + "fsdp: full_shard\n", "distributed_type: DEEPSPEED\nnum_processes: 2\n",
     "launch.yaml:1: distributed_type: DEEPSPEED contradicts {lf}:7: fsdp (FSDP)"),
    (LF_DS3, "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 2\n",
     "launch.yaml:4: deepspeed_config.zero_stage: sharding zero2 contradicts {lf}:7: deepspeed (sharding zero3)"),
    (LF_FULL + "fsdp: shard_grad_op\n", FSDP1, "launch.yaml:6: fsdp_config.fsdp_sharding_strategy: sharding fsdp "
     "contradicts {lf}:7: fsdp (sharding shard-grad-op)"),
    (LF_DS3, "distributed_type: 'NO'\n", "launch.yaml:1: distributed_type: NO runs one process; {lf}:7: deepspeed "
     "shards over several GPUs"),
    (LF_FULL, FSDP1.replace("bf16", "fp16"), "launch.yaml:3: mixed_precision: fp16 contradicts {lf}:6: bf16 (bf16)"),
]


@pytest.mark.parametrize("train, text, says", CONTRADICTIONS)
def test_a_contradiction_is_an_error_naming_both_files(tmp_path, capsys, train, text, says):
    lf, path = _write(tmp_path, "lf.yaml", train), _write(tmp_path, "launch.yaml", text)
    assert main(["estimate", "--from", str(lf), "--launch", str(path), "--gpu", "h100-sxm"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert says.format(lf=lf).replace("launch.yaml", str(path)) in err and "Traceback" not in err, err


BAD = [
    ("distributed_type: [FSDP\n", "launch.yaml:2: not valid YAML"),
    ("- distributed_type: FSDP\n", "an accelerate config is a mapping of keys to values, not a list"),
    ("num_processes: 2\n", "launch.yaml: distributed_type is missing (accelerate requires it)"),
    ("distributed_type: NO\n", "launch.yaml:1: distributed_type: NO unquoted is YAML's false, which accelerate refuses "
     "hint: distributed_type: 'NO'"),
    ("distributed_type: XLA\nnum_processes: 8\n", "launch.yaml:1: distributed_type: 'XLA' is not modelled"),
    ("distributed_type: FDSP\nnum_processes: 2\n", "'FDSP' is not one of accelerate's DistributedType values"),
    ("distributed_type: FSDP\n", "num_processes: not set: accelerate would start one process per GPU"),
    ("distributed_type: FSDP\nnum_processes: 1\n", "launch.yaml:2: num_processes: FSDP over one process"),
    ("distributed_type: FSDP\nnum_processes: two\n", "launch.yaml:2: num_processes: must be a whole number"),
    (FSDP1.replace("FULL_SHARD", "HALF_SHARD"), "launch.yaml:6: fsdp_config.fsdp_sharding_strategy: 'HALF_SHARD' is "
     "not an FSDP sharding strategy"),
    (FSDP1 + "  fsdp_version: 2\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n", "launch.yaml:8: "
     "fsdp_config.fsdp_reshard_after_forward: must be true or false (got 'SHARD_GRAD_OP')"),  # FSDP2 takes a bool
    (FSDP1.replace("bf16", "fp8"), "launch.yaml:3: mixed_precision: 'fp8': fp8 training is not modelled"),
    (FSDP1 + "parallelism_config:\n  parallelism_config_tp_size: 2\n", "tensor, context or pipeline parallelism"),
    ("distributed_type: MULTI_GPU\nnum_proceses: 2\n", "launch.yaml:2: num_proceses: not a key of an accelerate "
     "config: accelerate refuses the file hint: did you mean num_processes?"),
    ("distributed_type: FSDP\nnum_processes: 2\nfsdp_config: full_shard\n", "launch.yaml:3: fsdp_config: must be a "
     "mapping of its keys"),
    ("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: MULTI_GPU\n", "compute_environment: "
     "'AMAZON_SAGEMAKER': only a local machine's launch is modelled"),
    # one GPU on each of four nodes was priced as four GPUs on one NVSwitch, num_machines "ignored"
    ("distributed_type: MULTI_GPU\nnum_processes: 4\nnum_machines: 4\n", "launch.yaml:3: num_machines: 4 for 4 "
     "processes (1 a machine): reportgen places ranks 8 to a machine, 1 machine(s) for 4"),
    ("distributed_type: MULTI_GPU\nnum_processes: 16\nnum_machines: 4\n", "hint: num_machines: 2"),
    ("distributed_type: MULTI_GPU\nnum_processes: 4\nnum_machines: 0\n", "num_machines: must be at least 1"),
]


@pytest.mark.parametrize("text, says", BAD, ids=[b[1][:40] for b in BAD])
def test_a_bad_launch_file_exits_2_naming_file_line_and_key(tmp_path, capsys, text, says):
    lf, path = _write(tmp_path, "lf.yaml", LF_FULL), _write(tmp_path, "launch.yaml", text)
    assert main(["estimate", "--from", str(lf), "--launch", str(path), "--gpu", "h100-sxm"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert says.replace("launch.yaml", str(path)) in err and "Traceback" not in err, err


def test_a_misspelled_section_key_is_a_warning_with_the_right_name(tmp_path, capsys):
    lf = _write(tmp_path, "lf.yaml", LF_FULL)
    path = _write(tmp_path, "launch.yaml", FSDP1 + "  fsdp_ofload_params: true\n")
    assert main(["estimate", "--from", str(lf), "--launch", str(path), "--gpu", "h100-sxm", "--format", "json"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert (f"launch {path} (accelerate {table.version('accelerate')} config keys)" in err
            and "warning: unknown key 'fsdp_config.fsdp_ofload_params'" in err
            and "did you mean fsdp_config.fsdp_offload_params" in err)


def test_a_section_key_yaml_reads_as_a_bool_is_a_warning_not_a_traceback(tmp_path, capsys):
    """``yes:`` inside fsdp_config is the key True to YAML: reported as unknown at its section's line (it was a
    KeyError looking up its line)."""
    lf = _write(tmp_path, "lf.yaml", LF_FULL)
    path = _write(tmp_path, "launch.yaml", FSDP1 + "  yes: 1\n")
    assert main(["estimate", "--from", str(lf), "--launch", str(path), "--gpu", "h100-sxm", "--format", "json"]) == 0
    assert "warning: unknown key 'fsdp_config.fsdp_True'" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("argv, says", [
    (["--launch", "x.yaml", "--model", "llama-3.2-1b"], "--launch: needs --from CONFIG"),
    (["--from", "{lf}", "--launch", "{missing}"], "missing.yaml"),
    (["--from", "{tt}", "--launch", "{missing}"], "is a torchtune config, not run by accelerate launch"),
])
def test_launch_without_a_trainer_config_or_file_is_refused(tmp_path, capsys, argv, says):
    lf = _write(tmp_path, "lf.yaml", LF_FULL)
    tt = Path(__file__).parent / "fixtures" / "configs" / "torchtune_lora_single_device.yaml"
    argv = [a.format(lf=lf, tt=tt, missing=tmp_path / "missing.yaml") for a in argv]
    assert main(["estimate", *argv, "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert says in " ".join(err.split()) and "Traceback" not in err, err


def test_keys_json_matches_the_installed_accelerate():
    """keys.json's accelerate entry is ClusterConfig's fields and the launcher's FSDP options (scripts/config_keys.py);
    rerun the script after an accelerate pin change."""
    pytest.importorskip("accelerate")
    from importlib import metadata

    from accelerate.commands.config.config_args import ClusterConfig

    data = table.schema()["accelerate"]
    if metadata.version("accelerate") != data["version"]:
        pytest.skip(f"keys.json is of accelerate {data['version']}")
    top = {k for k in data["keys"] if "." not in k}
    assert top == {f.name for f in dataclasses.fields(ClusterConfig)}
    assert {"fsdp_config.fsdp_offload_params", "fsdp_config.fsdp_sharding_strategy", "deepspeed_config.zero_stage",
            "fsdp_config.fsdp_reshard_after_forward"} <= set(data["keys"])
    assert all(r.key in data["keys"] for r in table.rows("accelerate"))
    assert {"FSDP", "DEEPSPEED", "MULTI_GPU", "NO"} <= set(data["distributed_types"])
