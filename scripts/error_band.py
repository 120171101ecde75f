#!/usr/bin/env python3
"""Compute the estimator's expected error range from the validation data, with leave-one-out.

    python scripts/error_band.py [--check] [results/validation ...]

Reads every comparison of an estimate with a measurement the project has:

* the published measurements (``data/published_measurements.csv`` through
  ``reportgen.published.compare``, each row estimated with the current code; loss-only rows are
  left out: they measure one op, not a run);
* our own CUDA measurements under the results directories given (default ``results/*``), where the
  provenance rule lets them count for the case's card (allocated and reserved figures).

Per measure (allocated, reserved) and technique (full, LoRA, QLoRA, and all of them) it writes the
10th and 90th percentile of ``measured / estimated - 1`` and the leave-one-out coverage: for each
comparison, the band computed from all the others, and whether the left-out one falls inside it
(the number to quote: the in-sample share flatters). The result goes to
``reportgen/estimate/error_band.json`` with the estimator's code hash; ``--check`` exits 1 when the
stored bands or comparisons differ from what the current code computes (a test runs it), so a
formula change that moves any number must come with a rerun.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reportgen import catalog, store  # noqa: E402
from reportgen.estimate.band import BAND_FILE  # noqa: E402
from reportgen.estimate.memory import estimate_memory  # noqa: E402
from reportgen.fingerprint import estimator_hash  # noqa: E402
from reportgen.provenance import provenance_of  # noqa: E402
from reportgen.published.compare import compare  # noqa: E402
from reportgen.setup import TrainingSetup  # noqa: E402

CSV = ROOT / "data" / "published_measurements.csv"
LOW, HIGH = 0.10, 0.90


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the order statistics (the 'inclusive' definition)."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = q * (len(xs) - 1)
    i = int(pos)
    return xs[i] if i + 1 >= len(xs) else xs[i] + (xs[i + 1] - xs[i]) * (pos - i)


def published_comparisons() -> list[dict]:
    out = []
    for r in compare(CSV)["rows"]:
        if r["measure"] not in ("allocated", "reserved"):
            continue
        out.append({"measure": r["measure"], "technique": r["setup"]["method"], "ratio": r["published"] / r["estimated"],
                    "source": f"published {r['id']}"})
    return out


def measured_comparisons(dirs: list[Path]) -> list[dict]:
    """Every measurement file's current attempt (``store.load_measured``: each carries its case,
    so the band does not depend on whether the sweep's estimate files were written in this checkout),
    estimated now."""
    out = []
    for d in dirs:
        for r in store.load_measured(d, warn=lambda m: None):
            m = r.get("measurement")
            if not m or m.get("status") != "ok" or not isinstance(m.get("measurement"), dict):
                continue
            case = m["case"]
            if not provenance_of(m).memory_counts_for(case["gpu"]):
                continue
            setup = TrainingSetup.model_validate(case["setup"])
            mem = estimate_memory(catalog.load_model(case["model"]), setup, catalog.load_gpu(case["gpu"]))
            for measure, figure, est in (("allocated", "peak_allocated", mem.peak_allocated),
                                         ("reserved", "peak_reserved", mem.peak_reserved)):
                value = m["measurement"].get(figure)
                if value:
                    out.append({"measure": measure, "technique": setup.method.value, "ratio": value / est,
                                "source": f"measured {r['id']}"})
    return out


def band(rows: list[dict], basis: str) -> dict:
    errors = [r["ratio"] - 1 for r in rows]
    inside = 0
    for i in range(len(errors)):
        rest = errors[:i] + errors[i + 1:]
        if rest and percentile(rest, LOW) <= errors[i] <= percentile(rest, HIGH):
            inside += 1
    return {"lo": round(percentile(errors, LOW), 4), "hi": round(percentile(errors, HIGH), 4), "n": len(errors),
            "median": round(statistics.median(errors), 4),
            "coverage": round(inside / len(errors), 4) if len(errors) > 1 else None, "basis": basis}


def compute(dirs: list[Path]) -> dict:
    rows = published_comparisons() + measured_comparisons(dirs)
    bands: dict[str, dict] = {}
    for measure in ("allocated", "reserved"):
        mine = [r for r in rows if r["measure"] == measure]
        if not mine:
            continue
        groups = {"all": mine}
        for technique in ("full", "lora", "qlora"):
            sel = [r for r in mine if r["technique"] == technique]
            if sel:
                groups[technique] = sel
        bands[measure] = {}
        for key, sel in groups.items():
            n_pub = sum(r["source"].startswith("published") for r in sel)
            what = "all techniques" if key == "all" else {"full": "full fine-tuning", "lora": "LoRA",
                                                          "qlora": "QLoRA"}[key]
            basis = (f"{measure} memory, {what}: {n_pub} published and {len(sel) - n_pub} own measurements "
                     f"(10th to 90th percentile of measured / estimated - 1)")
            bands[measure][key] = band(sel, basis)
    return {"estimator_hash": estimator_hash(), "percentiles": [LOW, HIGH], "bands": bands,
            "comparisons": sorted((r["source"], r["measure"], round(r["ratio"], 4)) for r in rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 when the stored band is not current")
    args = parser.parse_args()
    dirs = args.results or sorted(p for p in (ROOT / "results").glob("*") if p.is_dir())
    data = compute(dirs)
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if args.check:  # the numbers must be current; the code hash is a record of what computed them
        try:
            stored = json.loads(BAND_FILE.read_text())
        except (OSError, ValueError):
            stored = {}
        if {k: v for k, v in stored.items() if k != "estimator_hash"} != {
                k: v for k, v in json.loads(text).items() if k != "estimator_hash"}:
            print(f"{BAND_FILE} is not what the current code computes: run python scripts/error_band.py")
            return 1
        print(f"{BAND_FILE} is current")
        return 0
    BAND_FILE.write_text(text)
    for measure, groups in data["bands"].items():
        for key, b in groups.items():
            cov = "-" if b["coverage"] is None else f"{100 * b['coverage']:.0f}%"
            print(f"{measure:9} {key:5} n={b['n']:3}  band {100 * b['lo']:+6.1f}% .. {100 * b['hi']:+6.1f}%  "
                  f"median {100 * b['median']:+6.1f}%  leave-one-out coverage {cov}")
    print(f"wrote {BAND_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
