"""Parameter counts from the shipped configs must equal the published totals exactly."""

import json
from pathlib import Path

import pytest

from reportgen import catalog
from reportgen.errors import UserError

# Totals as published on each model's Hugging Face page (safetensors metadata) / in the issue.
# The families added for issue 9, with where each exact figure is published (each also equals the
# parameter count of the transformers 5.23 model built from the same config on the meta device):
NEW_FAMILIES = {
    # keras-nlp ``models/gemma/gemma_presets.py``: gemma_2b_en "params": 2506172416,
    # gemma_7b_en "params": 8537680896 (Google's Keras presets of the same checkpoints)
    "gemma-2b": 2_506_172_416,
    "gemma-7b": 8_537_680_896,
    # Hugging Face API for google/gemma-3-1b-it: "safetensors": {"total": 999885952}; keras-hub
    # ``gemma3_presets.py`` gemma3_1b (text-only) "params": 999885952
    "gemma-3-1b": 999_885_952,
    # Qwen/Qwen3-8B ``model.safetensors.index.json`` "total_size": 16381470720 bytes of BF16 = 2 x
    # 8,190,735,360 (Hugging Face API: "safetensors": {"total": 8190735360})
    "qwen3-8b": 8_190_735_360,
    # Qwen/Qwen3-30B-A3B ``model.safetensors.index.json`` "total_size": 61064245248 bytes of BF16
    # (llama.cpp's GGUF general.parameter_count of the same model: 30532122624)
    "qwen3-30b-a3b": 30_532_122_624,
    # microsoft/phi-2 ``model.safetensors.index.json`` "total_size": 5559367680 bytes of FP16
    # (Hugging Face API: "safetensors": {"parameters": {"F16": 2779683840}})
    "phi-2": 2_779_683_840,
    # microsoft/phi-4 ``model.safetensors.index.json`` "total_size": 29319014400 bytes of BF16
    # (GGUF general.parameter_count of microsoft/phi-4: 14659507200)
    "phi-4": 14_659_507_200,
    # Hugging Face API for allenai/OLMo-2-1124-7B: "safetensors": {"parameters": {"F32": 7298617344}}
    "olmo-2-7b": 7_298_617_344,
}

PUBLISHED = NEW_FAMILIES | {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "tinyllama-1.1b": 1_100_048_384,
    "mistral-7b-v0.3": 7_248_023_552,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-14b": 14_770_033_664,
    "gemma-2-9b": 9_241_705_984,
    "phi-3-mini": 3_821_079_552,
    "mixtral-8x7b": 46_702_792_704,
}


def test_catalog_has_every_required_model():
    assert sorted(PUBLISHED) == catalog.model_names()


@pytest.mark.parametrize("name,total", sorted(PUBLISHED.items()))
def test_total_params_match_published(name, total):
    spec = catalog.load_model(name)
    assert spec.total_params == total
    assert sum(spec.components().values()) == total


def test_llama2_7b_components():
    c = catalog.load_model("llama-2-7b").components()
    assert c == {"embeddings": 131_072_000, "attention": 2_147_483_648, "mlp": 4_328_521_728,
                 "norms": 266_240, "head": 131_072_000}


def test_tied_embeddings_have_no_head():
    assert catalog.load_model("llama-3.2-1b").components()["head"] == 0
    assert catalog.load_model("gemma-2-9b").components()["head"] == 0
    # GemmaConfig and Gemma3TextConfig tie by default: the configs do not say it
    for name in ("gemma-7b", "gemma-3-1b"):
        spec = catalog.load_model(name)
        assert "tie_word_embeddings" not in spec.config and spec.components()["head"] == 0


def test_families_of_the_new_models():
    family = {name: catalog.load_model(name).family for name in NEW_FAMILIES}
    assert family == {"gemma-2b": "gemma", "gemma-7b": "gemma", "gemma-3-1b": "gemma3", "qwen3-8b": "qwen3",
                      "qwen3-30b-a3b": "qwen3_moe", "phi-2": "phi", "phi-4": "phi3", "olmo-2-7b": "olmo2"}


def test_qk_norm_widths():
    # Qwen3Attention / Gemma3Attention: q_norm and k_norm over head_dim; Olmo2Attention: over the
    # whole q (nq*hd) and k (nkv*hd) width
    assert catalog.load_model("qwen3-8b").qk_norm_widths == (128, 128)
    assert catalog.load_model("gemma-3-1b").qk_norm_widths == (256, 256)
    assert catalog.load_model("olmo-2-7b").qk_norm_widths == (4096, 4096)
    assert catalog.load_model("gemma-7b").qk_norm_widths is None


def test_gemma3_1b_norms():
    # 26 layers x (4 x 1152 + 2 x 256) + final 1152 = 134,272
    assert catalog.load_model("gemma-3-1b").components()["norms"] == 26 * (4 * 1152 + 2 * 256) + 1152


def test_phi2_biases_layernorm_and_head_bias():
    spec = catalog.load_model("phi-2")
    assert {lin.name for lin in spec.layer_linears() if lin.bias} == {"q_proj", "k_proj", "v_proj", "dense",
                                                                       "fc1", "fc2"}
    assert spec.components()["norms"] == 33 * 2 * 2560  # 32 layers + final, weight and bias
    assert spec.components()["head"] == 51200 * 2560 + 51200  # lm_head has a bias
    assert spec.rotary_dim == 32  # 80 x partial_rotary_factor 0.4
    assert spec.resid_dropout == 0.1


def test_qwen3_moe_experts_router_and_active_params():
    spec = catalog.load_model("qwen3-30b-a3b")
    assert spec.intermediate_size == 768  # moe_intermediate_size, not the dense intermediate_size
    assert (spec.num_experts, spec.experts_per_token, spec.norm_topk_prob) == (128, 8, True)
    # third-party exact count of the active parameters (Qwen's model card: "3.3B activated")
    assert spec.active_params == 3_353_032_704


def test_qwen3_moe_with_dense_layers_is_refused(tmp_path):
    cfg = dict(catalog.load_model("qwen3-30b-a3b").config, mlp_only_layers=[0, 1])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(UserError) as exc:
        catalog.load_model(str(path))
    assert "mlp_only_layers" in str(exc.value)


def test_multimodal_gemma3_errors_name_the_text_config(tmp_path):
    """The multimodal Gemma 3 is estimated from its text_config (tests/test_vision.py); an empty or
    missing one is an error that says where the language model belongs."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"},
                                "vision_config": {}}))
    with pytest.raises(UserError, match=r"\(text_config\)"):
        catalog.load_model(str(path))
    path.write_text(json.dumps({"model_type": "gemma3", "hidden_size": 2560}))
    with pytest.raises(UserError, match="holds its language model under text_config"):
        catalog.load_model(str(path))


def test_lora_targets_of_phi2():
    spec = catalog.load_model("phi-2")
    names = {t: {lin.name for lin in spec.layer_linears() if t in lin.lora_sets} for t in ("qv", "attn", "all-linear")}
    assert names == {"qv": {"q_proj", "v_proj"}, "attn": {"q_proj", "k_proj", "v_proj", "dense"},
                     "all-linear": {"q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"}}


def test_qwen2_has_qkv_bias_only():
    spec = catalog.load_model("qwen2.5-7b")
    biased = {lin.name for lin in spec.layer_linears() if lin.bias}
    assert biased == {"q_proj", "k_proj", "v_proj"}


def test_mixtral_active_params():
    # 2 of 8 experts per token: 12.9B active (Mistral AI's announcement: "12.9B active")
    assert 12_800_000_000 < catalog.load_model("mixtral-8x7b").active_params < 13_000_000_000


def test_lora_params_llama2_7b_r8_qv():
    # peft's print_trainable_parameters() for Llama-2-7b, r=8 on q_proj and v_proj: 4,194,304
    assert catalog.load_model("llama-2-7b").lora_params(8, "qv") == 4_194_304


def test_model_from_config_path(tmp_path):
    src = catalog.load_model("llama-3.2-1b").config
    path = tmp_path / "config.json"
    path.write_text(json.dumps(src))
    assert catalog.load_model(str(path)).total_params == PUBLISHED["llama-3.2-1b"]
    assert catalog.load_model(str(tmp_path)).total_params == PUBLISHED["llama-3.2-1b"]


def test_unknown_model_lists_close_names():
    with pytest.raises(UserError) as exc:
        catalog.load_model("llama-3.1-7b")
    assert "llama-3.1-8b" in str(exc.value)


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bert", "hidden_size": 1024}))
    with pytest.raises(UserError) as exc:
        catalog.load_model(str(path))
    assert "bert" in str(exc.value) and "llama" in str(exc.value)


def test_gpu_catalog_complete_and_cited():
    names = ["t4", "rtx-2080-ti", "titan-rtx", "rtx-3060", "rtx-4060-ti-16gb", "rtx-5060-ti-16gb", "rtx-3080",
             "rtx-3080-12gb", "rtx-3090", "rtx-3090-ti", "rtx-4080", "rtx-4080-super", "rtx-5070-ti", "rtx-5080", "rtx-4090", "rtx-5090",
             "rtx-a4000", "rtx-a5000", "rtx-a6000", "rtx-6000-ada", "rtx-pro-6000", "a10g", "a10", "l4", "l40s",
             "a100-40gb", "a100-80gb", "h100-pcie", "h100-nvl", "h100-sxm", "h200", "b200"]
    assert catalog.gpu_names() == names
    for name in names:
        gpu = catalog.load_gpu(name)
        assert gpu.sources, name
        assert gpu.memory_bytes >= 10 * 2**30  # the 10 GB RTX 3080 is the smallest card
    assert catalog.load_gpu("t4").peak_flops("bf16") is None


def test_unknown_gpu_suggests():
    with pytest.raises(UserError) as exc:
        catalog.load_gpu("rtx4090")
    assert "rtx-4090" in str(exc.value)


@pytest.mark.parametrize("quant, method, says", [
    ({"quant_method": "gptq", "bits": 4}, "full", "holds a quantization_config (gptq, 4-bit): that checkpoint loads "
                                                  "quantized, which this full estimate (16-bit base weights)"),
    ({"quant_method": "fp8"}, "lora", "quantization_config (fp8)"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "qlora", "it loads as QLoRA's base, as estimated"),
])
def test_a_checkpoint_saved_quantized_is_said_to_be(tmp_path, quant, method, says):
    """A config.json with a quantization_config was estimated as a plain 16-bit model without a word."""
    from reportgen import catalog
    from reportgen.estimate import estimate
    from reportgen.setup import TrainingSetup

    config = json.loads(Path("reportgen/catalog/models/llama-3.2-1b.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "quantization_config": quant}))
    est = estimate(catalog.load_model(str(path)), catalog.load_gpu("rtx-4090"), TrainingSetup(method=method, seq=256))
    assert any(says in n for n in est.notes), est.notes
    plain = estimate(catalog.load_model("llama-3.2-1b"), catalog.load_gpu("rtx-4090"), TrainingSetup(method=method))
    assert not any("quantization_config" in n for n in plain.notes)
