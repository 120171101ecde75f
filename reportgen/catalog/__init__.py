"""Catalogs shipped with reportgen: model configs (HF ``config.json``), GPU specs and host CPUs.

Models are loaded by name (``reportgen models`` lists them) or from a path to any ``config.json``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from reportgen import hub
from reportgen.errors import UserError, unknown_name
from reportgen.hardware import GpuSpec, HostCpu, gpu_from_entry
from reportgen.model import FAMILIES, ModelSpec, from_config, load_config_file
from reportgen.vision import TEXT_TOWER

_ROOT = resources.files(__package__)


def model_names() -> list[str]:
    return sorted(p.name[: -len(".json")] for p in (_ROOT / "models").iterdir() if p.name.endswith(".json"))


@lru_cache(maxsize=None)
def catalog_ids() -> dict[str, str]:
    """Hub id (``_name_or_path`` of each catalog config.json) -> catalog name. Read once per process:
    the catalog is package data (a reverse-mapping test read the 22 files 1,872 times, 8 of its 31 s)."""
    out = {}
    for name in model_names():
        hub = json.loads((_ROOT / "models" / f"{name}.json").read_text()).get("_name_or_path")
        if hub:
            out[hub] = name
    return out


@lru_cache(maxsize=None)
def load_model(name_or_path: str) -> ModelSpec:
    """A catalog name such as ``llama-3.1-8b``, a path to a ``config.json`` (or a folder holding
    one: a local path wins over a Hub id of the same spelling, as in transformers), or a Hugging Face
    Hub id ``ORG/NAME[@REVISION]`` (``hub.py``: its config.json only, through the Hugging Face cache).
    A catalog model's own Hub id, without a revision, is the catalog model; a Hub address pasted from
    a browser is its id (``hub.canonical``)."""
    if not Path(name_or_path).exists():
        name_or_path = hub.canonical(name_or_path)
    if name_or_path in model_names():
        path = Path(str(_ROOT / "models" / f"{name_or_path}.json"))
        return from_config(load_config_file(path), name=name_or_path, source=str(path))
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if path.is_dir():
            path = path / "config.json"
        return from_config(load_config_file(path), name=str(name_or_path), source=str(path))
    ref = hub.parse(name_or_path)
    if ref is None:
        error = unknown_name("model", name_or_path, model_names())
        parts = str(name_or_path).strip().strip("/").split("/")
        near = hub.parse("/".join(parts[:2])) if len(parts) > 2 else None
        if near is not None:  # ORG/NAME/more: a Hub id is two parts
            error.hint = f"a Hub id is ORG/NAME: did you mean {near[0]}? ({name_or_path} is no file here either)"
        else:
            error.hint = (error.hint + " " if error.hint else "") + "Any model on the Hugging Face Hub: --model " \
                "ORG/NAME (e.g. Qwen/Qwen3-14B); a local config.json: --model PATH/config.json"
        raise error
    repo, revision = ref
    if revision is None and repo in catalog_ids():
        return load_model(catalog_ids()[repo])
    return load_hub_model(repo, revision, label=name_or_path)


def load_hub_model(repo: str, revision: str | None, label: str) -> ModelSpec:
    """The ``ModelSpec`` of a Hub repository's config.json, named ``label`` (the id as the user wrote
    it), with the commit it came from as its ``revision``. A family without analytic formulas is
    refused with the command that can model it (``reportgen trace``)."""
    fetched = hub.fetch_config(repo, revision, catalog_ids())
    config = fetched.config
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in FAMILIES and model_type not in TEXT_TOWER:
        raise UserError(f"model {label!r} ({fetched.source}): model_type {model_type!r} has no analytic formulas "
                        "in reportgen; estimate and advise cover the families of `reportgen models`",
                        hint=f"`reportgen trace --model {label} --gpu GPU [setup flags]` runs its real training "
                             "step on the meta device for any causal LM transformers knows (no GPU, no weights; "
                             "about 10 s for a small model to a few minutes for a 70B)")
    spec = from_config(config, name=label, source=fetched.source)
    return dataclasses.replace(spec, hf_repo=repo, revision=fetched.commit or revision)


@lru_cache(maxsize=None)
def _gpu_table() -> dict[str, dict]:
    """``gpus.yaml``, parsed by libyaml's C loader where PyYAML has it (about 0.1 s faster per CLI call
    than the pure-Python loader; the same safe constructors, so the same table) and by the pure-Python
    ``SafeLoader`` elsewhere (the calculator's Pyodide)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((_ROOT / "gpus.yaml").read_text(), Loader=loader)  # noqa: S506 - a safe loader


def gpu_names() -> list[str]:
    return list(_gpu_table())


@lru_cache(maxsize=None)
def _cpu_table() -> dict:
    """``cpus.yaml``: ``{"defaults": {role: key}, "cpus": {key: entry}}``, read as ``_gpu_table`` reads
    ``gpus.yaml``."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((_ROOT / "cpus.yaml").read_text(), Loader=loader)  # noqa: S506 - a safe loader


def cpu_names() -> list[str]:
    return list(_cpu_table()["cpus"])


@lru_cache(maxsize=None)
def load_cpu(name: str) -> HostCpu:
    """A host CPU of ``cpus.yaml`` by its key (``--host-cpu``); an unknown name is a ``UserError`` with
    the close names."""
    cpus = _cpu_table()["cpus"]
    if name not in cpus:
        error = unknown_name("host CPU", name, list(cpus))
        error.message = f"unknown host CPU {name!r}"
        error.hint = (error.hint + " " if error.hint else "") + "(`reportgen cpus` lists them all)"
        raise error
    e = cpus[name]
    return HostCpu(key=name, name=e["name"], kind=e["kind"], single_thread=float(e["single_thread"]),
                   source=" ".join(str(e.get("source", "")).split()))


def default_cpu(role: str) -> HostCpu:
    """The host CPU of a role of ``cpus.yaml``'s ``defaults``: ``reference`` (the H100 machine's host,
    whose dispatch the time constants were fitted on), ``desktop`` or ``server``."""
    return load_cpu(_cpu_table()["defaults"][role])


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
    return parse_size(text, "GPU memory", MIN_GPU_MEMORY, MAX_GPU_MEMORY)


#: host RAM a node may have (``--host-memory``): from 1 GiB to 64 TiB
HOST_MEMORY_RANGE = (2**30, 64 * 2**40)


def parse_host_memory(text: str) -> int:
    """``--host-memory``: the node's RAM, as ``parse_memory`` reads a size."""
    return parse_size(text, "host memory", *HOST_MEMORY_RANGE)


def parse_size(text: str, what: str, low: int, high: int) -> int:
    from reportgen.errors import UserError

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)\s*", str(text))
    unit = m.group(2).lower() if m else None
    units = "units: GiB, GB, MiB, MB, TiB, TB (GiB = 2^30 bytes, GB = 10^9)"
    example = "e.g. 48GiB, 24GB or 23028MiB" if what == "GPU memory" else "e.g. 128GiB or 256GB"
    if m is not None and unit not in MEMORY_UNITS:
        raise UserError(f"{what} {text!r}: {m.group(2)!r} is not a unit reportgen reads, {example}", hint=units)
    if m is None:
        said = ("write the number in digits" if re.fullmatch(r"\s*[0-9.]+[eE][0-9+-]+\s*[A-Za-z]+\s*", str(text))
                else "expected a size with its unit")
        raise UserError(f"{what} {text!r}: {said}, {example}", hint=units)
    size = int(float(m.group(1)) * MEMORY_UNITS[unit])
    if size <= 0:
        raise UserError(f"{what} {text!r}: must be more than zero", hint=example)
    if size < low:
        floor = "less than 64 MiB, less than the CUDA context alone" if what == "GPU memory" else "less than 1 GiB"
        raise UserError(f"{what} {text!r}: {floor}", hint=f"give the size with its unit, {example}")
    if size > high:
        if what == "GPU memory":
            raise UserError(f"{what} {text!r}: more than 4 TiB, far above any GPU",
                            hint="give one card's memory, e.g. 48GiB; several cards: --gpus N")
        raise UserError(f"{what} {text!r}: more than 64 TiB, far above any node", hint=f"{example}")
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
