"""The site's data pages as providers (``provider(site) -> list[Page]``, see ``page.py``):
home, one page per catalog GPU, one per catalog model, validation, and the CSV downloads.

Providers only read result dicts (through ``rows.row``) and catalog facts; charts are drawn here
(SVG text in ``Page.files``), tables are view models for the templates.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

from markupsafe import Markup

from reportgen import catalog, store
from reportgen.artifacts import Artifact
from reportgen.report import charts, compare
from reportgen.report.page import Page, SiteData
from reportgen.report.traced import traced_view, validation_traced
from reportgen.provenance import MEMORY_QUANTITIES
from reportgen.results import UnreadableResult, read_json
from reportgen.published import DEFAULT_OUT
from reportgen.report.rows import (PRIMARY_SEQ, TECHNIQUE_COLORS, TECHNIQUES, anchor, best_fit, environment_of,
                                    gib_value, gpu_label, gpu_order, group, measured_results, model_order, rel,
                                    reproduce, row, setup_label, site_results, site_rows, sort_key, training_setup)
from reportgen.estimate.time import rates_source
from reportgen.format import GIB, TERM_LABELS

PUBLISHED_COMMAND = "reportgen compare-published"


def _models(rows: list[dict]) -> list[str]:
    return sorted({r["model"] for r in rows}, key=model_order)


def _gpus(rows: list[dict]) -> list[str]:
    return sorted({r["gpu"] for r in rows}, key=gpu_order)


# ----- CSV ---------------------------------------------------------------------------------------
CSV_COLUMNS = (
    "case_id", "sweep", "model", "gpu", "technique", "setup", "gpus", "batch", "seq_tokens", "status", "fits", "verdict",
    "est_peak_allocated_gib", "est_peak_reserved_gib", "est_device_total_gib", "est_max_batch", "est_max_seq_tokens",
    "est_step_s", "est_tokens_per_s", "est_mfu", "est_hours_per_100m_tokens", "est_usd_per_100m_tokens",
    "meas_peak_allocated_gib", "meas_peak_reserved_gib", "meas_device_total_gib", "meas_step_s", "meas_tokens_per_s",
    "environment_id",
)


def _num(x, digits: int = 4):
    if x is None:
        return ""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}g}" if abs(x) >= 1e6 else f"{round(x, digits):g}" if digits else str(x)


def csv_row(r: dict, terms: bool = False) -> dict:
    m = r["measured"] or {}
    step = (((r.get("compare") or {}).get("quantities") or {}).get("step_s") or {}).get("meas")
    out = {
        "case_id": r["id"], "sweep": r["sweep"], "model": r["model"], "gpu": r["gpu"], "technique": r["technique"],
        "setup": r["label"], "gpus": r["gpus"], "batch": r["batch"], "seq_tokens": r["seq"], "status": r["status"],
        "fits": _num(r["fits"]), "verdict": r["verdict"] or "",
        "est_peak_allocated_gib": _num(gib_value(r["peak_allocated"])),
        "est_peak_reserved_gib": _num(gib_value(r["peak_reserved"])),
        "est_device_total_gib": _num(gib_value(r["device_total"])),
        "est_max_batch": _num(r["max_batch"]), "est_max_seq_tokens": _num(r["max_seq"]),
        "est_step_s": _num(r["step_s"], 6), "est_tokens_per_s": _num(r["tokens_per_s"], 6), "est_mfu": _num(r["mfu"], 4),
        "est_hours_per_100m_tokens": _num(r["hours_per_100m"], 6),
        "est_usd_per_100m_tokens": _num(r["dollars_per_100m"], 6),
        "meas_peak_allocated_gib": _num(gib_value(m.get("peak_allocated"))),
        "meas_peak_reserved_gib": _num(gib_value(m.get("peak_reserved"))),
        "meas_device_total_gib": _num(gib_value(m.get("device_total"))),
        "meas_step_s": _num(step, 6), "meas_tokens_per_s": _num(m.get("tokens_per_s"), 6),
        "environment_id": r["env_id"] or "",
    }
    if terms:
        for term in TERM_LABELS:
            out[f"est_{term}_gib"] = _num(gib_value(r["terms"].get(term)))
    return out


#: first characters that make a spreadsheet read a cell as a formula (OWASP, "CSV Injection")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(value):
    """A cell a spreadsheet shows as the text it is: a string that starts like a formula (a model
    path ``=HYPERLINK(...)``) gets a leading ``'``, as OWASP recommends; numbers (``-0.05``) pass."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_START) else value


def write_csv(rows: list[dict], terms: bool = False) -> str:
    columns = list(CSV_COLUMNS) + ([f"est_{t}_gib" for t in TERM_LABELS] if terms else [])
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: csv_safe(v) for k, v in csv_row(r, terms).items()})
    return buf.getvalue()


# ----- home --------------------------------------------------------------------------------------
def _cell(r: dict | None) -> dict | None:
    if r is None:
        return None
    return {"technique": r["technique"], "label": r["label"], "color": r["color"], "tokens_per_s": r["tokens_per_s"],
            "batch": r["batch"], "gpus": r["gpus"], "seq": r["seq"], "id": r["id"],
            "hours_per_100m": r["hours_per_100m"], "dollars_per_100m": r["dollars_per_100m"],
            "measured": (r["measured"] or {}).get("tokens_per_s"), "env_id": r["env_id"],
            "measured_err": ((r["compare"] or {}).get("tokens_per_s") or {}).get("err"),
            "measured_label": r["measured_label"]}


def _walks(site: SiteData) -> dict:
    from reportgen.report.guides import stored_walks

    return stored_walks(site)


def unswept_fit(walks: dict, model: str, gpu: str, page: str) -> dict | None:
    """Where no swept setup of ``model`` fits ``gpu``: the setup the stored decision-tree walk
    recommends at the overviews' sequence length (it uses techniques the sweep may not cover, such
    as the fused loss or double quantization), so the page says that the guide's setup fits but was
    not swept instead of contradicting the guide. None when the walk finds nothing that fits either."""
    from reportgen.report.guides import guide_path

    seqs = sorted(s for g, m, s in walks if (g, m) == (gpu, model))
    if not seqs:
        return None
    seq = PRIMARY_SEQ if PRIMARY_SEQ in seqs else seqs[0]
    rec = walks[(gpu, model, seq)].get("recommended")
    if not rec:
        return None
    setup = training_setup(rec["setup"])
    return {"label": setup_label(setup.model_copy(update={"accum": 1}), any_mixed=True), "technique": setup.technique(),
            "color": TECHNIQUE_COLORS[setup.technique()], "batch": setup.batch, "accum": setup.accum, "seq": seq,
            "tokens_per_s": rec["tokens_per_s"], "device_total": rec["device_total"],
            "verdict_text": rec.get("verdict_text"), "link": rel(page, guide_path(gpu)) + f"#{anchor(model)}"}


def home_pages(site: SiteData) -> list[Page]:
    path = "index.md"
    rows = site_rows(site)
    models, gpus = _models(rows), _gpus(rows)
    by_pair = group(rows, "model", "gpu")
    best = {k: best_fit(v) for k, v in by_pair.items()}
    walks = _walks(site)
    guide = {k: unswept_fit(walks, *k, path) for k, v in best.items() if v is None}
    seqs_used = sorted({b["seq"] for b in best.values() if b})
    files: dict[str, str] = {}
    chart = None
    if models and gpus:
        chart = "charts/home-fit-grid.svg"
        seq_note = f"seq {PRIMARY_SEQ}" if seqs_used == [PRIMARY_SEQ] else "seq " + ", ".join(map(str, seqs_used))
        grid = {k: _cell(v) or (guide[k] and {**guide[k], "unswept": True}) for k, v in best.items()}
        measured = any(c and c.get("measured") for c in grid.values())
        files[chart] = charts.fit_grid(
            models, [(g, gpu_label(g)) for g in gpus], grid,
            title=f"Fastest setup that fits, estimated tokens/s ({seq_note}{'; ◆ = measured too' if measured else ''})")
    table = []
    for m in models:
        cells = []
        for g in gpus:
            key = (m, g)
            cells.append({"gpu": g, "swept": key in by_pair, "best": _cell(best.get(key)), "guide": guide.get(key),
                          "link": rel(path, f"gpus/{g}.md") + f"#{anchor(m)}"})
        table.append({"model": m, "link": model_link(path, m), "cells": cells})
    chosen = [b for b in best.values() if b]
    chosen.sort(key=lambda r: (model_order(r["model"]), gpu_order(r["gpu"])))
    files["data/home.csv"] = write_csv(chosen)
    for name in sorted(site.results):  # every sweep as one CSV with all memory terms
        files[f"data/sweeps/{name}.csv"] = write_csv(sorted((row(r) for r in site.results[name]), key=sort_key),
                                                     terms=True)
    context = {
        "root": "",
        "gpus": [{"key": g, "label": gpu_label(g), "link": rel(path, f"gpus/{g}.md")} for g in gpus],
        "table": table,
        "chart": chart,
        "chart_alt": (f"Grid of {len(models)} models by {len(gpus)} GPUs: each cell names the estimated fastest "
                      "setup that fits and its tokens per second, or says that nothing fits"),
        "seqs": seqs_used,
        "n_cases": len(rows),
        # the Methodology page's count: a case whose measurement counts (an OOM verdict counts too)
        "n_measured": sum(1 for r in rows if r["compare"]),
        "overview": measured_overview(site, rows, path) if any(r["compare"] for r in rows) else None,
        "sweeps": [{"name": n, "cases": len(site.results[n]), "csv": f"data/sweeps/{n}.csv"}
                   for n in sorted(site.results)],
        "unswept_gpus": [{"key": g, "label": gpu_label(g), "link": rel(path, f"gpus/{g}.md")}
                         for g in catalog.gpu_names() if g not in gpus],
        "unswept_models": [{"name": m, "link": rel(path, f"models/{m}.md")}
                           for m in catalog.model_names() if m not in models],
        "techniques": [{"name": t, "color": c} for t, c in TECHNIQUE_COLORS.items()],
        "repro": reproduce(site, chosen, "data/home.csv"),
    }
    return [Page(path=path, template="home.md.j2", context=context, files=files)]


def model_link(page: str, model: str) -> str | None:
    """Link from ``page`` to the model's page; None for a model given by a config.json path, which
    has no page (the site has one page per catalog model)."""
    return rel(page, f"models/{model}.md") if model in catalog.model_names() else None


# ----- GPU pages ---------------------------------------------------------------------------------
def _gpu_facts(key: str) -> dict:
    g, entry = catalog.load_gpu(key), catalog.gpu_entry(key)
    return {
        "key": key, "name": g.name, "label": gpu_label(key), "architecture": g.architecture,
        "compute_capability": g.compute_capability, "memory_gb": g.memory_gb, "memory_type": g.memory_type,
        "memory_bytes": g.memory_bytes, "nvidia_smi_mib": g.nvidia_smi_total_mib,
        "bandwidth_gbs": g.memory_bandwidth_gbs, "l2_mb": g.l2_cache_bytes // 2**20 or None,
        "l2_source": entry.get("l2_cache_source") or "", "rates": rates_source(g),
        "peaks": [{"dtype": d, "tflops": g.peak_tflops.get(d), "derived": d in g.derived}
                  for d in ("fp32", "tf32", "fp16", "bf16")],
        "host_link": g.host_link, "host_link_gbs": g.host_link_gbs, "tdp_w": g.tdp_w,
        "peer_link": g.peer_link, "peer_link_gbs": g.peer_link_gbs, "peer_link_gpus": g.peer_link_gpus,
        "peer_link_source": g.peer_link_source,
        "price": g.price_usd_per_hour, "price_source": g.price_source, "price_date": g.price_date,
        "sources": list(g.sources), "notes": g.notes.strip(),
    }


def _chart_rows(rows: list[dict]) -> list[dict]:
    """Per model and setup (label), the case with the smallest micro-batch: what a memory chart shows."""
    out = []
    for (model, label), rs in group(rows, "model", "label").items():
        r = min(rs, key=lambda r: (r["batch"], r["id"]))
        if r["status"] == "ok" and r["device_total"] is not None:
            out.append({**r, "group": model, "label": label + (f", batch {r['batch']}" if r["batch"] > 1 else "")})
    out.sort(key=lambda r: (model_order(r["model"]), TECHNIQUES.index(r["technique"]), r["gpus"], r["label"]))
    return out


#: how many cards each model needs (``reportgen cards``, ``advise/cards.py``), if written
DEFAULT_CARDS = Path("data/cards_needed.json")


def _fit_cell(fit: dict | None, consumer: bool = False) -> str:
    """One answer of the cards table in words; a count past one machine says how many machines, and
    on a consumer card that it is no realistic setup (``advise.cards.NODE_GPUS``)."""
    from reportgen.advise.cards import NODE_GPUS

    if fit is None:
        return ""
    n = fit["gpus"]
    how = "one card" if n == 1 else f"{n} cards, {fit['sharding']}"
    if fit["offload"] != "none":
        how += f" + parameter offload ({fit['host_ram_gib']:,.0f} GiB host RAM)"
    text = how + ("" if fit["tokens_per_s"] is None else f" · {fit['tokens_per_s']:,.0f} tokens/s")
    if n > NODE_GPUS:
        machines = -(-n // NODE_GPUS)
        text += (f" <span class=\"rg-dim\">({machines} machines of {NODE_GPUS} over a network"
                 + (": impractical for consumer cards" if consumer else "") + ")</span>")
    return text


def cards_view(data: dict | None, key: str) -> dict | None:
    """The GPU page's "how many cards" table from the stored answers: one row per model, one cell
    per method (None where no answers are stored for this card)."""
    if not data or key not in data.get("gpus", {}):
        return None
    rows = []
    consumer = catalog.load_gpu(key).is_consumer if key in catalog.gpu_names() else False
    for model in sorted(data["gpus"][key], key=model_order):
        cells = []
        for method in ("full", "lora", "qlora"):
            c = data["gpus"][key][model].get(method) or {}
            text = _fit_cell(c.get("fit"), consumer) or f"not within {data['counts'][-1]} cards"
            if c.get("offload_fit"):
                text += "<br>or " + _fit_cell(c["offload_fit"], consumer)
            cells.append(Markup(text))  # numbers and words of advise/cards.py, with their markup
        rows.append({"model": model, "cells": cells})
    return {"seq": data["seq"], "max": data["counts"][-1], "rows": rows}


def _warn_if_stale(artifact: Artifact, data: dict, inputs: str, shown: str, command: str) -> None:
    """The render's word on a committed document the pages show (the cards table, the comparison with
    published rows) that was not computed from this checkout's ``inputs``: the page still shows it."""
    if not artifact.is_current(data):
        print(f"warning: {artifact.path} was computed by other {inputs} than this checkout's: {shown} may be "
              f"stale; run `{command}`", file=sys.stderr)


def _read_shown(path: Path | None, shown: str, command: str) -> dict | None:
    """A committed document the pages show, or None when it is absent; one that cannot be read (a
    merge conflict, a truncated copy) is a warning and the pages leave ``shown`` out, as when absent."""
    if path is None or not path.is_file():
        return None
    try:
        return read_json(path)
    except UnreadableResult as exc:
        print(f"warning: {exc}; the site goes without {shown}; run `{command}`", file=sys.stderr)
        return None


def _load_cards(path: Path | None) -> dict | None:
    """``reportgen cards``'s answers, with a warning when they are stale: computed by other code or
    from other catalog entries than this checkout's (``advise.cards.cards_inputs_hash``)."""
    from reportgen.advise.cards import cards_inputs_hash

    data = _read_shown(path, "the GPU pages' 'How many cards' tables", "reportgen cards")
    if data is None:
        return None
    _warn_if_stale(Artifact("cards", path, cards_inputs_hash(data.get("seq", 2048))), data,
                   "code or catalog entries", "the GPU pages' 'How many cards' tables", "reportgen cards")
    return data


def gpu_pages(site: SiteData, cards: Path | None = DEFAULT_CARDS) -> list[Page]:
    from reportgen.report.grpo_guides import grpo_links
    from reportgen.report.guides import calculator_link, guided_gpus

    from reportgen.report.profiles import load_profiles, profiles_view

    cards_data = _load_cards(cards)
    profiles = load_profiles()
    all_rows = site_rows(site)
    by_gpu = group(all_rows, "gpu")
    guided = set(guided_gpus(site))
    walks = _walks(site)
    pages = []
    for key in catalog.gpu_names():
        path = f"gpus/{key}.md"
        rows = by_gpu.get(key, [])
        facts = _gpu_facts(key)
        files: dict[str, str] = {}
        seqs = sorted({r["seq"] for r in rows})
        charts_ctx = []
        for seq in seqs:
            at = [r for r in rows if r["seq"] == seq]
            mem_rows = _chart_rows(at)
            mem_path = f"charts/gpus/{key}-memory-s{seq}.svg"
            files[mem_path] = charts.memory_breakdown(
                mem_rows, facts["memory_bytes"], title=f"{facts['label']}: memory terms per setup, seq {seq:,} (est.)")
            panels = [(m, rs) for m, rs in sorted(group(at, "model").items(), key=lambda kv: model_order(kv[0]))]
            tp_path = f"charts/gpus/{key}-throughput-s{seq}.svg"
            files[tp_path] = charts.throughput_by_batch(
                panels, title=f"{facts['label']}: tokens/s against micro-batch, seq {seq:,} (est.; fitting cases only)")
            charts_ctx.append({
                "seq": seq,
                "memory": rel(path, mem_path),
                "memory_alt": (f"Stacked bars of the estimated memory terms of each model and setup on the "
                               f"{facts['label']} at sequence length {seq}, micro-batch 1, with the peak allocated "
                               f"and device total marked and the {facts['memory_bytes'] / GIB:.1f} GiB capacity "
                               f"as a dashed line"),
                "throughput": rel(path, tp_path),
                "throughput_alt": (f"One small chart per model: estimated tokens per second on the {facts['label']} "
                                   f"against micro-batch size at sequence length {seq}, one line per technique"),
            })
        models = []
        for m, rs in sorted(group(rows, "model").items(), key=lambda kv: model_order(kv[0])):
            best = best_fit(rs)
            models.append({
                "name": m, "anchor": anchor(m), "link": model_link(path, m),
                "best": _cell(best), "guide": None if best else unswept_fit(walks, m, key, path),
                "seqs": [{"seq": s, "rows": [r for r in rs if r["seq"] == s],
                          "traced": any(r["traced"] for r in rs if r["seq"] == s)} for s in sorted({r["seq"] for r in rs})],
            })
        csv_path = f"data/gpus/{key}.csv"
        if rows:
            files[csv_path] = write_csv(rows)
        context = {
            "root": "../",
            "answer": gpu_answer(models, rows),
            "gpu": facts,
            "covered": bool(rows),
            "sweeps": sorted({r["sweep"] for r in rows}),
            "seqs": seqs,
            "primary_seq": PRIMARY_SEQ if PRIMARY_SEQ in seqs else (seqs[0] if seqs else None),
            "charts": charts_ctx,
            "models": models,
            "has_measured": any(r["measured"] for r in rows),
            **measured_context(rows),
            "traced": traced_view(rows),
            "guide": rel(path, f"guides/{key}.md") if key in guided else None,
            "grpo_guides": grpo_links(site, path, gpu=key),
            "calculator": calculator_link(path, key),
            "validation": rel(path, "validation.md"),
            "csv": rel(path, csv_path) if rows else None,
            "repro": reproduce(site, rows, rel(path, csv_path) if rows else None),
            "example_model": "llama-3.1-8b",
            "cards": cards_view(cards_data, key),
            "profiles": profiles_view(profiles, key),
        }
        pages.append(Page(path=path, template="gpu.md.j2", context=context, files=files))
    pages.append(_gpus_index(site, by_gpu))
    return pages


def _params(model: str) -> int:
    try:
        return catalog.load_model(model).total_params
    except Exception:  # noqa: BLE001 - a model this machine cannot resolve (a path gone): orders last
        return 0


def gpu_answer(models: list[dict], rows: list[dict]) -> dict | None:
    """What a GPU page opens with (issue 31: the answer first): how many of the swept models fine-tune
    on one card, the largest of them with its fastest fitting setup, and how many fit a full
    fine-tune on one card. None without a swept case."""
    if not models:
        return None
    fitting = [x for x in models if x["best"] and x["best"]["gpus"] == 1]
    largest = max(fitting, key=lambda x: (_params(x["name"]), x["name"]), default=None)
    full = {r["model"] for r in rows if r["fits"] and r["gpus"] == 1 and r["technique"].startswith("Full")}
    return {"fitting": len(fitting), "models": len(models), "largest": largest, "full": len(full)}


def model_answer(fits: list[dict], rows: list[dict]) -> dict | None:
    """What a model page opens with (issue 31): the smallest swept card that fine-tunes it alone, with
    its fastest fitting setup; the fastest single card; the smallest card a full fine-tune fits on.
    None without a swept case."""
    if not fits:
        return None
    memory = {f["gpu"]: catalog.load_gpu(f["gpu"]).memory_bytes for f in fits}
    alone = [f for f in fits if f["best"] and f["best"]["gpus"] == 1]
    smallest = min(alone, key=lambda f: (memory[f["gpu"]], f["gpu"]), default=None)
    fastest = max(alone, key=lambda f: (f["best"]["tokens_per_s"] or 0, f["gpu"]), default=None)
    full = [r["gpu"] for r in rows if r["fits"] and r["gpus"] == 1 and r["technique"].startswith("Full")]
    full_card = min(full, key=lambda g: (memory[g], g), default=None)
    by_gpu = {f["gpu"]: f for f in fits}
    return {"smallest": smallest, "fastest": fastest if fastest is not smallest else None,
            "full": by_gpu.get(full_card), "cards": len(fits), "alone": len(alone)}


def _gpus_index(site: SiteData, by_gpu: dict) -> Page:
    path = "gpus/index.md"
    items = []
    for key in catalog.gpu_names():
        rows = by_gpu.get(key, [])
        items.append({**_gpu_facts(key), "link": rel(path, f"gpus/{key}.md"), "cases": len(rows),
                      "sweeps": sorted({r["sweep"] for r in rows}),
                      "fitting_models": sum(1 for rs in group(rows, "model").values()
                                            if (b := best_fit(rs)) is not None and b["gpus"] == 1),
                      "models": len({r["model"] for r in rows})})
    return Page(path=path, template="gpus_index.md.j2", context={"root": "../", "gpus": items, "primary_seq": PRIMARY_SEQ})


# ----- model pages -------------------------------------------------------------------------------
def _capacities(shown: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """GPU capacities, those within 3% of each other merged, each drawn at the capacity of the GPU it names
    and labelled with how many more share it (``24 GiB: RTX 3090 +4 more``: the catalog holds 30-odd cards,
    and one line per capacity keeps every label apart on the chart). The named GPU is one the page's own rows
    use (``shown``), where one does, else the group's smallest card (the first in the catalog among equals)."""
    caps = sorted((catalog.load_gpu(k).memory_bytes, i, k) for i, k in enumerate(catalog.gpu_names()))
    merged: list[list] = []
    for cap in caps:
        if merged and cap[0] <= merged[-1][0][0] * 1.03:
            merged[-1].append(cap)
        else:
            merged.append([cap])
    out = []
    for cards in merged:
        b, _, first = min(cards, key=lambda c: (c[2] not in shown, c))
        out.append((b, gpu_label(first) + (f" +{len(cards) - 1} more" if len(cards) > 1 else "")))
    return out


def memory_by_seq_view(rows: list[dict]) -> tuple[list[dict], list[dict], list[int]]:
    """A model page's memory against sequence length: per setup at its smallest batch, the highest
    device total over the GPUs, as the chart's series and the table's rows (colours as the chart
    draws them, ``charts.variant_style``), and the sequence lengths."""
    # memory against sequence length: per setup, batch 1 (smallest batch), highest over the GPUs
    series_map: dict[tuple, dict] = {}
    for r in rows:
        if r["status"] != "ok" or r["device_total"] is None:
            continue
        key = (TECHNIQUES.index(r["technique"]), r["gpus"], r["family"])
        se = series_map.setdefault(key, {"label": r["family"], "technique": r["technique"],
                                         "multi_gpu": r["gpus"] > 1, "by_seq": {}})
        se["by_seq"].setdefault(r["seq"], []).append(r)
    series, table = [], []
    seqs = sorted({r["seq"] for r in rows})
    for key in sorted(series_map):
        se = series_map[key]
        points, measured, cells = [], [], {}
        for seq, rs in sorted(se["by_seq"].items()):
            b = min(r["batch"] for r in rs)
            at = [r for r in rs if r["batch"] == b]
            top = max(at, key=lambda r: (r["device_total"], r["id"]))
            points.append((seq, top["device_total"]))
            cells[seq] = {"device_total": top["device_total"], "batch": b,
                          "spread": top["device_total"] - min(r["device_total"] for r in at),
                          "gpus_n": len(at), "id": top["id"]}
            for r in at:
                mv = (r["measured"] or {}).get("device_total")
                if mv is not None:
                    measured.append((seq, mv))
        series.append({"label": se["label"], "technique": se["technique"], "multi_gpu": se["multi_gpu"],
                       "points": points, "measured": sorted(measured)})
        k = sum(1 for t in table if t["technique"] == se["technique"])  # as memory_by_seq counts
        table.append({"label": se["label"], "technique": se["technique"],
                      "color": charts.variant_style(se["technique"], k)[0], "cells": [cells.get(s) for s in seqs]})
    return series, table, seqs


def model_pages(site: SiteData) -> list[Page]:
    from reportgen.report.grpo_guides import grpo_links

    walks = _walks(site)
    all_rows = site_rows(site)
    by_model = group(all_rows, "model")
    pages = []
    for name in catalog.model_names():
        path = f"models/{name}.md"
        rows = by_model.get(name, [])
        spec = catalog.load_model(name)
        comps = spec.components()
        facts = {
            "name": name, "hf_repo": spec.hf_repo, "model_type": spec.model_type, "family": spec.family,
            "total_params": spec.total_params, "active_params": spec.active_params, "layers": spec.num_layers,
            "hidden": spec.hidden_size, "heads": spec.num_heads, "kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim, "intermediate": spec.intermediate_size, "vocab": spec.vocab_size,
            "tied": spec.tie_word_embeddings, "experts": spec.num_experts, "experts_per_token": spec.experts_per_token,
            "max_position": spec.max_position_embeddings, "sliding_window": spec.sliding_window,
        }
        components = [{"name": k, "params": v, "share": v / spec.total_params} for k, v in comps.items()]
        files: dict[str, str] = {}
        series, table, seqs = memory_by_seq_view(rows)
        chart = None
        if series:
            chart_path = f"charts/models/{name}-memory-by-seq.svg"
            files[chart_path] = charts.memory_by_seq(
                series, _capacities(frozenset(r["gpu"] for r in rows)),
                title=f"{name}: device total against sequence length (est.)")
            chart = rel(path, chart_path)
        fits = []
        for g, rs in sorted(group(rows, "gpu").items(), key=lambda kv: gpu_order(kv[0])):
            best = best_fit(rs)
            fits.append({"gpu": g, "label": gpu_label(g), "link": rel(path, f"gpus/{g}.md") + f"#{anchor(name)}",
                         "best": _cell(best), "guide": None if best else unswept_fit(walks, name, g, path),
                         "cases": len(rs),
                         "fitting": sum(1 for r in rs if r["fits"])})
        csv_path = f"data/models/{name}.csv"
        if rows:
            files[csv_path] = write_csv(rows)
        context = {
            "root": "../", "model": facts, "components": components, "covered": bool(rows),
            "calculator": rel(path, "calculator/index.md") + f"#model={name}",
            "chart": chart,
            "chart_alt": (f"Line chart: estimated device memory of {name} on one GPU against sequence length, one "
                          "line per technique at micro-batch 1, with the memory of each catalog GPU as a dotted "
                          "horizontal line"),
            "seqs": seqs, "memory_table": table, "fits": fits, "answer": model_answer(fits, rows),
            "max_spread": max((c["spread"] for t in table for c in t["cells"] if c), default=0),
            "csv": rel(path, csv_path) if rows else None,
            "repro": reproduce(site, rows, rel(path, csv_path) if rows else None),
            "has_measured": any(r["measured"] for r in rows),
            **measured_context(rows),
            "validation": rel(path, "validation.md"),
            "traced": traced_view(rows),
            "grpo_guides": grpo_links(site, path, model=name),
        }
        pages.append(Page(path=path, template="model.md.j2", context=context, files=files))
    idx = []
    for name in catalog.model_names():
        spec = catalog.load_model(name)
        rows = by_model.get(name, [])
        idx.append({"name": name, "link": name + ".md", "hf_repo": spec.hf_repo, "params": spec.total_params,
                    "layers": spec.num_layers, "hidden": spec.hidden_size, "vocab": spec.vocab_size,
                    "cases": len(rows), "gpus_fit": len({r["gpu"] for r in rows if r["fits"]}),
                    "gpus": len({r["gpu"] for r in rows})})
    idx.sort(key=lambda m: (m["params"], m["name"]))
    pages.append(Page(path="models/index.md", template="models_index.md.j2", context={"root": "../", "models": idx}))
    return pages


# ----- validation --------------------------------------------------------------------------------
#: what the validation page reads of each row of a comparison (``published.compare.compare``)
_MEMORY_ROW = {"id": str, "source": str, "model": str, "technique": str, "measure": str, "published_gb": float,
               "estimated_gb": float, "abs_error_gb": float, "rel_error": float}
_SPEED_ROW = {"id": str, "model": str, "technique": str, "gpu": str, "gpus": int, "batch": int, "seq": int,
              "published_tokens_per_s": float, "derivation": str, "source_key": str, "source_url": str}


def published_problem(data: dict) -> str | None:
    """Why a comparison file cannot be shown, or None: its rows lack what the page reads (or hold it in
    another type), or it compares no row at all. ``compare-published`` writes none such; a hand-edited
    or truncated file stopped ``render`` with a traceback."""
    def bad_rows(rows, want: dict, where: str) -> str | None:
        if not isinstance(rows, list):
            return f"{where} is not a list"
        for i, item in enumerate(rows):
            miss = [k for k, t in want.items() if not isinstance(item, dict) or not isinstance(item.get(k), t)
                    and not (t is float and isinstance(item.get(k), int) and not isinstance(item.get(k), bool))]
            if miss:
                return f"{where}[{i}] lacks or mistypes {', '.join(miss)}"
        return None

    speed = data.get("speed") if isinstance(data.get("speed"), dict) else {}
    problem = bad_rows(data.get("rows", []), _MEMORY_ROW, "rows") or bad_rows(speed.get("rows", []), _SPEED_ROW,
                                                                              "speed.rows")
    if problem:
        return problem
    numbers = [data.get(k) for k in ("median_abs_error_gb", "median_abs_rel_error", "median_rel_error")] + [
        speed.get(k) for k in ("median_abs_rel_error", "median_rel_error")]
    if any(v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))) for v in numbers):
        return "a median is not a number"
    if not data.get("rows") and not speed.get("rows"):
        return "it compares no row"
    return None


def _published(path: Path | None) -> dict | None:
    """``reportgen compare-published``'s comparison, with a warning when it is stale: computed by other
    code, catalog entries or published rows than this checkout's (``published.compare.comparison_inputs_hash``
    of the CSV beside it), as the cards table warns."""
    from reportgen.published import DEFAULT_CSV
    from reportgen.published.compare import comparison_inputs_hash

    data = _read_shown(path, "the validation page's comparison with published measurements",
                       "reportgen compare-published")
    if data is None:
        return None
    problem = published_problem(data)
    if problem:  # a file the pages cannot show: said, and the site goes without it (as an unreadable one)
        print(f"warning: {path}: {problem}; the validation page goes without the comparison with published "
              "measurements (reportgen compare-published writes it)", file=sys.stderr)
        return None
    csv = path.parent / DEFAULT_CSV.name
    if csv.is_file():
        _warn_if_stale(Artifact("published", path, comparison_inputs_hash(csv)), data,
                       "code, catalog entries or published rows",
                       "the validation page's comparison with published measurements", "reportgen compare-published")
    rows = sorted(data.get("rows", []), key=lambda r: str(r.get("id")))
    return {
        "rows": rows,
        "unmapped": sorted(data.get("unmapped", []), key=lambda r: str(r.get("id"))),
        "median_abs_error_gb": data.get("median_abs_error_gb"),
        "median_abs_rel_error": data.get("median_abs_rel_error"),
        "median_rel_error": data.get("median_rel_error"),
        "by_source": [{"source": k, **v} for k, v in sorted((data.get("by_source") or {}).items())],
        "speed": data.get("speed"),
        "multi_gpu": data.get("multi_gpu"),
        "file": path.as_posix(),
    }


def _bands() -> list[dict]:
    """The stored error band (``reportgen/estimate/error_band.json``, written by
    ``scripts/error_band.py``), one row per measure and technique."""
    from reportgen.estimate.band import MIN_ROWS, band_table

    names = {"all": "all techniques", "full": "Full", "lora": "LoRA", "qlora": "QLoRA"}
    out = []
    for measure, groups in sorted(band_table().get("bands", {}).items()):
        for key in ("all", "full", "lora", "qlora"):
            g = groups.get(key)
            if g:
                out.append({"measure": measure, "technique": names[key], "used": g["n"] >= MIN_ROWS, **g})
    return out


#: what each published measure is on the validation scatter (its colour)
_SCATTER_MEASURE = {"allocated": "allocated", "reserved": "reserved", "loss-forward": "loss",
                    "loss-forward-backward": "loss"}
OWN_SOURCE = "measured on a GPU by this project"


def _source_name(source: str, known: list[str]) -> str:
    """``"github.com/Lightning-AI/litgpt/blob/..."`` -> ``"Lightning-AI/litgpt"`` (a ``by_source`` key)."""
    return next((k for k in known if k in source), source.split(" ")[0])


def _validation_scatter(rows: list[dict], published: dict | None) -> dict | None:
    """The points and bands of ``charts.validation_scatter``: every published row (GB as the comparison
    stores them) and every measured case's peak allocated and reserved (the provenance rule already
    decided they count for the case's GPU; a CPU run has none), against their estimates."""
    points = []
    known = [s["source"] for s in published["by_source"]] if published else []
    for r in published["rows"] if published else []:
        measure = _SCATTER_MEASURE.get(r.get("measure"))
        if measure and r.get("published_gb") and r.get("estimated_gb"):
            points.append({"x": r["published_gb"], "y": r["estimated_gb"], "measure": measure,
                           "source": _source_name(r.get("source", ""), known)})
    for r in rows:
        for q, measure in (("peak_allocated", "allocated"), ("peak_reserved", "reserved")):
            meas = r["measured"].get(q)
            if meas and r[q]:
                points.append({"x": meas / 1e9, "y": r[q] / 1e9, "measure": measure, "source": OWN_SOURCE})
    if not points:
        return None
    from reportgen.estimate.band import band_table

    bands = [{"measure": m, "lo": g["lo"], "hi": g["hi"]} for m, groups in sorted(band_table().get("bands", {}).items())
             if m in charts.MEASURE_COLORS and (g := groups.get("all"))]
    return {"points": points, "bands": bands}


def _item(r: dict) -> dict:
    """A row as ``compare.summary`` reads it: the case's words for the worst-case line."""
    return {"id": r["id"], "label": compare.case_label(r["model"], r["label"], r["batch"], r["seq"]),
            "compare": r["compare"]}


def measured_overview(site: SiteData, rows: list[dict], page: str) -> dict:
    """What the home and validation pages say about the measurements as a whole, from the stored
    files at render time: the headline errors (``compare.summary``), the cases whose speed is not
    compared, the measurement files per sweep folder, how many did not finish, the environments
    (``compare.environment_groups``, linked from ``page``) and the cards capped runs emulated."""
    compared = [r for r in rows if r["compare"]]
    chosen = site_results(site)
    groups = compare.environment_groups((cid, env) for cid, result in sorted(chosen.items())
                                        if (env := environment_of(result)))
    files = {(name, m.get("path") or f"{r['id']}.{m.get('measured_at')}")
             for name, results in site.results.items() for r in results
             for m in r.get("measurements") or ([r["measurement"]] if r.get("measurement") else [])}
    folders = sorted({name for name, path in files if f"/{store.MEASURED_DIR}/" in path})
    headline = compare.summary(_item(r) for r in compared)
    basis: list[dict] = []  # what each quantity rests on; memory quantities with the same cases as one line
    for h in headline:
        last = basis[-1] if basis else None
        if last and h["quantity"] != "step_s" and last["quantity"] != "step_s" and \
                (last["n"], last["capped"]) == (h["n"], h["capped"]):
            last.update(label=last["label"] + ", " + h["label"], merged=True)
        else:
            basis.append({**h, "merged": False})
    return {
        "headline": headline,
        "basis": basis,
        "speed_excluded": compare.speed_excluded(_item(r) for r in compared),
        "n_cases": sum(1 for r in compared if r["compare"]["status"] == "ok"),
        "n_failed": sum(1 for r in compared if r["compare"]["status"] != "ok"),
        "n_files": len(files),
        "folders": [f"results/{name}/{store.MEASURED_DIR}/" for name in folders],
        "gpus": sorted({r["gpu"] for r in compared}, key=gpu_order),
        "capped_to": [gpu_label(g) for g in sorted({r["gpu"] for r in compared if r["compare"]["capped"]},
                                                   key=gpu_order)],
        "environments": [{**g, "link": rel(page, "validation.md") + f"#{g['id']}"} for g in groups],
        "validation": rel(page, "validation.md"),
        "methodology": rel(page, "methodology.md"),
        "wide_spread": compare.WIDE_SPREAD,
    }


_CASE_KEYS = ("id", "model", "gpu", "color", "label", "batch", "seq", "env_id", "measured_label")


def _quantity_tables(rows: list[dict]) -> list[dict]:
    """One table per compared quantity (``compare.COMPARED``) of the rows whose measurement counts:
    estimate, measurement, errors; the step time with how it was timed; the measured cases whose
    step time the provenance rule leaves out (``excluded``)."""
    tables = []
    for q in compare.COMPARED:
        qrows, excluded = [], []
        for r in rows:
            c = r["compare"]
            if c is None or c["status"] != "ok":
                continue
            hit = c["quantities"].get(q)
            if hit:
                qrows.append({**{k: r[k] for k in _CASE_KEYS}, **hit, "abs_err": abs(hit["est"] - hit["meas"]),
                              "capped": c["capped"], "timing": c["timing"], "tokens_per_s": c["tokens_per_s"]})
            elif q == "step_s" and c["speed_not_compared"]:
                excluded.append({**{k: r[k] for k in _CASE_KEYS}, "why": c["speed_not_compared"]})
        if qrows or excluded:
            tables.append({"quantity": q, "label": compare.LABELS[q], "unit": compare.UNITS[q],
                           "memory": q in MEMORY_QUANTITIES, "rows": qrows, "excluded": excluded,
                           "fixed": any(c["timing"] and c["timing"]["fixed"] for c in qrows)})
    return tables


def _unfinished(rows: list[dict]) -> list[dict]:
    """Runs that did not finish ok on the case's card: an OOM is a verdict on the estimate's "fits"
    (``expected``: the estimate does not say it fits); errors and timeouts check nothing."""
    return [{**{k: r[k] for k in ("id", "model", "gpu", "color", "label", "batch", "seq", "fits", "verdict",
                                  "verdict_label", "verdict_text", "device_total", "measured_label", "env_id")},
             "capped": bool(r["compare"] and r["compare"]["capped"]),
             "allocated_at_failure": r["compare"]["allocated_at_failure"] if r["compare"] else None,
             "expected": r["compare"]["expected"] if r["compare"] else None, "status": r["measured_status"]}
            for r in rows if r["measured_status"] and r["measured_status"] != "ok"]


def measured_context(rows: list[dict]) -> dict:
    """The "Measured" section of a GPU or model page: its measured cases as the validation page's
    quantity tabs, and the runs that did not finish."""
    compared = [r for r in rows if r["compare"]]
    return {"compared": compared, "measured_tables": _quantity_tables(compared), "unfinished": _unfinished(rows),
            "wide_spread": compare.WIDE_SPREAD}


def validation_pages(site: SiteData, published: Path | None = None) -> list[Page]:
    path = "validation.md"
    chosen = site_results(site)
    every = sorted((row(r) for r in chosen.values()), key=sort_key)
    rows = [r for r in every if r["measured"]]
    compared = [r for r in every if r["compare"]]
    files: dict[str, str] = {}
    overview = measured_overview(site, every, path)
    by_technique = [{"technique": t, "color": TECHNIQUE_COLORS[t], **s}
                    for t in TECHNIQUES
                    for s in compare.summary(_item(r) for r in compared if r["technique"] == t)]
    chart = None
    if compared:
        panels = []
        for q in ("peak_allocated", "device_total", "step_s"):
            scale = GIB if q in MEMORY_QUANTITIES else 1
            pts = [{"est": c["est"] / scale, "meas": c["meas"] / scale, "technique": r["technique"]}
                   for r in compared if (c := r["compare"]["quantities"].get(q))]
            if pts:
                panels.append((f"{compare.LABELS[q]} ({compare.UNITS[q]})", pts))
        if panels:
            chart_path = "charts/validation-scatter.svg"
            files[chart_path] = charts.estimate_vs_measured(panels, title="Estimate against measurement")
            chart = chart_path
    pub = _published(published)
    scatter, scatter_path = _validation_scatter(rows, pub), None
    if scatter:
        scatter_path = "charts/validation-published.svg"
        files[scatter_path] = charts.validation_scatter(
            scatter["points"], scatter["bands"], title="Estimated against measured and published peak memory")
    environments = []
    for g in overview["environments"]:
        mine = [r for r in compared if r["env_id"] == g["id"]]
        environments.append({**g, "tables": _quantity_tables(mine),
                             "ok": sum(1 for r in mine if r["compare"]["status"] == "ok"),
                             "failed": [r["id"] for r in mine if r["compare"]["status"] != "ok"]})
    if rows:
        files["data/validation.csv"] = write_csv(rows)
    verdicts = _unfinished(every)
    # runs that count for no GPU comparison: shown as what they are, never as GPU measurements
    other_runs = [{"id": r["id"], "model": r["model"], "gpu": r["gpu"], "setup": r["label"], **r["other_run"]}
                  for r in every if r["other_run"]]
    context = {
        "root": "",
        "measured": bool(compared), "n_cases": len(rows), "chart": chart,
        "chart_alt": ("Scatter charts of estimated against measured peak allocated memory, device total memory and "
                      "step time, one marker per measured case, its colour and shape by technique, with the y = x "
                      "line of a perfect estimate"),
        "overview": overview, "by_technique": by_technique,
        "environments": environments,
        "fake": [r["id"] for r in measured_results(site) if (r.get("measurement") or {}).get("fake")],
        "published": pub, "published_command": PUBLISHED_COMMAND, "scatter": scatter_path,
        "scatter_alt": ("Log-log scatter of estimated against measured or published peak memory in GB, one marker "
                        "shape per source, coloured by measure (allocated, reserved, loss), with the y = x line "
                        "and the shaded error band of each measure"),
        "published_path": (published or DEFAULT_OUT).as_posix(),
        "csv": "data/validation.csv" if rows else None,
        "repro": reproduce(site, rows, "data/validation.csv" if rows else None),
        "verdicts": verdicts,
        "other_runs": other_runs,
        "bands": _bands(),
        "traced": validation_traced(site),
    }
    return [Page(path=path, template="validation.md.j2", context=context, files=files)]


__all__ = ["home_pages", "gpu_pages", "model_pages", "validation_pages"]
