"""Check a Hugging Face ``config.json`` before the estimator reads it, so a bad file gets a message
that names the field and what it accepts (exit 2), never a traceback.

The fields and their meaning are transformers' (``PretrainedConfig`` and the families'
``configuration_*.py``): sizes are positive integers, ``num_key_value_heads`` divides
``num_attention_heads`` (grouped-query attention shares each KV head among a whole number of query
heads), and without an explicit ``head_dim`` the heads divide ``hidden_size``. Values no model has
are refused too (``MAX_SIZES``: far above the largest released model's), as are activations and
RoPE scalings transformers does not know (``ACTIVATIONS``, ``ROPE_TYPES``): the estimate would
otherwise describe a model that cannot be built.
"""

from __future__ import annotations

import json
import math

from reportgen.errors import UserError

#: sizes every supported family's config has
REQUIRED_SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "intermediate_size")
#: sizes that may be absent or null (a default applies)
OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings", "num_local_experts",
                  "num_experts_per_tok", "num_experts", "moe_intermediate_size")
OPTIONAL_BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")
OPTIONAL_NUMBERS = ("attn_logit_softcapping", "final_logit_softcapping", "rope_theta")
#: the largest value each size may take: 16 to 64 times the largest released model's (vocabularies
#: reach 262,144 in Gemma 3, widths 16,384 and 126 layers in Llama 3.1 405B, contexts 10M tokens in
#: Llama 4 Scout, 384 experts in Kimi K2); beyond them a value is a typo or a test of the tool
MAX_SIZES = {"hidden_size": 2**17, "num_attention_heads": 2**13, "num_hidden_layers": 2**12, "vocab_size": 2**22,
             "intermediate_size": 2**20, "num_key_value_heads": 2**13, "head_dim": 2**13,
             "max_position_embeddings": 2**28, "num_local_experts": 2**13, "num_experts_per_tok": 2**13,
             "num_experts": 2**13, "moe_intermediate_size": 2**20, "sliding_window": 2**28}
#: ``hidden_act`` values transformers builds (``transformers.activations.ACT2CLS``, transformers 5)
ACTIVATIONS = ("gelu", "gelu_10", "gelu_accurate", "gelu_fast", "gelu_new", "gelu_python", "gelu_python_tanh",
               "gelu_pytorch_tanh", "hardswish", "laplace", "leaky_relu", "linear", "mish", "prelu", "quick_gelu",
               "relu", "relu2", "relu6", "sigmoid", "silu", "sqrtsoftplus", "swish", "tanh", "xielu")
#: RoPE types (``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` and ``default``)
ROPE_TYPES = ("default", "dynamic", "linear", "llama3", "longrope", "proportional", "yarn")
#: the deepest nesting of lists and objects a config.json may have (real ones: 3)
MAX_DEPTH = 32


def depth(value, limit: int = MAX_DEPTH) -> int:
    """How deeply ``value`` nests lists and dicts, counted without recursion, up to ``limit + 1``."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, d + 1) for v in item)
    return deepest


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fail(source: str, key: str, value, accepted: str) -> UserError:
    return UserError(f"{source}: {key} is {json.dumps(value)}; it must be {accepted}",
                     hint=f"fix {key} in the config.json (as the model's Hugging Face config.json has it)")


def check_config(config, source: str, families: list[str], default_head_dim: int | None = None) -> None:
    """Raise ``UserError`` naming the first field of ``config`` the estimator cannot use."""
    if not isinstance(config, dict):
        raise UserError(f"{source}: a config.json holds a JSON object ({{...}}), this one holds a "
                        f"{type(config).__name__}", hint="pass a model's Hugging Face config.json")
    if depth(config) > MAX_DEPTH:
        raise UserError(f"{source}: nested more than {MAX_DEPTH} levels deep; a config.json is a flat object",
                        hint="pass a model's Hugging Face config.json")
    model_type = config.get("model_type")
    if model_type not in families:
        raise UserError(f"{source}: model_type {model_type!r} is not supported; supported model types: "
                        f"{', '.join(sorted(families))}",
                        hint="pass a config.json of a Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Gemma, Gemma 2, "
                             "Gemma 3 (text), Phi-2, Phi-3/Phi-4, Mixtral or OLMo 2 model; `reportgen trace` runs "
                             "other architectures through transformers itself")
    for key in REQUIRED_SIZES:
        if key not in config:
            raise UserError(f"{source}: config.json lacks the key {key!r}",
                            hint="required: " + ", ".join(REQUIRED_SIZES))
    for key in REQUIRED_SIZES + OPTIONAL_SIZES:
        value = config.get(key)
        if value is None and key not in REQUIRED_SIZES:
            continue
        minimum = 0 if key in ("num_local_experts", "num_experts", "num_experts_per_tok") else 1
        if not _is_int(value) or value < minimum:
            raise _fail(source, key, value, "a positive integer" if minimum else "an integer >= 0")
        if value > MAX_SIZES[key]:
            raise _fail(source, key, value, f"at most {MAX_SIZES[key]:,} (no released model comes near it)")
    for key in OPTIONAL_BOOLS:
        if config.get(key) is not None and not isinstance(config[key], bool):
            raise _fail(source, key, config[key], "true or false")
    for key in OPTIONAL_NUMBERS:
        value = config.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0
                                  or not math.isfinite(value)):
            raise _fail(source, key, value, "null or a positive, finite number")
    for key, low, high, closed in (("partial_rotary_factor", 0.0, 1.0, True), ("resid_pdrop", 0.0, 1.0, False)):
        value = config.get(key)
        if value is None:
            continue
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not (low < value <= high if closed else low <= value < high):
            raise _fail(source, key, value, f"a number in {'(' if closed else '['}{low:g}, {high:g}{']' if closed else ')'}")
    window = config.get("sliding_window")
    if window is not None and (not _is_int(window) or window < 0 or window > MAX_SIZES["sliding_window"]):
        raise _fail(source, "sliding_window", window, "null or a positive integer")
    for key in ("hidden_act", "hidden_activation"):
        act = config.get(key)
        if act is not None and act not in ACTIVATIONS:
            raise _fail(source, key, act, "an activation transformers knows: " + ", ".join(ACTIVATIONS))
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise _fail(source, key, rope, "null or an object such as {\"rope_type\": \"linear\", \"factor\": 2.0}")
        kind = rope.get("rope_type", rope.get("type"))
        if kind is not None and kind not in ROPE_TYPES:
            raise _fail(source, f"{key}.rope_type", kind, "a RoPE type transformers knows: " + ", ".join(ROPE_TYPES))
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    if heads % kv:
        raise _fail(source, "num_key_value_heads", kv,
                    f"a divisor of num_attention_heads ({heads}): each KV head serves a whole group of query heads")
    if not config.get("head_dim") and default_head_dim is None and config["hidden_size"] % heads:
        raise _fail(source, "num_attention_heads", heads,
                    f"a divisor of hidden_size ({config['hidden_size']}) when the config gives no head_dim")
    experts = config.get("num_local_experts") or config.get("num_experts") or 0
    per_token = config.get("num_experts_per_tok") or 0
    if model_type == "mixtral" and not experts:
        raise _fail(source, "num_local_experts", config.get("num_local_experts"),
                    "a positive integer: a Mixtral model is a mixture of experts (MixtralConfig: 8 by default)")
    if experts and not 1 <= per_token <= experts:
        raise _fail(source, "num_experts_per_tok", config.get("num_experts_per_tok"),
                    f"between 1 and the number of experts ({experts})")
