"""The one definition of whether a run fits a card: fits, tight or does not fit, with its margin
and its band. Every surface reads it from here: ``reportgen estimate`` and ``advise``, the guides,
the home grid, the GPU and model pages, the "how many cards" table, the CSV downloads and the
calculator; and every search (largest micro-batch, longest sequence, the cheapest setup, the
decision tree's checks, the card counts) asks ``Verdict.fits``, so a setup they pick is one the
verdict calls "fits".

What is compared: ``MemoryEstimate.card_demand``, what the step asks of the card (the device total
nvidia-smi would show, with the cached blocks the allocator would keep before releasing any, less
paged optimizer states that may spill to host RAM), against the card's memory ``capacity``. The
demand is an estimate; the error band (``band.py``: 10th to 90th percentile of measured /
estimated - 1 over every comparison the project has) gives its expected range ``[d(1+lo), d(1+hi)]``:

* **fits**: even the high end fits, ``d(1 + hi) <= capacity``;
* **does not fit**: even the low end does not, ``d(1 + lo) > capacity``;
* **tight**: the card's capacity lies inside the expected range; also a demand that passes the
  card only by cached blocks the allocator can release (``cache_released``: the allocated peak
  fits, so it runs if releasing the cache leaves room).

Only "fits" fits: a tight setup is shown as tight with its margin, never as fitting, and never
recommended. Without a band (no validation data for the technique) the point estimate decides
between fits and does not fit. The margin is ``capacity - demand`` (negative: short by that much).

Worked example (``tests/test_verdict.py``): 23.2 GiB asked of a 24.0 GiB card with LoRA's band
-4.6 % to +6.9 % is expected at 22.1 to 24.8 GiB: tight, margin +0.8 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from reportgen.estimate.band import Band, band_for
from reportgen.estimate.band import verdict as classify  # fits / tight / does not fit of a demand

GIB = 2**30
KINDS = ("fits", "tight", "does not fit")


@dataclass(frozen=True)
class Verdict:
    kind: str  # fits | tight | does not fit
    demand: int  # bytes the step asks of the card (MemoryEstimate.card_demand)
    capacity: int  # bytes of the card
    band: Band | None = None  # expected error of the demand, from the validation data
    phase: str = "train"  # the run's phase whose demand this is (run.py): the training step unless another asks more

    @property
    def fits(self) -> bool:
        """The only answer that counts as fitting: the whole expected range within the card."""
        return self.kind == "fits"

    @property
    def margin(self) -> int:
        """Bytes left on the card by the point estimate (negative: short by that much)."""
        return self.capacity - self.demand

    @property
    def range(self) -> tuple[int, int] | None:
        """The expected range of the demand (None without a band)."""
        if self.band is None:
            return None
        lo, hi = self.band.range(self.demand)
        return int(lo), int(hi)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "fits": self.fits, "demand": self.demand, "capacity": self.capacity,
                "margin": self.margin, "range": None if self.range is None else list(self.range)}

    def text(self) -> str:
        """One line a reader can act on, e.g. ``tight: needs 23.2 of 24.0 GiB, 0.8 GiB to spare by the
        estimate, but its error band reaches 24.8 GiB: may run out of memory``."""
        text = verdict_text(self.kind, self.demand, self.capacity, self.range)
        if self.phase == "train":
            return text
        # "does not fit: needs 56.9 of 24.0 GiB at evaluation, short by ...": the demand is that phase's
        return text.replace(" GiB", f" GiB at {PHASE_WORDS.get(self.phase, self.phase)}", 1)


#: how a sentence names a run phase other than the training step (run.py)
PHASE_WORDS = {"eval": "evaluation", "load": "loading", "save": "the checkpoint save",
               "generation": "generation", "scoring": "scoring"}  # (grpo.py's phases)


def _g(n: float) -> str:
    return f"{n / GIB:.1f}"


def verdict_text(kind: str, demand: int, capacity: int, rng: tuple[int, int] | list[int] | None) -> str:
    """The words for a verdict, from plain values (stored walks and result files hold them)."""
    margin = capacity - demand
    need = f"needs {_g(demand)} of {_g(capacity)} GiB"
    expected = "" if rng is None else f", expected {_g(rng[0])}-{_g(rng[1])} GiB"
    if kind == "fits":
        return f"fits: {need}, {_g(margin)} GiB free{expected}"
    if kind == "does not fit":
        return f"does not fit: {need}, short by {_g(-margin)} GiB{expected}"
    if margin >= 0:
        why = f"{_g(margin)} GiB to spare by the estimate" + (
            "" if rng is None else f", but its error band reaches {_g(rng[1])} GiB")
    elif rng is not None and rng[0] <= capacity:
        why = f"short by {_g(-margin)} GiB by the estimate, but its error band starts at {_g(rng[0])} GiB"
    else:
        why = f"short by {_g(-margin)} GiB unless the allocator releases cached blocks"
    return f"tight: {need}, {why}: may run out of memory"


def margin_label(kind: str, margin: int) -> str:
    """The short form for table cells: ``fits``, ``tight (+0.8 GiB)``, ``no (-9.3 GiB)``."""
    if kind == "fits":
        return "fits"
    word = "tight" if kind == "tight" else "no"
    return f"{word} ({margin / GIB:+.1f} GiB)"


def judge(mem, capacity: int, method: str, demand: int | None = None, phase: str = "train") -> Verdict:
    """The verdict of a ``MemoryEstimate`` on a card of ``capacity`` bytes, for a technique
    (``full`` | ``lora`` | ``qlora``: which band applies); ``demand``/``phase``: the run's phase that asks
    the most of the card (``run.py``), by default the training step's ``card_demand``."""
    band = band_for("device_total", method)
    demand = mem.card_demand if demand is None else demand
    kind = classify(demand, capacity, band)
    if mem.cache_released and kind == "does not fit" and phase == "train":
        kind = "tight"  # the allocated peak fits: it runs if releasing the cache leaves room
    return Verdict(kind=kind, demand=demand, capacity=capacity, band=band, phase=phase)


__all__ = ["KINDS", "Verdict", "classify", "judge", "margin_label", "verdict_text"]
