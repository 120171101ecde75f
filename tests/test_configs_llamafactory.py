"""LLaMA-Factory configs in (issue 33): ``llamafactory-cli train`` YAMLs read with LLaMA-Factory 0.9.5's own keys
and defaults (``reportgen/configs/llamafactory.py``), field by field, and what it does not model refused naming
the file, the line and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reportgen.cli import main
from reportgen.configs import ConfigError, setup_from, table, translate_file
from reportgen.setup import TrainingSetup

FIXTURE = Path(__file__).parent / "fixtures" / "configs" / "llamafactory_qlora.yaml"
HEAD = "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nbf16: true\n"


def _setup(tmp_path, text: str) -> TrainingSetup:
    path = tmp_path / "lf.yaml"
    path.write_text((HEAD.replace("stage: sft\n", "") if "stage:" in text else HEAD) + text)
    return setup_from(translate_file(path))


def test_the_qlora_example_field_by_field():
    """LLaMA-Factory's QLoRA example (examples/train_qlora, with lora_rank 16): 4-bit NF4 with double quantization
    (LLaMA-Factory's default), alpha twice the rank, dropout 0, every linear layer, checkpointing on unless disabled,
    the checkpoint's bf16 weights unprepared (no prepare_model_for_kbit_training), transformers' Trainer. It was once
    read as a TRL file: a full fine-tune at 1,024 tokens."""
    t = translate_file(FIXTURE)
    s = setup_from(t)
    assert (t.tool, t.model) == ("llamafactory", "llama-3.1-8b")
    assert s.model_dump(mode="json") == {**TrainingSetup().model_dump(mode="json"), **{
        "method": "qlora", "quant": "nf4", "double_quant": True, "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.0,
        "lora_targets": "all-linear", "batch": 1, "accum": 8, "seq": 2048, "padding": "longest", "grad_ckpt": True,
        "precision": "bf16-mixed", "kbit_prep": "none", "recipe": "trainer", "attn": "sdpa", "optimizer": "adamw",
        "loss": "standard", "dora": False, "compile": False}}
    assert "warmup_ratio" in t.ignored and not t.unknown  # transformers 5.6's TrainingArguments has it


@pytest.mark.parametrize("text, field, value", [
    ("finetuning_type: full\n", "precision", "bf16-mixed"),  # fp32 master weights: trainable params cast to fp32
    ("finetuning_type: full\npure_bf16: true\n", "precision", "bf16"),
    ("finetuning_type: lora\n", "lora_rank", 8),  # LLaMA-Factory's default rank
    ("lora_rank: 4\n", "lora_alpha", 8),  # alpha defaults to twice the rank
    ("lora_target: q_proj,v_proj\n", "lora_targets", "q_proj,v_proj"),
    ("stage: pt\n", "padding", "packed"),  # pre-training packs by default
    ("packing: true\n", "padding", "packed"),
    ("neat_packing: true\n", "padding", "packed"),
    ("disable_gradient_checkpointing: true\n", "grad_ckpt", False),
    ("flash_attn: disabled\n", "attn", "eager"),
    ("flash_attn: fa2\n", "attn", "sdpa"),
    ("enable_liger_kernel: true\n", "loss", "fused"),  # sft: Liger's fused linear cross-entropy
    ("enable_liger_kernel: true\n", "kernels", "liger"),  # and its RMSNorm, RoPE and SwiGLU
    ("stage: sft\n", "kernels", "eager"),
    ("quantization_bit: 4\ndouble_quantization: false\n", "double_quant", False),
    ("optim: paged_adamw_8bit\n", "optimizer", "paged-adamw-8bit"),
    ("use_dora: true\n", "dora", True),
])
def test_each_key_as_llamafactory_reads_it(tmp_path, text, field, value):
    got = getattr(_setup(tmp_path, text), field)
    assert (got.value if hasattr(got, "value") else got) == value


def test_liger_on_a_model_llamafactory_does_not_patch_keeps_transformers_modules_and_loss(tmp_path):
    """LLaMA-Factory's apply_liger_kernel lists the model types it patches; Phi-2 (model_type phi) is not one:
    it logs "Current model does not support liger kernel." and the step is transformers' own."""
    path = tmp_path / "lf.yaml"
    path.write_text("model_name_or_path: microsoft/phi-2\nstage: sft\nbf16: true\nenable_liger_kernel: true\n")
    t = translate_file(path)
    s = setup_from(t)
    assert (t.model, s.loss.value, s.kernels.value) == ("phi-2", "standard", "eager")
    assert any("does not patch model type 'phi'" in note for _, note in t.approximated)
    path.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nbf16: true\nenable_liger_kernel: true\n")
    s = setup_from(translate_file(path))
    assert (s.loss.value, s.kernels.value) == ("fused", "liger")


@pytest.mark.parametrize("text, says", [
    ("stage: dpo\n", "lf.yaml:3: stage: 'dpo': reward modelling and preference training"),
    ("quantization_bit: 8\n", "lf.yaml:4: quantization_bit: 8-bit training is not modelled"),
    ("finetuning_type: freeze\n", "lf.yaml:4: finetuning_type: 'freeze' (freezing layers) is not modelled"),
    ("finetuning_type: lroa\n", "finetuning_type: 'lroa' is not one of LLaMA-Factory's lora, oft, freeze, full; did "
     "you mean lora?"),  # a typo was described as the unmodelled freeze/OFT
    ("finetuning_type: full\nquantization_bit: 4\n", "quantization_bit: a 4-bit model trains only through adapters"),
    ("quantization_bit: 4\nquantization_method: hqq\n", "quantization_method: only bitsandbytes 4-bit"),
    ("use_galore: true\n", "lf.yaml:4: use_galore: this way of training a subset of the weights is not modelled"),
    ("fp16: true\n", "fp16: contradicts bf16: true"),
    ("flash_attn: fast\n", "flash_attn: 'fast' is not a LLaMA-Factory attention"),
])
def test_what_is_not_modelled_is_refused_naming_the_line(tmp_path, text, says):
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)").replace("'", "'")):
        _setup(tmp_path, text)


def test_a_file_of_two_tools_is_refused(tmp_path):
    path = tmp_path / "both.yaml"
    path.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\ncutoff_len: 1024\nuse_peft: true\n")
    with pytest.raises(ConfigError, match="has LLaMA-Factory keys \\(cutoff_len\\) and TRL keys \\(use_peft\\)"):
        translate_file(path)


def test_a_misspelled_key_is_a_warning_with_the_right_name(tmp_path, capsys):
    path = tmp_path / "lf.yaml"
    path.write_text(HEAD + "finetuning_type: lora\ncutof_len: 4096\n")
    assert main(["estimate", "--from", str(path), "--gpu", "rtx-4090", "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert "unknown key 'cutof_len'" in err and "cutoff_len" in err
    assert "LLaMA-Factory 0.9.5" in err


def test_estimate_from_a_llamafactory_file_equals_the_same_flags(capsys):
    assert main(["estimate", "--from", str(FIXTURE), "--gpu", "rtx-4090", "--format", "json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--method", "qlora", "--double-quant",
                 "--lora-rank", "16", "--lora-alpha", "32", "--accum", "8", "--grad-ckpt", "--kbit-prep", "none",
                 "--recipe", "trainer", "--format", "json"]) == 0
    flags = json.loads(capsys.readouterr().out)
    assert from_file["memory"] == flags["memory"] and from_file["time"]["step_s"] == flags["time"]["step_s"]


def test_every_llamafactory_row_is_a_key_of_its_schema():
    keys = table.schema()["llamafactory"]["keys"]
    assert table.version("llamafactory") == "0.9.5" and table.schema()["llamafactory"]["transformers"] == "5.6.0"
    assert {"cutoff_len", "finetuning_type", "quantization_bit", "per_device_train_batch_size", "warmup_ratio"} <= set(keys)
    assert all(r.key in keys for r in table.rows("llamafactory"))
    assert keys["double_quantization"] is True and keys["lora_rank"] == 8 and keys["cutoff_len"] == 2048
