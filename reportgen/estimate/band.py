"""How sure an estimate is: the expected error range from the validation data, and the three-way
verdict on whether a run fits.

``error_band.json`` (beside this file) is written by ``scripts/error_band.py`` from every
comparison the project has: the measurements other projects published (``reportgen
compare-published``) and our own CUDA measurements once they exist (those the provenance rule lets
count). For each measure (allocated, reserved) and technique (full, LoRA, QLoRA) it holds the 10th
and 90th percentile of ``measured / estimated - 1``, the number of comparisons, and the
leave-one-out coverage of that band (how often a comparison left out of the band falls inside it).
A group with fewer than ``MIN_ROWS`` comparisons borrows the band of all techniques of its
measure. The device total (what nvidia-smi shows, and what ``fits`` compares with the card) takes
the reserved band: it is reserved memory plus the CUDA context.

The verdict, for a card of ``capacity`` bytes and an estimated device total ``d``:

* ``fits``: even the high end of the band fits, ``d x (1 + hi) <= capacity``;
* ``does not fit``: even the low end does not, ``d x (1 + lo) > capacity``;
* ``tight``: the card's capacity lies inside the band.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

BAND_FILE = Path(__file__).with_name("error_band.json")
#: comparisons a (measure, technique) group needs for its own band
MIN_ROWS = 5


@dataclass(frozen=True)
class Band:
    lo: float  # measured / estimated - 1 at the low end (10th percentile)
    hi: float  # ... at the high end (90th percentile)
    n: int  # comparisons behind it
    basis: str  # what it was computed from, in words
    coverage: float | None = None  # leave-one-out share of comparisons inside their band

    def range(self, estimate: float) -> tuple[float, float]:
        """The expected range of the real value given an estimate."""
        return estimate * (1 + self.lo), estimate * (1 + self.hi)

    def as_dict(self) -> dict:
        return {"lo": self.lo, "hi": self.hi, "n": self.n, "basis": self.basis, "coverage": self.coverage}


@lru_cache(maxsize=1)
def band_table() -> dict:
    try:
        return json.loads(BAND_FILE.read_text())
    except (OSError, ValueError):
        return {}


def band_for(measure: str, technique: str) -> Band | None:
    """The band of ``measure`` (``allocated`` | ``reserved`` | ``device_total``) for a technique
    (``full`` | ``lora`` | ``qlora``), falling back to all techniques of the measure; None when the
    validation data say nothing about it."""
    table = band_table().get("bands", {})
    measure = "reserved" if measure == "device_total" else measure
    groups = table.get(measure, {})
    for key in (technique, "all"):
        g = groups.get(key)
        if g and g["n"] >= MIN_ROWS:
            return Band(lo=g["lo"], hi=g["hi"], n=g["n"], basis=g["basis"], coverage=g.get("coverage"))
    return None


def verdict(device_total: float, capacity: float, band: Band | None) -> str:
    """``fits`` / ``tight`` / ``does not fit`` (module docstring); without a band, the point estimate
    decides between the two ends."""
    if band is None:
        return "fits" if device_total <= capacity else "does not fit"
    lo, hi = band.range(device_total)
    if hi <= capacity:
        return "fits"
    if lo > capacity:
        return "does not fit"
    return "tight"
