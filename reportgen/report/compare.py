"""Estimate against measurement: what every surface prints beside a measured case, and the headline
errors over all of them.

One measured case compares with its estimate in four quantities:

* ``peak_allocated``: the estimate against ``torch.cuda.max_memory_allocated()``;
* ``peak_reserved``: against ``torch.cuda.max_memory_reserved()``;
* ``device_total``: against the harness's ``device_used`` (NVML's memory of the process, what
  ``nvidia-smi`` shows);
* ``step_s``: the estimated step time against the measured one (the median of the timed steps'
  wall times, ``reportgen.measure.timing``); tokens/s is the same comparison inverted and is shown
  beside it, not counted twice.

Which of them a measurement may be compared with is decided by ``reportgen.provenance`` alone
(``valid_quantities``): memory for the card that ran it or the card its memory cap emulated, speed
only for the card that ran it, a CPU run for nothing. Relative error is
``(estimate - measurement) / measurement``: positive means the estimate is too high (for the step
time: too slow). Nothing here estimates or measures: it reads an estimate block and a measurement
block (``store.load_results``'s ``estimate`` and ``measurement``), so the figures shown are always the
stored files' own, recomputed at every render.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from reportgen.provenance import MEMORY_QUANTITIES, SPEED_QUANTITIES, provenance_of
from reportgen.results import short_hash

#: the quantities compared, in the order every table shows them
COMPARED = MEMORY_QUANTITIES + ("step_s",)
LABELS = {
    "peak_allocated": "peak allocated",
    "peak_reserved": "peak reserved",
    "device_total": "device total",
    "step_s": "step time",
}
UNITS = {"peak_allocated": "GiB", "peak_reserved": "GiB", "device_total": "GiB", "step_s": "s"}
#: where each quantity stands in a measurement's figures (the harness calls the device total
#: ``device_used``: this process's memory as NVML sees it)
MEASURED_FIELDS = {"peak_allocated": ("peak_allocated",), "peak_reserved": ("peak_reserved",),
                   "device_total": ("device_total", "device_used"), "step_s": ("step_s",),
                   "tokens_per_s": ("tokens_per_s",)}
#: a step-time spread (max - min over the median) beyond this is called wide on the pages
WIDE_SPREAD = 0.25


def relative_error(est: float | None, meas: float | None) -> float | None:
    """``(est - meas) / meas``; None when either is missing or the measurement is zero."""
    if est is None or meas is None or not meas:
        return None
    return (est - meas) / meas


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def figure(block: dict, quantity: str) -> float | None:
    """A measured figure of ``quantity`` from a measurement block: its ``measurement`` figures, or the
    block itself (result files older than the measurement files embedded them there)."""
    for source in (block.get("measurement"), block):
        if isinstance(source, dict):
            for key in MEASURED_FIELDS[quantity]:
                if _number(source.get(key)):
                    return source[key]
    return None


def timing(block: dict) -> dict | None:
    """How a measured step time was obtained: steps, why they stopped, the spread; None without
    timed steps. ``fixed``: a fixed count of timed steps (every measurement made before the adaptive
    rule of ``reportgen.measure.timing``: ``settings`` has no ``max_steps``)."""
    fig = block.get("measurement") if isinstance(block.get("measurement"), dict) else {}
    times = [t for t in fig.get("step_times_s") or [] if _number(t)]
    med = fig.get("step_s")
    if not times or not _number(med) or med <= 0:
        return None
    settings = block.get("settings") if isinstance(block.get("settings"), dict) else {}
    lo = fig.get("step_s_min") if _number(fig.get("step_s_min")) else min(times)
    hi = fig.get("step_s_max") if _number(fig.get("step_s_max")) else max(times)
    return {"steps": fig.get("steps_run") or len(times), "fixed": settings.get("max_steps") is None,
            "stop_reason": fig.get("stop_reason"), "min": lo, "max": hi, "spread_rel": (hi - lo) / med,
            "iqr_rel": fig.get("step_s_iqr_rel"), "ci_rel": fig.get("step_s_ci_rel")}


def compare(estimate: dict | None, block: dict | None, gpu: str) -> dict | None:
    """One measurement block against the estimate of a case on ``gpu``; None without a block.

    ``quantities``: ``{quantity: {"est", "meas", "err"}}`` for each of ``COMPARED`` the provenance
    rule lets count and both sides have; ``tokens_per_s`` the same for tokens/s (with the step time);
    ``speed_not_compared``: why a measured step time is not compared (a capped run, another card),
    else None; ``timing`` (``timing``); ``status``, ``label`` (the provenance rule's words),
    ``capped``, ``counts`` (anything of it counts for ``gpu``, an out-of-memory verdict included) and,
    for a run that did not finish, ``verdict`` (the estimate's), ``expected`` (the estimate foresaw
    it: an OOM where the estimate does not say "fits") and ``allocated_at_failure``."""
    if not block:
        return None
    est = estimate or {}
    mem, tim = est.get("memory") or {}, est.get("time") or {}
    prov = provenance_of(block)
    valid = prov.valid_quantities(gpu)
    speed = any(q in valid for q in SPEED_QUANTITIES)
    status = block.get("status")
    out = {"status": status, "label": prov.label(gpu), "counts": bool(valid),
           "capped": prov.emulated_gpu == gpu and prov.device_gpu != gpu and bool(valid),
           "quantities": {}, "tokens_per_s": None, "speed_not_compared": None, "timing": None,
           "verdict": est.get("verdict"), "expected": None, "allocated_at_failure": None}
    if status != "ok":
        if status == "oom" and prov.memory_counts_for(gpu):
            out["expected"] = est.get("verdict") not in (None, "fits")
            at = (block.get("measurement") or {}).get("peak_allocated_at_failure")
            out["allocated_at_failure"] = at if _number(at) else None
        return out
    for q in COMPARED:
        allowed = speed if q == "step_s" else q in valid
        e = tim.get("step_s") if q == "step_s" else mem.get(q)
        m = figure(block, q)
        if allowed and _number(e) and m is not None:
            out["quantities"][q] = {"est": e, "meas": m, "err": relative_error(e, m)}
    if speed:
        e, m = tim.get("tokens_per_s"), figure(block, "tokens_per_s")
        if _number(e) and m is not None:
            out["tokens_per_s"] = {"est": e, "meas": m, "err": relative_error(e, m)}
        out["timing"] = timing(block)
    elif figure(block, "step_s") is not None and valid:
        out["speed_not_compared"] = prov.label(gpu)
    return out


# ----- the headline -------------------------------------------------------------------------------
def case_label(model: str, setup_label: str, batch: int, seq: int) -> str:
    """A case in words, for the worst-case column: ``llama-3.2-1b, LoRA, fp32, batch 1, seq 2,048``."""
    return f"{model}, {setup_label}, batch {batch}, seq {seq:,}"


def headline_markdown(headline: list[dict]) -> str:
    """The headline table as Markdown (``reportgen validation --format markdown``, the README)."""
    lines = ["| Quantity | Cases | Median \\|error\\| | Signed median | Worst case |", "|:--|--:|--:|--:|:--|"]
    for s in headline:
        lines.append(f"| {s['label']} | {s['n']} | {100 * s['median_abs']:.2f}% | {100 * s['median']:+.2f}% | "
                     f"{100 * s['worst']['err']:+.1f}%: {s['worst']['label']} (`{s['worst']['id']}`) |")
    return "\n".join(lines)


def summary(items: Iterable[dict]) -> list[dict]:
    """The headline errors over measured cases, one entry per quantity of ``COMPARED`` that has any:
    ``n``, ``median_abs`` (median |relative error|), ``median`` (signed median), ``worst`` (the
    largest |error|, with its case: ``{"err", "id", "label"}``), ``capped`` (how many of the cases ran
    on a larger card capped to the case card's memory), ``fixed`` and ``spread_max`` /
    ``spread_median`` for the step time (how many rest on a fixed count of timed steps, and how far
    apart their steps were). ``items``: ``{"id", "label", "compare"}``, ``compare`` from ``compare``."""
    items = [i for i in items if i.get("compare")]
    out = []
    for q in COMPARED:
        hits = [(i, i["compare"]["quantities"][q]) for i in items if q in i["compare"]["quantities"]]
        errs = [c["err"] for _, c in hits if c["err"] is not None]
        if not errs:
            continue
        worst_item, worst = max(((i, c) for i, c in hits if c["err"] is not None),
                                key=lambda ic: (abs(ic[1]["err"]), ic[1]["err"], ic[0]["id"]))
        entry = {"quantity": q, "label": LABELS[q], "n": len(errs),
                 "median_abs": statistics.median(abs(x) for x in errs), "median": statistics.median(errs),
                 "worst": {"err": worst["err"], "id": worst_item["id"], "label": worst_item["label"]},
                 "capped": sum(1 for i, _ in hits if i["compare"]["capped"]),
                 "steps": None, "fixed": 0, "spread_max": None, "spread_median": None, "wide": 0}
        if q == "step_s":
            tims = [i["compare"]["timing"] for i, _ in hits if i["compare"]["timing"]]
            spreads = [t["spread_rel"] for t in tims]
            entry.update(fixed=sum(1 for t in tims if t["fixed"]),
                         steps=sorted({t["steps"] for t in tims if t["fixed"]}),
                         spread_max=max(spreads, default=None),
                         spread_median=statistics.median(spreads) if spreads else None,
                         wide=sum(1 for s in spreads if s > WIDE_SPREAD))
        out.append(entry)
    return out


def speed_excluded(items: Iterable[dict]) -> list[dict]:
    """Measured cases whose memory counts but whose step time does not (capped runs): ``{"id",
    "label", "why"}``."""
    return [{"id": i["id"], "label": i["label"], "why": i["compare"]["speed_not_compared"]}
            for i in items if i.get("compare") and i["compare"]["speed_not_compared"]]


# ----- environments -------------------------------------------------------------------------------
#: what makes two measurements' environments one: the card, its driver and CUDA, the libraries that
#: decide the memory and the speed, and the code that measured (``environment`` of a measurement)
ENVIRONMENT_KEY = (
    ("GPU", ("gpu_name",)),
    ("driver", ("driver_version",)),
    ("CUDA", ("cuda_version",)),
    ("torch", ("versions", "torch")),
    ("transformers", ("versions", "transformers")),
    ("peft", ("versions", "peft")),
    ("bitsandbytes", ("versions", "bitsandbytes")),
    ("commit", ("git_commit",)),
)
#: fields that differ from run to run within one environment and are summarised, not listed
PER_RUN = ("utc",)


def _get(env: dict, path: tuple[str, ...]):
    for key in path:
        env = env.get(key) if isinstance(env, dict) else None
    return env


def environment_key(env: dict) -> tuple[tuple[str, str | None], ...]:
    """``((name, value), ...)`` of ``ENVIRONMENT_KEY``: two measurements with the same key ran in one
    environment."""
    return tuple((name, None if _get(env, path) is None else str(_get(env, path))) for name, path in ENVIRONMENT_KEY)


def environment_id(env: dict) -> str:
    """The anchor of an environment's section on the validation page: ``env-`` + a hash of its key."""
    return "env-" + short_hash([list(kv) for kv in environment_key(env)], 8)


def _flat(env: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in env.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)
    return out


def _differing(groups: dict) -> tuple[str, ...]:
    """The key's names beyond GPU, driver, CUDA and torch whose values differ between ``groups``: each
    title names them, so that two environments never read the same."""
    keys = [dict(g["key"]) for g in groups.values()]
    return tuple(n for n, _ in ENVIRONMENT_KEY if n not in ("GPU", "driver", "CUDA", "torch")
                 and len({k[n] for k in keys}) > 1)


def _short(name: str, value: str) -> str:
    return value[:7] if name == "commit" else value


def environment_groups(measured: Iterable[tuple[str, dict]]) -> list[dict]:
    """``measured``: ``(case id, environment)`` of every measurement that counts. One group per
    environment key, in order of first appearance: ``id``, ``key`` (``[(name, value)]``), ``title``,
    ``same`` (the other fields equal in every run of it), ``varying`` (``[(field, [(value, runs)])]``
    for fields that differ, ``PER_RUN`` fields as their first and last value), ``cases`` (sorted ids)."""
    groups: dict[str, dict] = {}
    for cid, env in measured:
        g = groups.setdefault(environment_id(env), {"id": environment_id(env), "key": environment_key(env),
                                                    "envs": [], "cases": []})
        g["envs"].append(_flat(env))
        g["cases"].append(cid)
    keyed = {".".join(path) for _, path in ENVIRONMENT_KEY}
    out = []
    for g in groups.values():
        fields = sorted({f for e in g["envs"] for f in e} - keyed)
        same, varying = [], []
        for f in fields:
            values = [e.get(f, "-") for e in g["envs"]]
            if len(set(values)) == 1:
                same.append((f, values[0]))
            elif f in PER_RUN:
                varying.append((f, [(min(values), None), (max(values), None)]))
            else:
                varying.append((f, sorted(((v, values.count(v)) for v in set(values)), key=lambda vc: (-vc[1], vc[0]))))
        named = dict(g["key"])
        title = [named["GPU"] or "unnamed device"] + [f"{n} {_short(n, named[n])}" for n in ("driver", "CUDA", "torch")
                                                      + _differing(groups) if named[n] is not None]
        out.append({"id": g["id"], "key": [(n, v) for n, v in g["key"]],
                    "title": " · ".join(title) if any(v is not None for v in named.values())
                    else "environment not recorded",
                    "same": same, "varying": varying, "cases": sorted(set(g["cases"])), "runs": len(g["envs"])})
    return out
