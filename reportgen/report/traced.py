"""View models of the traced figures: the model and GPU pages' "traced beside the estimate" tables and
the validation page's "Analytic vs traced" section.

Reads only the rows of ``rows.row`` (each case's estimate and, joined by ``render.load_site``, its
current traced file) and the data modules of the trace (``trace/agreement.py``: tolerance, known
disagreements and their causes; ``trace/emulations.py``: what a trace rests on). Nothing traces here.
"""

from __future__ import annotations

import statistics

from reportgen.report.page import SiteData
from reportgen.report.rows import site_rows
from reportgen.trace import agreement
from reportgen.trace.emulations import EMULATIONS


def _gap(est: float | None, traced: float | None) -> float | None:
    return None if est is None or not traced else (est - traced) / traced


def comparison(r: dict) -> dict:
    """One case: estimated and traced peak allocated and reserved, the relative gaps, and whether the
    allocated gap is within the agreement tolerance (with the listed cause when it is not)."""
    t = r["traced"]
    gap = _gap(r["peak_allocated"], t["peak_allocated"])
    # like with like: what each would reserve without the card's limit, unless the traced replay was
    # itself limited to the card (then both are what the card shows)
    est_reserved = r["peak_reserved"] if r["peak_reserved"] is None or t.get("cache_limited") else (
        r["peak_reserved"] + (r.get("cache_released") or 0))
    return {**{k: r[k] for k in ("id", "model", "gpu", "color", "label", "batch", "seq", "sweep")},
            "est_allocated": r["peak_allocated"], "traced_allocated": t["peak_allocated"], "gap": gap,
            "est_reserved": est_reserved, "traced_reserved": t["peak_reserved"],
            "reserved_gap": _gap(est_reserved, t["peak_reserved"]),
            "within": gap is not None and abs(gap) <= agreement.TOLERANCE,
            "cause": agreement.STORED_DISAGREEMENTS.get(r["id"])}


def traced_table(rows: list[dict]) -> list[dict]:
    """The comparisons of the rows that have a traced figure and an estimate, in the rows' order."""
    return [comparison(r) for r in rows if r["traced"] and r["status"] == "ok" and r["peak_allocated"] is not None]


def _gap_stats(table: list[dict]) -> dict:
    gaps = [c["gap"] for c in table if c["gap"] is not None]
    res = [c["reserved_gap"] for c in table if c["reserved_gap"] is not None]
    return {"median_abs_gap": statistics.median(abs(g) for g in gaps) if gaps else None,
            "worst_gap": max(gaps, key=abs) if gaps else None,
            "median_reserved_gap": statistics.median(res) if res else None,
            "min_reserved_gap": min(res, default=None), "max_reserved_gap": max(res, default=None)}


def step_time_check(rows: list[dict]) -> dict | None:
    """The second step time against the measurements: the time model priced on each traced step's own
    inventory (``traced_results.traced_time``) and on the analytic one, for the cases with a current
    traced file and a measured step time that counts (``compare``); signed errors (est - meas) / meas.
    Nothing is fitted to the traced figure. None without such a case."""
    cases = []
    for r in rows:
        hit = ((r.get("compare") or {}).get("quantities") or {}).get("step_s")
        t = r.get("traced") or {}
        if hit and hit["meas"] and t.get("step_s") and hit.get("est"):
            cases.append({"id": r["id"], "label": r["label"], "model": r["model"], "meas": hit["meas"],
                          "traced": t["step_s"], "est": hit["est"], "traced_err": t["step_s"] / hit["meas"] - 1,
                          "est_err": hit["est"] / hit["meas"] - 1,
                          "steps": ((r["compare"].get("timing") or {}).get("steps"))})
    if not cases:
        return None

    def stats(key: str) -> dict:
        errs = [c[key] for c in cases]
        return {"median_abs": statistics.median(abs(e) for e in errs), "signed": statistics.median(errs),
                "worst": max(errs, key=abs)}

    steps = sorted({c["steps"] for c in cases if c["steps"]})
    return {"n": len(cases), "traced": stats("traced_err"), "analytic": stats("est_err"), "rows": cases,
            "steps": " to ".join(str(n) for n in steps[:1] + steps[1:][-1:])}


def traced_view(rows: list[dict]) -> dict | None:
    """A page's traced cases (model and GPU pages): ``{rows, tolerance}``, None when none was traced."""
    table = traced_table(rows)
    return {"rows": table, "tolerance": agreement.TOLERANCE} if table else None


def validation_traced(site: SiteData) -> dict:
    """The validation page's "Analytic vs traced" section."""
    rows = site_rows(site)
    table = traced_table(rows)
    estimated = {r["id"] for r in rows}
    not_estimated = sorted(cid for cid in site.traced if cid not in estimated)
    used: dict[str, int] = {}
    for doc in site.traced.values():
        for name in doc.get("emulations") or []:
            used[name] = used.get(name, 0) + 1
    grid_ids = agreement.grid_ids()
    by_cause = {}
    for cid, cause in sorted(agreement.DISAGREEMENTS.items()):
        by_cause.setdefault(cause, []).append(cid)
    envs = sorted({tuple(sorted((k, str(v)) for k, v in (d.get("environment") or {}).items()))
                   for d in site.traced.values()})
    sweeps = sorted({d.get("sweep") for d in site.traced.values() if d.get("sweep")})
    return {
        "tolerance": agreement.TOLERANCE,
        "rows": table,
        "n": len(table),
        "n_within": sum(1 for c in table if c["within"]),
        **_gap_stats(table),
        "outside": [c for c in table if not c["within"]],
        "not_estimated": not_estimated,
        "sweeps": [{"name": s, "command": f"reportgen sweep sweeps/{s}.yaml --trace"} for s in sweeps],
        "trace_hashes": sorted({d.get("trace_hash") for d in site.traced.values() if d.get("trace_hash")}),
        "environments": [", ".join(f"{k} {v}" for k, v in env) for env in envs],
        "causes": [{"name": k, "text": v} for k, v in agreement.CAUSES.items()],
        "grid": {"n": len(grid_ids), "layers": agreement.LAYERS, "gpu": agreement.GPU,
                 "n_disagreements": len(agreement.DISAGREEMENTS),
                 "by_cause": [{"cause": c, "text": agreement.CAUSES[c], "cases": ids} for c, ids in by_cause.items()]},
        "fixed": [{"name": k, "text": v} for k, v in agreement.FIXED.items()],
        "emulations": [{"name": e.name, "what": e.what, "source": e.source, "used": used.get(e.name, 0)}
                       for e in EMULATIONS.values()],
        "n_traced": len(site.traced),
        "time": step_time_check(rows),
    }
