"""torchtune configs in (issue 33): ``tune run`` recipe YAMLs read with torchtune 0.6.1's own keys and defaults
(``reportgen/configs/torchtune.py``), section keys as ``section.key``, and what it does not model refused naming
the file, the line and the key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reportgen import catalog
from reportgen.cli import main
from reportgen.configs import ConfigError, setup_from, table, torchtune, translate_file
from reportgen.setup import TrainingSetup

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
LORA = FIXTURES / "torchtune_lora_single_device.yaml"
QLORA = FIXTURES / "torchtune_qlora_single_device.yaml"
FULL = """model:
  _component_: torchtune.models.llama3_2.llama3_2_1b
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  max_seq_len: 1024
dataset:
  _component_: torchtune.datasets.alpaca_dataset
  packed: true
optimizer:
  _component_: bitsandbytes.optim.PagedAdamW8bit
  lr: 2e-5
loss:
  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss
batch_size: 4
gradient_accumulation_steps: 1
optimizer_in_bwd: true
compile: false
enable_activation_checkpointing: false
dtype: bf16
"""
DEFAULTS = TrainingSetup().model_dump(mode="json")


def _write(tmp_path, text: str, name: str = "tt.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_lora_single_device_config_field_by_field():
    """torchtune's llama3_1/8B_lora_single_device.yaml with compile, offloading and max_seq_len 2048: pure bf16 (no
    autocast), adapters on q, v, o and the MLP, the chunked loss compiled with the model (``compile: true``:
    ``training.compile_loss``), torchtune's own loop."""
    t = translate_file(LORA)
    s = setup_from(t)
    assert (t.tool, t.model) == ("torchtune", "llama-3.1-8b")
    assert s.model_dump(mode="json") == {**DEFAULTS, **{
        "method": "lora", "precision": "bf16", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0,
        "lora_targets": "q,v,o,gate,up,down", "dora": False, "batch": 2, "accum": 8, "seq": 2048,
        "padding": "longest", "grad_ckpt": True, "act_offload": True, "compile": True,
        "loss": "chunked-compiled", "optimizer": "adamw", "attn": "sdpa", "modeling": "torchtune",
        "rope_positions": 131072}}
    assert not t.unknown and not t.approximated
    assert t.not_modelled == [("optimizer.fused", table.row("torchtune", "optimizer.fused").note)]
    assert {"optimizer.lr", "checkpointer.output_dir", "profiler.enabled", "seed"} <= set(t.ignored)
    accounted = set(t.honoured) | set(t.ignored) | {k for k, _ in t.not_modelled} | {k for k, _ in t.approximated}
    assert accounted == set(t.present)
    assert t.where("model.lora_rank").endswith(":10")


def test_the_qlora_config():
    """qlora_llama3_1_8b is partial(lora_llama3_1_8b, quantize_base=True): NF4 base linears (torchao's, modelled with
    double quantization), the head in bf16, nothing prepared for k-bit training; packed rows."""
    t = translate_file(QLORA)
    s = setup_from(t)
    assert s.model_dump(mode="json") == {**DEFAULTS, **{
        "method": "qlora", "quant": "nf4", "double_quant": True, "kbit_prep": "none", "quant_head": False,
        "precision": "bf16", "lora_rank": 16, "lora_alpha": 32, "lora_targets": "q,v,o,gate,up,down", "batch": 1,
        "accum": 8, "seq": 2048, "padding": "packed", "grad_ckpt": True, "loss": "chunked", "modeling": "torchtune",
        "rope_positions": 131072}}
    assert [k for k, _ in t.approximated] == ["model._component_"]


def test_a_full_finetune_with_the_optimizer_in_backward(tmp_path):
    s = setup_from(translate_file(_write(tmp_path, FULL)))
    assert s.model_dump(mode="json") == {**DEFAULTS, **{
        "method": "full", "precision": "bf16", "optimizer": "paged-adamw-8bit", "optimizer_in_backward": True,
        "batch": 4, "seq": 1024, "padding": "packed", "loss": "chunked", "modeling": "torchtune",
        "rope_positions": 131072}}


def test_the_distributed_recipe_shards_with_fsdp(tmp_path):
    """torchtune's distributed recipes shard with FSDP2: --gpus over any file is FSDP (there is no DDP recipe);
    fsdp_cpu_offload offloads the parameters and needs --gpus."""
    t = translate_file(LORA)
    s = setup_from(t, {"gpus": 4})
    assert (s.gpus, s.sharding.value, s.offload.value) == (4, "fsdp", "none")
    path = _write(tmp_path, FULL.replace("optimizer_in_bwd: true", "optimizer_in_bwd: false")
                  .replace("PagedAdamW8bit", "PagedAdamW") + "fsdp_cpu_offload: true\nfsdp_reshard_after_forward: false\n")
    t = translate_file(path)
    with pytest.raises(ConfigError, match=r"fsdp_cpu_offload: shards over several GPUs"):
        setup_from(t)
    s = setup_from(t, {"gpus": 8})
    assert (s.sharding.value, s.offload.value, s.optimizer.value) == ("shard-grad-op", "params", "paged-adamw")


@pytest.mark.parametrize("change, says", [
    (("lora_llama3_1_8b", "lora_llama3_1_8c"), r"tt.yaml:6: model._component_: 'torchtune.models.llama3_1.lora_llama3_1"
     r"_8c' is not a model builder of torchtune 0.6.1.*did you mean torchtune.models.llama3_1.lora_llama3_1_8b"),
    (("batch_size: 2", "batch_size: 0"), r"tt.yaml:\d+: batch_size: must be at least 1 \(got 0\)"),
    (("batch_size: 2", "batch_size: two"), r"tt.yaml:\d+: batch_size: must be a whole number, 1 or more, in digits \(got 'two'\)"),
    (("lora_rank: 8", "lora_rank: [8]"), r"tt.yaml:10: model.lora_rank: must be a whole number"),
    (("dtype: bf16", "dtype: fp16"), r"dtype: fp16 is refused by torchtune's fine-tuning recipes"),
    (("enable_activation_checkpointing: True", "enable_activation_checkpointing: False"),
     r"enable_activation_offloading: needs enable_activation_checkpointing: true"),
    (("torchtune.modules.loss.CEWithChunkedOutputLoss", "torchtune.rlhf.loss.DPOLoss"),
     r"loss._component_: a preference or RL loss"),
    (("loss:\n  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n", ""),
     r"tt.yaml: loss: no loss section: the recipe instantiates cfg.loss"),  # was "loss: None is not modelled"
    (("torch.optim.AdamW", "torch.optim.Adagrad"), r"optimizer._component_: 'torch.optim.Adagrad' is not modelled"),
    (("max_seq_len: 2048", "max_seq_len: ${seq}"), r"tokenizer.max_seq_len: '\$\{seq\}': an OmegaConf interpolation"),
    (("  lora_alpha: 16\n", ""), None),
    (("  lora_rank: 8\n", ""), r"tt.yaml:5: model: lora_rank is missing: torchtune's LoRA recipes read"),
    (("max_seq_len: 2048", "max_seq_len: null"), r"tokenizer.max_seq_len: null: the tokenizer does not truncate.*"
     r"--seq N"),
])
def test_bad_input_is_refused_with_file_and_line(tmp_path, change, says):
    text = LORA.read_text().replace(*change)
    if says is None:  # lora_alpha missing
        says = r"tt.yaml:5: model: lora_alpha is missing"
    with pytest.raises(ConfigError, match="(?s)" + says) as exc:
        setup_from(translate_file(_write(tmp_path, text)))
    assert "Traceback" not in str(exc.value)


def test_an_interpolation_of_another_key_is_resolved(tmp_path):
    text = "seq_len: 4096\n" + LORA.read_text().replace("max_seq_len: 2048", "max_seq_len: ${seq_len}")
    assert setup_from(translate_file(_write(tmp_path, text))).seq == 4096


def test_a_null_length_takes_seq_from_the_flags(tmp_path):
    t = translate_file(_write(tmp_path, LORA.read_text().replace("max_seq_len: 2048", "max_seq_len: null")))
    assert setup_from(t, {"seq": 512}).seq == 512


def test_other_recipes_configs_are_refused(tmp_path):
    path = _write(tmp_path, FULL + "teacher_model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\n")
    with pytest.raises(ConfigError, match=r"teacher_model._component_: a knowledge distillation"):
        translate_file(path)


def test_cli_end_to_end_and_exit_2(tmp_path, capsys):
    assert main(["estimate", "--from", str(LORA), "--gpu", "rtx-4090", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert d["setup"]["loss"] == "chunked-compiled" and d["setup"]["act_offload"] is True
    assert "torchtune 0.6.1 keys" in err
    path = _write(tmp_path, LORA.read_text().replace("batch_size: 2", "batch_size: 0"))
    assert main(["estimate", "--from", str(path), "--gpu", "rtx-4090"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"error: .*tt.yaml:\d+: batch_size: must be at least 1", err) and "Traceback" not in err


def test_a_builder_without_a_catalog_model_needs_model(tmp_path, capsys):
    path = _write(tmp_path, LORA.read_text().replace("llama3_1.lora_llama3_1_8b", "mistral.lora_mistral_7b"))
    assert main(["estimate", "--from", str(path), "--gpu", "rtx-4090"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"error: .*tt.yaml:6: model._component_: lora_mistral_7b: reportgen has no catalog model", err)
    assert "--model ORG/NAME" in err and "Traceback" not in err
    assert main(["estimate", "--from", str(path), "--model", "mistral-7b-v0.3", "--gpu", "rtx-4090",
                 "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["method"] == "lora"


def test_a_misspelled_key_is_a_warning_with_the_right_name(tmp_path, capsys):
    path = _write(tmp_path, LORA.read_text() + "enable_activation_checkpoint: true\nfsdp:\n  cpu_offload: true\n")
    assert main(["estimate", "--from", str(path), "--gpu", "rtx-4090", "--format", "json"]) == 0
    err = capsys.readouterr().err
    assert "unknown key 'enable_activation_checkpoint'" in err and "did you mean enable_activation_checkpointing" in err
    assert "unknown key 'fsdp.cpu_offload'" in err and "fsdp_cpu_offload" in err


def test_every_catalog_builder_has_the_catalog_models_shapes():
    """The builders CATALOG maps are checked against the literal shapes the builders pass (keys.json, read from
    the wheel) and the catalog's config.json."""
    shapes = table.schema()["torchtune"]["shapes"]
    names = {"vocab_size": "vocab_size", "num_layers": "num_layers", "embed_dim": "hidden_size",
             "num_heads": "num_heads", "num_kv_heads": "num_kv_heads", "intermediate_dim": "intermediate_size"}
    for builder, model in torchtune.CATALOG.items():
        path = next(p for p in shapes if p.endswith("." + builder))
        spec = catalog.load_model(model)
        for ours, theirs in names.items():
            if shapes[path].get(ours) is not None:
                assert shapes[path][ours] == getattr(spec, theirs), (builder, ours)


def test_every_torchtune_row_is_a_key_of_its_schema():
    tt = table.schema()["torchtune"]
    # CPUOffloadOptimizer's optimizer_class is torchao's argument (torchao is not in torchtune's wheel)
    assert tt["version"] == "0.6.1" and all(r.key in tt["keys"] for r in table.rows("torchtune")
                                            if r.key != "optimizer.optimizer_class")
    assert tt["keys"]["dataset.packed"] is False and tt["keys"]["enable_activation_checkpointing"] is False
    assert tt["builders"]["torchtune.models.llama3_1.qlora_llama3_1_8b"]["quantize_base"] is True
    assert "compile" in tt["required"]["lora_finetune_single_device"]


@pytest.mark.parametrize("builder, model", [("phi3.lora_phi3_mini", "phi-3-mini"), ("phi4.qlora_phi4_14b", "phi-4")])
def test_phi_builders_train_the_hf_models_fused_modules(tmp_path, capsys, builder, model):
    """torchtune's phi3/phi4 builders (``models/phi3/_component_builders.py`` ``lora_phi3``: separate q/k/v_proj,
    MLP w1/w2/w3) read as the HF Phi-3 model's modules (fused ``qkv_proj`` and ``gate_up_proj``, ``down_proj``):
    ``apply_lora_to_mlp`` is gate_up and down, not gate/up/down (which phi-3 does not have): the shipped
    ``phi3/mini_lora_single_device.yaml`` (q, v, output_proj and the MLP) is estimated."""
    path = _write(tmp_path, LORA.read_text().replace("llama3_1.lora_llama3_1_8b", builder))
    t = translate_file(path)
    assert t.model == model and setup_from(t).lora_targets == "q,v,o,gate_up,down"
    assert any("fused" in why for _, why in t.approximated)
    assert main(["estimate", "--from", str(path), "--gpu", "h100-sxm", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["lora_targets"] == "q,v,o,gate_up,down"
    every = LORA.read_text().replace("llama3_1.lora_llama3_1_8b", builder).replace(
        "lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']", "lora_attn_modules: [q_proj, k_proj, v_proj, output_proj]")
    assert setup_from(translate_file(_write(tmp_path, every))).lora_targets == "all-linear"


@pytest.mark.parametrize("builder", ["llama3_3_70b", "lora_llama3_3_70b", "qlora_llama3_3_70b"])
def test_the_llama3_3_builders_are_llama3_1s(tmp_path, builder):
    """``llama3_3/_model_builders.py`` assigns llama3_1's builders (``lora_llama3_3_70b = lora_llama3_1_70b``): keys.json
    holds them with llama3_1's arguments and shapes, and the shipped llama3_3 configs read as Llama 3.1 70B."""
    tt = table.schema()["torchtune"]
    name = f"torchtune.models.llama3_3.{builder}"
    assert tt["builders"][name] == tt["builders"][name.replace("3_3", "3_1")]
    assert tt["shapes"][name] == tt["shapes"][name.replace("3_3", "3_1")]
    text = LORA.read_text().replace("llama3_1.lora_llama3_1_8b", f"llama3_3.{builder}")
    t = translate_file(_write(tmp_path, text))
    assert t.model == "llama-3.1-70b" and any("Llama 3.3 70B" in why for _, why in t.approximated)


GEMMA2_2B = LORA.read_text().replace("llama3_1.lora_llama3_1_8b", "gemma2.lora_gemma2_2b")


def _gemma2(tmp_path, config: dict | None, name: str = "gemma-2-2b") -> Path:
    """The LoRA config on lora_gemma2_2b, its FullModelHFCheckpointer's checkpoint_dir a folder as ``tune download``
    leaves it (its config.json; none: the folder is not on this machine)."""
    folder = tmp_path / name
    if config is not None:
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config))
    return _write(tmp_path, GEMMA2_2B.replace("checkpoint_dir: /tmp/Meta-Llama-3.1-8B-Instruct/",
                                              f"checkpoint_dir: {folder}/"))


def _gemma2_2b_config() -> dict:
    """Gemma 2's config.json (the catalog's gemma-2-9b) with the shapes torchtune's gemma2_2b builder passes
    (keys.json, read from the wheel)."""
    shapes = table.schema()["torchtune"]["shapes"]["torchtune.models.gemma2.gemma2_2b"]
    config = json.loads((Path(catalog.__file__).parent / "models" / "gemma-2-9b.json").read_text())
    return {**config, "hidden_size": shapes["embed_dim"], "num_hidden_layers": shapes["num_layers"],
            "num_attention_heads": shapes["num_heads"], "num_key_value_heads": shapes["num_kv_heads"],
            "intermediate_size": shapes["intermediate_dim"], "head_dim": shapes["head_dim"]}


def test_a_builder_without_a_catalog_model_names_the_checkpoint_to_give(tmp_path, capsys):
    """The shipped gemma2/2B_lora_single_device.yaml: no catalog model has lora_gemma2_2b's shapes and its
    checkpoint_dir is not on this machine: exit 2, naming the Hub id torchtune's own configs download for it."""
    path = _gemma2(tmp_path, None)
    assert main(["estimate", "--from", str(path), "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert "lora_gemma2_2b: reportgen has no catalog model" in err and "--model google/gemma-2-2b" in err
    assert "Traceback" not in err


def test_a_builder_without_a_catalog_model_reads_its_hf_checkpoints_config(tmp_path, capsys):
    """FullModelHFCheckpointer reads checkpoint_dir/config.json (torchtune ``training/checkpointing/_checkpointer.py``):
    where that folder is on this machine, its config.json is the model, its shapes checked against the builder's."""
    path = _gemma2(tmp_path, _gemma2_2b_config())
    t = translate_file(path)
    assert t.model == str(tmp_path / "gemma-2-2b" / "config.json")
    assert "checkpointer.checkpoint_dir" in t.honoured
    assert main(["estimate", "--from", str(path), "--gpu", "h100-sxm", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["lora_targets"] == "q,v,o,gate,up,down"
    wrong = {**_gemma2_2b_config(), "num_hidden_layers": 42}
    path = _gemma2(tmp_path, wrong, "gemma-2-9b-layers")
    assert main(["estimate", "--from", str(path), "--gpu", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"checkpointer.checkpoint_dir: .*num_hidden_layers 42.* lora_gemma2_2b .*26", err), err
    assert "Traceback" not in err


def test_a_missing_checkpoint_folder_is_not_reported_as_read(tmp_path):
    """Where checkpoint_dir holds no config.json, the key did nothing: it is listed as ignored, not honoured."""
    t = translate_file(_gemma2(tmp_path, None))
    assert t.model is None and "checkpointer.checkpoint_dir" in t.ignored and not t.read_from


def test_torchtunes_vision_builders_are_refused_even_with_model(tmp_path, capsys):
    """llama3_2_vision's builders are torchtune's DeepFusionModel (``models/llama3_2_vision/_component_builders.py``:
    a CLIP image encoder, fusion cross-attention layers, ``decoder_trainable``/``encoder_trainable``/
    ``fusion_trainable``): a text model given as --model would be a silently wrong estimate, so exit 2."""
    text = LORA.read_text().replace("llama3_1.lora_llama3_1_8b", "llama3_2_vision.lora_llama3_2_vision_11b")
    path = _write(tmp_path, text.replace("  lora_rank:", "  encoder_trainable: lora\n  lora_rank:", 1))
    for extra in ([], ["--model", "llama-3.1-8b"]):
        assert main(["estimate", "--from", str(path), "--gpu", "h100-sxm", *extra]) == 2
        err = capsys.readouterr().err
        assert "model._component_: lora_llama3_2_vision_11b: a vision-language model" in err
        assert "Traceback" not in err
