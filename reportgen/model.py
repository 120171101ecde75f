"""ModelSpec: the shape of a decoder-only LLM, read from a Hugging Face ``config.json``.

Parameter counts are computed per component from the config, following the module
definitions in transformers 5 (``models/<model_type>/modeling_<model_type>.py``):

* embeddings: ``vocab_size * hidden_size``
* attention per layer: q ``h x nq*hd``, k and v ``h x nkv*hd``, o ``nq*hd x h`` (+ biases where the
  config has them: Qwen2 has q/k/v biases, o has none; Phi-2's ``PhiAttention`` has biases on q, k,
  v and ``dense``). Phi-3 fuses q, k, v into ``qkv_proj``.
* MLP per layer: gate, up ``h x I`` and down ``I x h`` (SwiGLU / GeGLU; Phi-3 fuses gate and up);
  Phi-2's ``PhiMLP`` is ``fc1 h x I`` and ``fc2 I x h`` with biases. Mixtral and Qwen3-MoE have ``E``
  experts (3-D parameters, ``MixtralExperts`` / ``Qwen3MoeExperts``) plus a router ``h x E``.
* norms: RMSNorm weights, two per layer (four for Gemma 2 and Gemma 3: ``Gemma3DecoderLayer``
  has input, post-attention, pre- and post-feedforward norms; OLMo 2's ``Olmo2DecoderLayer`` has
  only the post-attention and post-feedforward norms), plus the final norm. Qwen3, Qwen3-MoE and
  Gemma 3 add ``q_norm``/``k_norm`` over ``head_dim``; OLMo 2 over the whole q and k width
  (``Olmo2Attention``: ``nq*hd`` and ``nkv*hd``). Phi-2 has one ``nn.LayerNorm`` per layer (weight
  and bias) and a final one.
* head: ``hidden_size * vocab_size`` unless ``tie_word_embeddings`` (Phi-2's ``lm_head`` has a bias)

Tests pin the totals to the published figures (e.g. Llama-2-7B 6,738,415,616).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from reportgen import userfile
from reportgen.config_check import check_config
from reportgen.errors import UserError
from reportgen.vision import TEXT_TOWER, VisionTower, vision_tower

#: model_type -> family name used by the estimator (same module structure => same family)
FAMILIES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",  # the multimodal checkpoints: their text_config's language model (vision.py)
    "mistral3": "llama",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "phi": "phi",
    "phi3": "phi3",
    "mixtral": "mixtral",
    "olmo2": "olmo2",
}

#: model types whose transformers config ties the head to the embedding by default
#: (``GemmaConfig``, ``Gemma2Config``, ``Gemma3TextConfig``: ``tie_word_embeddings = True``)
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3_text")

#: ``head_dim`` defaults of the config classes where it is not ``hidden_size // heads``
#: (``GemmaConfig``/``Gemma3TextConfig``: 256, ``Qwen3Config``: 128)
HEAD_DIM_DEFAULT = {"gemma": 256, "gemma2": 256, "gemma3_text": 256, "qwen3": 128}

#: MoE defaults of the config classes: ``MixtralConfig(num_local_experts=8, num_experts_per_tok=2)``;
#: a Mixtral config without them is a Mixtral of 8 experts, not a dense model
MOE_DEFAULTS = {"mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2}}

#: families whose RMSNorm computes ``(x * w)`` in fp32 and casts after (``GemmaRMSNorm``:
#: ``x * (1 + w)``; ``Olmo2RMSNorm``: ``(w * x).to(dtype)``) instead of Llama's ``w * x.to(dtype)``
FP32_WEIGHTED_NORM = ("gemma", "gemma2", "gemma3", "olmo2")
#: families whose norm weight enters as ``1 + weight`` (zero-centred, ``GemmaRMSNorm``)
GEMMA_NORM = ("gemma", "gemma2", "gemma3")


def cached(method):
    """Memoize a method of a frozen ``ModelSpec`` per instance and arguments (the estimator asks for
    the same layer structure hundreds of times per reverse search)."""
    import functools

    @functools.wraps(method)
    def wrapper(self, *args):
        cache = self.__dict__.setdefault("_cache", {})
        key = (method.__name__, args)
        if key not in cache:
            cache[key] = method(self, *args)
        return cache[key]

    return wrapper


@dataclass(frozen=True)
class Linear:
    """One linear layer of a decoder block: ``in_features -> out_features``, repeated ``count`` times
    per layer (``count`` > 1 only for MoE experts)."""

    name: str
    in_features: int
    out_features: int
    bias: bool = False
    count: int = 1
    #: which LoRA target sets include it ("qv", "attn", "all-linear")
    lora_sets: tuple[str, ...] = ()
    #: the LoRA rank of this linear, in units of the setup's rank: 2 for the experts' fused gate_up
    #: tensor, for which peft sets ``rank_pattern = 2 r`` (and ``alpha_pattern = 2 alpha``) so that
    #: the fused w1 and w3 keep rank r each (peft ``utils/transformers_weight_conversion.py``)
    lora_rank_factor: int = 1

    def lora_rank(self, rank: int) -> int:
        return rank * self.lora_rank_factor

    @property
    def params(self) -> int:
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))

    @property
    def weight_params(self) -> int:
        return self.count * self.in_features * self.out_features


@dataclass(frozen=True)
class LoraSelection:
    """The modules that get LoRA adapters: decoder linears by name, the LM head, the embeddings."""

    linears: frozenset
    head: bool = False
    embed: bool = False


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hf_repo: str
    model_type: str
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    mlp_bias: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    sliding_window: int | None = None
    max_position_embeddings: int = 0
    #: fraction of ``head_dim`` that RoPE rotates (Phi-2: ``partial_rotary_factor`` 0.4)
    partial_rotary_factor: float = 1.0
    #: dropout on the attention and MLP outputs in training (Phi-2's ``resid_pdrop``)
    resid_dropout: float = 0.0
    #: MoE: the top-k routing weights are renormalised to sum to one (Mixtral always; Qwen3-MoE
    #: when ``norm_topk_prob``)
    norm_topk_prob: bool = True
    #: distinct RoPE tables the layers share (Gemma 3: one per layer type, sliding and full)
    rope_tables: int = 1
    #: decoder layers with sliding-window attention (0 without a window; Gemma 2 and 3 alternate
    #: sliding and full layers, ``_sliding_layers``)
    sliding_layers: int = 0
    lm_head_bias: bool = False
    #: the Hub commit the config came from (a model given by Hub id, ``hub.py``); None otherwise
    revision: str | None = None
    #: a multimodal checkpoint's vision tower and projector (``vision.py``): loaded, not run on text
    vision: VisionTower | None = None
    config: dict = field(default_factory=dict, compare=False, repr=False)

    # ----- structure -------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def norms_per_layer(self) -> int:
        """Norms of ``hidden_size`` width in one decoder layer (q/k norms not included)."""
        return {"gemma2": 4, "gemma3": 4, "phi": 1}.get(self.family, 2)

    @property
    def layer_norm_kind(self) -> str:
        """``layer`` (``nn.LayerNorm``: weight and bias, Phi-2) or ``rms`` (RMSNorm: weight)."""
        return "layer" if self.family == "phi" else "rms"

    @property
    def qk_norm_widths(self) -> tuple[int, int] | None:
        """Widths of the ``q_norm``/``k_norm`` weights: ``head_dim`` for Qwen3, Qwen3-MoE, Gemma 3
        (normalised per head); the whole q and k width for OLMo 2; None without q/k norms."""
        if self.family in ("qwen3", "qwen3_moe", "gemma3"):
            return self.head_dim, self.head_dim
        if self.family == "olmo2":
            return self.q_dim, self.kv_dim
        return None

    @property
    def norm_params_per_layer(self) -> int:
        per_norm = self.hidden_size * (2 if self.layer_norm_kind == "layer" else 1)
        return self.norms_per_layer * per_norm + sum(self.qk_norm_widths or ())

    def norm_shapes(self) -> list[tuple[tuple[int, ...], int]]:
        """``(shape, how many)`` of every norm parameter tensor of the model (final norm included)."""
        h, layers = self.hidden_size, self.num_layers
        per_norm = 2 if self.layer_norm_kind == "layer" else 1  # LayerNorm: weight and bias
        shapes = [((h,), (layers * self.norms_per_layer + 1) * per_norm)]
        if self.qk_norm_widths:
            q, k = self.qk_norm_widths
            shapes += [((q,), layers), ((k,), layers)] if q != k else [((q,), 2 * layers)]
        return shapes

    @property
    def rotary_dim(self) -> int:
        """Dimensions RoPE rotates per head (``PhiAttention.rotary_ndims``)."""
        return int(self.head_dim * self.partial_rotary_factor)

    # LoRA target sets: peft's "all-linear" wraps every nn.Linear but the output head
    # (``peft/tuners/tuners_utils.py`` ``_maybe_include_all_linear_layers``)
    def attn_in_names(self) -> list[str]:
        return ["qkv_proj"] if self.family == "phi3" else ["q_proj", "k_proj", "v_proj"]

    @property
    def attn_out_name(self) -> str:
        return "dense" if self.family == "phi" else "o_proj"

    def mlp_in_names(self) -> list[str]:
        return {"phi3": ["gate_up_proj"], "phi": ["fc1"]}.get(self.family, ["gate_proj", "up_proj"])

    @property
    def mlp_out_name(self) -> str:
        return "fc2" if self.family == "phi" else "down_proj"

    @cached
    def layer_linears(self) -> list[Linear]:
        """The linear layers of one decoder block, as transformers builds them."""
        h, i = self.hidden_size, self.intermediate_size
        b = self.attention_bias
        if self.family == "phi":
            # modeling_phi.py PhiAttention / PhiMLP: every projection has a bias
            return [
                Linear("q_proj", h, self.q_dim, True, lora_sets=("qv", "attn", "all-linear")),
                Linear("k_proj", h, self.kv_dim, True, lora_sets=("attn", "all-linear")),
                Linear("v_proj", h, self.kv_dim, True, lora_sets=("qv", "attn", "all-linear")),
                Linear("dense", self.q_dim, h, True, lora_sets=("attn", "all-linear")),
                Linear("fc1", h, i, True, lora_sets=("all-linear",)),
                Linear("fc2", i, h, True, lora_sets=("all-linear",)),
            ]
        if self.family == "phi3":
            attn = [
                Linear("qkv_proj", h, self.q_dim + 2 * self.kv_dim, b, lora_sets=("qv", "attn", "all-linear")),
                Linear("o_proj", self.q_dim, h, b, lora_sets=("attn", "all-linear")),
            ]
            mlp = [
                Linear("gate_up_proj", h, 2 * i, self.mlp_bias, lora_sets=("all-linear",)),
                Linear("down_proj", i, h, self.mlp_bias, lora_sets=("all-linear",)),
            ]
            return attn + mlp
        # Qwen2 puts biases on q, k, v only (modeling_qwen2.py: o_proj bias=False).
        o_bias = b and self.model_type != "qwen2"
        attn = [
            Linear("q_proj", h, self.q_dim, b, lora_sets=("qv", "attn", "all-linear")),
            Linear("k_proj", h, self.kv_dim, b, lora_sets=("attn", "all-linear")),
            Linear("v_proj", h, self.kv_dim, b, lora_sets=("qv", "attn", "all-linear")),
            Linear("o_proj", self.q_dim, h, o_bias, lora_sets=("attn", "all-linear")),
        ]
        if self.num_experts:
            e = self.num_experts
            # transformers >= 5 stores experts as 3-D parameters (MixtralExperts, Qwen3MoeExperts).
            # peft's "all-linear" wraps the router and, through ParamWrapper, the expert tensors.
            mlp = [
                Linear("experts.gate_up_proj", h, 2 * i, count=e, lora_sets=("all-linear",), lora_rank_factor=2),
                Linear("experts.down_proj", i, h, count=e, lora_sets=("all-linear",)),
                Linear("router", h, e, lora_sets=("all-linear",)),
            ]
        else:
            sets = ("all-linear",)
            mlp = [
                Linear("gate_proj", h, i, self.mlp_bias, lora_sets=sets),
                Linear("up_proj", h, i, self.mlp_bias, lora_sets=sets),
                Linear("down_proj", i, h, self.mlp_bias, lora_sets=sets),
            ]
        return attn + mlp

    # ----- parameter counts --------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def head_params(self) -> int:
        bias = self.vocab_size if self.lm_head_bias else 0
        return bias + (0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size)

    @property
    def attention_params_per_layer(self) -> int:
        return sum(lin.params for lin in self.layer_linears() if _is_attn(lin))

    @property
    def mlp_params_per_layer(self) -> int:
        return sum(lin.params for lin in self.layer_linears() if not _is_attn(lin))

    @property
    def norm_params(self) -> int:
        final = self.hidden_size * (2 if self.layer_norm_kind == "layer" else 1)
        return self.num_layers * self.norm_params_per_layer + final

    @property
    def layer_linear_params(self) -> int:
        return self.num_layers * sum(lin.params for lin in self.layer_linears())

    @property
    def total_params(self) -> int:
        """Memoized (``cached``): every estimate reads it several times and it walks the layer."""
        return self._total_params()

    @cached
    def _total_params(self) -> int:
        return self.embedding_params + self.head_params + self.layer_linear_params + self.norm_params

    def components(self) -> dict[str, int]:
        """Parameter count per component; the values add up to ``total_params``."""
        return {
            "embeddings": self.embedding_params,
            "attention": self.num_layers * self.attention_params_per_layer,
            "mlp": self.num_layers * self.mlp_params_per_layer,
            "norms": self.norm_params,
            "head": self.head_params,
        }

    @cached
    def lora_selection(self, targets: str) -> LoraSelection:
        """Which modules a ``lora_targets`` value puts adapters on (``setup.py``): a preset (``qv``,
        ``attn``, ``all-linear``: ``Linear.lora_sets``) or a comma list of this model's decoder
        linears by module name (``q_proj``), short name (``q``, ``k``, ``v``, ``o``/``proj``, ``gate``,
        ``up``, ``down``, ``qkv``, ``gate_up``, ``dense``, ``fc1``, ``fc2``), group (``attn``, ``mlp``),
        and ``lm_head``/``head`` and ``embed_tokens``/``embed`` (peft wraps them like any linear or
        embedding when named: its "all-linear" leaves the head out). Raises ``UserError`` for a name
        this model does not have."""
        names = [lin.name for lin in self.layer_linears()]
        attn = [n for n in names if n in ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "dense")]
        fused = "qkv_proj" in names  # peft targets whole modules: q, k or v is Phi-3's fused projection
        aliases = {"q": ["qkv_proj" if fused else "q_proj"], "k": ["qkv_proj" if fused else "k_proj"],
                   "v": ["qkv_proj" if fused else "v_proj"], "o": [self.attn_out_name],
                   "proj": [self.attn_out_name], "qkv": ["qkv_proj"], "gate": ["gate_proj"], "up": ["up_proj"],
                   "down": ["down_proj"], "gate_up": ["gate_up_proj"], "dense": ["dense"], "fc1": ["fc1"],
                   "fc2": ["fc2"], "mlp": [n for n in names if n not in attn]}
        chosen: set[str] = set()
        head = embed = False
        for token in (t.strip() for t in targets.split(",")):
            if token in ("qv", "all-linear") or (token == "attn" and "," not in targets):
                chosen |= {lin.name for lin in self.layer_linears() if token in lin.lora_sets}
            elif token == "attn":
                chosen |= set(attn)
            elif token in ("lm_head", "head"):
                head = True
            elif token in ("embed_tokens", "embed"):
                embed = True
            elif token in names:
                chosen.add(token)
            elif token in aliases and all(n in names for n in aliases[token]) and aliases[token]:
                chosen |= set(aliases[token])
            else:
                known = sorted(set(names) | {k for k, v in aliases.items() if v and all(n in names for n in v)})
                raise UserError(f"lora_targets {targets!r}: {self.name} has no module {token!r}",
                                hint="presets: qv, attn, all-linear; or a comma list of: " + ", ".join(known)
                                + ", lm_head, embed_tokens")
        return LoraSelection(linears=frozenset(chosen), head=head, embed=embed)

    @cached
    def lora_params(self, rank: int, targets: str) -> int:
        """LoRA adds ``A: in x r`` and ``B: r x out`` to each targeted linear (Hu et al. 2021;
        peft ``tuners/lora/layer.py`` ``update_layer``); on the head ``r (h + V)``; on the
        embeddings ``lora_embedding_A: r x V`` and ``lora_embedding_B: h x r`` (peft ``Embedding``)."""
        sel = self.lora_selection(targets)
        per_layer = sum(lin.lora_rank(rank) * (lin.in_features + lin.out_features) * lin.count
                        for lin in self.layer_linears() if lin.name in sel.linears)
        edges = (sel.head + sel.embed) * rank * (self.hidden_size + self.vocab_size)
        return self.num_layers * per_layer + edges

    @property
    def active_params(self) -> int:
        """Parameters used per token (MoE: only ``experts_per_token`` of ``num_experts`` experts)."""
        if not self.num_experts:
            return self.total_params
        expert = sum(lin.params for lin in self.layer_linears() if lin.name.startswith("experts"))
        inactive = self.num_layers * expert * (self.num_experts - self.experts_per_token) // self.num_experts
        return self.total_params - inactive


def _is_attn(lin: Linear) -> bool:
    return lin.name in ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "dense")


def from_config(config: dict, name: str | None = None, source: str = "<config>") -> ModelSpec:
    """Build a ModelSpec from a parsed Hugging Face ``config.json`` (checked first: a bad field is a
    ``UserError`` naming it, ``config_check.py``).

    Keys a config leaves out take the defaults of its transformers config class (e.g.
    ``GemmaConfig.tie_word_embeddings = True``, ``Qwen3Config.head_dim = 128``,
    ``PhiConfig.partial_rotary_factor = 0.5``).
    """
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type in TEXT_TOWER:
        if not isinstance(config.get("text_config"), dict):
            raise UserError(f"{source}: model_type {model_type!r} is a multimodal checkpoint: its config.json holds its "
                            "language model under text_config, which this one lacks",
                            hint=f"pass the checkpoint's own config.json, or its language model's ({TEXT_TOWER[model_type]})")
        return _multimodal(config, model_type, name, source)
    raw = config
    if isinstance(config, dict) and model_type in MOE_DEFAULTS:  # a key left out (or null) takes its default
        config = {**config, **{k: v for k, v in MOE_DEFAULTS[model_type].items() if config.get(k) is None}}
    check_config(config, source, list(FAMILIES), default_head_dim=HEAD_DIM_DEFAULT.get(model_type))
    _check_structure(config, model_type, source)
    try:
        h = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        experts_key = "num_experts" if model_type == "qwen3_moe" else "num_local_experts"
        experts = int(config.get(experts_key) or 0)
        # Qwen3-MoE: every layer's MLP is the sparse block (checked above), whose experts are
        # moe_intermediate_size wide (Qwen3MoeExperts); intermediate_size is the dense MLP's
        width = config["moe_intermediate_size"] if model_type == "qwen3_moe" else config["intermediate_size"]
        spec = ModelSpec(
            name=name or config.get("_name_or_path") or Path(source).stem,
            hf_repo=config.get("_name_or_path", ""),
            model_type=model_type,
            family=FAMILIES[model_type],
            vocab_size=int(config["vocab_size"]),
            hidden_size=h,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or HEAD_DIM_DEFAULT.get(model_type) or h // heads),
            intermediate_size=int(width),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT)),
            attention_bias=bool(config.get("attention_bias", model_type == "qwen2")),
            mlp_bias=bool(config.get("mlp_bias", False)),
            num_experts=experts,
            experts_per_token=int(config.get("num_experts_per_tok") or 0) if experts else 0,
            attn_logit_softcapping=config.get("attn_logit_softcapping"),
            final_logit_softcapping=config.get("final_logit_softcapping"),
            sliding_window=_sliding_window(config),
            max_position_embeddings=int(config.get("max_position_embeddings") or 0),
            partial_rotary_factor=_partial_rotary_factor(config),
            resid_dropout=float(config.get("resid_pdrop") or 0.0) if model_type == "phi" else 0.0,
            norm_topk_prob=bool(config.get("norm_topk_prob", False)) if model_type == "qwen3_moe" else True,
            rope_tables=_rope_tables(config),
            sliding_layers=_sliding_layers(config),
            lm_head_bias=model_type == "phi",
            config=raw,
        )
    except KeyError as exc:
        raise UserError(f"{source}: config.json lacks the key {exc.args[0]!r}") from None
    return spec


def _multimodal(config: dict, model_type: str, name: str | None, source: str) -> ModelSpec:
    """A multimodal checkpoint whose language model is a supported family (``vision.TEXT_TOWER``):
    the language model from its ``text_config``, the vision tower beside it (``vision.py``); the raw
    config is kept whole, so the harness and the tracer build the checkpoint's own class."""
    text = dict(config["text_config"])
    # transformers 5 ties the head by the checkpoint's own config (modeling_utils: the top-level
    # tie_word_embeddings; Gemma3Config and Mistral3Config default it to True), not the text_config's
    text["tie_word_embeddings"] = config.get("tie_word_embeddings", True)
    expected = TEXT_TOWER[model_type]
    if text.setdefault("model_type", expected) != expected:
        raise UserError(f"{source}: text_config.model_type {text['model_type']!r} is not {expected!r}, the language "
                        f"model of model_type {model_type!r}")
    spec = from_config(text, name=name or config.get("_name_or_path") or Path(source).stem,
                       source=f"{source} (text_config)")
    tower = vision_tower(config, spec.hidden_size, source)
    # the checkpoint's own model_type: the harness and the tracer build its class (Gemma3ForConditionalGeneration)
    return dataclasses.replace(spec, vision=tower, config=config, hf_repo=config.get("_name_or_path", ""),
                               model_type=model_type)


def _check_structure(config: dict, model_type: str, source: str) -> None:
    """Refuse configs whose layers differ in ways the per-layer counts cannot express."""
    if model_type == "qwen3_moe":
        dense = config.get("mlp_only_layers") or []
        step = int(config.get("decoder_sparse_step") or 1)
        if not config.get("num_experts"):  # every layer dense: the other checks' values are fine (a CLI probe)
            raise UserError(f"{source}: num_experts is {config.get('num_experts')!r}; a Qwen3-MoE model has experts "
                            "(num_experts of 1 or more, at least num_experts_per_tok)",
                            hint="Qwen3-30B-A3B: num_experts 128, num_experts_per_tok 8")
        if dense or step != 1:
            # Qwen3MoeDecoderLayer: a layer is sparse iff it is not in mlp_only_layers, num_experts > 0
            # and (layer_idx + 1) % decoder_sparse_step == 0
            raise UserError(
                f"{source}: Qwen3-MoE with dense layers (mlp_only_layers={dense}, decoder_sparse_step={step}) "
                "is not modelled: every layer must use the sparse MoE block",
                hint="the released Qwen3-MoE models (30B-A3B, 235B-A22B) have mlp_only_layers [] and "
                     "decoder_sparse_step 1")
    if model_type == "phi" and config.get("qk_layernorm"):
        raise UserError(f"{source}: Phi with qk_layernorm (per-head LayerNorm on q and k) is not modelled",
                        hint="Phi-1, Phi-1.5 and Phi-2 have qk_layernorm false")


def _partial_rotary_factor(config: dict) -> float:
    """``partial_rotary_factor`` from the config (or ``rope_parameters``), else the config class's
    default: 0.5 for ``PhiConfig``, 1.0 otherwise."""
    rope = config.get("rope_parameters") or {}
    value = config.get("partial_rotary_factor", rope.get("partial_rotary_factor"))
    if value is None:
        value = 0.5 if config.get("model_type") == "phi" else 1.0
    return float(value)


def _rope_tables(config: dict) -> int:
    """Gemma 3 computes one (cos, sin) pair per layer type present (``Gemma3TextModel.forward``:
    ``for layer_type in set(self.config.layer_types)``); layer ``i`` is full attention when
    ``(i + 1) % sliding_window_pattern == 0`` (``Gemma3TextConfig``), else sliding."""
    if config.get("model_type") != "gemma3_text":
        return 1
    types = config.get("layer_types")
    if not types:
        pattern = int(config.get("sliding_window_pattern") or 6)
        n = int(config.get("num_hidden_layers") or 0)
        types = ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(n)]
    return max(1, len(set(types)))


def _sliding_layers(config: dict) -> int:
    """Decoder layers that attend through a sliding window: from ``layer_types`` when the config
    lists them, else as the config classes define them: Gemma 3 every layer but each
    ``sliding_window_pattern``-th (``Gemma3TextConfig``), Gemma 2 every other layer from the first
    (``Gemma2Config``: sliding when ``(i + 1) % 2``), other families every layer (Phi-3, Mistral v0.1);
    none without a window."""
    if _sliding_window(config) is None:
        return 0
    n = int(config.get("num_hidden_layers") or 0)
    types = config.get("layer_types")
    if types:
        return sum("sliding" in str(t) for t in types)
    if config.get("model_type") == "gemma3_text":
        pattern = int(config.get("sliding_window_pattern") or 6)
        return sum(1 for i in range(n) if (i + 1) % pattern)
    if config.get("model_type") == "gemma2":
        return sum(1 for i in range(n) if (i + 1) % 2)
    return n


def _sliding_window(config: dict) -> int | None:
    if config.get("model_type") in ("qwen2", "qwen3", "qwen3_moe") and not config.get("use_sliding_window", False):
        return None
    sw = config.get("sliding_window")
    return int(sw) if sw else None


#: the largest config.json read (real ones are a few KB)
MAX_CONFIG_BYTES = 4_000_000


def load_config_file(path: Path) -> dict:
    """A ``config.json`` as a dict; a ``UserError`` naming the file for anything that is not one
    (missing, unreadable, not UTF-8 JSON, too large or deep, not an object)."""
    try:
        config = json.loads(userfile.read_bytes(path, MAX_CONFIG_BYTES).decode("utf-8"))
    except userfile.TooLarge as exc:
        raise UserError(f"{path}: {exc.amount()}; a config.json is a few KB (at most {MAX_CONFIG_BYTES:,} bytes "
                        "read)", hint="pass a model's Hugging Face config.json") from None
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file (a config.json is UTF-8 JSON)") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to read; a config.json is a flat object",
                        hint="pass a model's Hugging Face config.json") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise UserError(f"{path}: a value cannot be read ({exc})") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: a config.json holds a JSON object ({{...}}), this one holds a "
                        f"{type(config).__name__}", hint="pass a model's Hugging Face config.json")
    return config
