"""What a measurement is valid for: the one rule that decides which measured figure may be compared
with which case.

A measurement block (``reportgen.measure.protocol``) records the device that really ran it
(``environment.device``: ``cuda`` or ``cpu``; ``environment.gpu_catalog_key``: the catalog card that
CUDA device is) and, for a capped run, the card whose memory was emulated
(``cap.applied`` and ``cap.emulated_gpu``: ``torch.cuda.set_per_process_memory_fraction`` on a
larger card). A case is always for one catalog card, its ``gpu``. The rule:

* **memory** (peak allocated, peak reserved, device total, and an out-of-memory verdict) counts for
  the case's card when the run was on that card, or on a larger card capped to that card's memory;
* **speed** (step time, tokens/s, MFU) counts only for the card that ran it: a capped run's step
  times are the large card's, never the emulated card's;
* a CPU run, a CUDA device the catalog does not know, or a block without an environment counts for
  no GPU case at all. It may be shown, labelled as what it is ("CPU run"), never as a GPU
  measurement.
* a multi-GPU run (``environment.world_size`` > 1, one environment per rank in
  ``measurement.ranks``) is judged on every rank: it counts for a card only when all ranks ran on
  that card (the same device kind and catalog key, and for a cap, the same applied cap). A run
  counts only for a case with as many GPUs as it had processes: a single-process block never
  describes a 2-GPU case, nor a 2-process block a 1-GPU or 4-GPU one (when the block names its
  case).

The renderer (``report/rows.py``), the validation page, ``reportgen show`` and
``scripts/calibrate.py`` all ask ``provenance_of(block).valid_quantities(case_gpu)``; nothing else
decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reportgen.hardware import catalog_gpu_for

#: measured quantities compared with the estimate of the same name
MEMORY_QUANTITIES = ("peak_allocated", "peak_reserved", "device_total")
SPEED_QUANTITIES = ("tokens_per_s",)
QUANTITIES = MEMORY_QUANTITIES + SPEED_QUANTITIES


@dataclass(frozen=True)
class Provenance:
    """Where a measurement was made, and so what it may be compared with."""

    device: str  # "cuda", "cpu" or "unknown"
    device_name: str | None  # as CUDA (or /proc/cpuinfo) names it
    device_gpu: str | None  # GPU catalog key of the CUDA device that ran it; None when not known
    emulated_gpu: str | None  # catalog key whose memory a cap emulated (only when the cap was applied)
    fake: bool = False  # a test fixture, never a real run
    world_size: int = 1  # processes (GPUs) of the run: torchrun's WORLD_SIZE, 1 for a single-process run
    mismatch: str | None = None  # why the run compares with nothing (ranks disagree, GPU count of the case)

    @property
    def is_gpu(self) -> bool:
        return self.device == "cuda" and self.device_gpu is not None and self.mismatch is None

    def memory_counts_for(self, gpu: str) -> bool:
        """Memory figures (and an OOM) of this run describe card ``gpu``."""
        cuda = self.device == "cuda" and self.mismatch is None
        return cuda and gpu is not None and (self.device_gpu == gpu or self.emulated_gpu == gpu)

    def speed_counts_for(self, gpu: str) -> bool:
        """Step time and tokens/s of this run describe card ``gpu``."""
        return self.is_gpu and self.device_gpu == gpu

    def valid_quantities(self, gpu: str) -> tuple[str, ...]:
        """The quantities of ``QUANTITIES`` this run may be compared with for a case on ``gpu``."""
        out: tuple[str, ...] = ()
        if self.memory_counts_for(gpu):
            out += MEMORY_QUANTITIES
        if self.speed_counts_for(gpu):
            out += SPEED_QUANTITIES
        return out

    def label(self, gpu: str) -> str:
        """What the run is, in words, for a case on ``gpu`` (badges, ``show``, tables). A test
        fixture (``fake: true``) says so first: the badge of a label that starts with ``FAKE``
        reads "fake", never "meas." (``_macros.md.j2``)."""
        if self.fake:
            return "FAKE: a test fixture (fake: true in its file), not a run; " + self._label(gpu)
        return self._label(gpu)

    def _label(self, gpu: str) -> str:
        name = self.device_name or self.device_gpu or "an unnamed device"
        if self.world_size > 1:
            name = f"{self.world_size}x {name}" if self.device == "cuda" else f"{name}, {self.world_size} processes"
        if self.device == "cpu":
            return f"CPU run ({name}): timings of the CPU, not a GPU measurement"
        if self.device != "cuda":
            return "run on an unrecorded device: not comparable" + (f" ({self.mismatch})" if self.mismatch else "")
        if self.mismatch:
            return f"measured on {name}, but {self.mismatch}: not comparable"
        if self.device_gpu is not None and self.device_gpu == gpu:
            return f"measured on {name}"
        if self.emulated_gpu == gpu:
            return f"measured on {name} capped to the memory of {gpu}: memory only, the speed is not {gpu}'s"
        if self.device_gpu is None:
            return f"measured on {name}, a card the catalog does not know: not comparable with {gpu}"
        return f"measured on {name} ({self.device_gpu}), not on {gpu}: not comparable"


def provenance_of(block: dict | None) -> Provenance:
    """The provenance of a measurement block (``measurement`` file or legacy embedded block).

    Missing facts count against the block: without an environment naming ``device: cuda`` and a
    catalog card, nothing of it compares with a GPU case."""
    block = block or {}
    env = block.get("environment") if isinstance(block.get("environment"), dict) else {}
    settings = block.get("settings") if isinstance(block.get("settings"), dict) else {}
    # the environment says where it ran; the settings only say where it was asked to run: a CUDA run
    # whose environment does not record it counts for nothing (a CPU one is labelled as such either way)
    device = env.get("device") or ("cpu" if settings.get("device") == "cpu" else "unknown")
    if device not in ("cuda", "cpu"):
        device = "unknown"
    cap = block.get("cap") if isinstance(block.get("cap"), dict) else {}
    emulated = cap.get("emulated_gpu") if cap.get("applied") else None
    name = env.get("gpu_name") if device == "cuda" else env.get("cpu")
    key = env.get("gpu_catalog_key") if device == "cuda" else None
    world, mismatch = _world_size(block, env)
    measurement = block.get("measurement") if isinstance(block.get("measurement"), dict) else {}
    ranks = measurement.get("ranks")
    if world > 1 and mismatch is None:
        if not isinstance(ranks, list) or len(ranks) != world:
            mismatch = f"{world} processes but {len(ranks) if isinstance(ranks, list) else 'no'} per-rank records"
        else:
            envs = [r.get("environment") if isinstance(r, dict) else None for r in ranks]
            envs = [e if isinstance(e, dict) else {} for e in envs]
            devices = {e.get("device") for e in envs}
            keys = {e.get("gpu_catalog_key") for e in envs}
            if devices != {device}:
                mismatch = f"its ranks ran on {' and '.join(sorted(str(d) for d in devices))}"
            elif device == "cuda" and len(keys) != 1:
                mismatch = f"its ranks ran on different cards ({', '.join(sorted(str(k) for k in keys))})"
            else:
                key = keys.pop() if device == "cuda" else None
            rank_caps = [r.get("cap") if isinstance(r, dict) and isinstance(r.get("cap"), dict) else {} for r in ranks]
            if emulated and not all(c.get("applied") and c.get("emulated_gpu") == emulated for c in rank_caps):
                emulated = None  # a cap counts only when every rank ran under it
    mismatch = mismatch or inconsistency(block, env, settings, measurement, device, key, world)
    return Provenance(device=device, device_name=name, device_gpu=key, emulated_gpu=emulated,
                      fake=bool(block.get("fake")), world_size=world, mismatch=mismatch)


#: figures of a measurement block that are byte counts, times or rates: a number, finite and not negative
_FIGURES = ("peak_allocated", "peak_reserved", "device_used", "step_s", "tokens_per_s", "memory_after_load", "mfu",
            "host_rss_after_load", "host_peak_rss_load", "host_peak_rss_warmup", "host_peak_rss",
            "host_peak_rss_children", "host_peak_rss_at_failure")


def inconsistency(block: dict, env: dict, settings: dict, measurement: dict, device: str, key: str | None,
                  world: int) -> str | None:
    """Why a measurement file cannot be what it says (issue 29), or None. Checked before any page,
    ``show``, ``validation`` or the calibration treats it as a measurement, so a damaged or edited file
    is set aside with its reason instead of published:

    * its environment agrees with its settings (a run its settings say was on the CPU is not a CUDA
      run because ``environment.device`` says so) and its card: the GPU name CUDA reported maps to
      the catalog key it claims (``hardware.catalog_gpu_for``, the mapping the harness itself used;
      a file without a GPU name is not checked by name);
    * its figures are physically possible: numbers, finite and not negative (the host memory figures
      too: ``host_peak_rss`` and the others, absent from files made before issue 32); peak reserved at least
      peak allocated (the caching allocator reserves what it allocates); the device total at least
      the reserved; neither above the memory of the GPU that ran it, nor, capped, the reserved above
      the cap; a step time is not zero; MFU within the card's peak (at most 1);
      peak allocated at least the weights it had to hold (half a byte per parameter, the NF4 floor,
      divided over the ranks; not checked with parameters offloaded to the CPU).
    """
    if device == "cuda":
        if settings.get("device") == "cpu":
            return "its settings say it ran on the CPU"
        gpu_name = env.get("gpu_name")
        if key is not None and gpu_name and catalog_gpu_for(gpu_name, env.get("gpu_total_bytes")) != key:
            return f"its GPU name {gpu_name!r} is not the card it claims ({key})"
    for figure in _FIGURES:
        value = measurement.get(figure)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 0):
            return f"its {figure} ({value!r}) is not a size, time or rate"
    alloc, reserved, used = (measurement.get(k) for k in ("peak_allocated", "peak_reserved", "device_used"))
    if alloc is not None and reserved is not None and reserved < alloc:
        return "its peak reserved is below its peak allocated"
    if reserved is not None and used is not None and used < reserved:
        return "its device total is below its peak reserved"
    why = _beyond_the_card(block, env, reserved, used)
    if why:
        return why
    mfu = measurement.get("mfu")
    if mfu is not None and mfu > 1:
        return f"its MFU ({mfu!r}) is beyond what the card can do"
    if measurement.get("step_s") == 0:
        return "its step time is zero"
    if block.get("status") == "ok":
        return _holds_too_little(block, alloc, world)
    return None


def _beyond_the_card(block: dict, env: dict, reserved, used) -> str | None:
    """A CUDA run cannot reserve more than its device holds, nor, capped, more than the cap allowed
    (``torch.cuda.set_per_process_memory_fraction`` refuses the allocation: an OOM)."""
    total = env.get("gpu_total_bytes")
    if isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0:
        for name, value in (("peak reserved", reserved), ("device total", used)):
            if value is not None and value > total:
                return f"its {name} ({value:,} bytes) is more than its GPU holds ({total:,})"
    cap = block.get("cap") if isinstance(block.get("cap"), dict) else {}
    limit = cap.get("emulated_memory_bytes")
    if cap.get("applied") and isinstance(limit, (int, float)) and not isinstance(limit, bool) and reserved is not None \
            and reserved > limit:
        return f"its peak reserved ({reserved:,} bytes) is more than its cap allowed ({limit:,})"
    return None


def _holds_too_little(block: dict, alloc, world: int) -> str | None:
    case = block.get("case") if isinstance(block.get("case"), dict) else {}
    setup = case.get("setup") if isinstance(case.get("setup"), dict) else {}
    if alloc is None or setup.get("offload") == "params" or not isinstance(case.get("model"), str):
        return None
    from reportgen import catalog
    from reportgen.errors import UserError

    try:
        params = catalog.load_model(case["model"]).total_params
    except (UserError, OSError, ValueError):
        return None  # a model this machine cannot resolve: nothing to check against
    floor = params * 0.5 / max(world, 1)
    if alloc < floor:
        return f"its peak allocated ({alloc:,} bytes) is below the weights it had to hold (at least {floor:,.0f})"
    return None


def _world_size(block: dict, env: dict) -> tuple[int, str | None]:
    """The run's process count, and the mismatch with its case's GPU count (when the block names
    its case: measurement files and ``reportgen measure`` answers do)."""
    world = env.get("world_size")
    world = world if isinstance(world, int) and world >= 1 else 1
    case = block.get("case") if isinstance(block.get("case"), dict) else {}
    setup = case.get("setup") if isinstance(case.get("setup"), dict) else {}
    gpus = setup.get("gpus", 1)
    if isinstance(gpus, int) and gpus != world:
        return world, (f"it ran as {world} process{'es' if world > 1 else ''} for a {gpus}-GPU case")
    return world, None
