"""Provenance of a measurement: the hardware and software it ran on.

Every measured result carries this block ("numbers are sacred": a figure without the machine it
came from is not publishable). Two collectors:

* ``collect_environment(device)`` runs in the measuring worker (it imports torch and may touch
  CUDA): GPU name and memory from ``torch.cuda.get_device_properties``, driver version from NVML
  (``nvmlSystemGetDriverVersion``), CUDA version from ``torch.version.cuda``.
* ``light_environment()`` runs in the parent (no torch import, no CUDA state): package versions
  from ``importlib.metadata`` only. It stands in when the worker died before it could report.

``catalog_gpu_for(name, total_bytes)`` maps a device name as CUDA reports it
(``NVIDIA H100 80GB HBM3``) to the GPU catalog key (``h100-sxm``), for the MFU rule.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from reportgen import __version__

GIB = 2**30

#: environment variables that change what the allocator reserves or what CUDA loads (recorded when set)
CUDA_ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUDA_MODULE_LOADING", "CUDA_VISIBLE_DEVICES",
                 "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE")

#: distributions whose versions every measured result records (null when not installed)
PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "torchao", "nvidia-ml-py", "liger-kernel",
            "trl")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> tuple[str | None, bool | None]:
    """``(commit, dirty)`` of the reportgen checkout: ``git rev-parse HEAD`` where the package
    lives in a git work tree, else the ``REPORTGEN_GIT_COMMIT`` environment variable (set it where
    the tree was copied without ``.git``, e.g. on the GPU machine), else ``(None, None)``."""
    root = Path(__file__).resolve().parents[2]
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
        # only this checkout's own repository, not one that happens to contain a copied tree
        ours = top.returncode == 0 and Path(top.stdout.strip()).resolve() == root
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10) if ours else None
        if head is not None and head.returncode == 0 and head.stdout.strip():
            status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=10)
            dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
            return head.stdout.strip(), dirty
    except (OSError, subprocess.SubprocessError):
        pass
    env = os.environ.get("REPORTGEN_GIT_COMMIT")
    if env:
        dirty_env = os.environ.get("REPORTGEN_GIT_DIRTY")
        return env.strip(), None if dirty_env is None else dirty_env.strip() in ("1", "true", "yes")
    return None, None


def cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def light_environment() -> dict:
    """What the parent can say without importing torch: versions, host, time, commit."""
    commit, dirty = git_commit()
    return {
        "device": None,
        "gpu_name": None,
        "gpu_total_bytes": None,
        "gpu_catalog_key": None,
        "gpu_count": None,
        "driver_version": None,
        "cuda_version": None,
        "cpu": cpu_name(),
        "versions": package_versions(),
        "python": platform.python_version(),
        "reportgen": __version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "hostname": socket.gethostname(),
        "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cuda_env": {name: os.environ[name] for name in CUDA_ENV_VARS if name in os.environ},
        "source": "parent",
    }


def collect_environment(device: str, index: int = 0) -> dict:
    """Full provenance, in the worker, after ``import torch``; ``index``: the CUDA device this
    process measures on (its local rank under torchrun, else 0)."""
    import torch

    env = light_environment()
    env["source"] = "worker"
    env["device"] = device
    env["cuda_version"] = torch.version.cuda
    env["versions"]["torch"] = torch.__version__  # the imported one, with its local tag (+cu130)
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(index)
        env["gpu_name"] = props.name
        env["gpu_total_bytes"] = int(props.total_memory)
        env["gpu_count"] = torch.cuda.device_count()
        env["gpu_capability"] = f"{props.major}.{props.minor}"
        env["gpu_catalog_key"] = catalog_gpu_for(props.name, int(props.total_memory))
        from reportgen.measure import nvml

        env["driver_version"] = nvml.driver_version()
        env["gpu_uuid"] = nvml.uuid_of(props)
    return env


# ----- device name -> catalog key ------------------------------------------------------------------
#: (catalog key, regex on the lower-cased CUDA device name, minimum memory in GiB or None). First match
#: wins. Names as CUDA reports them, e.g. "NVIDIA H100 80GB HBM3" (SXM5), "NVIDIA H100 PCIe",
#: "NVIDIA H100 NVL", "NVIDIA B200", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "Tesla T4",
#: "NVIDIA L40S", "NVIDIA RTX A6000", "NVIDIA RTX 6000 Ada Generation", "NVIDIA GeForce RTX 5090".
#: Variants with other silicon or limits map to None: the NVL (PCIe) H200, GB200, L40 (not L40S),
#: "... D" export GeForce parts and laptop GPUs. The 8 GB and 16 GB RTX 4060 Ti share one name
#: ("NVIDIA GeForce RTX 4060 Ti"), so the memory floor picks the 16 GB card; likewise the 8 GB
#: RTX 3060 is not the 12 GB card in the catalog.
_DEVICE_PATTERNS: tuple[tuple[str, str, float | None], ...] = (
    ("b200", r"^nvidia b200$", None),
    ("h200", r"\bh200\b(?!.*\bnvl\b)", None),
    ("h100-nvl", r"\bh100 nvl\b", None),
    ("h100-pcie", r"\bh100\b.*\bpcie\b", None),
    ("h100-sxm", r"\bh100\b(?!.*\b(nvl|pcie)\b)", None),
    ("a100-80gb", r"\ba100\b", 60),
    ("a100-40gb", r"\ba100\b", None),
    ("l40s", r"^nvidia l40s$", None),
    ("l4", r"^nvidia l4$", None),
    ("a10g", r"\ba10g\b", None),
    ("t4", r"\bt4\b", None),
    ("rtx-6000-ada", r"\brtx 6000 ada\b", None),
    ("rtx-a6000", r"\brtx a6000\b", None),
    ("rtx-5090", r"\brtx 5090$", None),
    ("rtx-4090", r"\brtx 4090$", None),
    ("rtx-3090", r"\brtx 3090$", None),
    ("rtx-4060-ti-16gb", r"\brtx 4060 ti$", 12),
    ("rtx-3060", r"\brtx 3060$", 10),
)


def catalog_gpu_for(name: str | None, total_bytes: int | None = None) -> str | None:
    """The GPU catalog key of a device, or None when the catalog has no entry for its family."""
    if not name:
        return None
    low = name.lower().strip()
    for key, pattern, min_gib in _DEVICE_PATTERNS:
        if re.search(pattern, low):
            if min_gib is not None and (total_bytes is None or total_bytes < min_gib * GIB):
                continue
            return key
    return None
