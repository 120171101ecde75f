"""Estimate what each mappable published row reports and compute the error.

The estimator is never tuned to these rows: they come from other code bases and library versions
(see ``mapping.py``). The comparison is a public sanity check; our own CUDA measurements are the
ground truth.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from reportgen import catalog
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.logits import logits_memory
from reportgen.estimate.memory import estimate_memory
from reportgen.published.mapping import Mapped, Unmapped, map_row, prose_allocated, read_rows, row_problem
from reportgen.published.consumer import CSV_NAME as CONSUMER_CSV
from reportgen.published.consumer import SETUPS_NAME as CONSUMER_SETUPS
from reportgen.published.consumer import consumer_speed_rows
from reportgen.published.speed import compare_speed, slowdown_rows

UNIT_BYTES = {"GiB": 2**30, "GB": 1e9, "MB": 1e6, "MiB": 2**20}
#: the code and data a comparison is computed by, besides the estimator's (globs relative to the
#: package): the rows' mapping, this module, the speed comparison and the model configs the mapping
#: reads (``cli.py`` only prints and writes)
CODE = ("published/mapping.py", "published/compare.py", "published/speed.py", "published/consumer.py",
        "published/configs/*.json")


def comparison_inputs_hash(csv_path: Path) -> str:
    """What the whole comparison depends on, hashed: the published rows (the CSV's bytes, and those of
    ``consumer_speed.csv`` and its mapping beside it), the
    estimator's code, this folder's code and configs, and every catalog model's config and GPU entry.
    ``data/published_comparison.json`` records it as ``inputs_hash`` (an ``artifacts.Artifact`` of
    kind ``published``): a file of another hash is stale."""
    from reportgen.fingerprint import catalog_entries, estimator_hash, source_hash
    from reportgen.results import short_hash

    beside = {name: (Path(csv_path).parent / name).read_text(encoding="utf-8")
              for name in (CONSUMER_CSV, CONSUMER_SETUPS) if (Path(csv_path).parent / name).is_file()}
    return short_hash({"rows": Path(csv_path).read_text(encoding="utf-8"), "estimator": estimator_hash(),
                       "code": source_hash(CODE), **catalog_entries(), **beside}, 16)


def source_key(source: str) -> str:
    """``owner/repo`` of a GitHub source, else the source's first word."""
    m = re.search(r"github\.com/([^/\s]+/[^/\s]+)", source)
    return m.group(1) if m else source.split()[0]


def estimated_bytes(m: Mapped) -> float:
    spec = m.spec
    if m.measure.startswith("loss"):
        lm = logits_memory(spec, dtypes_for(m.setup), m.setup.batch * m.setup.seq)
        return lm.forward_live if m.measure == "loss-forward" else max(lm.forward_live, lm.backward_live)
    mem = estimate_memory(spec, m.setup, catalog.load_gpu(m.gpu), libs=m.libs)
    # the published reserved peaks count from the first step (fsdp_qlora's train.py resets the peak
    # statistics before its training loop), where a step that releases its cache first filled the card
    return mem.reserved_from_first_step if m.measure == "reserved" else mem.peak_allocated


def same_run_key(m: Mapped) -> tuple:
    """Rows with this key and different GPUs are one measurement printed in two GPUs' tables: the
    same source document, model, setup, measure and figure. fsdp_qlora's benchmark page prints the
    memory of its RTX 3090 runs again in its RTX 4090 tables (the times differ, the memory figures
    are the same to the hundredth of a GiB); two rows on one GPU stay two measurements (litgpt's
    Llama 3 and 3.1 8B configs report the same figure from two runs)."""
    return (m.source.split()[0], m.model, m.setup.model_dump_json(), m.measure, m.unit, m.published)


def dedupe(mapped: list[tuple[dict, Mapped]]) -> list[tuple[dict, Mapped, list[str]]]:
    """``[(raw, mapped, ids of the other printings)]``, one entry per measurement, first printing kept."""
    out: list[tuple[dict, Mapped, list[str]]] = []
    first: dict[tuple, tuple[dict, Mapped, list[str]]] = {}
    for raw, m in mapped:
        key = same_run_key(m)
        seen = first.get(key)
        if seen is not None and seen[1].gpu != m.gpu:
            seen[2].append(m.row_id)
            continue
        entry = (raw, m, [])
        first.setdefault(key, entry)
        out.append(entry)
    return out


def _median(values) -> float | None:
    values = list(values)
    return round(statistics.median(values), 4) if values else None


def _repeated_ids(rows: list[dict]) -> dict[int, str]:
    """``{row number: why}`` of the rows whose id an earlier row already has (a pasted row, a copy left behind)."""
    first: dict[str, int] = {}
    again = {}
    for n, row in enumerate(rows, 1):
        rid = row.get("id")
        if rid in first:
            again[n] = f"the id of row {first[rid]} again (row {n}): an id names one row"
        else:
            first[rid] = n
    return again


def compare(csv_path: Path) -> dict:
    rows, unmapped = [], []
    mapped: list[tuple[dict, Mapped]] = []
    raw_rows = read_rows(csv_path)
    again = _repeated_ids(raw_rows)
    for n, raw in enumerate(raw_rows, 1):
        if n in again:  # every figure is compared once, under the id that names it first
            unmapped.append({"id": raw.get("id"), "source": raw.get("source") or "", "reason": again[n]})
            continue
        m = map_row(raw)
        if isinstance(m, Unmapped):
            unmapped.append({"id": m.row_id, "source": m.source, "reason": m.reason})
            continue
        mapped.append((raw, m))
        extra = prose_allocated(raw, m)
        if extra:
            mapped.append((raw, extra))
    for raw, m, also in dedupe(mapped):
        est = estimated_bytes(m) / UNIT_BYTES[m.unit]
        err = est - m.published
        to_gb = UNIT_BYTES[m.unit] / 1e9
        rows.append({
            "id": m.row_id, "same_as": also, "source": m.source, "model": raw["model"],
            "model_as": Path(m.model).stem if m.model.endswith(".json") else m.model, "technique": raw["technique"],
            "gpu": m.gpu, "batch": m.setup.batch, "seq": m.setup.seq, "measure": m.measure, "unit": m.unit,
            "published": round(m.published, 4), "estimated": round(est, 4), "abs_error": round(abs(err), 4),
            "published_gb": round(m.published * to_gb, 4), "estimated_gb": round(est * to_gb, 4),
            "abs_error_gb": round(abs(err) * to_gb, 4), "rel_error": round(err / m.published, 4),
            "setup": m.setup.model_dump(mode="json"), "assumptions": m.assumptions,
            "bitsandbytes": m.libs.bitsandbytes,
        })
    summary = {
        "inputs_hash": comparison_inputs_hash(csv_path),
        "rows": rows,
        "unmapped": unmapped,
        "median_abs_error_gb": round(statistics.median(r["abs_error_gb"] for r in rows), 4) if rows else None,
        "median_abs_rel_error": round(statistics.median(abs(r["rel_error"]) for r in rows), 4) if rows else None,
        "median_rel_error": round(statistics.median(r["rel_error"] for r in rows), 4) if rows else None,
        "by_source": {},
        # a damaged row (``mapping.row_problem``) is named once, among the unmapped rows above
        "speed": compare_speed(clean := [r for n, r in enumerate(raw_rows, 1) if not row_problem(r) and n not in again],
                               consumer_speed_rows(Path(csv_path).parent)),
    }
    for r in summary["speed"]["rows"]:  # the document each row comes from: its name and its address
        r["source_key"], address = source_key(r["source"]), r["source"].split()[0]
        r["source_url"] = address if address.startswith("https://") else f"https://{address}"
    summary["speed"]["qlora_over_lora"] = slowdown_rows(clean)
    speed_multi = [r for r in summary["speed"]["rows"] if r["gpus"] > 1 and r["rel_error"] is not None]
    multi = [r for r in rows if r["setup"]["gpus"] > 1]
    summary["multi_gpu"] = {
        "memory_rows": len(multi),
        "memory_median_abs_rel_error": _median(abs(r["rel_error"]) for r in multi),
        "memory_median_rel_error": _median(r["rel_error"] for r in multi),
        "speed_rows": len(speed_multi),
        "speed_median_abs_rel_error": _median(abs(r["rel_error"]) for r in speed_multi),
        "speed_median_rel_error": _median(r["rel_error"] for r in speed_multi),
    }
    for src in sorted({source_key(r["source"]) for r in rows}):
        sel = [r for r in rows if source_key(r["source"]) == src]
        summary["by_source"][src] = {
            "rows": len(sel),
            "median_abs_error_gb": round(statistics.median(r["abs_error_gb"] for r in sel), 4),
            "median_rel_error": round(statistics.median(r["rel_error"] for r in sel), 4),
        }
    return summary
