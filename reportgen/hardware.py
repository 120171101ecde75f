"""GpuSpec: memory, peak FLOP/s per dtype, bandwidths and price of one GPU model.

Figures come from ``catalog/gpus.yaml``, where each entry cites the vendor datasheet it was
copied from. Peak FLOP/s are dense datasheet peaks (tensor cores with FP32 accumulate), not
achievable throughput: the time model multiplies them by named efficiency constants.
"""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from functools import cached_property

MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    architecture: str
    compute_capability: str
    memory_gb: float
    memory_bandwidth_gbs: float
    peak_tflops: dict[str, float | None]
    host_link: str
    host_link_gbs: float | None
    price_usd_per_hour: float | None
    price_source: str | None = None
    price_date: str | None = None
    memory_type: str = ""
    tdp_w: float | None = None
    nvidia_smi_total_mib: int | None = None
    derived: tuple[str, ...] = ()  # peak_tflops columns derived by reportgen, not published
    #: GPU-to-GPU link for collectives: NVLink (via NVSwitch or a bridge) or PCIe, GB/s per direction
    peer_link: str = ""
    peer_link_gbs: float | None = None
    #: GPUs that share the NVLink domain (8 on an HGX board, 2 for bridged pairs); None: PCIe, any number
    peer_link_gpus: int | None = None
    peer_link_source: str = field(default="", compare=False)
    #: False where the driver gives no GPU peer-to-peer over PCIe (GeForce): NCCL goes through host memory
    peer_p2p: bool = True
    #: L2 cache in bytes (the architecture whitepaper's KB figure, binary), 0 where not in the catalog
    l2_cache_bytes: int = 0
    #: memory a user set for the card (``--gpu-memory``, ``card@SIZE``), replacing the catalog's
    memory_override_bytes: int | None = None
    #: the rates ``reportgen profile-gpu`` measured on the user's own card (``gpu_profile.GpuProfile``),
    #: which the time and memory models use instead of the datasheet's (``--gpu-profile FILE``)
    profile: object | None = None
    #: the host CPU whose dispatch the time model assumes when none is named (``--host-cpu``) and no
    #: profile measured one: ``desktop``, ``server`` or ``reference`` (``gpus.yaml`` ``default_host``)
    default_host: str = "server"
    #: the host CPU the user named (``--host-cpu``, a ``HostCpu``), instead of ``default_host``'s
    host_cpu: object | None = None
    sources: tuple[str, ...] = field(default=(), compare=False)
    notes: str = field(default="", compare=False)

    @property
    def memory_bytes(self) -> int:
        """Memory a process can see. Marketed "GB" on these cards are binary (GiB) sizes; the driver
        keeps a few hundred MiB back, so where ``nvidia-smi``'s total has been read on a real card we
        use that figure (``nvidia_smi_total_mib``), else the marketed size; a user's
        ``--gpu-memory`` replaces both."""
        if self.memory_override_bytes:
            return self.memory_override_bytes
        if self.nvidia_smi_total_mib:
            return self.nvidia_smi_total_mib * MIB
        return int(self.memory_gb * GIB)

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak FLOP/s for ``fp32``/``tf32``/``fp16``/``bf16``; None where unsupported."""
        tf = self.peak_tflops.get(dtype)
        return None if tf is None else tf * 1e12

    @property
    def supports_bf16(self) -> bool:
        """bf16 tensor cores arrived with Ampere (compute capability 8.0): a card whose datasheet
        figure is merely unpublished (A10G) still supports bf16."""
        return float(self.compute_capability) >= 8.0

    @property
    def is_consumer(self) -> bool:
        """GeForce cards: fp16/bf16 tensor throughput with fp32 accumulate is half rate, no NVLink. The
        TITAN RTX (TU102, not named GeForce) is not one: NVIDIA's GA102 whitepaper gives it 130.5 TFLOPS
        of FP16 tensor math with FP32 accumulate (quoted in arXiv 2212.14034), 576 tensor cores x 128
        FLOP/clk x 1.77 GHz, the full rate, where the GeForce RTX 2080 Ti has 56.9 of its 113.8 with
        FP16 accumulate (Turing whitepaper, Table 1)."""
        return "GeForce" in self.name

    @cached_property
    def generation(self) -> str:
        """The GPU generation whose rates the time model uses (``estimate/constants.GENERATIONS``), from the
        compute capability (NVIDIA's CUDA GPUs table: 7.5 Turing, 8.0 Ampere GA100, 8.6 Ampere GA10x,
        8.9 Ada, 9.0 Hopper, 10.x Blackwell data-center, 12.x Blackwell consumer and workstation)
        and, for the parts with half-rate fp32-accumulate tensor throughput, the GeForce line."""
        major, _, minor = self.compute_capability.partition(".")
        gen = {"7.5": "turing", "8.0": "ampere-ga100", "8.6": "ampere-ga10x", "8.7": "ampere-ga10x",
               "8.9": "ada", "9.0": "hopper"}.get(f"{major}.{minor or 0}")
        if gen is None:
            gen = {"10": "blackwell-dc", "11": "blackwell-dc", "12": "blackwell"}.get(major, "unknown")
        return f"{gen}-geforce" if self.is_consumer else gen

    @property
    def is_hopper_or_newer(self) -> bool:
        return float(self.compute_capability) >= 9.0


@dataclass(frozen=True)
class HostCpu:
    """A host CPU of ``catalog/cpus.yaml``: its single-thread speed on one published benchmark (PassMark's
    single-thread rating, the file's header), with where the figure was read."""

    key: str
    name: str
    kind: str  # desktop | laptop | server
    single_thread: float
    source: str = field(default="", compare=False)


def gpu_from_entry(key: str, entry: dict) -> GpuSpec:
    override = entry.get("memory_override_bytes")
    return GpuSpec(
        key=key,
        name=entry["name"] + (f" with {override / GIB:g} GiB (user-set)" if override else ""),
        memory_override_bytes=override,
        architecture=entry.get("architecture", ""),
        compute_capability=str(entry.get("compute_capability", "0")),
        memory_gb=float(entry["memory_gb"]),
        memory_bandwidth_gbs=float(entry["memory_bandwidth_gbs"]),
        peak_tflops=dict(entry["peak_tflops"]),
        host_link=entry.get("host_link", ""),
        host_link_gbs=entry.get("host_link_gbs"),
        price_usd_per_hour=entry.get("price_usd_per_hour"),
        price_source=entry.get("price_source"),
        price_date=str(entry["price_date"]) if entry.get("price_date") else None,
        memory_type=entry.get("memory_type", ""),
        tdp_w=entry.get("tdp_w"),
        nvidia_smi_total_mib=entry.get("nvidia_smi_total_mib"),
        derived=tuple(entry.get("derived", ())),
        peer_link=entry.get("peer_link") or "",
        peer_link_gbs=entry.get("peer_link_gbs"),
        peer_link_gpus=entry.get("peer_link_gpus"),
        peer_link_source=entry.get("peer_link_source") or "",
        peer_p2p=bool(entry.get("peer_p2p", True)),
        l2_cache_bytes=int(float(entry.get("l2_cache_mb") or 0) * MIB),
        default_host=entry.get("default_host") or "server",
        sources=tuple(entry.get("sources", ())),
        notes=entry.get("notes", "") or "",
    )


# ----- device name -> catalog key ------------------------------------------------------------------
#: (catalog key, regex on the lower-cased CUDA device name, minimum memory in GiB or None). First match
#: wins. Names as CUDA reports them, e.g. "NVIDIA H100 80GB HBM3" (SXM5), "NVIDIA H100 PCIe",
#: "NVIDIA H100 NVL", "NVIDIA B200", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "Tesla T4",
#: "NVIDIA L40S", "NVIDIA RTX A6000", "NVIDIA RTX 6000 Ada Generation", "NVIDIA GeForce RTX 5090",
#: "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA TITAN RTX", "NVIDIA A10",
#: "NVIDIA GeForce RTX 2080 Ti" ("GeForce RTX 2080 Ti" on older drivers: NVIDIA/nvidia-docker#1146, #1760).
#: Variants with other silicon or limits map to None: the NVL (PCIe) H200, GB200, L40 (not L40S),
#: "... D" export GeForce parts, laptop GPUs and the RTX PRO 6000's Server and Max-Q editions. The
#: 8 GB and 16 GB RTX 4060 Ti (and RTX 5060 Ti) share one name ("NVIDIA GeForce RTX 4060 Ti"), so
#: the memory floor picks the 16 GB card; likewise the 8 GB RTX 3060 is not the 12 GB card in the
#: catalog, and the 12 GB RTX 3080 ("NVIDIA GeForce RTX 3080" as the 10 GB card) is told apart by size.
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
    ("a10", r"^nvidia a10$", None),
    ("t4", r"\bt4\b", None),
    ("titan-rtx", r"\btitan rtx$", None),
    ("rtx-2080-ti", r"\brtx 2080 ti$", None),
    ("rtx-pro-6000", r"\brtx pro 6000 blackwell workstation edition$", None),
    ("rtx-6000-ada", r"\brtx 6000 ada\b", None),
    ("rtx-a6000", r"\brtx a6000\b", None),
    ("rtx-a5000", r"\brtx a5000$", None),
    ("rtx-a4000", r"\brtx a4000$", None),
    ("rtx-5090", r"\brtx 5090$", None),
    ("rtx-5080", r"\brtx 5080$", None),
    ("rtx-5070-ti", r"\brtx 5070 ti$", None),
    ("rtx-5060-ti-16gb", r"\brtx 5060 ti$", 12),
    ("rtx-4090", r"\brtx 4090$", None),
    ("rtx-4080-super", r"\brtx 4080 super$", None),
    ("rtx-4080", r"\brtx 4080$", None),
    ("rtx-3090-ti", r"\brtx 3090 ti$", None),
    ("rtx-3090", r"\brtx 3090$", None),
    ("rtx-3080-12gb", r"\brtx 3080$", 11),
    ("rtx-3080", r"\brtx 3080$", 9),
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
