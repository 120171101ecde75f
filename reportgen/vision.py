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
TEXT_TOWER = {"gemma3": "gemma3_text"}

#: ``SiglipVisionConfig``'s defaults: a key a ``vision_config`` leaves out takes these
SIGLIP_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_channels": 3,
                   "image_size": 224, "patch_size": 16, "vision_use_head": True}
#: the largest value each read key may have (far above any released tower): a typo is refused, not estimated
_LIMITS = {"hidden_size": 65_536, "intermediate_size": 262_144, "num_hidden_layers": 1_024, "num_channels": 64,
           "image_size": 16_384, "patch_size": 1_024}
#: the tower's ``nn.Linear`` modules per encoder layer, by peft's name for them
LAYER_LINEARS = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")


@dataclass(frozen=True)
class VisionTower:
    """A SigLIP vision tower and the projector into the language model's width."""

    hidden: int
    intermediate: int
    layers: int
    channels: int
    image: int
    patch: int
    head: bool
    text_hidden: int

    def linears(self) -> list[tuple[str, int, int, int]]:
        """``(peft name, in, out, how many)`` of every ``nn.Linear`` of the tower."""
        h, i, n = self.hidden, self.intermediate, self.layers
        out = [("q_proj", h, h, n), ("k_proj", h, h, n), ("v_proj", h, h, n), ("out_proj", h, h, n),
               ("fc1", h, i, n), ("fc2", i, h, n)]
        if self.head:  # the pooling head: nn.MultiheadAttention's out_proj and an MLP
            out += [("out_proj", h, h, 1), ("fc1", h, i, 1), ("fc2", i, h, 1)]
        return out

    @property
    def params(self) -> int:
        """Every parameter of the tower and the projector (loaded with the model)."""
        h, i = self.hidden, self.intermediate
        embeddings = self.channels * self.patch ** 2 * h + h + (self.image // self.patch) ** 2 * h
        layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h
        head = (h + 3 * h * h + 3 * h + h * h + h + 2 * h + (h * i + i) + (i * h + h)) if self.head else 0
        projector = h * self.text_hidden + h
        return embeddings + self.layers * layer + 2 * h + head + projector

    @property
    def linear_weight_params(self) -> int:
        """The weights bitsandbytes packs to 4 bits under QLoRA (its ``nn.Linear`` weights, biases not)."""
        return sum(a * b * n for _, a, b, n in self.linears())

    def lora_params(self, rank: int, names: frozenset, all_linear: bool) -> int:
        """LoRA's ``A`` and ``B`` on the tower's linears that peft's ``target_modules`` reach: every one
        for ``all-linear``, else those whose name is targeted (``q_proj``, ``v_proj``: the text names)."""
        return sum(rank * (a + b) * n for name, a, b, n in self.linears() if all_linear or name in names)


def vision_tower(config: dict, text_hidden: int, source: str) -> VisionTower:
    """The tower of a multimodal ``config.json`` (its ``vision_config`` over ``SiglipVisionConfig``'s
    defaults); a ``UserError`` naming the key for a value that cannot be one."""
    vision = config.get("vision_config") or {}
    if not isinstance(vision, dict):
        raise UserError(f"{source}: vision_config must be a mapping (got {type(vision).__name__})")
    kind = vision.get("model_type", "siglip_vision_model")
    if kind != "siglip_vision_model":
        raise UserError(f"{source}: vision_config.model_type {kind!r} is not modelled (a SigLIP tower is)")
    values = {**SIGLIP_DEFAULTS, **{k: v for k, v in vision.items() if k in SIGLIP_DEFAULTS and v is not None}}
    for key, limit in _LIMITS.items():
        v = values[key]
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= limit:
            raise UserError(f"{source}: vision_config.{key} must be a whole number from 1 to {limit:,} (got {v!r})")
    if not isinstance(values["vision_use_head"], bool):
        raise UserError(f"{source}: vision_config.vision_use_head must be true or false")
    return VisionTower(hidden=values["hidden_size"], intermediate=values["intermediate_size"],
                       layers=values["num_hidden_layers"], channels=values["num_channels"], image=values["image_size"],
                       patch=values["patch_size"], head=values["vision_use_head"], text_hidden=text_hidden)
