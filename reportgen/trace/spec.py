"""The model to trace: a catalog name, or a ``config.json`` of any causal-LM architecture that
transformers knows, including families the analytic estimator has no formulas for.

Known families go through ``catalog.load_model`` as everywhere else. For another ``model_type``
the trace needs only what ``measure/build.py`` reads (the raw config, ``model_type``, a family name,
attention soft-capping), so it gets a ``ModelSpec`` whose family is its ``model_type`` and whose
shape fields are read best-effort from the config for labels only: no analytic formula is ever
applied to it.
"""

from __future__ import annotations

from pathlib import Path

from reportgen import catalog
from reportgen.errors import UserError
from reportgen.model import FAMILIES, ModelSpec, load_config_file


def is_known_family(spec: ModelSpec) -> bool:
    return spec.model_type in FAMILIES and spec.family == FAMILIES[spec.model_type]


def load_any(name_or_path: str) -> ModelSpec:
    """A catalog name or a path to a ``config.json`` (or a directory holding one)."""
    if name_or_path in catalog.model_names():
        return catalog.load_model(name_or_path)
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not (path.suffix == ".json" or path.exists()):
        return catalog.load_model(name_or_path)  # raises the catalog's "unknown model" error
    config = load_config_file(path)
    if config.get("model_type") in FAMILIES and config.get("model_type") != "gemma":
        return catalog.load_model(str(path))
    return generic_spec(config, name=str(name_or_path), source=str(path))


def _first(config: dict, *keys, default=0):
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def generic_spec(config: dict, name: str, source: str) -> ModelSpec:
    """A ``ModelSpec`` for an architecture without analytic formulas (labels and the build only)."""
    model_type = config.get("model_type")
    if not model_type:
        raise UserError(f"{source}: config.json has no model_type")
    try:
        from transformers import AutoConfig

        AutoConfig.for_model(model_type)
    except ImportError:
        from reportgen.errors import MEASURE_EXTRA

        raise UserError("reportgen trace needs torch, transformers and peft", hint=MEASURE_EXTRA) from None
    except (ValueError, KeyError):
        raise UserError(f"{source}: model_type {model_type!r} is not known to the installed transformers",
                        hint="pass the config.json of a causal language model transformers can build") from None
    hidden = int(_first(config, "hidden_size", "n_embd", "d_model"))
    heads = int(_first(config, "num_attention_heads", "n_head", default=1)) or 1
    kv = _first(config, "num_key_value_heads", "num_kv_heads", default=None)
    if kv is None and config.get("multi_query"):
        kv = 1
    return ModelSpec(
        name=name, hf_repo=config.get("_name_or_path", ""), model_type=model_type, family=model_type,
        vocab_size=int(_first(config, "vocab_size")), hidden_size=hidden,
        num_layers=int(_first(config, "num_hidden_layers", "n_layer", "num_layers")),
        num_heads=heads, num_kv_heads=int(kv or heads), head_dim=int(_first(config, "head_dim") or hidden // heads),
        intermediate_size=int(_first(config, "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        attn_logit_softcapping=config.get("attn_logit_softcapping"),
        final_logit_softcapping=config.get("final_logit_softcapping"),
        max_position_embeddings=int(_first(config, "max_position_embeddings", "n_positions")),
        config=config,
    )
