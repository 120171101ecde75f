"""A GPU profile: the rates ``reportgen profile-gpu`` measured on one card and its host
(``measure/profile_gpu.py`` documents each figure), read back for ``--gpu-profile FILE``.

Torch-free (layer 0): the calculator reads a pasted profile in the browser. The file is YAML, as
the profiler writes it; it is input a user names, so it is read within ``yamlfile``'s limits and
checked field by field (``_checked``, no pydantic: it runs under Pyodide): a figure must be a positive
number or null, the card must be in the catalog. ``attach`` gives a card its profile, refusing a profile of another card model.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from reportgen import yamlfile
from reportgen.errors import UserError
from reportgen.hardware import GpuSpec

KIND = yamlfile.Kind(noun="GPU profile", what_it_holds="a profile written by `reportgen profile-gpu`",
                     example="write one with `reportgen profile-gpu --out my-card.yaml` on the machine with the card")

#: the single figures of ``measured`` (each a positive number or null) and its mappings of figures
#: (with the keys each may have; None: any)
FIGURES = ("host_s_per_op", "host_s_per_launch", "kernel_device_s", "l2_bytes", "cpu_adam_params_per_s",
           "cuda_context_bytes", "memory_total_bytes", "memory_free_bytes")
MAPPINGS = {"matmul_tflops": ("bf16", "fp16", "fp32"), "copy_bandwidth_gbs": None, "host_link_gbs": ("h2d", "d2h")}
#: what else the profiler writes in ``measured`` (``measure/profile_gpu.py``), kept but not priced
RECORDS = ("cpu_adam_kind", "cpu_threads", "matmul_shapes", "cuda_context_source")
#: the range a per-op time can have on any machine, in seconds: a figure outside is a damaged or
#: hand-edited file, not a fast or slow computer (the profiled H100 machine: 0.99 us a tiny kernel on
#: the device, 6.7 us a CPU op and 10.9 us a CUDA op queued on the host, ``data/gpu-profiles``)
SECONDS_RANGE = {"kernel_device_s": (1e-7, 1e-3), "host_s_per_op": (1e-8, 1e-2), "host_s_per_launch": (1e-8, 1e-2)}
#: a measured rate may pass the datasheet's by this much (boost clocks above the rated one), no more
ABOVE_DATASHEET = 1.15


def _positive(value) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            and value > 0)


def _checked(doc: dict, source: str) -> dict:
    """``doc``'s ``measured`` block once every field is what it must be; a ``UserError`` naming the first
    that is not. Checked by hand, not by pydantic: this module runs in the calculator, under Pyodide,
    where pydantic's compiled core is not loaded (``setup.py`` says the same)."""
    def bad(where: str, what: str):
        raise UserError(f"{source}: {where}: {what}", hint=KIND.what_it_holds)

    if doc.get("kind") != "gpu-profile":
        bad("kind", "must be gpu-profile")
    if doc.get("schema_version") != 1:
        bad("schema_version", "must be 1")
    if not isinstance(doc.get("card"), str):
        bad("card", "must be a catalog card's name")
    if doc.get("device") not in ("cuda", "cpu"):
        bad("device", "must be cuda or cpu")
    if not isinstance(doc.get("environment", {}), dict):
        bad("environment", "must be a mapping")
    m = doc.get("measured")
    if not isinstance(m, dict):
        bad("measured", "must be a mapping of figures")
    for name in m:
        if name not in FIGURES + tuple(MAPPINGS) + RECORDS:
            import difflib

            close = difflib.get_close_matches(str(name), FIGURES + tuple(MAPPINGS), n=1)
            bad(f"measured.{name}", "is not a figure of a profile" + (f"; did you mean {close[0]}?" if close else ""))
    for name in FIGURES:
        if m.get(name) is not None and not _positive(m[name]):
            bad(f"measured.{name}", "must be a positive number or null")
    for name, keys in MAPPINGS.items():
        v = m.get(name) or {}
        if not isinstance(v, dict) or any(keys and k not in keys for k in v) or not all(map(_positive, v.values())):
            bad(f"measured.{name}", "must be a mapping of " + (", ".join(keys) if keys else "sizes")
                + " to positive numbers")
    return m


def _plausible(m: dict, doc: dict, gpu: GpuSpec, source: str) -> None:
    """Refuse figures no run on ``gpu`` can measure: a GEMM rate or a 1 GiB copy more than
    ``ABOVE_DATASHEET`` times the card's datasheet peak (``catalog/gpus.yaml``; fp32 GEMMs against
    the TF32 peak, which torch may use for them), per-op times outside ``SECONDS_RANGE``, more memory
    free than the card has, and a CUDA profile whose environment names another card than ``card``."""
    def bad(where: str, what: str):
        raise UserError(f"{source}: {where}: {what}", hint="a profile holds what profile-gpu measured; measure "
                        "again rather than edit it: reportgen profile-gpu --out FILE")

    peaks = gpu.peak_tflops
    for dtype, tflops in (m.get("matmul_tflops") or {}).items():
        peak = max(filter(None, (peaks.get(dtype), peaks.get("tf32") if dtype == "fp32" else None)), default=None)
        if peak and tflops > ABOVE_DATASHEET * peak:
            bad(f"measured.matmul_tflops.{dtype}", f"{tflops:,.1f} TFLOP/s is above the {gpu.name}'s datasheet "
                f"peak of {peak:,.1f}")
    copy = (m.get("copy_bandwidth_gbs") or {}).get("1GiB")
    if copy and copy > ABOVE_DATASHEET * gpu.memory_bandwidth_gbs:
        bad("measured.copy_bandwidth_gbs.1GiB", f"{copy:,.0f} GB/s is above the {gpu.name}'s memory bandwidth "
            f"of {gpu.memory_bandwidth_gbs:,.0f} GB/s")
    for name, (lo, hi) in SECONDS_RANGE.items():
        if m.get(name) is not None and not lo <= m[name] <= hi:
            bad(f"measured.{name}", f"{m[name]:g} s is outside {lo:g} to {hi:g} s, the range of any machine")
    total, free, context = (m.get(k) for k in ("memory_total_bytes", "memory_free_bytes", "cuda_context_bytes"))
    if total and ((free and free > total) or (context and context >= total)):
        bad("measured.memory_free_bytes" if free and free > total else "measured.cuda_context_bytes",
            f"more than the card's total of {total:,} bytes")
    named = (doc.get("environment") or {}).get("gpu_catalog_key")
    if doc.get("device") == "cuda" and named and named != doc["card"]:
        bad("card", f"{doc['card']!r}, but the environment measured {named!r}")


@dataclasses.dataclass(frozen=True)
class GpuProfile:
    """What the time and memory models take from a profile (hashable: it is part of a ``GpuSpec``)."""

    card: str
    device: str
    source: str  # the file, for the notes
    gpu_name: str | None
    cpu: str | None
    utc: str | None  # when it was measured
    host_s_per_op: float | None
    host_s_per_launch: float | None
    kernel_device_s: float | None
    matmul_tflops: tuple[tuple[str, float], ...]
    copy_1gib_gbs: float | None
    host_link_gbs: float | None  # the slower direction
    cpu_adam_params_per_s: float | None
    cuda_context_bytes: int | None
    memory_total_bytes: int | None
    memory_free_bytes: int | None

    def matmul_rate(self, dtype: str) -> float | None:
        """Measured FLOP/s of the GEMMs in ``dtype``, None where not measured."""
        tf = dict(self.matmul_tflops).get(dtype)
        return None if tf is None else tf * 1e12


def from_document(doc: dict, source: str) -> GpuProfile:
    """The profile of a parsed document; a ``UserError`` naming the first wrong field."""
    from reportgen import catalog

    m = _checked(doc, source)
    if doc["card"] not in catalog.gpu_names():
        raise UserError(f"{source}: card {doc['card']!r} is not in the GPU catalog", hint="`reportgen gpus` lists it")
    _plausible(m, doc, catalog.load_gpu(doc["card"]), source)
    env = doc.get("environment") or {}
    links, tflops = m.get("host_link_gbs") or {}, m.get("matmul_tflops") or {}
    return GpuProfile(card=doc["card"], device=doc["device"], source=source, gpu_name=env.get("gpu_name"),
                      cpu=env.get("cpu"), utc=str(env["utc"]) if env.get("utc") else None,
                      host_s_per_op=m.get("host_s_per_op"), host_s_per_launch=m.get("host_s_per_launch"),
                      kernel_device_s=m.get("kernel_device_s"), matmul_tflops=tuple(sorted(tflops.items())),
                      copy_1gib_gbs=(m.get("copy_bandwidth_gbs") or {}).get("1GiB"),
                      host_link_gbs=min(links.values()) if links else None,
                      cpu_adam_params_per_s=m.get("cpu_adam_params_per_s"),
                      cuda_context_bytes=m.get("cuda_context_bytes"), memory_total_bytes=m.get("memory_total_bytes"),
                      memory_free_bytes=m.get("memory_free_bytes"))


def read_profile(path: Path) -> GpuProfile:
    """A profile file, within ``yamlfile``'s limits; a ``UserError`` naming the file for anything wrong."""
    _, data = yamlfile.load(Path(path), KIND)
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a GPU profile (expected a mapping with kind: gpu-profile)",
                        hint=KIND.example)
    return from_document(data, str(path))


def attach(gpu: GpuSpec, profile: GpuProfile) -> GpuSpec:
    """``gpu`` priced with ``profile``; a ``UserError`` when the profile is of another card model (a
    card given another memory, ``rtx-4090@48GiB``, is still that card)."""
    base = gpu.key.partition("@")[0]
    if profile.card != base:
        raise UserError(f"{profile.source}: a profile of {profile.card}"
                        f"{f' ({profile.gpu_name})' if profile.gpu_name else ''}, not of --gpu {gpu.key}",
                        hint=(f"it measured this host alone (--device cpu): reportgen profile-gpu --device cpu --gpu "
                              f"{base} writes one for the {gpu.name} in seconds" if profile.device == "cpu" else
                              f"give --gpu {profile.card}, or profile the {gpu.name} on its own machine"))
    return dataclasses.replace(gpu, profile=profile)


def on_machine(gpu: GpuSpec, host_cpu=None, profile: Path | None = None) -> GpuSpec:
    """``gpu`` on ``host_cpu`` (a ``hardware.HostCpu``) when given, priced with the profile file when given
    (``attach``; the profile's measured host then wins, ``time.TimeConstants.current``): the card of
    ``--gpu``/``--host-cpu``/``--gpu-profile`` (``flags.gpu_from_args``) and of a sweep's ``host_cpu`` and
    ``gpu_profiles`` (``runner``) alike."""
    if host_cpu is not None:
        gpu = dataclasses.replace(gpu, host_cpu=host_cpu)
    return gpu if profile is None else attach(gpu, read_profile(Path(profile)))


def summary_lines(p: GpuProfile) -> list[str]:
    """The profile's figures, one line each, in a reader's units (measured figures only)."""
    out = []
    if p.matmul_tflops:
        out.append("GEMM: " + ", ".join(f"{d} {tf:,.1f} TFLOP/s" for d, tf in p.matmul_tflops))
    if p.copy_1gib_gbs:
        out.append(f"memory bandwidth (1 GiB copy): {p.copy_1gib_gbs:,.0f} GB/s")
    if p.kernel_device_s:
        out.append(f"device time per tiny kernel: {p.kernel_device_s * 1e6:.2f} us")
    if p.host_s_per_launch:
        out.append(f"host time per CUDA op queued: {p.host_s_per_launch * 1e6:.2f} us")
    if p.host_s_per_op:
        out.append(f"host time per CPU op: {p.host_s_per_op * 1e6:.2f} us" + (f" ({p.cpu})" if p.cpu else ""))
    if p.cpu_adam_params_per_s:
        out.append(f"host AdamW: {p.cpu_adam_params_per_s / 1e9:.2f} billion parameters/s")
    if p.host_link_gbs:
        out.append(f"host link (pinned, slower direction): {p.host_link_gbs:,.1f} GB/s")
    if p.cuda_context_bytes:
        out.append(f"CUDA context: {p.cuda_context_bytes / 2**20:,.0f} MiB")
    if p.memory_total_bytes and p.memory_free_bytes:
        out.append(f"memory: {p.memory_free_bytes / 2**30:.2f} of {p.memory_total_bytes / 2**30:.2f} GiB free "
                   "when profiled")
    return out
