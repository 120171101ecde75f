"""unsloth's arguments in (issue 33): a YAML file of its calls' keyword arguments (``FastLanguageModel.from_pretrained``,
``get_peft_model``, ``SFTConfig``) read with unsloth 2026.10.9's own keys and defaults (``reportgen/configs/unsloth.py``),
section keys as ``section.key``, and what it does not model refused naming the file, the line and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reportgen.cli import main
from reportgen.configs import ConfigError, setup_from, table, translate_file
from reportgen.setup import TrainingSetup

FIXTURE = Path(__file__).parent / "fixtures" / "configs" / "unsloth_qlora.yaml"
DEFAULTS = TrainingSetup().model_dump(mode="json")
HEAD = "FastLanguageModel.from_pretrained:\n  model_name: unsloth/Llama-3.2-1B-Instruct\n"


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "us.yaml"
    path.write_text(text)
    return path


def _setup(tmp_path, text: str) -> TrainingSetup:
    return setup_from(translate_file(_write(tmp_path, text)))


def test_the_qlora_notebook_field_by_field():
    """unsloth's Llama 3.1 8B notebook: the pre-quantized repo as the catalog's llama-3.1-8b, NF4 with double
    quantization, rank 16 on every linear layer, adapters in fp32 under bf16 autocast (nothing else upcast: kbit_prep
    none), offloaded checkpointing, padding-free batching, adamw_8bit, its fused loss on transformers' Trainer."""
    t = translate_file(FIXTURE)
    s = setup_from(t)
    assert (t.tool, t.model) == ("unsloth", "llama-3.1-8b")
    assert s.model_dump(mode="json") == {**DEFAULTS, **{
        "method": "qlora", "quant": "nf4", "double_quant": True, "kbit_prep": "none", "precision": "bf16-mixed",
        "lora_rank": 16, "lora_alpha": 16, "lora_dropout": 0.0, "lora_targets": "all-linear", "batch": 2, "accum": 4,
        "seq": 2048, "padding": "packed", "grad_ckpt": True, "act_offload": True, "optimizer": "adamw-8bit",
        "recipe": "trainer", "loss": "fused", "attn": "sdpa", "compile": False}}
    accounted = set(t.honoured) | set(t.ignored) | {k for k, _ in t.not_modelled} | {k for k, _ in t.approximated}
    assert accounted == set(t.present) and not t.unknown
    assert {k for k, _ in t.approximated} == {"from_pretrained.model_name", "from_pretrained.load_in_4bit",
                                              "get_peft_model.use_gradient_checkpointing", "SFTConfig.packing"}
    assert {"SFTConfig.learning_rate", "get_peft_model.random_state"} <= set(t.ignored)
    assert "get_peft_model.r" in t.honoured and t.where("get_peft_model.r").endswith(":9")


def test_unsloths_defaults_where_the_file_is_silent(tmp_path):
    """A bare from_pretrained with get_peft_model: unsloth's defaults, 4-bit, rank 16 on every linear layer, its
    trainer's batch 4, accumulation 2 and adamw_8bit (rl.py replacements), length 2048."""
    s = _setup(tmp_path, HEAD + "get_peft_model:\n")
    assert (s.method.value, s.lora_rank, s.lora_targets, s.batch, s.accum, s.seq, s.optimizer.value) == (
        "qlora", 16, "all-linear", 4, 2, 2048, "adamw-8bit")


@pytest.mark.parametrize("text, field, value", [
    ("  load_in_4bit: false\nget_peft_model: {r: 8}\n", "method", "lora"),
    ("  load_in_16bit: true\nget_peft_model: {r: 8}\n", "method", "lora"),
    ("  full_finetuning: true\n", "precision", "bf16"),  # a bf16 model trains in pure bf16
    ("  full_finetuning: true\n  float32_mixed_precision: true\n", "precision", "bf16-mixed"),
    ("  dtype: float16\nget_peft_model:\n", "precision", "fp16-mixed"),
    ("get_peft_model: {use_gradient_checkpointing: true}\n", "act_offload", False),
    ("get_peft_model: {use_gradient_checkpointing: false}\n", "grad_ckpt", False),
    ("get_peft_model: {target_modules: [q_proj, v_proj]}\n", "lora_targets", "q_proj,v_proj"),
    ("get_peft_model:\nSFTConfig: {padding_free: false}\n", "padding", "longest"),
    ("get_peft_model:\nSFTConfig: {max_length: 512}\n", "seq", 512),  # set below max_seq_length: caps it
    ("get_peft_model:\nSFTConfig: {max_length: 1024}\n", "seq", 2048),  # TRL's default is not taken as a cap
    ("get_peft_model:\nTrainingArguments: {optim: paged_adamw_8bit}\n", "optimizer", "paged-adamw-8bit"),
])
def test_each_key_as_unsloth_reads_it(tmp_path, text, field, value):
    got = getattr(_setup(tmp_path, HEAD + text), field)
    assert (got.value if hasattr(got, "value") else got) == value


def test_unsloth_repos_map_to_the_catalog_model_of_their_shapes(tmp_path):
    """unsloth/llama-3-8b-Instruct is a copy of meta-llama/Meta-Llama-3-8B-Instruct (its mapper.py): Llama 3.1 8B's
    shapes; a plain Hub id of a catalog model is read as the other tools read it."""
    for name, model in (("unsloth/llama-3-8b-Instruct", "llama-3.1-8b"), ("unsloth/Qwen2.5-7B", "qwen2.5-7b"),
                        ("meta-llama/Llama-3.2-1B", "llama-3.2-1b"), ("unsloth/mistral-7b-v0.3-bnb-4bit",
                                                                      "mistral-7b-v0.3")):
        t = translate_file(_write(tmp_path, f"from_pretrained:\n  model_name: {name}\nget_peft_model:\n"))
        assert t.model == model, name


@pytest.mark.parametrize("text, says", [
    (HEAD + "  load_in_8bit: true\nget_peft_model:\n", "us.yaml:3: from_pretrained.load_in_8bit: 8-bit (LLM.int8) "
     "LoRA is not modelled"),
    (HEAD + "  load_in_fp8: block\nget_peft_model:\n", "us.yaml:3: from_pretrained.load_in_fp8: fp8 LoRA"),
    (HEAD + "get_peft_model:\nSFTConfig:\n  per_device_train_batch_size: 0\n",
     "us.yaml:5: SFTConfig.per_device_train_batch_size: must be at least 1 (got 0)"),
    (HEAD + "get_peft_model:\n  r: sixteen\n", "us.yaml:4: get_peft_model.r: must be a whole number"),
    (HEAD + "get_peft_model:\n  use_gradient_checkpointing: offload\n",
     "us.yaml:4: get_peft_model.use_gradient_checkpointing: must be true, false or unsloth"),
    (HEAD + "get_peft_model:\n  target_modules: 7\n", "us.yaml:4: get_peft_model.target_modules: must be a list"),
    (HEAD + "  dtype: float8\nget_peft_model:\n", "us.yaml:3: from_pretrained.dtype: 'float8' is not a dtype"),
    (HEAD + "  dtype: float16\nget_peft_model:\nSFTConfig: {bf16: true}\n", "SFTConfig.bf16: a fp16 model with bf16 "
     "autocast: unsloth raises TypeError"),
    (HEAD, "us.yaml:1: from_pretrained: load_in_4bit (unsloth default true): a 4-bit model trains only through the "
     "adapters"),
    (HEAD + "  load_in_4bit: false\n", "us.yaml:3: from_pretrained.load_in_4bit: load_in_4bit: a 16-bit LoRA model"),
    ("from_pretrained: 3\n", "us.yaml:1: from_pretrained: must be a mapping"),
    (HEAD + "from_pretrained: {}\n", "us.yaml:3: from_pretrained: the same call as FastLanguageModel.from_pretrained"),
])
def test_what_is_not_modelled_is_refused_naming_the_line(tmp_path, text, says):
    with pytest.raises(ConfigError) as info:
        _setup(tmp_path, text)
    assert says in info.value.message


def test_bad_input_exits_2_naming_file_and_line(tmp_path, capsys):
    path = _write(tmp_path, HEAD + "get_peft_model:\nSFTConfig:\n  per_device_train_batch_size: 0\n")
    assert main(["estimate", "--from", str(path), "--gpu", "rtx-4090"]) == 2
    err = capsys.readouterr().err
    assert "us.yaml:5: SFTConfig.per_device_train_batch_size" in err and "Traceback" not in err


def test_an_unsloth_repo_without_a_catalog_model_asks_for_model(tmp_path, capsys):
    path = _write(tmp_path, "from_pretrained:\n  model_name: unsloth/gemma-4-E2B-it\nget_peft_model:\n")
    assert main(["estimate", "--from", str(path), "--gpu", "rtx-4090"]) == 2
    err = capsys.readouterr().err
    assert "us.yaml:2: from_pretrained.model_name: unsloth/gemma-4-E2B-it (a copy of google/gemma-4-E2B-it)" in err
    assert "--model" in err
    assert main(["estimate", "--from", str(path), "--gpu", "rtx-4090", "--model", "gemma-2b", "--format",
                 "json"]) == 0


def test_a_misspelled_key_is_a_warning_with_the_right_name(tmp_path, capsys):
    path = _write(tmp_path, HEAD + "get_peft_model:\n  lora_alpah: 32\nSFTConfig: {gradient_accumulation_step: 2}\n")
    assert main(["estimate", "--from", str(path), "--gpu", "rtx-4090", "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert "unknown key 'get_peft_model.lora_alpah'" in err and "get_peft_model.lora_alpha" in err
    assert "SFTConfig.gradient_accumulation_steps" in err and "unsloth 2026.10.9" in err


def test_estimate_from_an_unsloth_file_equals_the_same_flags(capsys):
    assert main(["estimate", "--from", str(FIXTURE), "--gpu", "rtx-4090", "--format", "json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--method", "qlora", "--double-quant",
                 "--lora-rank", "16", "--lora-alpha", "16", "--lora-dropout", "0", "--lora-targets", "all-linear",
                 "--batch", "2", "--accum", "4", "--seq", "2048", "--padding", "packed", "--grad-ckpt",
                 "--act-offload", "--optimizer", "adamw-8bit", "--kbit-prep", "none", "--recipe", "trainer", "--loss",
                 "fused", "--format", "json"]) == 0
    flags = json.loads(capsys.readouterr().out)
    assert from_file["memory"] == flags["memory"] and from_file["time"]["step_s"] == flags["time"]["step_s"]


def test_every_unsloth_row_is_a_key_of_its_schema():
    keys = table.known_keys("unsloth")
    assert table.version("unsloth") == "2026.10.9"
    assert all(r.key in keys for r in table.rows("unsloth"))
    assert keys["from_pretrained.load_in_4bit"] is True and keys["get_peft_model.r"] == 16
    assert keys["SFTConfig.optim"] == "adamw_8bit" and keys["SFTConfig.per_device_train_batch_size"] == 4
    assert table.schema()["unsloth"]["models"]["unsloth/meta-llama-3.1-8b-bnb-4bit"] == "meta-llama/Meta-Llama-3.1-8B"


def test_a_misspelled_call_is_an_error_not_unsloths_default_model(tmp_path):
    """A typo in a section name left from_pretrained empty, and the estimate silently took unsloth's default
    model (Llama 3.2 1B) instead of the 8B the file names."""
    text = FIXTURE.read_text().replace("FastLanguageModel.from_pretrained:", "FastLanguageModel.from_pretrainedx:")
    path = tmp_path / "typo.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"from_pretrainedx: not a call .*did you mean FastLanguageModel.from_pretrained"):
        translate_file(path)
