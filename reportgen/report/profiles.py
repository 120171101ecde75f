"""The GPU pages' "Profiled" section: the profiles ``reportgen profile-gpu`` wrote on real cards and the
repository keeps under ``data/gpu-profiles/`` (``gpu_profile.py`` reads and checks each), with each
measured rate beside the datasheet figure it stands for."""

from __future__ import annotations

import sys
from pathlib import Path

from reportgen import catalog
from reportgen.errors import UserError
from reportgen.gpu_profile import GpuProfile, read_profile, summary_lines

DEFAULT_PROFILES = Path("data/gpu-profiles")


def load_profiles(folder: Path | None = DEFAULT_PROFILES) -> list[GpuProfile]:
    """Every readable profile in ``folder`` (a damaged one is skipped with a warning naming it)."""
    out = []
    if folder is None or not Path(folder).is_dir():
        return out
    for path in sorted(Path(folder).glob("*.yaml")):
        try:
            out.append(read_profile(path))
        except UserError as exc:
            print(f"warning: {exc.message}; the GPU page goes without it", file=sys.stderr)
    return out


def _of_datasheet(measured: float | None, datasheet: float | None) -> str | None:
    return None if not measured or not datasheet else f"{100 * measured / datasheet:.0f} %"


def profiles_view(profiles: list[GpuProfile], key: str) -> list[dict]:
    """The profiles of card ``key``, each as its file, where and when, its figures, and the fractions of
    the datasheet's GEMM peak and memory bandwidth it reached."""
    gpu = catalog.load_gpu(key)
    out = []
    for p in profiles:
        if p.card != key:
            continue
        dtype = "bf16" if p.matmul_rate("bf16") else "fp16"
        out.append({"file": p.source, "gpu_name": p.gpu_name, "cpu": p.cpu, "device": p.device, "utc": p.utc,
                    "lines": summary_lines(p), "gemm_dtype": dtype,
                    "gemm_of_peak": _of_datasheet(p.matmul_rate(dtype), gpu.peak_flops(dtype)),
                    "copy_of_bandwidth": _of_datasheet(p.copy_1gib_gbs, gpu.memory_bandwidth_gbs)})
    return out
