"""The vision tower of a multimodal checkpoint whose language model is a supported family.

Gemma 3 4B, 12B and 27B are released as one multimodal checkpoint (``Gemma3ForConditionalGeneration``:
``model_type: gemma3``, a ``text_config`` of ``model_type: gemma3_text`` and a SigLIP ``vision_config``).
Fine-tuned on text, the language model runs and the vision tower does not (no image tokens), but the
tower is loaded with the model, and the training libraries reach into it:

* its weights are on the GPU: every parameter, in the base dtype; under QLoRA its ``nn.Linear``
  weights are 4-bit like the language model's (transformers ``quantizers/base.py``
  ``get_keys_to_not_convert`` keeps only the output embedding, tied weights and the last module);
* peft matches ``target_modules`` by module-name suffix over the whole model, so ``q_proj`` and
  ``v_proj`` are adapted in the tower too, and ``"all-linear"`` adapts every ``nn.Linear`` of it
  (``tuners_utils._maybe_include_all_linear_layers`` leaves out only the output embedding);
* a full fine-tune trains it unless it is frozen: not modelled (the estimate says so).

Parameter counts follow transformers ``models/siglip/modeling_siglip.py`` (``SiglipVisionEmbeddings``:
a ``Conv2d`` patch embedding with bias and a position embedding per patch; ``SiglipEncoderLayer``:
two LayerNorms, q/k/v/out projections with bias, an MLP ``fc1``/``fc2`` with bias; a final LayerNorm;
``SiglipMultiheadAttentionPoolingHead`` when ``vision_use_head``) and ``models/gemma3/modeling_gemma3.py``
(``Gemma3MultiModalProjector``: ``mm_input_projection_weight`` vision x text hidden and an RMSNorm of
the vision width). ``tests/test_vision.py`` pins them to the modules built on the meta device.
Torch-free (the calculator runs it).
"""

from __future__ import annotations

from dataclasses import dataclass

from reportgen.errors import UserError

#: top-level model_type of a multimodal checkpoint -> the model_type of its language model
TEXT_TOWER = {"gemma3": "gemma3_text", "mistral3": "mistral"}
#: top-level model_type -> the vision tower it carries (``vision_config.model_type``)
TOWER_KIND = {"gemma3": "siglip_vision_model", "mistral3": "pixtral"}

#: the vision config classes' defaults (``SiglipVisionConfig``, ``PixtralVisionConfig``): a key a
#: ``vision_config`` leaves out takes these
DEFAULTS = {
    "siglip_vision_model": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_channels": 3,
                            "image_size": 224, "patch_size": 16, "vision_use_head": True},
    "pixtral": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_channels": 3,
                "image_size": 1540, "patch_size": 14, "vision_use_head": False},
}
#: the largest value each read key may have (far above any released tower): a typo is refused, not estimated
_LIMITS = {"hidden_size": 65_536, "intermediate_size": 262_144, "num_hidden_layers": 1_024, "num_channels": 64,
           "image_size": 16_384, "patch_size": 1_024}


@dataclass(frozen=True)
class VisionTower:
    """A vision tower and the projector into the language model's width."""

    kind: str  # "siglip_vision_model" (Gemma 3) or "pixtral" (Mistral 3)
    hidden: int
    intermediate: int
    layers: int
    channels: int
    image: int
    patch: int
    head: bool
    text_hidden: int
    merge: int = 2  # Mistral 3's patch merger: spatial_merge_size
    projector_bias: bool = False  # Mistral 3's multimodal_projector_bias

    def linears(self) -> list[tuple[str, int, int, int, bool]]:
        """``(peft name, in, out, how many, bias)`` of every ``nn.Linear`` of the tower and projector."""
        h, i, n = self.hidden, self.intermediate, self.layers
        if self.kind == "pixtral":  # PixtralAttention, PixtralMLP (no biases); Mistral3MultiModalProjector
            t, b = self.text_hidden, self.projector_bias
            return [("q_proj", h, h, n, False), ("k_proj", h, h, n, False), ("v_proj", h, h, n, False),
                    ("o_proj", h, h, n, False), ("gate_proj", h, i, n, False), ("up_proj", h, i, n, False),
                    ("down_proj", i, h, n, False), ("merging_layer", h * self.merge ** 2, h, 1, False),
                    ("linear_1", h, t, 1, b), ("linear_2", t, t, 1, b)]
        out = [("q_proj", h, h, n, True), ("k_proj", h, h, n, True), ("v_proj", h, h, n, True),
               ("out_proj", h, h, n, True), ("fc1", h, i, n, True), ("fc2", i, h, n, True)]
        if self.head:  # the pooling head: nn.MultiheadAttention's out_proj and an MLP
            out += [("out_proj", h, h, 1, True), ("fc1", h, i, 1, True), ("fc2", i, h, 1, True)]
        return out

    @property
    def params(self) -> int:
        """Every parameter of the tower and the projector (loaded with the model)."""
        h = self.hidden
        linears = sum(n * (a * b + (b if bias else 0)) for _, a, b, n, bias in self.linears())
        if self.kind == "pixtral":  # patch_conv (no bias), ln_pre, two RMSNorms a layer; the projector's norm
            return linears + self.channels * self.patch ** 2 * h + h + self.layers * 2 * h + h
        embeddings = self.channels * self.patch ** 2 * h + h + (self.image // self.patch) ** 2 * h
        norms = self.layers * 2 * 2 * h + 2 * h  # two LayerNorms a layer, the post LayerNorm
        head = (h + 3 * h * h + 3 * h + 2 * h) if self.head else 0  # probe, MHA in_proj, its LayerNorm
        projector = h * self.text_hidden + h  # mm_input_projection_weight and mm_soft_emb_norm
        return linears + embeddings + norms + head + projector

    @property
    def linear_weight_params(self) -> int:
        """The weights bitsandbytes packs to 4 bits under QLoRA (its ``nn.Linear`` weights, biases not)."""
        return sum(a * b * n for _, a, b, n, _ in self.linears())

    def lora_params(self, rank: int, names: frozenset, all_linear: bool) -> int:
        """LoRA's ``A`` and ``B`` on the tower's linears that peft's ``target_modules`` reach: every one
        for ``all-linear``, else those whose name is targeted (``q_proj``, ``v_proj``: the text names)."""
        return sum(rank * (a + b) * n for name, a, b, n, _ in self.linears() if all_linear or name in names)


def vision_tower(config: dict, text_hidden: int, source: str) -> VisionTower:
    """The tower of a multimodal ``config.json`` (its ``vision_config`` over its class's defaults); a
    ``UserError`` naming the key for a value that cannot be one."""
    vision = config.get("vision_config") or {}
    if not isinstance(vision, dict):
        raise UserError(f"{source}: vision_config must be a mapping (got {type(vision).__name__})")
    expected = TOWER_KIND[config["model_type"]]
    kind = vision.get("model_type", expected)
    if kind != expected:
        raise UserError(f"{source}: vision_config.model_type {kind!r} is not modelled (a {expected} tower is)")
    values = {**DEFAULTS[kind], **{k: v for k, v in vision.items() if k in DEFAULTS[kind] and v is not None}}
    values["spatial_merge_size"] = config.get("spatial_merge_size", 2)
    for key, limit in {**_LIMITS, "spatial_merge_size": 64}.items():
        v = values[key]
        where = key if key == "spatial_merge_size" else f"vision_config.{key}"
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limit:
            raise UserError(f"{source}: {where} must be a whole number from 1 to {limit:,} (got {v!r})")
    bias = config.get("multimodal_projector_bias", False)
    if not isinstance(values["vision_use_head"], bool) or not isinstance(bias, bool):
        raise UserError(f"{source}: vision_config.vision_use_head and multimodal_projector_bias are true or false")
    return VisionTower(kind=kind, hidden=values["hidden_size"], intermediate=values["intermediate_size"],
                       layers=values["num_hidden_layers"], channels=values["num_channels"], image=values["image_size"],
                       patch=values["patch_size"], head=values["vision_use_head"], text_hidden=text_hidden,
                       merge=values["spatial_merge_size"], projector_bias=bias)
