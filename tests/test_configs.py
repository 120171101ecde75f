"""TRL and Axolotl configs in (``reportgen/configs/``): worked examples of real recipes turned into
a setup field by field, the CLI's ``--from`` with flags overriding the file, and bad input as a
message naming the file and key with exit status 2."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
import sys
from pathlib import Path

import pytest

from reportgen import catalog
from reportgen.cli import main
from reportgen.configs import ConfigError, setup_from, table, translate_file
from reportgen.setup import TrainingSetup
from tests.fixtures.hostile import DEEP_TRL, alias_bomb_trl

FIXTURES = Path(__file__).parent / "fixtures" / "configs"


def expected(**fields) -> dict:
    """A whole setup as JSON: the setup's defaults with ``fields`` changed."""
    return {**TrainingSetup().model_dump(mode="json"), **fields}


def test_trl_qlora_recipe_field_by_field():
    t = translate_file(FIXTURES / "trl_qlora.yaml")
    assert t.tool == "trl" and t.model == "qwen2.5-7b"
    assert setup_from(t).model_dump(mode="json") == expected(
        method="qlora", quant="nf4", double_quant=True, lora_rank=16, lora_alpha=32, lora_dropout=0.05,
        lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        precision="bf16-mixed", kbit_prep="none",  # bfloat16 weights: embeddings, norms and head stay bf16
        optimizer="paged-adamw-8bit", batch=4, accum=4, seq=1024, padding="longest",
        grad_ckpt=True,  # SFTConfig's default
        loss="standard", recipe="trl-sft",  # SFTTrainer's own loss: TRL 1.16's fused LM head
    )
    assert {"learning_rate", "output_dir", "dataset_name", "report_to"} <= set(t.ignored)
    assert t.unknown == [] and t.not_modelled == []


def test_trl_full_bf16_recipe_field_by_field():
    t = translate_file(FIXTURES / "trl_full_bf16.json")
    assert t.model == "llama-3.2-1b"
    # TRL loads the weights in float32 (ModelConfig.dtype) and trains under bf16 autocast: fp32 master weights
    assert setup_from(t).model_dump(mode="json") == expected(
        method="full", precision="bf16-mixed", batch=2, accum=8, seq=2048, padding="packed", grad_ckpt=True,
        attn="sdpa", loss="standard", recipe="trl-sft", optimizer="adamw", lora_dropout=0.0)
    assert dict(t.approximated)["attn_implementation"].startswith("flash_attention_2")
    # transformers 5 has no warmup_ratio: a key of neither TRL 1.16 nor its TrainingArguments
    assert t.unknown == ["warmup_ratio"]


def test_trl_bfloat16_weights_are_pure_bf16(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\ndtype: bfloat16\n")
    s = setup_from(translate_file(path))
    # TRL's own defaults where the file is silent: micro-batch 8, max_length 1024, checkpointing on
    assert (s.precision.value, s.batch, s.seq, s.grad_ckpt, s.method.value) == ("bf16", 8, 1024, True, "full")


def test_trl_lora_fp32_weights_are_fp32_frozen(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nuse_peft: true\n")
    s = setup_from(translate_file(path))
    assert (s.method.value, s.precision.value, s.frozen_dtype.value, s.lora_targets, s.lora_dropout) == \
        ("lora", "bf16-mixed", "fp32", "qv", 0.05)


def test_axolotl_qlora_yaml_field_by_field():
    t = translate_file(FIXTURES / "axolotl_qlora.yml")
    assert t.tool == "axolotl" and t.model == "llama-3.1-8b"
    assert setup_from(t).model_dump(mode="json") == expected(
        method="qlora", quant="nf4", double_quant=True,  # Axolotl's QLoRA BitsAndBytesConfig defaults
        lora_rank=32, lora_alpha=16, lora_dropout=0.05, lora_targets="all-linear",
        precision="bf16-mixed", kbit_prep="none",  # prepared, then norms, embedding and head cast back to bf16
        batch=2, accum=4, seq=4096, padding="packed", grad_ckpt=True, optimizer="paged-adamw", attn="sdpa",
        loss="standard", recipe="trainer",  # Axolotl runs transformers' Trainer
        eval_batch=2)  # val_set_size 0.05: it evaluates, eval_batch_size defaulting to micro_batch_size
    assert {"num_epochs", "learning_rate", "datasets", "output_dir", "special_tokens"} <= set(t.ignored)
    assert t.unknown == []
    assert "bf16" in dict(t.approximated)  # auto: read as the card's bf16 support


def test_axolotl_qlora_holds_its_unquantized_weights_in_the_load_dtype(tmp_path):
    """Axolotl runs prepare_model_for_kbit_training (fp32 upcast) and then casts the norms, embedding and head
    back to the load dtype (loaders/model.py _configure_embedding_dtypes): the step prices them in 16 bit, 2 bytes
    per weight of Llama 3.1 8B's 2 x 128,256 x 4,096 embedding and head, where peft's preparation alone priced 4.
    The report says they are fp32 for a moment while loading unless embeddings_skip_upcast. fp32_norms (FSDP2
    only, refused without it as Axolotl's check_fp32_norms does) changes no dtype the estimate prices."""
    from reportgen.estimate.memory import estimate_memory

    base = (FIXTURES / "axolotl_qlora.yml").read_text()
    t = translate_file(FIXTURES / "axolotl_qlora.yml")
    prepared = setup_from(t)
    model, gpu = catalog.load_model("llama-3.1-8b"), catalog.load_gpu("rtx-4090")
    upcast = estimate_memory(model, prepared.model_copy(update={"kbit_prep": "peft"}), gpu).terms["weights"]
    assert upcast - estimate_memory(model, prepared, gpu).terms["weights"] >= 2 * 128_256 * 4_096 * 2
    assert "fp32 for a moment" in dict(t.approximated)["embeddings_skip_upcast"]
    (tmp_path / "skip.yml").write_text(base + "embeddings_skip_upcast: true\n")
    assert "embeddings_skip_upcast" not in dict(translate_file(tmp_path / "skip.yml").approximated)
    (tmp_path / "norms.yml").write_text(base + "fp32_norms: true\n")
    with pytest.raises(ConfigError, match="fp32_norms"):
        translate_file(tmp_path / "norms.yml")


def test_axolotl_qlora_memory_matches_the_allocations_its_example_logged(capsys):
    """Axolotl's Colab example (Qwen3-14B QLoRA on a T4: examples/colab-notebooks/colab-axolotl-example.ipynb, its
    output committed in axolotl 29289a4de; the log's line numbers are axolotl 0.9.1's; data/consumer_speed.csv CS176;
    its config in tests/fixtures/configs) logs torch.cuda.memory_allocated in GiB (0.9.1 utils/bench.py
    gpu_memory_usage_all): 9.264 after the model loads (before the k-bit preparation; with embeddings_skip_upcast
    nothing was upcast yet), 9.743 after the adapters (after the preparation and Axolotl's cast back: this point
    checks the reader's kbit_prep), 9.768 at the end of step 2 (callbacks GPUStatsCallback.on_step_end: the
    gradients freed, the paged 8-bit optimizer's states in managed memory). The estimate of that config read with
    --from: weights and quantization constants 9.247 GiB (-0.2 %), with the adapters 9.726 (-0.2 %), with the
    optimizer states outside managed memory 9.734 (-0.3 %). Priced with peft's preparation alone (fp32 embedding,
    head and norms, as the reader did before Axolotl's cast back was read) the last is 12.63 GiB: +29 %."""
    d, _ = _json(capsys, "estimate", "--from", str(FIXTURES / "axolotl_qwen3_14b_t4.yml"), "--gpu", "t4",
                 "--format", "json")
    t = {k: v / 2**30 for k, v in d["memory"].items() if isinstance(v, (int, float))}
    loaded = t["weights"] + t["quant_constants"]
    assert loaded == pytest.approx(9.264, rel=0.01)
    assert loaded + t["lora_adapters"] == pytest.approx(9.743, rel=0.01)
    assert loaded + t["lora_adapters"] + t["optimizer"] == pytest.approx(9.768, rel=0.01)
    assert d["setup"]["loss"] == "fused"  # the Cut Cross-Entropy plugin listed: on by default


def test_axolotl_bf16_auto_follows_the_card():
    t = translate_file(FIXTURES / "axolotl_qlora.yml", bf16_capable=False)
    assert setup_from(t).precision.value == "fp16-mixed"


def test_axolotl_full_bf16_is_pure_bf16(tmp_path):
    path = tmp_path / "full.yml"
    path.write_text("base_model: meta-llama/Llama-3.2-1B\nbf16: true\nmicro_batch_size: 4\nsequence_len: 1024\n"
                    "liger_fused_linear_cross_entropy: true\nplugins: [axolotl.integrations.liger.LigerPlugin]\n")
    s = setup_from(translate_file(path))
    assert (s.method.value, s.precision.value, s.batch, s.seq, s.loss.value, s.grad_ckpt) == \
        ("full", "bf16", 4, 1024, "fused", False)


def test_axolotl_reports_what_it_read_as_honoured_and_what_it_dropped(tmp_path):
    """A CLI probe: Axolotl's deepspeed (read: it set zero3) was listed as ignored, and fp16: true beside
    bf16: true as honoured though Axolotl drops it."""
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    path = tmp_path / "ds.yml"
    path.write_text("base_model: meta-llama/Llama-3.2-1B\ndeepspeed: ds.json\nbf16: true\nfp16: true\n")
    t = translate_file(path)
    assert "deepspeed" in t.honoured and "deepspeed" not in t.ignored
    assert "fp16" not in t.honoured and any(k == "fp16" and "Axolotl drops it" in why for k, why in t.approximated)
    assert setup_from(t, {"gpus": 2}).sharding.value == "zero3" and setup_from(t, {"gpus": 2}).precision.value == "bf16"


def test_sharding_sections_need_gpus(tmp_path):
    ds = tmp_path / "ds" / "zero3.json"
    ds.parent.mkdir()
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}))
    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\ndeepspeed: ds/zero3.json\n")
    t = translate_file(path)
    with pytest.raises(ConfigError, match="deepspeed: shards over several GPUs"):
        setup_from(t)
    s = setup_from(t, {"gpus": 4})
    assert (s.gpus, s.sharding.value, s.offload.value) == (4, "zero3", "params")
    fsdp = tmp_path / "fsdp.yaml"
    fsdp.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nfsdp: full_shard auto_wrap offload\n")
    s = setup_from(translate_file(fsdp), {"gpus": 2})
    assert (s.sharding.value, s.offload.value) == ("fsdp", "params")
    plain = tmp_path / "plain.yaml"
    plain.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\n")
    assert setup_from(translate_file(plain), {"gpus": 8}).sharding.value == "ddp"  # torchrun's default


# ----- the CLI ----------------------------------------------------------------------------------
def _json(capsys, *argv) -> tuple[dict, str]:
    assert main(list(argv)) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def test_estimate_from_equals_the_same_flags(capsys):
    d, err = _json(capsys, "estimate", "--from", str(FIXTURES / "axolotl_qlora.yml"), "--gpu", "rtx-4090",
                   "--format", "json")
    assert "honoured: base_model" in err and "ignored (no effect" in err  # the report goes to stderr
    s = TrainingSetup.model_validate(d["setup"])
    flags = ["estimate", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--format", "json"]
    for name, value in s.model_dump(mode="json").items():
        if value is not None and not isinstance(value, bool):
            flags += ["--" + name.replace("_", "-"), str(value)]
        elif value is True:
            flags.append("--" + name.replace("_", "-"))
    same, _ = _json(capsys, *flags)
    assert same == d


def test_flags_beside_from_override_the_file(capsys):
    d, _ = _json(capsys, "estimate", "--from", str(FIXTURES / "trl_qlora.yaml"), "--gpu", "rtx-4090",
                 "--batch", "1", "--no-grad-ckpt", "--model", "llama-3.2-1b", "--format", "json")
    assert (d["model"], d["setup"]["batch"], d["setup"]["grad_ckpt"], d["setup"]["method"]) == \
        ("llama-3.2-1b", 1, False, "qlora")


def test_advise_from_walks_the_files_model_and_length(capsys):
    d, _ = _json(capsys, "advise", "--from", str(FIXTURES / "trl_full_bf16.json"), "--gpu", "rtx-4090",
                 "--format", "json")
    assert d["model"] == "llama-3.2-1b" and d["seq"] == 2048
    assert d["config"]["setup"]["padding"] == "packed" and d["config"]["verdict"] in ("fits", "tight", "does not fit")


BAD = [
    ("bad.yaml", "model_name_or_path: [unclosed\n", "bad.yaml:2: not valid YAML"),
    ("list.yaml", "- model_name_or_path: x\n", "a config is a mapping"),
    ("neither.yaml", "learning_rate: 1.0e-4\n", "neither a TRL, an Axolotl, a LLaMA-Factory, a torchtune nor an unsloth config"),
    ("unknown-model.yaml", "output_dir: x\nmodel_name_or_path: acme/NotAModel-3B\n",
     "unknown-model.yaml:2: model_name_or_path: model 'acme/NotAModel-3B': HF_HUB_OFFLINE is set and its "
     "config.json is not in the Hugging Face cache"),
    ("not-a-model.yaml", "output_dir: x\nmodel_name_or_path: NotAModel\n",
     "not-a-model.yaml:2: model_name_or_path: 'NotAModel' is not a local config.json or directory (looked in the "
     "working directory, "),
    ("4-and-8.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nuse_peft: true\nload_in_4bit: true\n"
     "load_in_8bit: true\n", "4-and-8.yaml:4: load_in_8bit: contradicts load_in_4bit"),
    ("4bit-no-peft.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nload_in_4bit: true\n",
     "load_in_4bit: a 4-bit model trains only through adapters"),
    ("optim.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\noptim: lion_8bit\n",
     "optim: 'lion_8bit' is not modelled"),
    ("bf16-fp16.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nbf16: true\nfp16: true\n",
     "fp16: contradicts bf16"),
    ("batch.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nper_device_train_batch_size: two\n",
     "per_device_train_batch_size: must be a whole number"),
    ("rank.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nuse_peft: true\nlora_r: 0\n",
     "rank.yaml:3: lora_r: must be >= 1"),
    ("targets.yml", "base_model: meta-llama/Llama-3.2-1B\nadapter: lora\nlora_r: 8\nlora_target_modules: [nope]\n",
     "targets.yml:4: lora_target_modules: lora_targets 'nope': llama-3.2-1b has no module 'nope'"),
    ("qlora-no-4bit.yml", "base_model: meta-llama/Llama-3.2-1B\nadapter: qlora\nlora_r: 8\nlora_target_linear: true\n",
     "adapter: qlora needs load_in_4bit: true"),
    ("both.yaml", "base_model: a\nmodel_name_or_path: b\n", "has TRL keys (model_name_or_path) and Axolotl keys"),
    ("ds.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\ndeepspeed: missing.json\n",
     "deepspeed: cannot read the DeepSpeed config 'missing.json' (looked for "),
    # issue 33: a torchtune file is read as torchtune's (tests/test_configs_torchtune.py), never as a TRL config: one
    # without the LoRA recipe's required keys names them
    ("tt.yaml", "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_rank: 8\nbatch_size: 2\n",
     "tt.yaml:1: model: lora_alpha is missing: torchtune's LoRA recipes read"),
    # issue 29, class 4: a value of the wrong type or out of range is refused as the tool refuses it
    ("micro0.yml", "base_model: meta-llama/Llama-3.2-1B\nmicro_batch_size: 0\nbatch_size: 8\n",
     "micro0.yml:2: micro_batch_size: must be at least 1 (got 0)"),
    ("accum0.yml", "base_model: meta-llama/Llama-3.2-1B\ngradient_accumulation_steps: 0\n",
     "accum0.yml:2: gradient_accumulation_steps: must be at least 1 (got 0)"),
    ("plugins5.yml", "base_model: meta-llama/Llama-3.2-1B\ncut_cross_entropy: true\nplugins: 5\n",
     "plugins5.yml:3: plugins: must be a list of plugin class paths (got 5)"),
    ("plugins-str.yml", "base_model: meta-llama/Llama-3.2-1B\ncut_cross_entropy: true\n"
     "plugins: axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n",
     "plugins-str.yml:3: plugins: must be a list of plugin class paths"),
    ("compile.yml", "base_model: meta-llama/Llama-3.2-1B\ntorch_compile: maybe\n",
     "compile.yml:2: torch_compile: must be true or false (got 'maybe')"),
    ("dq.yml", "base_model: meta-llama/Llama-3.2-1B\nadapter: qlora\nload_in_4bit: true\nlora_r: 8\n"
     "lora_target_linear: true\nbnb_config_kwargs:\n  bnb_4bit_use_double_quant: \"false\"\n",
     "dq.yml:6: bnb_config_kwargs: must be true or false (got 'false')"),
    ("batch0.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nper_device_train_batch_size: 0\n",
     "batch0.yaml:2: per_device_train_batch_size: must be at least 1 (got 0)"),
    ("arabic.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nper_device_train_batch_size: \"\u0664\"\n",
     "arabic.yaml:2: per_device_train_batch_size: must be a whole number, 1 or more, in digits (got '\u0664')"),
    ("ds-true.yml", "base_model: meta-llama/Llama-3.2-1B\ndeepspeed:\n  zero_optimization:\n    stage: true\n",
     "zero_optimization.stage must be 0, 1, 2 or 3 (got True)"),
    # null was taken as the default (the trainer gets None and fails on it)
    ("ds-batch.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nper_device_train_batch_size: 2\ndeepspeed:\n"
     "  zero_optimization: {stage: 2}\n  train_micro_batch_size_per_gpu: 16\n",
     "ds-batch.yaml:3: deepspeed: train_micro_batch_size_per_gpu 16 contradicts per_device_train_batch_size 2"),
    ("two-lengths.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nmax_length: 512\nmax_seq_length: 4096\n",
     "two-lengths.yaml:3: max_seq_length: 4096 beside max_length 512"),  # 512 was used, 4096 called ignored
    ("grpo-loss.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nnum_generations: 8\nloss_type: weird\n",
     "grpo-loss.yaml:3: loss_type: 'weird' is not a TRL 1.16 GRPO loss type"),
    ("batch-null.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nper_device_train_batch_size: null\n",
     "batch-null.yaml:2: per_device_train_batch_size: is null, where the trainer takes a whole number (default 8)"),
]


@pytest.mark.parametrize("name,text,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_configs_exit_2_naming_file_and_key(tmp_path, capsys, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    assert main(["estimate", "--from", str(path), "--gpu", "rtx-4090"]) == 2
    err = capsys.readouterr().err
    assert needle in " ".join(err.split()) and "Traceback" not in err, err


#: files that once hung the command (the alias bomb ran until killed) or ended in a traceback
#: (RecursionError, UnicodeDecodeError): each is now a file:line error, as for a sweep file
HOSTILE = [
    ("deep.yaml", DEEP_TRL, "deep.yaml: nested too deeply to read"),
    ("bomb.yaml", alias_bomb_trl(), "bomb.yaml:6: more than 100,000 values once its aliases are expanded"),
    ("twice.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nlora_r: 8\nlora_r: 16\n",
     "twice.yaml:3: duplicate key 'lora_r' (first at line 2); YAML would keep only the last one hint: write each "
     "key once: the trainer would read only the last one"),
    ("empty.yaml", "", "empty.yaml: a config is a mapping of keys to values, not an empty file"),
    ("list.yaml", "- model_name_or_path: a\n", "list.yaml: a config is a mapping of keys to values, not a list"),
    ("loop.yaml", "model_name_or_path: meta-llama/Llama-3.2-1B\nx: &x [*x]\n", "loop.yaml:2: an alias refers to the node that contains it"),
]


@pytest.mark.parametrize("name,text,needle", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_configs_exit_2_fast_naming_file_and_line(tmp_path, capsys, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    t0 = time.perf_counter()
    assert main(["estimate", "--from", str(path), "--gpu", "rtx-4090"]) == 2
    assert time.perf_counter() - t0 < 5
    err = capsys.readouterr().err
    assert needle in " ".join(err.split()) and "Traceback" not in err, err


def test_a_hostile_deepspeed_json_is_an_error_at_its_key(tmp_path, capsys):
    """The DeepSpeed file a config names is read as DeepSpeed reads it (json.load), within limits."""
    config = tmp_path / "sft.yaml"
    config.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\ndeepspeed: ds.json\n")
    for text, needle in (('{"zero_optimization": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
                         ('{"zero_optimization": {"stage": 2}, "x": "' + "a" * 1_000_000 + '"}', "bytes; a DeepSpeed"),
                         ("{'zero': 2}", "is not valid JSON")):
        (tmp_path / "ds.json").write_text(text)
        assert main(["estimate", "--from", str(config), "--gpu", "t4", "--gpus", "2"]) == 2
        err = capsys.readouterr().err
        assert "sft.yaml:2: deepspeed: " in err and needle in err and "Traceback" not in err, err


def test_config_files_that_are_not_utf8_or_too_large_exit_2(tmp_path, capsys):
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"model_name_or_path: a\n\xd8\xff\n")
    assert main(["estimate", "--from", str(binary), "--gpu", "t4"]) == 2
    assert "bin.yaml:2: not UTF-8 text (byte 0xd8 at offset 22)" in capsys.readouterr().err
    big = tmp_path / "big.yaml"
    big.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nx: " + "a" * 1_000_000 + "\n")
    assert main(["estimate", "--from", str(big), "--gpu", "t4"]) == 2
    assert "a config file is at most 1,000,000 bytes" in capsys.readouterr().err


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert main(["estimate", "--from", str(tmp_path / "nope.yaml"), "--gpu", "rtx-4090"]) == 2
    assert "nope.yaml: no such config file" in capsys.readouterr().err


def test_unknown_key_is_a_warning_not_silence(tmp_path, capsys):
    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nper_device_train_batch_sise: 4\n")
    assert main(["estimate", "--from", str(path), "--gpu", "rtx-4090", "--format", "json"]) == 0
    out = capsys.readouterr()
    assert "warning: unknown key 'per_device_train_batch_sise'" in out.err
    assert "did you mean per_device_train_batch_size" in out.err
    assert json.loads(out.out)["setup"]["batch"] == 8  # the typo is not read: TRL's default stands


def test_not_modelled_keys_are_warned(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nuse_peft: true\nlora_modules_to_save: [lm_head]\n")
    t = translate_file(path)
    assert [k for k, _ in t.not_modelled] == ["lora_modules_to_save"]
    assert any(line.startswith("warning: not modelled: lora_modules_to_save") for line in t.lines())


def test_no_traceback_from_the_command_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("base_model: meta-llama/Llama-3.2-1B\nadapter: ia3\n")
    proc = subprocess.run([sys.executable, "-m", "reportgen", "estimate", "--from", str(path), "--gpu", "t4"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "adapter: 'ia3' is not modelled" in proc.stderr
    assert "Traceback" not in proc.stderr


# ----- the table ---------------------------------------------------------------------------------
LEGACY = {("trl", "max_seq_length"), ("trl", "max_prompt_length"),  # read for older TRL files, not pinned keys
          ("torchtune", "optimizer.optimizer_class")}  # torchao CPUOffloadOptimizer's: torchao is not in the wheel


def test_every_row_is_a_key_of_the_pinned_tool_and_sets_real_fields():
    fields = set(TrainingSetup.model_fields) | {"model"}
    for row in table.ROWS:
        assert (row.tool, row.key) in LEGACY or row.key in table.known_keys(row.tool), row
        assert row.status in (table.HONOURED, table.APPROXIMATED, table.IGNORED)
        named = {f.strip() for f in row.fields.split(",") if f.strip()}
        assert named <= fields, row
        assert bool(named) == (row.status != table.IGNORED), row


def test_keys_json_matches_the_installed_trl():
    """keys.json is TRL's own field list (scripts/config_keys.py); rerun the script after a TRL pin change."""
    pytest.importorskip("trl")
    from importlib import metadata

    data = table.schema()["trl"]
    if metadata.version("trl") != data["version"] or metadata.version("transformers") != data["transformers"]:
        pytest.skip(f"keys.json is of trl {data['version']} / transformers {data['transformers']}")
    from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, SFTConfig

    names = {f.name for cls in (ScriptArguments, SFTConfig, ModelConfig, DatasetMixtureConfig)
             for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}
    assert names == set(data["keys"])
    assert SFTConfig.__dataclass_fields__["max_length"].default == data["keys"]["max_length"] == 1024
    from trl import GRPOConfig  # trl grpo's keys beyond SFT's (scripts/config_keys.py trl_grpo_keys)

    grpo = {f.name for f in dataclasses.fields(GRPOConfig) if f.init and not f.name.startswith("_")}
    assert set(data["grpo_keys"]) <= grpo | {"reward_funcs", "reward_model_name_or_path"}
    assert grpo - names <= set(data["grpo_keys"]) and data["grpo_keys"]["num_generations"] == 8


# ----- the sweep key ------------------------------------------------------------------------------
def test_sweep_grid_from_config(tmp_path):
    from reportgen.sweep import load_sweep

    (tmp_path / "sft.yaml").write_text((FIXTURES / "trl_qlora.yaml").read_text() + "not_a_key: 1\n")
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: s\ngrids:\n  - from: sft.yaml\n    gpu: rtx-4090\n    batch: [1, 4]\n")
    s = load_sweep(sweep)
    assert sorted((c.model, c.setup.batch) for c in s.cases) == [("qwen2.5-7b", 1), ("qwen2.5-7b", 4)]
    file_setup = setup_from(translate_file(FIXTURES / "trl_qlora.yaml"))
    assert {c.setup for c in s.cases} == {file_setup.model_copy(update={"batch": b}) for b in (1, 4)}
    assert any("unknown key 'not_a_key'" in w for w in s.warnings)


def test_sweep_from_errors_name_the_sweep_and_the_config(tmp_path):
    from reportgen.errors import UserError
    from reportgen.sweep import load_sweep

    (tmp_path / "bad.yaml").write_text("model_name_or_path: meta-llama/Llama-3.2-1B\noptim: lion_8bit\n")
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: s\ngrids:\n  - gpu: rtx-4090\n    from: bad.yaml\n")
    with pytest.raises(UserError) as err:
        load_sweep(sweep)
    assert "s.yaml:4: from:" in err.value.message and "bad.yaml:2: optim: 'lion_8bit' is not modelled" in \
        err.value.message


# ----- the reverse mapping: a setup as each tool's keys, read back -------------------------------
def _setups():
    import itertools

    for method, precision, padding, optimizer, ckpt in itertools.product(
            ("full", "lora", "qlora"), ("bf16-mixed", "bf16", "fp16-mixed", "fp32"), ("longest", "packed", "max"),
            ("adamw", "paged-adamw-8bit", "adafactor"), (False, True)):
        for extra in ({}, {"lora_targets": "qv", "lora_rank": 64, "dora": True}, {"frozen_dtype": "fp32"},
                      {"kbit_prep": "none"}, {"gpus": 4, "sharding": "fsdp"}, {"gpus": 2, "sharding": "zero3",
                                                                               "offload": "optimizer"}):
            try:
                yield TrainingSetup(method=method, precision=precision, padding=padding, optimizer=optimizer,
                                    grad_ckpt=ckpt, lora_dropout=0.05, **extra)
            except ValueError:
                continue


@pytest.mark.parametrize("tool", ["trl", "axolotl", "llamafactory", "torchtune"])
def test_reverse_keys_read_back_as_the_same_setup(tool, tmp_path):
    """Every setup a tool can express comes back unchanged from its keys; the others carry a note."""
    import yaml

    from reportgen import catalog
    from reportgen.configs import reverse

    model = catalog.load_model("llama-3.1-8b")
    checked = noted = 0
    for s in _setups():
        s = s.model_copy(update={"recipe": {"trl": "trl-sft", "torchtune": "loop"}.get(tool, "trainer")})
        write = {"trl": reverse.trl_keys, "axolotl": reverse.axolotl_keys, "llamafactory": reverse.llamafactory_keys,
                 "torchtune": reverse.torchtune_keys}
        keys = write[tool]("llama-3.1-8b", s)
        path = tmp_path / "c.yaml"
        path.write_text(keys.yaml())
        assert yaml.safe_load(path.read_text()) == keys.keys
        t = translate_file(path)
        assert t.unknown == [] and t.not_modelled == [], (s.short(), t.lines())
        back = setup_from(t, {"gpus": s.gpus})
        if [n for n in keys.notes if not n.startswith(("launch on", "add tokenizer._component_"))]:
            noted += 1
            continue
        if tool == "torchtune":  # its file runs torchtune's model (estimate/recipes.py), at its builder's RoPE length
            s = s.model_copy(update={"modeling": "torchtune", "rope_positions": 131072})
        got, want = back.model_dump(mode="json"), s.model_dump(mode="json")
        if s.is_peft:
            assert model.lora_selection(got.pop("lora_targets")) == model.lora_selection(want.pop("lora_targets"))
        unused = ("lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "dora") if not s.is_peft else ()
        unused += ("quant", "double_quant") if s.method.value != "qlora" else ()
        for name in unused:  # fields the method does not use
            got.pop(name), want.pop(name)
        got["kbit_prep"], want["kbit_prep"] = back.kbit.value, s.kbit.value  # None means the recipe's default
        assert got == want, (tool, s.short(), keys.keys)
        checked += 1
    # torchtune trains without autocast: the mixed-precision half of the setups carries a note there
    assert checked > (50 if tool == "torchtune" else 100) and noted > 10, (checked, noted)


def test_guides_show_the_recommended_setup_as_tool_keys(tmp_path):
    """A GPU guide's recommended setup, as the TRL and Axolotl keys it shows, reads back as that setup."""
    from reportgen.report.guides import walk_view
    from reportgen.advise.walk import walk

    doc = walk("llama-3.1-8b", "rtx-4090", 2048)
    view = walk_view(doc, "guides/rtx-4090.md", {})
    want = TrainingSetup.model_validate(doc["recommended"]["setup"])
    shown = {r["tool"]: r for r in view["recommended"]["run_with"]}
    assert set(shown) == {"TRL", "Axolotl", "LLaMA-Factory", "torchtune"}
    for tool, r in shown.items():
        path = tmp_path / f"{tool}.yaml"
        path.write_text(r["yaml"])
        back = setup_from(translate_file(path))
        if not r["notes"]:  # the file runs its tool's recipe (Axolotl: transformers' Trainer)
            assert back == want.model_copy(update={"recipe": back.recipe}), (tool, back.short(), want.short())
    assert sum(not r["notes"] for r in shown.values()) >= 1  # at least one tool expresses it exactly


def test_docs_page_lists_the_table_the_cli_reads():
    from reportgen.report import render
    from reportgen.report.configs import config_pages

    (page,) = config_pages(None)
    text = render.environment().get_template(page.template).render(**page.context)
    for row in table.ROWS:
        assert f"| `{row.key}` | {row.status}" in text, row.key
    assert f"## TRL {table.version('trl')}" in text and f"## Axolotl {table.version('axolotl')}" in text
    assert f"## torchtune {table.version('torchtune')}" in text
    assert "base_model: meta-llama/Llama-3.1-8B" in text  # the worked example, written by reverse.py


def test_keys_the_recipe_does_not_use_are_listed_as_ignored(tmp_path):
    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nlora_r: 64\n")  # no use_peft: full fine-tuning
    t = translate_file(path)
    assert "lora_r" in t.ignored and "lora_r" not in t.honoured


@pytest.mark.parametrize("text, field, value", [
    ("torch_compile: \"true\"\n", "compile", True),  # pydantic (Axolotl) reads the string as true
    ("torch_compile: \"false\"\n", "compile", False),
    ("plugins: [axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin]\ncut_cross_entropy: \"true\"\n",
     "loss", "fused"),
    ("fsdp_config:\n  offload_params: \"true\"\n", "offload", "params"),  # accelerate's str_to_bool
])
def test_axolotl_values_are_read_as_axolotl_reads_them(tmp_path, text, field, value):
    """Issue 29, class 4: the value an honoured key is listed with is the value the estimate uses."""
    path = tmp_path / "c.yml"
    path.write_text("base_model: meta-llama/Llama-3.2-1B\n" + text)
    t = translate_file(path)
    gpus = {"gpus": 2} if "fsdp" in text else {}
    assert setup_from(t, gpus).model_dump(mode="json")[field] == value


@pytest.mark.parametrize("config", ["axolotl_qlora.yml", "trl_qlora.yaml"])
def test_method_beside_a_qlora_file_overrides_it(config, capsys):
    """Issue 29, class 4: --method lora beside a QLoRA file is LoRA (the file's 4-bit fields go with
    its method), not an error blaming a key the file does not have."""
    d, _ = _json(capsys, "estimate", "--from", str(FIXTURES / config), "--method", "lora", "--gpu", "h100-sxm",
                 "--format", "json")
    assert d["setup"]["method"] == "lora" and d["setup"]["kbit_prep"] is None


def test_a_relative_deepspeed_path_says_which_file_it_read(tmp_path, monkeypatch, capsys):
    """Issue 29, class 5: beside the config first, then the working directory (where the trainer
    opens it), and the report names the file read."""
    (tmp_path / "cfg").mkdir()
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "z2.json").write_text('{"zero_optimization": {"stage": 2}}')
    path = tmp_path / "cfg" / "c.yml"
    path.write_text("base_model: meta-llama/Llama-3.2-1B\ndeepspeed: ds/z2.json\n")
    monkeypatch.chdir(tmp_path)
    t = translate_file(path)
    assert setup_from(t, {"gpus": 2}).sharding.value == "zero2"
    assert f"read: deepspeed: {tmp_path / 'ds' / 'z2.json'} (the working directory)" in t.lines()


#: setup-bearing keys of each tool the readers act on (the others are only listed as ignored)
ACTED_ON = {
    "axolotl": ["adapter", "load_in_4bit", "load_in_8bit", "lora_r", "lora_alpha", "lora_dropout", "lora_target_linear",
                "lora_target_modules", "micro_batch_size", "gradient_accumulation_steps", "batch_size", "sequence_len",
                "sample_packing", "pad_to_sequence_len", "gradient_checkpointing", "activation_offloading",
                "torch_compile", "optimizer", "flash_attention", "sdp_attention", "bf16", "fp16", "tf32",
                "cut_cross_entropy", "plugins", "liger_fused_linear_cross_entropy", "liger_rms_norm", "liger_rope",
                "liger_glu_activation", "fsdp", "fsdp_config", "deepspeed",
                "bnb_config_kwargs", "peft_use_dora", "bfloat16", "float16"],
    "trl": ["use_peft", "load_in_4bit", "load_in_8bit", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
            "per_device_train_batch_size", "gradient_accumulation_steps", "max_length", "max_seq_length", "packing",
            "padding_free", "gradient_checkpointing", "optim", "attn_implementation", "bf16", "fp16", "dtype",
            "torch_dtype", "use_liger_kernel", "fsdp", "fsdp_config", "deepspeed", "torch_compile",
            "bnb_4bit_quant_type", "use_bnb_nested_quant"],
    "llamafactory": ["stage", "finetuning_type", "quantization_bit", "quantization_method", "quantization_type",
                     "double_quantization", "lora_rank", "lora_alpha", "lora_dropout", "lora_target", "use_dora",
                     "bf16", "fp16", "pure_bf16", "per_device_train_batch_size", "gradient_accumulation_steps",
                     "cutoff_len", "packing", "neat_packing", "disable_gradient_checkpointing", "flash_attn",
                     "enable_liger_kernel", "optim", "fsdp", "deepspeed", "use_galore", "torch_compile"],
    "torchtune": ["model._component_", "model.quantize_base", "model.lora_rank", "model.lora_alpha", "model.lora_dropout",
                  "model.lora_attn_modules", "model.apply_lora_to_mlp", "model.apply_lora_to_output", "model.use_dora",
                  "dtype", "batch_size", "gradient_accumulation_steps", "tokenizer.max_seq_len", "dataset.packed",
                  "dataset", "enable_activation_checkpointing", "enable_activation_offloading", "compile",
                  "optimizer_in_bwd", "loss._component_", "optimizer._component_", "optimizer.momentum",
                  "fsdp_cpu_offload", "fsdp_reshard_after_forward", "tensor_parallel_dim", "ac_mode"],
    "unsloth": ["from_pretrained.model_name", "from_pretrained.max_seq_length", "from_pretrained.dtype",
                "from_pretrained.load_in_4bit", "from_pretrained.load_in_8bit", "from_pretrained.load_in_16bit",
                "from_pretrained.load_in_fp8", "from_pretrained.full_finetuning",
                "from_pretrained.float32_mixed_precision", "from_pretrained.use_gradient_checkpointing",
                "get_peft_model.r", "get_peft_model.lora_alpha", "get_peft_model.lora_dropout",
                "get_peft_model.target_modules", "get_peft_model.use_gradient_checkpointing", "get_peft_model.bias",
                "SFTConfig.per_device_train_batch_size", "SFTConfig.gradient_accumulation_steps", "SFTConfig.max_length",
                "SFTConfig.packing", "SFTConfig.padding_free", "SFTConfig.bf16", "SFTConfig.fp16", "SFTConfig.optim",
                "SFTConfig.fsdp", "SFTConfig.deepspeed", "get_peft_model", "SFTConfig"],
}


@pytest.mark.parametrize("tool", ["axolotl", "trl", "llamafactory", "torchtune", "unsloth"])
def test_any_config_exits_0_or_2(tool, tmp_path_factory, capsys):
    """Property (hypothesis), issue 29 class 4: a valid config (the fixture, with Cut Cross-Entropy or
    Liger on) with one to three of the keys the readers act on set to any YAML value (of any type,
    nested or not) or removed is an estimate or a file:line error, never a traceback, on one GPU or two."""
    import yaml
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    fixture = {"axolotl": "axolotl_qlora.yml", "trl": "trl_qlora.yaml", "llamafactory": "llamafactory_qlora.yaml",
               "torchtune": "torchtune_lora_single_device.yaml", "unsloth": "unsloth_qlora.yaml"}
    base = yaml.safe_load((FIXTURES / fixture[tool]).read_text())
    if tool == "unsloth":  # its sections by their short names, so that section.key sets them
        base = {k.removeprefix("FastLanguageModel."): v for k, v in base.items()}
    base.update({"axolotl": {"cut_cross_entropy": True,
                             "plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]},
                 "trl": {"use_liger_kernel": True}, "llamafactory": {"enable_liger_kernel": True},
                 "torchtune": {}, "unsloth": {}}[tool])
    known = [k for k in ACTED_ON[tool] if k in table.known_keys(tool) or tool == "unsloth"]
    leaves = st.one_of(st.none(), st.booleans(), st.integers(min_value=-3, max_value=70_000),
                       st.floats(allow_nan=False, allow_infinity=False, width=32), st.sampled_from(
                           ["true", "false", "auto", "4", "\u0664", "", "nf4", "offload", "full_shard", "adamw_torch",
                            "paged_adamw_8bit", "lora", "qlora", "all-linear", "sdpa", "bfloat16", "x.json", "bf16", "fp32",
                            "q_proj", "torch.optim.SGD", "torchtune.models.llama3_2.qlora_llama3_2_1b",
                            "${output_dir}", "${batch_size}", "unsloth", "float16", "unsloth/llama-3-8b-Instruct",
                            "unsloth/gemma-4-E2B-it", "adamw_8bit"]))
    values = st.one_of(leaves, st.lists(leaves, max_size=3), st.dictionaries(
        st.sampled_from(["stage", "offload_params", "bnb_4bit_use_double_quant", "zero_optimization", "x", "packed",
                         "_component_"]), leaves,
        max_size=2), st.just(_REMOVE))

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from(known), values, min_size=1, max_size=3), st.sampled_from(["1", "2"]))
    def check(changes, gpus):
        doc = {k: v for k, v in {**base, **changes}.items() if v is not _REMOVE}
        if tool in ("torchtune", "unsloth"):  # section.key: set in its section
            doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
            for key, v in changes.items():
                section, _, sub = key.partition(".")
                if sub and not isinstance(doc.get(section), dict):
                    doc[section] = {}
                target, name = (doc[section], sub) if sub else (doc, section)
                target.pop(name, None) if v is _REMOVE else target.__setitem__(name, v)
        path = tmp_path_factory.mktemp("cfg") / ("c.yml" if tool == "axolotl" else "c.yaml")
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
        rc = main(["estimate", "--from", str(path), "--gpu", "h100-sxm", "--gpus", gpus, "--format", "json"])
        err = capsys.readouterr().err
        assert rc in (0, 2) and "Traceback" not in err, (changes, err)

    check()


_REMOVE = object()


@pytest.mark.parametrize("text, eval_batch", [
    ("eval_strategy: steps\nper_device_eval_batch_size: 4\n", 4),
    ("eval_strategy: epoch\n", 8),  # TrainingArguments' default per_device_eval_batch_size
    ("eval_strategy: 'no'\nper_device_eval_batch_size: 4\n", None),
    ("per_device_eval_batch_size: 4\n", None),  # eval_strategy defaults to no
])
def test_trl_and_llamafactory_evaluation_keys_make_the_runs_eval_phase(tmp_path, text, eval_batch):
    for head in ("model_name_or_path: meta-llama/Llama-3.2-1B\n",
                 "model_name_or_path: meta-llama/Llama-3.2-1B\nfinetuning_type: lora\nbf16: true\n"):
        path = tmp_path / "c.yaml"
        path.write_text(head + text)
        t = translate_file(path)
        assert setup_from(t).eval_batch == eval_batch, (head, text)
        if "per_device_eval_batch_size" in text:
            assert ("per_device_eval_batch_size" in t.honoured) == (eval_batch is not None)


@pytest.mark.parametrize("text, eval_batch", [
    ("val_set_size: 0.05\n", 2), ("val_set_size: 0.05\neval_batch_size: 6\n", 6), ("val_set_size: 0\n", None),
    ("val_set_size: 0.05\neval_strategy: 'no'\n", None), ("test_datasets: [{path: x}]\n", 2),
])
def test_axolotl_validation_split_makes_the_runs_eval_phase(tmp_path, text, eval_batch):
    path = tmp_path / "c.yaml"
    path.write_text("base_model: meta-llama/Llama-3.2-1B\nmicro_batch_size: 2\n" + text)
    assert setup_from(translate_file(path)).eval_batch == eval_batch


def test_a_bad_evaluation_key_names_its_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\neval_strategy: sometimes\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: eval_strategy: must be no, steps or epoch"):
        translate_file(path)
    path.write_text("base_model: meta-llama/Llama-3.2-1B\nval_set_size: lots\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: val_set_size"):
        translate_file(path)
