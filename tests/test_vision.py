"""Issue 28: multimodal checkpoints whose language model is a supported family (Gemma 3 4B/12B/27B,
``model_type: gemma3`` with a SigLIP vision tower; Mistral Small 3.1/3.2, ``mistral3`` with a Pixtral
tower and a patch-merging projector). The tower's parameters are pinned to the modules
transformers builds on the meta device, peft's adapters on it to peft's own count, and the estimate
of the whole checkpoint to the trace of ``Gemma3ForConditionalGeneration`` (the tracer builds the
checkpoint's own class from the config)."""

from __future__ import annotations

import pytest

from reportgen import catalog
from reportgen.errors import UserError
from reportgen.model import from_config
from reportgen.setup import TrainingSetup

#: the SigLIP tower of the released Gemma 3 4B, 12B and 27B (their vision_config: 1152 wide, 27
#: layers, 896-pixel images in 14-pixel patches, no pooling head), before a 2-layer cut of the 1B's
#: language model at its real widths
GEMMA3_VISION = {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                 "num_hidden_layers": 27, "num_attention_heads": 16, "image_size": 896, "patch_size": 14,
                 "vision_use_head": False}


def multimodal(layers: int = 2, **vision) -> dict:
    text = dict(catalog.load_model("gemma-3-1b").config, num_hidden_layers=layers)
    text["layer_types"] = text.get("layer_types", [])[:layers] or None
    text = {k: v for k, v in text.items() if v is not None}
    return {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text,
            "vision_config": {**GEMMA3_VISION, **vision}, "mm_tokens_per_image": 256}


@pytest.mark.parametrize("head", [False, True])
def test_the_towers_parameters_are_transformers(head):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = multimodal(vision_use_head=head, num_hidden_layers=3, hidden_size=96, intermediate_size=160,
                        image_size=64, patch_size=8, num_attention_heads=4)
    spec = from_config(config, name="t")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.Gemma3Config(**config))
    tower = {n: p.numel() for n, p in model.named_parameters() if ".vision_tower." in n or ".multi_modal_projector." in n}
    linears = sum(m.weight.numel() for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and ".vision_tower." in n)
    assert spec.vision.params == sum(tower.values())
    assert spec.vision.linear_weight_params == linears  # what bitsandbytes packs to 4 bits
    assert spec.total_params == sum(p.numel() for n, p in model.named_parameters() if n not in tower)


#: Mistral Small 3.1's Pixtral tower at its real widths (1024 wide, 24 layers, 1540-pixel images)
PIXTRAL = {"model_type": "pixtral", "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
           "num_attention_heads": 16, "head_dim": 64, "image_size": 1540, "patch_size": 14}


def mistral3(bias: bool = False, **vision) -> dict:
    text = dict(catalog.load_model("mistral-7b-v0.3").config, num_hidden_layers=2)
    return {"model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"], "text_config": text,
            "vision_config": {**PIXTRAL, **vision}, "spatial_merge_size": 2, "multimodal_projector_bias": bias}


@pytest.mark.parametrize("bias, tied", [(False, None), (True, False)])
def test_the_pixtral_towers_parameters_are_transformers(bias, tied):
    """Also the head: tied unless the checkpoint's own (top-level) tie_word_embeddings says false."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = mistral3(bias, num_hidden_layers=2, hidden_size=96, intermediate_size=160, num_attention_heads=4,
                      head_dim=24, image_size=112)
    if tied is not None:
        config["tie_word_embeddings"] = tied
    spec = from_config(config, name="t")
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(transformers.Mistral3Config(**config))
    tower = {n: p.numel() for n, p in model.named_parameters() if ".vision_tower." in n or ".multi_modal_projector." in n}
    linears = sum(m.weight.numel() for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and (".vision_tower." in n or ".multi_modal_projector." in n))
    assert spec.vision.params == sum(tower.values())
    assert spec.vision.linear_weight_params == linears
    assert spec.total_params == sum(p.numel() for n, p in model.named_parameters() if n not in tower)


@pytest.mark.parametrize("kind", ["gemma3", "mistral3"])
@pytest.mark.parametrize("targets", ["qv", "attn", "all-linear"])
def test_peft_adapts_the_towers_linears_as_counted(targets, kind):
    """peft matches target names by suffix over the whole model: q_proj/v_proj reach the tower (and
    Pixtral's o_proj and MLP names are the language model's), all-linear every linear of it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from reportgen.estimate.params import vision_lora_params
    from reportgen.measure.build import lora_target_modules
    from peft import LoraConfig, get_peft_model

    small = dict(num_hidden_layers=2, hidden_size=96, intermediate_size=160, num_attention_heads=4)
    if kind == "gemma3":
        config = multimodal(**small, image_size=64, patch_size=8)
        cls, auto = transformers.Gemma3Config, transformers.AutoModelForCausalLM
    else:
        config = mistral3(**small, head_dim=24, image_size=112)
        cls, auto = transformers.Mistral3Config, transformers.AutoModelForImageTextToText
    spec = from_config(config, name="t")
    with torch.device("meta"):
        model = auto.from_config(cls(**config))
        peft = get_peft_model(model, LoraConfig(r=8, target_modules=lora_target_modules(spec, targets)))
    in_tower = sum(p.numel() for n, p in peft.named_parameters()
                   if "lora_" in n and (".vision_tower." in n or ".multi_modal_projector." in n))
    assert vision_lora_params(spec, TrainingSetup(method="lora", lora_rank=8, lora_targets=targets)) == in_tower > 0


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_the_estimate_of_the_whole_checkpoint_agrees_with_its_trace(method):
    """Peak allocated within 1% of the traced ``Gemma3ForConditionalGeneration`` (its real 400M-param
    tower, the 1B's language model cut to 2 layers): the tower adds weights (4-bit linears under
    QLoRA) and never-updated adapters, and nothing else."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    from reportgen.estimate.memory import estimate_memory
    from reportgen.trace.result import trace_case

    spec = from_config(multimodal(), name="gemma-3-4b-tower-2-layers")
    gpu = catalog.load_gpu("h100-sxm")
    setup = TrainingSetup(method=method, grad_ckpt=True, seq=512)
    traced = trace_case(spec, gpu, setup).replay.peak_allocated
    analytic = estimate_memory(spec, setup, gpu).peak_allocated
    assert abs(analytic - traced) / traced <= 0.01, (analytic, traced)


def test_the_estimate_says_what_it_covers():
    from reportgen.estimate import estimate

    spec = from_config(multimodal(), name="mm")
    text = from_config(multimodal()["text_config"], name="text")
    gpu = catalog.load_gpu("rtx-4090")
    for method in ("lora", "qlora", "full"):
        setup = TrainingSetup(method=method, seq=512)
        mm, alone = estimate(spec, gpu, setup, reverse=False), estimate(text, gpu, setup, reverse=False)
        assert mm.params_total == text.total_params + spec.vision.params
        assert mm.memory.terms["weights"] > alone.memory.terms["weights"]
        for term in ("activations", "gradients", "optimizer", "logits"):  # the tower does not run
            assert mm.memory.terms[term] == alone.memory.terms[term], (method, term)
        assert any("mm is multimodal" in n and f"{spec.vision.params:,} parameters" in n for n in mm.notes)


@pytest.mark.parametrize("field, value, needle", [
    ("vision_config", "big", "vision_config must be a mapping"),
    ("vision_config", {"model_type": "pixtral"}, "vision_config.model_type 'pixtral' is not modelled"),
    ("vision_config", {"hidden_size": -4}, "vision_config.hidden_size must be a whole number"),
    ("vision_config", {"num_hidden_layers": "27"}, "vision_config.num_hidden_layers must be a whole number"),
])
def test_a_bad_vision_config_names_its_key(field, value, needle):
    config = multimodal()
    config[field] = value
    with pytest.raises(UserError, match=needle):
        from_config(config, name="t")
