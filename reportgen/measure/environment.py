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
import socket
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from reportgen import __version__
from reportgen.hardware import catalog_gpu_for

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
    """``(commit, dirty)`` of the reportgen checkout: the ``REPORTGEN_GIT_COMMIT`` environment variable
    when set (set it where the tree was copied, e.g. on the GPU machine: a copied ``.git`` can be stale,
    and recorded 7e71339 for a tree at 48bac0e on 2026-11-27), else ``git rev-parse HEAD`` where the
    package lives in a git work tree, else ``(None, None)``."""
    env = os.environ.get("REPORTGEN_GIT_COMMIT")
    if env:  # set by whoever copied the tree: it knows the commit better than a copied .git may
        dirty_env = os.environ.get("REPORTGEN_GIT_DIRTY")
        return env.strip(), None if dirty_env is None else dirty_env.strip() in ("1", "true", "yes")
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


# ----- device name -> catalog key: reportgen.hardware.catalog_gpu_for (provenance.py checks a file with it)
