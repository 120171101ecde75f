"""How many timed steps a measurement runs, and what their times say (no torch: pure functions).

The harness (``harness.py``) times each step twice: the wall time (``time.perf_counter`` around a
step between two ``torch.cuda.synchronize()``) and, on CUDA, the time between two CUDA events
recorded on the current stream at the step's start and end (``torch.cuda.Event.elapsed_time``).
``step_s``, what tokens/s and MFU are based on, is the median of the wall times.

Stopping rule (``stop_reason``), checked after every timed step:

1. never before ``min_steps`` timed steps;
2. ``stable``: the distribution-free 95 % confidence interval of the median (``median_ci``) lies
   within ``target_rel_ci`` of the median (``rel_ci``): the median is known to +-target;
3. ``max_steps``: that many timed steps ran;
4. ``time_cap``: the timed steps' wall times add up to ``max_timed_s``, or the next step, at the
   median so far, would take them past it.

A fixed count is ``min_steps == max_steps`` (what every measurement before this rule did:
``settings.steps`` timed steps and no ``max_steps``, ``rule_from_settings``). The idea is
``torch.utils.benchmark.Timer.adaptive_autorange`` (repeat until IQR/median < threshold or a time
cap); the criterion here is the median's confidence interval instead of the IQR, because the IQR
measures the spread of single steps and does not shrink with more steps, while the interval says
how well the median itself is known. The relative IQR is recorded beside it
(``torch.utils.benchmark`` warns when it exceeds 10 %).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, field

#: why the timed steps stopped
STOP_REASONS = ("stable", "max_steps", "time_cap")
#: the confidence level of the median's interval
CONFIDENCE = 0.95


@dataclass(frozen=True)
class StopRule:
    """When the timed steps stop (module docstring). ``max_timed_s``/``target_rel_ci`` None: not used."""

    min_steps: int
    max_steps: int
    max_timed_s: float | None = None
    target_rel_ci: float | None = None

    def __post_init__(self) -> None:
        if self.min_steps < 1 or self.max_steps < self.min_steps:
            raise ValueError(f"StopRule: need 1 <= min_steps ({self.min_steps}) <= max_steps ({self.max_steps})")

    @property
    def fixed(self) -> bool:
        return self.min_steps == self.max_steps

    def key(self) -> tuple:
        """What decides the steps that run: a fixed count is only its count."""
        if self.fixed:
            return ("fixed", self.min_steps)
        return (self.min_steps, self.max_steps, self.max_timed_s, self.target_rel_ci)


def rule_from_settings(settings: dict) -> StopRule:
    """The rule a request or a stored ``settings`` block describes. ``steps`` is the minimum; a block
    without ``max_steps`` (every measurement made before the adaptive rule) ran exactly ``steps``."""
    steps = int(settings.get("steps") or 1)
    max_steps = settings.get("max_steps")
    return StopRule(min_steps=steps, max_steps=steps if max_steps is None else int(max_steps),
                    max_timed_s=settings.get("max_timed_s"), target_rel_ci=settings.get("target_rel_ci"))


def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """1-based ranks ``(j, n + 1 - j)`` of the sorted sample that bound the median with at least
    ``confidence``, or None when ``n`` is too small for any.

    The number of observations below the median is Binomial(n, 1/2), so
    ``P(x_(j) <= median <= x_(n+1-j)) = 1 - 2 P(B <= j - 1)``; ``j`` is the largest rank with
    ``P(B <= j - 1) <= (1 - confidence) / 2`` (Conover, *Practical Nonparametric Statistics*, 3rd ed.,
    1999, section 3.2, the confidence interval for a quantile). Worked example: n = 10 at 95 %:
    P(B <= 1) = 11/1024 = 1.07 %, P(B <= 2) = 56/1024 = 5.5 %, so j = 2: ``(x_(2), x_(9))``, coverage
    97.9 %. Below n = 6 no interval reaches 95 % (n = 5: ``(x_(1), x_(5))`` covers 93.75 %)."""
    tail = (1.0 - confidence) / 2.0
    cumulative, j = 0.0, 0
    for k in range(n + 1):
        cumulative += math.comb(n, k) / 2.0**n
        if cumulative > tail:
            break
        j = k + 1
    if j < 1 or j > n + 1 - j:
        return None
    return j, n + 1 - j


def median_ci(times: list[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The distribution-free confidence interval of the median (``median_ci_ranks``)."""
    ranks = median_ci_ranks(len(times), confidence)
    if ranks is None:
        return None
    ordered = sorted(times)
    return ordered[ranks[0] - 1], ordered[ranks[1] - 1]


def rel_ci(times: list[float], confidence: float = CONFIDENCE) -> float | None:
    """The larger distance from the median to an end of its interval, relative to the median: the
    median is known to +- this fraction (None: too few steps for an interval)."""
    ci = median_ci(times, confidence)
    if ci is None:
        return None
    med = statistics.median(times)
    return max(med - ci[0], ci[1] - med) / med if med > 0 else None


def quartiles(times: list[float]) -> tuple[float, float]:
    """First and third quartile, linear interpolation between order statistics (``numpy.percentile``'s
    and ``torch.quantile``'s default, which ``torch.utils.benchmark`` uses; ``statistics.quantiles``
    ``method="inclusive"``). One time: both are that time."""
    if len(times) < 2:
        return times[0], times[0]
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q1, q3


def summary(times: list[float]) -> dict:
    """The figures of a list of step times: the median (``step_s``), min, max, quartiles, the IQR
    relative to the median and the median's 95 % interval, absolute and relative."""
    med = statistics.median(times)
    q1, q3 = quartiles(times)
    ci = median_ci(times)
    return {"step_s": med, "step_s_min": min(times), "step_s_max": max(times), "step_s_q1": q1, "step_s_q3": q3,
            "step_s_iqr_rel": (q3 - q1) / med if med > 0 else None,
            "step_s_ci": list(ci) if ci is not None else None, "step_s_ci_rel": rel_ci(times),
            "steps_run": len(times)}


def stop_reason(times: list[float], rule: StopRule) -> str | None:
    """Why the timed steps stop after these ``times`` (module docstring), or None to go on."""
    n = len(times)
    if n < rule.min_steps:
        return None
    if rule.target_rel_ci is not None and not rule.fixed:
        spread = rel_ci(times)
        if spread is not None and spread <= rule.target_rel_ci:
            return "stable"
    if n >= rule.max_steps:
        return "max_steps"
    if rule.max_timed_s is not None and sum(times) + statistics.median(times) > rule.max_timed_s:
        return "time_cap"
    return None


def planned_timed_s(step_s: float, rule: StopRule) -> float:
    """The most seconds the timed steps of a case take when each step takes ``step_s``: the minimum
    steps always run; beyond them the time cap (which a step does not start past, at the median)
    or ``max_steps``, whichever comes first."""
    most = rule.max_steps * step_s
    if rule.max_timed_s is None:
        return most
    return min(most, max(rule.min_steps * step_s, rule.max_timed_s))


def timing_note(m: dict) -> str:
    """One line on how a measurement's step time was obtained: steps, why they stopped, the spread
    (empty for a measurement without timing figures). Older files (a fixed count, no summary) say
    what they have: the number of steps and, from their min and max, the range."""
    times = m.get("step_times_s") or []
    if not times:
        return ""
    n = m.get("steps_run") or len(times)
    parts = [f"{n} timed step{'s' if n != 1 else ''}"]
    if m.get("stop_reason"):
        parts[0] += f", stopped: {m['stop_reason']}"
    if m.get("step_s_ci_rel") is not None:
        parts.append(f"median +-{100 * m['step_s_ci_rel']:.1f}% (95% CI)")
    if m.get("step_s_iqr_rel") is not None:
        parts.append(f"IQR {100 * m['step_s_iqr_rel']:.1f}% of the median")
    elif m.get("step_s") and m.get("step_s_min") is not None and m.get("step_s_max") is not None:
        parts.append(f"range {100 * (m['step_s_max'] - m['step_s_min']) / m['step_s']:.1f}% of the median")
    return "; ".join(parts)


@dataclass
class GcPauses:
    """Python's garbage collector inside the timed steps: ``with GcPauses() as g:`` around a step, then
    ``g.take()`` gives ``(collections, seconds)`` since the last ``take`` (``gc.callbacks``: a "start"
    and a "stop" call per collection). A host-bound step that a generation-2 collection interrupts is
    longer by the pause; recorded beside each step's time, it tells a slow step's cause from noise."""

    events: list = field(default_factory=list)  # (generation, seconds)
    _start: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.events.append((info.get("generation"), time.perf_counter() - self._start))
            self._start = None

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def take(self) -> tuple[int, float]:
        events, self.events = self.events, []
        return len(events), sum(s for _, s in events)
