"""Whose host dispatches the step's kernels, and how much faster or slower than the H100 machine's.

The time model's host terms (``constants.HOST_S_PER_KERNEL``, ``HOST_S_PER_CALL``,
``HOST_S_PER_AUTOCAST_KERNEL``) were fitted to step times measured on one machine, the H100 machine
(``catalog/cpus.yaml`` ``h100-machine``). Dispatch is one thread of latency-bound code (Python, the
ATen dispatcher, ``cudaLaunchKernel``), so on another host it takes those constants times the ratio
of the two CPUs' single-thread speeds (TaxBreak, Vellaisamy et al., arXiv 2603.12465, ISPASS 2026:
"CPU single-thread performance is a first-order parameter" of host-bound steps; a faster host CPU
cut their orchestration overhead by 10-29 %):

    factor = reference single_thread / host single_thread

with both figures on one benchmark, PassMark's single-thread rating (``cpus.yaml`` header, each
figure's page). Worked example: the default desktop, an AMD Ryzen 5 7600X (4,221), against the
reference (3,004): factor 3,004 / 4,221 = 0.7117, so a step's 100 ms of H100-machine dispatch is
71.2 ms on the desktop (``tests/test_host_cpu.py`` pins it).

Which host, first that applies:

1. a profile of the user's machine that measured its dispatch (``reportgen profile-gpu``,
   ``--gpu-profile``): its host seconds per CUDA op queued (else per CPU op) over the H100 machine's
   (``constants.REFERENCE_PROFILE``), a measurement, which wins over any catalog figure;
2. the CPU the user named (``--host-cpu NAME``);
3. the card's default (``gpus.yaml`` ``default_host``): a desktop for GeForce and workstation cards,
   a server for data-center cards, the reference itself for the H100 SXM (the card the constants were
   fitted on, so its numbers do not move).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from reportgen.estimate import constants as K
from reportgen.hardware import GpuSpec, HostCpu

#: what each default role is called in the notes
ROLE_NAMES = {"reference": "the H100 machine's own host", "desktop": "default desktop", "server": "default server"}


@dataclass(frozen=True)
class HostDispatch:
    """The host the step's dispatch is priced on: ``factor`` multiplies the H100 machine's dispatch
    constants; ``cpu`` is the catalog CPU (None for a profile's measured host)."""

    factor: float
    why: str  # profile | --host-cpu | reference | desktop | server
    cpu: HostCpu | None = None
    measured_on: str | None = None  # a profile's CPU model name and file
    reference_single_thread: float | None = None

    def as_dict(self) -> dict:
        out = {"factor": self.factor, "why": self.why}
        if self.cpu is not None:
            out.update(cpu=self.cpu.key, name=self.cpu.name, single_thread=self.cpu.single_thread,
                       reference_single_thread=self.reference_single_thread, source=self.cpu.source)
        if self.measured_on:
            out["measured_on"] = self.measured_on
        return out

    def note(self) -> str:
        """One line for the estimate's notes: which host, how it scales, from what."""
        if self.why == "profile":
            return (f"host dispatch: measured by your profile ({self.measured_on}), x{self.factor:.2f} the H100 "
                    "machine's")
        cpu = self.cpu
        if self.why == "reference":
            return f"host dispatch: {cpu.name}, where the time constants were fitted (x1)"
        role = "--host-cpu" if self.why == "--host-cpu" else ROLE_NAMES[self.why]
        return (f"host dispatch: {cpu.name} ({role}), scaled from the H100 machine's by single-thread speed "
                f"x{self.factor:.2f} (PassMark single-thread {cpu.single_thread:,.0f} against "
                f"{self.reference_single_thread:,.0f}; catalog/cpus.yaml; --host-cpu NAME names yours, "
                "reportgen profile-gpu measures it)")


@lru_cache(maxsize=None)
def reference_cpu() -> HostCpu:
    from reportgen import catalog

    return catalog.default_cpu("reference")


def single_thread_factor(cpu: HostCpu) -> float:
    """The H100 machine's dispatch constants' multiplier on ``cpu``: reference single-thread speed over
    ``cpu``'s (module docstring)."""
    return reference_cpu().single_thread / cpu.single_thread


def _profile_ratio(gpu: GpuSpec) -> float | None:
    """A profile's measured host seconds per CUDA op queued (else per CPU op) over the H100 machine's
    (``K.REFERENCE_PROFILE``); None where the profile measured neither."""
    p, ref = gpu.profile, K.REFERENCE_PROFILE
    if p is None:
        return None
    if p.host_s_per_launch:
        return p.host_s_per_launch / ref["host_s_per_launch"]
    if p.host_s_per_op:
        return p.host_s_per_op / ref["host_s_per_op"]
    return None


@lru_cache(maxsize=None)
def _on_catalog_cpu(cpu: HostCpu, why: str) -> HostDispatch:
    """The dispatch on a catalog CPU (cached: every estimate asks, a sweep asks thousands of times)."""
    return HostDispatch(single_thread_factor(cpu), why, cpu, reference_single_thread=reference_cpu().single_thread)


@lru_cache(maxsize=None)
def _default(role: str) -> HostDispatch:
    from reportgen import catalog

    return _on_catalog_cpu(catalog.default_cpu(role), role)


def host_dispatch(gpu: GpuSpec) -> HostDispatch:
    """The host ``gpu``'s step is dispatched by (module docstring: profile, ``--host-cpu``, the card's
    default)."""
    if gpu.profile is not None:
        ratio = _profile_ratio(gpu)
        if ratio is not None:
            p = gpu.profile
            return HostDispatch(ratio, "profile", measured_on=f"{p.cpu or 'its CPU'}, {p.source}")
    if gpu.host_cpu is not None:
        return _on_catalog_cpu(gpu.host_cpu, "--host-cpu")
    return _default(gpu.default_host if gpu.default_host in ROLE_NAMES else "server")
