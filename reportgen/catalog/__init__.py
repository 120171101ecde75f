"""Catalogs shipped with reportgen: model configs (HF ``config.json``) and GPU specs.

Models are loaded by name (``reportgen models`` lists them) or from a path to any ``config.json``.
"""

from __future__ import annotations

import re
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
    """``gpus.yaml``, parsed by libyaml's C loader where PyYAML has it (about 0.1 s faster per CLI call
    than the pure-Python loader; the same safe constructors, so the same table) and by the pure-Python
    ``SafeLoader`` elsewhere (the calculator's Pyodide)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((_ROOT / "gpus.yaml").read_text(), Loader=loader)  # noqa: S506 - a safe loader


def gpu_names() -> list[str]:
    return list(_gpu_table())


#: units a ``--gpu-memory`` size may be written in
MEMORY_UNITS = {"gib": 2**30, "gb": 10**9, "mib": 2**20, "mb": 10**6, "tib": 2**40, "tb": 10**12}


#: the most memory a card may be given (``--gpu-memory``): far above any GPU made
MAX_GPU_MEMORY = 4 * 2**40
#: the least: below this not even the CUDA context fits
MIN_GPU_MEMORY = 64 * 2**20


def parse_memory(text: str) -> int:
    """``48GiB`` / ``48 GB`` / ``49140MiB`` -> bytes; a ``UserError`` for anything else (``48G`` is
    ambiguous between GB and GiB, so it is refused), for zero, and outside ``MIN_GPU_MEMORY`` to
    ``MAX_GPU_MEMORY``."""
    from reportgen.errors import UserError

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)\s*", str(text))
    unit = m.group(2).lower() if m else None
    units = "units: GiB, GB, MiB, MB, TiB, TB (GiB = 2^30 bytes, GB = 10^9)"
    if m is None or unit not in MEMORY_UNITS:
        raise UserError(f"GPU memory {text!r}: expected a size with its unit, e.g. 48GiB, 24GB or 23028MiB",
                        hint=units)
    size = int(float(m.group(1)) * MEMORY_UNITS[unit])
    if size <= 0:
        raise UserError(f"GPU memory {text!r}: must be more than zero", hint="e.g. 48GiB, 24GB or 23028MiB")
    if size < MIN_GPU_MEMORY:
        raise UserError(f"GPU memory {text!r}: less than 64 MiB, less than the CUDA context alone",
                        hint="give the card's memory with its unit, e.g. 48GiB, 24GB or 23028MiB")
    if size > MAX_GPU_MEMORY:
        raise UserError(f"GPU memory {text!r}: more than 4 TiB, far above any GPU",
                        hint="give one card's memory, e.g. 48GiB; several cards: --gpus N")
    return size


def gpu_key(name: str, memory: str | None) -> str:
    """The key of a catalog card with its memory replaced: ``rtx-4090@48GiB`` (the card's speed,
    another memory size: a modded card, a partitioned one, a card the catalog lacks)."""
    if not memory:
        return name
    parse_memory(memory)
    return f"{name}@{str(memory).replace(' ', '')}"


def gpu_entry(name: str) -> dict:
    """The raw catalog entry of a GPU (what a result's inputs hash covers); ``card@SIZE`` is the card
    with ``memory_override_bytes`` set."""
    base, _, memory = name.partition("@")
    table = _gpu_table()
    if base not in table:
        raise unknown_name("GPU", base, list(table))
    if memory:
        return {**table[base], "memory_override_bytes": parse_memory(memory)}
    return table[base]


@lru_cache(maxsize=None)
def load_gpu(name: str) -> GpuSpec:
    return gpu_from_entry(name, gpu_entry(name))
