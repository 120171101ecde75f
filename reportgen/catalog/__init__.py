"""Catalogs shipped with reportgen: model configs (HF ``config.json``) and GPU specs.

Models are loaded by name (``reportgen models`` lists them) or from a path to any ``config.json``.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from reportgen.errors import unknown_name
from reportgen.hardware import GpuSpec, gpu_from_entry
from reportgen.model import ModelSpec, from_config, load_config_file

_ROOT = resources.files(__package__)


def model_names() -> list[str]:
    return sorted(p.name[: -len(".json")] for p in (_ROOT / "models").iterdir() if p.name.endswith(".json"))


@lru_cache(maxsize=None)
def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name such as ``llama-3.1-8b``, or a path to a ``config.json``."""
    if name_or_path in model_names():
        path = Path(str(_ROOT / "models" / f"{name_or_path}.json"))
        return from_config(load_config_file(path), name=name_or_path, source=str(path))
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if path.is_dir():
            path = path / "config.json"
        return from_config(load_config_file(path), name=str(name_or_path), source=str(path))
    raise unknown_name("model", name_or_path, model_names())


@lru_cache(maxsize=None)
def _gpu_table() -> dict[str, dict]:
    return yaml.safe_load((_ROOT / "gpus.yaml").read_text())


def gpu_names() -> list[str]:
    return list(_gpu_table())


def gpu_entry(name: str) -> dict:
    """The raw catalog entry of a GPU (what a result's inputs hash covers)."""
    table = _gpu_table()
    if name not in table:
        raise unknown_name("GPU", name, list(table))
    return table[name]


@lru_cache(maxsize=None)
def load_gpu(name: str) -> GpuSpec:
    return gpu_from_entry(name, gpu_entry(name))
