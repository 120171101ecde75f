"""The site's rows (its view models): one result file -> one flat row of plain values.

Everything here only reads result dicts and catalog facts; nothing estimates. Numbers stay raw
(bytes, tokens/s, hours) in the rows; templates format them with the filters of ``render.py`` and
CSV files write them with units in the column names.
"""

from __future__ import annotations

import posixpath

import statistics
from collections.abc import Iterable
from functools import lru_cache

from reportgen import catalog
from reportgen.estimate.memory import TOTALS as MEMORY_TOTALS
from reportgen.provenance import QUANTITIES, Provenance, provenance_of
from reportgen.report import compare
from reportgen.report.page import SiteData
from reportgen.setup import TrainingSetup
from reportgen.traced_results import cache_limited, traced_time
from reportgen.format import GIB, demand_note

#: technique (``TrainingSetup.technique()``) -> its colour everywhere on the site, in site order:
#: Okabe & Ito's colour-blind-safe palette (jfly.uni-koeln.de/color), six colours no two alike for
#: the common colour-vision deficiencies; charts add a marker per technique and hatch "+ ckpt"
TECHNIQUE_COLORS = {
    "Full": "#0072B2",
    "Full + ckpt": "#56B4E9",
    "LoRA": "#009E73",
    "LoRA + ckpt": "#E69F00",
    "QLoRA": "#D55E00",
    "QLoRA + ckpt": "#CC79A7",
}
TECHNIQUES = tuple(TECHNIQUE_COLORS)
#: tokens the site quotes training hours and dollars for
PER_TOKENS = 100_000_000
#: the sequence length the overviews (home grid, "best setup" columns) compare at when a sweep has it
PRIMARY_SEQ = 2048
QUANTITY_LABELS = {
    "peak_allocated": "peak allocated (GiB)",
    "peak_reserved": "peak reserved (GiB)",
    "device_total": "device total (GiB)",
    "tokens_per_s": "tokens/s",
}


def technique_slug(technique: str) -> str:
    """``"QLoRA + ckpt"`` -> ``"qlora-ckpt"`` (CSS classes, file names)."""
    return technique.lower().replace(" + ", "-").replace(" ", "-")


@lru_cache(maxsize=None)
def _setup(setup_json: str) -> TrainingSetup:
    return TrainingSetup.model_validate_json(setup_json)


def training_setup(setup: dict) -> TrainingSetup:
    import json

    return _setup(json.dumps(setup, sort_keys=True))


def setup_label(setup: TrainingSetup, any_mixed: bool = False) -> str:
    """The technique plus whatever else differs from the sweep defaults a reader cares about.
    ``any_mixed``: fp16 and bf16 autocast count as one (same memory; the T4 has no bf16)."""
    parts = [setup.technique()]
    mixed = ("bf16-mixed", "fp16-mixed") if any_mixed else ("bf16-mixed",)
    if setup.precision.value not in mixed:
        parts.append(setup.precision.value)
    if setup.optimizer.value != "adamw":
        parts.append(setup.optimizer.value)
    if setup.is_peft and (setup.lora_rank != 16 or setup.lora_targets != "all-linear"):
        parts.append(f"r{setup.lora_rank} {setup.lora_targets}")
    if setup.method.value == "qlora" and (setup.double_quant or setup.quant.value != "nf4"):
        parts.append(setup.quant.value + (" + double quant" if setup.double_quant else ""))
    if setup.attn.value != "sdpa":
        parts.append(f"{setup.attn.value} attention")
    if setup.loss.value != "standard":
        parts.append(f"{setup.loss.value} CE")
    if setup.accum > 1:
        parts.append(f"accum {setup.accum}")
    if setup.offload.value != "none":
        parts.append(f"offload {setup.offload.value}")
    if setup.gpus > 1:
        parts.append(f"{setup.gpus}× {setup.sharding.value.upper()}")
    if setup.seq_mean is not None:
        parts.append(f"mean {setup.seq_mean} tokens, {setup.padding.value}")
    elif setup.padding.value == "packed":
        parts.append("packed")
    if setup.keep_outputs.value != "none":
        parts.append(f"outputs kept ({setup.keep_outputs.value})")
    if setup.optimizer_in_backward:
        parts.append("optimizer in backward")
    if setup.act_offload:
        parts.append("activation offload")
    if setup.compile:
        parts.append("torch.compile")
    if setup.kernels.value != "eager":  # Liger's RMSNorm, RoPE and SwiGLU kernels (estimate/liger.py)
        parts.append("Liger" if setup.kernels.value == "liger" else f"{setup.kernels.value} kernels")
    if setup.modeling.value != "transformers":
        parts.append(f"{setup.modeling.value} model code")
    if setup.is_peft and setup.lora_dropout:
        parts.append(f"dropout {setup.lora_dropout:g}")
    if setup.dora:
        parts.append("DoRA")
    if setup.quant_head:
        parts.append("4-bit head")
    if setup.kbit_prep is not None:
        parts.append(f"kbit prep {setup.kbit_prep.value}")
    if setup.frozen_dtype.value == "fp32":
        parts.append("fp32 frozen weights")
    return ", ".join(parts)


def gpu_label(key: str) -> str:
    """Short GPU name for charts and navigation: ``NVIDIA GeForce RTX 4090`` -> ``RTX 4090``."""
    name = catalog.load_gpu(key).name
    return name.replace("NVIDIA ", "").replace("GeForce ", "").replace("Tesla ", "")


def measurement_of(result: dict) -> dict | None:
    """The successful measurement block of a result, else None. Never invents a value."""
    m = result.get("measurement")
    if not m or m.get("status") != "ok":
        return None
    return m


def provenance(result: dict) -> Provenance | None:
    """Where the result's current measurement was made (``reportgen.provenance``), or None."""
    m = result.get("measurement")
    return provenance_of(m) if m else None


#: where a quantity may stand in a measurement block: the estimate's device total is what the
#: harness records as ``device_used`` (this process's memory as NVML/nvidia-smi sees it)
MEASURED_KEYS = {"device_total": ("device_total", "device_used")}


def _figures(m: dict) -> dict[str, float]:
    """Every ``QUANTITIES`` figure a block holds (nulls left out), read from its ``measurement``
    figures (``reportgen.measure.protocol``) or the block itself."""
    blocks = [b for b in (m.get("measurement"), m) if isinstance(b, dict)]
    out: dict[str, float] = {}
    for q in QUANTITIES:
        for block in blocks:
            hit = next((block[k] for k in MEASURED_KEYS.get(q, (q,))
                        if isinstance(block.get(k), (int, float)) and not isinstance(block.get(k), bool)), None)
            if hit is not None:
                out[q] = hit
                break
    return out


def measured_values(result: dict) -> dict[str, float]:
    """The measured quantities that may be compared with this case's estimate: those of a
    successful measurement that the provenance rule lets count for the case's GPU (a CPU run: none;
    a capped run: memory only)."""
    m = measurement_of(result)
    if m is None:
        return {}
    valid = provenance_of(m).valid_quantities(result["case"]["gpu"])
    return {q: v for q, v in _figures(m).items() if q in valid}


def measured_results(site: SiteData) -> list[dict]:
    """Results with a successful measurement that counts for the case's GPU (the provenance
    rule, ``reportgen.provenance``: a CPU run never does)."""
    return [r for r in site.all_results() if measured_values(r)]


def measured_verdict(result: dict) -> str | None:
    """The measured status of the case's GPU (``ok`` / ``oom`` / ``error`` / ``timeout``) when the
    current attempt's memory counts for that GPU (an OOM on a CPU or another card says nothing)."""
    m = result.get("measurement")
    if not m or not provenance_of(m).memory_counts_for(result["case"]["gpu"]):
        return None
    return m.get("status")


def other_run(result: dict) -> dict | None:
    """A current measurement that does not count for the case's GPU at all (a CPU run, another or
    unknown card): what it is, for a label. None when there is none or it counts."""
    m = result.get("measurement")
    if not m:
        return None
    p = provenance_of(m)
    if p.valid_quantities(result["case"]["gpu"]):
        return None
    figures = m.get("measurement") if isinstance(m.get("measurement"), dict) else {}
    return {"status": m.get("status"), "label": p.label(result["case"]["gpu"]), "device": p.device,
            "step_s": figures.get("step_s"), "tokens_per_s": figures.get("tokens_per_s"),
            "measured_at": m.get("measured_at")}


def counts(result: dict) -> bool:
    """The case's current measurement says something about its card: a figure that counts
    (``measured_values``) or a run status whose memory counts (an out-of-memory verdict)."""
    return bool(measured_values(result)) or measured_verdict(result) is not None


def environment_of(result: dict) -> dict | None:
    """The environment of a measurement that counts for the case (``counts``: an OOM on the case's
    card too), for the validation page's environment sections."""
    if not counts(result):
        return None
    env = result["measurement"].get("environment")
    return env if isinstance(env, dict) and env else None


def traced_values(result: dict) -> dict | None:
    """The traced figures joined to this case (``render.load_site``: a current traced file of the same
    case id, ``reportgen/traced_results.py``), or None. Never an estimate or a measurement."""
    doc = result.get("traced")
    if not doc:
        return None
    mem = doc.get("memory") or {}
    time = traced_time(doc)
    return {"peak_allocated": mem.get("peak_allocated"), "peak_reserved": mem.get("peak_reserved"),
            "device_total": mem.get("device_total"), "fits": doc.get("fits"), "peak_phase": doc.get("peak_phase"),
            "cache_limited": cache_limited(doc), "step_s": time.step_s if time is not None else None,
            "title": "traced: the real training step on the meta device, its allocations replayed through a "
                     "simulation of the CUDA caching allocator (reportgen trace); not measured"}


def environment_id(env: dict) -> str:
    """The validation page's section of the environment (``compare.environment_id``: the card,
    driver, CUDA, library versions and commit; not the time or host of each run)."""
    return compare.environment_id(env)


def comparison(result: dict) -> dict | None:
    """The current measurement against the estimate (``compare.compare``) where the measurement
    counts for the case's card; None otherwise (no measurement, a CPU run, another card)."""
    c = compare.compare(result.get("estimate"), result.get("measurement"), result["case"]["gpu"])
    return c if c and c["counts"] else None


def row(result: dict) -> dict:
    """One result as a flat view-model row (raw numbers; None where unknown)."""
    case = result["case"]
    setup = training_setup(case["setup"])
    est = result.get("estimate") or {}
    mem = est.get("memory") or {}
    t = est.get("time") or {}
    train_tokens = t.get("train_tokens")
    scale = PER_TOKENS / train_tokens if train_tokens else None
    hours = t.get("train_hours")
    dollars = t.get("train_dollars")
    env = environment_of(result)
    prov = provenance(result)
    technique = setup.technique()
    return {
        "id": result["id"],
        "sweep": result.get("sweep"),
        "status": result.get("status"),
        "error": result.get("error"),
        "model": case["model"],
        "gpu": case["gpu"],
        "technique": technique,
        "technique_slug": technique_slug(technique),
        "color": TECHNIQUE_COLORS[technique],
        "label": setup_label(setup),
        "family": setup_label(setup, any_mixed=True),
        "method": setup.method.value,
        "grad_ckpt": setup.grad_ckpt,
        "precision": setup.precision.value,
        "offload": setup.offload.value,
        "gpus": setup.gpus,
        "batch": setup.batch,
        "seq": setup.seq,
        **verdict_fields(est, case["gpu"]),
        "peak_allocated": mem.get("peak_allocated"),
        "peak_reserved": mem.get("peak_reserved"),
        "device_total": mem.get("device_total"),
        "terms": {k: v for k, v in mem.items() if k not in MEMORY_TOTALS},
        "host_ram": mem.get("host_ram"),
        "cache_released": mem.get("cache_released") or 0,
        "peak_phase": est.get("peak_phase"),
        "max_batch": est.get("max_batch"),
        "max_seq": est.get("max_seq"),
        "tokens_per_s": t.get("tokens_per_s"),
        "step_s": t.get("step_s"),
        "mfu": t.get("mfu"),
        "bound": t.get("bound"),
        "hours_per_100m": None if hours is None or scale is None else hours * scale,
        "dollars_per_100m": None if dollars is None or scale is None else dollars * scale,
        "notes": list(est.get("notes") or []),
        "measured": measured_values(result) or None,
        "traced": traced_values(result),
        "measured_status": measured_verdict(result),
        "measured_label": prov.label(case["gpu"]) if prov and (measured_values(result) or measured_verdict(result))
        else None,
        "measured_capped": bool(prov and prov.emulated_gpu == case["gpu"] and prov.device_gpu != case["gpu"]),
        "other_run": other_run(result),
        "env_id": environment_id(env) if env else None,
        "compare": comparison(result),
    }


def verdict_fields(est: dict, gpu: str) -> dict:
    """The verdict of a stored estimate as the pages show it (``estimate/verdict.py``): ``fits`` is
    True only for the verdict "fits"; ``verdict_label`` is the table cell (``fits``, ``tight (+0.8
    GiB)``, ``no (-9.3 GiB)``) and ``verdict_text`` its sentence. None everywhere without an estimate."""
    from reportgen.estimate.verdict import margin_label, verdict_text

    kind = est.get("verdict")
    if kind is None and est.get("fits") is not None:  # a result file older than the three-way verdict
        kind = "fits" if est["fits"] else "does not fit"
    mem = est.get("memory") or {}
    demand = est.get("demand", mem.get("device_total"))
    capacity = est.get("capacity")
    if not capacity:
        try:
            capacity = catalog.load_gpu(gpu).memory_bytes
        except Exception:  # a card this machine's catalog does not have
            capacity = None
    band = est.get("band")
    rng = (band or {}).get("demand_range") or (band or {}).get("device_total_range")
    known = kind is not None and demand is not None and capacity
    return {
        "fits": None if kind is None else kind == "fits",
        "verdict": kind,
        "band": band,
        "demand": demand,
        # what the verdict compares differs from the device total shown beside it: say why (format.py)
        "demand_note": demand_note(mem) if demand is not None and mem.get("device_total") is not None
        and abs(demand - mem["device_total"]) >= 0.05 * GIB else None,
        "margin": capacity - demand if known else None,
        "verdict_label": margin_label(kind, capacity - demand) if known else (kind or ""),
        "verdict_text": verdict_text(kind, demand, capacity, rng) if known else (kind or ""),
    }


@lru_cache(maxsize=None)
def model_order(name: str) -> tuple:
    """Models smallest first (by parameter count), then by name; unknown models last."""
    try:
        return (0, catalog.load_model(name).total_params, name)
    except Exception:  # a result may name a config.json that is not on this machine
        return (1, 0, name)


def gpu_order(key: str) -> tuple:
    """GPUs in catalog order (consumer cards first, as ``gpus.yaml`` lists them)."""
    names = catalog.gpu_names()
    return (names.index(key), key) if key in names else (len(names), key)


def sort_key(r: dict) -> tuple:
    """Site order: model (by size), GPU (catalog order), seq, technique (palette order), GPUs, label,
    batch, id."""
    return (model_order(r["model"]), gpu_order(r["gpu"]), r["seq"], TECHNIQUES.index(r["technique"]), r["gpus"],
            r["label"], r["batch"], r["id"])


def anchor(name: str) -> str:
    """Heading id for a model or GPU name: ``llama-3.1-8b`` -> ``llama-3-1-8b``."""
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def is_grpo(result: dict) -> bool:
    """A GRPO case (recipe grpo): its own guide pages (``report/grpo_guides.py``), not the SFT tables."""
    return (result.get("case") or {}).get("setup", {}).get("recipe") == "grpo"


def site_results(site: SiteData) -> dict[str, dict]:
    """Every SFT case once, by id: a case in several sweeps is the copy with a measurement that counts
    for it (``counts``: an out-of-memory run on the case's card too), else the first sweep's. GRPO cases
    (``is_grpo``) answer another question (a step with generation in the loop, per phase) and have no
    row: a GPU page's best fit is never a GRPO step; their guide pages read them."""
    chosen: dict[str, dict] = {}
    for result in site.all_results():
        if is_grpo(result):
            continue
        cid = result["id"]
        if cid not in chosen or (counts(result) and not counts(chosen[cid])):
            chosen[cid] = result
    return chosen


def site_rows(site: SiteData) -> list[dict]:
    """``row`` of every case once (``site_results``), in site order. Made once per site (five
    providers ask for them: 1.3 s of a consumer render): each caller gets its own copy of each row."""
    cached = getattr(site, "_site_rows", None)
    if cached is None:
        cached = sorted((row(r) for r in site_results(site).values()), key=sort_key)
        object.__setattr__(site, "_site_rows", cached)
    return [dict(r) for r in cached]


def best_fit(rows: Iterable[dict]) -> dict | None:
    """Among one model's cases on one GPU: at seq 2048 when the sweeps have it, single-GPU setups
    when any fits, the fitting case with the highest estimated tokens/s (ties: the smaller batch,
    then the id). None when nothing fits."""
    rows = [r for r in rows if r["status"] == "ok"]
    if any(r["seq"] == PRIMARY_SEQ for r in rows):
        rows = [r for r in rows if r["seq"] == PRIMARY_SEQ]
    fitting = [r for r in rows if r["fits"]]
    fewest = min((r["gpus"] for r in fitting), default=None)
    fitting = [r for r in fitting if r["gpus"] == fewest]
    if not fitting:
        return None
    return min(fitting, key=lambda r: (-(r["tokens_per_s"] or 0.0), r["batch"], r["id"]))


def group(rows: Iterable[dict], *keys: str) -> dict:
    """``{(k1, k2, ...) or k1: [rows]}`` keeping the rows' order; keys sorted on iteration by callers."""
    out: dict = {}
    for r in rows:
        k = tuple(r[key] for key in keys) if len(keys) > 1 else r[keys[0]]
        out.setdefault(k, []).append(r)
    return out


# ----- reproducibility ---------------------------------------------------------------------------
def reproduce(site: SiteData, rows: list[dict], csv: str | None) -> dict:
    """How to regenerate a table: the sweep commands and hashes behind its rows, the versions that
    estimated them, the renderer's commit, the CSV next to it."""
    sweeps = sorted({r["sweep"] for r in rows if r["sweep"]})
    by_name = {name: site.results.get(name, []) for name in sweeps}
    info = []
    for name in sweeps:
        results = by_name[name]
        info.append({
            "name": name,
            "file": f"sweeps/{name}.yaml",
            "command": f"reportgen sweep sweeps/{name}.yaml",
            "hashes": sorted({r.get("sweep_hash") for r in results if r.get("sweep_hash")}),
            "versions": sorted({r.get("reportgen_version") for r in results if r.get("reportgen_version")}),
            "estimators": sorted({r.get("estimator_hash") for r in results if r.get("estimator_hash")}),
        })
    return {
        "sweeps": info,
        "renderer_version": site.reportgen_version,
        "git_commit": site.git_commit,
        "csv": csv,
        "measured": sum(1 for r in rows if r["measured"]),
    }


# ----- errors ------------------------------------------------------------------------------------
def error_stats(pairs: list[tuple[float, float]]) -> dict:
    """Median and worst relative error ``(estimate - measured) / measured`` of (estimate, measured)."""
    rel = [(e - m) / m for e, m in pairs if m]
    if not rel:
        return {"n": 0, "median_abs_rel": None, "worst_rel": None}
    return {"n": len(rel), "median_abs_rel": statistics.median(abs(x) for x in rel),
            "worst_rel": max(rel, key=lambda x: (abs(x), x))}


def gib_value(n: float | None, digits: int = 3) -> float | None:
    return None if n is None else round(n / GIB, digits)


def rel(page: str, target: str) -> str:
    """Link from the page at ``page`` to ``target`` (both relative to docs/)."""
    return posixpath.relpath(target, posixpath.dirname(page) or ".")
