"""The guide pages: ``guides/index.md`` (the decision tree) and ``guides/<gpu>.md`` for every catalog
GPU (the tree walked for every model a sweep covers on that card).

Nothing here estimates. The walks are computed when a sweep runs (``store.write_advice``) and
stored next to its results; the renderer hands them over as ``site.advice`` (``store.load_advice``).
A card gets a guide page only when a sweep stored walks for it; the index links every other card to
the Calculator page and gives the ``reportgen advise`` command (a guide without a walk would have
nothing to show). Where a step's exact setup was measured in a sweep, the measurement is shown next
to the estimate.
"""

from __future__ import annotations


from markupsafe import Markup

from reportgen import catalog
from reportgen.advise import tree as T
from reportgen.advise.diagrams import stage_diagrams
from reportgen.report.grpo_guides import INDEX as GRPO_INDEX, grpo_results
from reportgen.report.page import Page, SiteData
from reportgen.report.rows import (PRIMARY_SEQ, anchor, gpu_label, measured_values, model_order, rel, setup_label,
                                    training_setup)

INDEX = "guides/index.md"
#: cards up to this much memory get the "memory decides" advice (T4, RTX 3060/3090/4090, A10G, L4)
SMALL_CARD_BYTES = 24 * 2**30
DEFAULT_SEQ = 2048


def _diagrams() -> list[dict]:
    """The decision tree's diagrams, Mermaid source from our own tree (``advise/diagrams.py``): printed
    as it is (``Markup``), not escaped as a value."""
    return [{**d, "mermaid": Markup(d["mermaid"])} for d in stage_diagrams()]


CALCULATOR = "calculator/index.md"


def guide_path(gpu: str) -> str:
    return f"guides/{gpu}.md"


def guided_gpus(site: SiteData) -> list[str]:
    """Catalog GPUs with at least one stored walk, in catalog order: the cards that get a guide page."""
    covered = {g for g, _, _ in stored_walks(site)}
    return [key for key in catalog.gpu_names() if key in covered]


def calculator_link(page: str, gpu: str) -> str:
    """The Calculator page with this card selected (its form restores the setup from the URL hash)."""
    return rel(page, CALCULATOR) + f"#gpu={gpu}"


def technique_link(page: str, slug: str | None) -> str | None:
    return rel(page, f"techniques/{slug}.md") if slug else None


def stored_walks(site: SiteData) -> dict[tuple[str, str, int], dict]:
    """``{(gpu, model, seq): walk}`` from every sweep's stored walks (the first sweep by name wins)."""
    out: dict[tuple[str, str, int], dict] = {}
    advice = getattr(site, "advice", None) or {}
    for sweep in sorted(advice):
        for doc in advice[sweep]:
            out.setdefault((doc["gpu"], doc["model"], doc["seq"]), {**doc, "sweep": doc.get("sweep", sweep)})
    return out


def _measured_by_id(site: SiteData) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in site.all_results():
        m = measured_values(r)
        if m and r["id"] not in out:
            out[r["id"]] = m
    return out


# ----- view models -------------------------------------------------------------------------------
def _numbers_view(n: dict | None, measured: dict[str, dict]) -> dict | None:
    if n is None:
        return None
    from reportgen.estimate.verdict import margin_label, verdict_text

    kind = n.get("verdict") or ("fits" if n["fits"] else "does not fit")
    demand = n.get("demand", n["capacity"] - n["free"])
    verdict = {"verdict": kind, "verdict_label": margin_label(kind, n["capacity"] - demand),
               "verdict_text": n.get("verdict_text") or verdict_text(kind, demand, n["capacity"], n.get("range"))}
    return {**verdict, "label": n["label"], "short": setup_label(training_setup({**n["setup"], "accum": 1})),
            "technique": n["technique"], "fits": n["fits"], "device_total": n["device_total"],
            "param_side": n["param_side"], "capacity": n["capacity"], "free": n["free"],
            "tokens_per_s": n["tokens_per_s"], "mfu": n["mfu"], "max_batch": n["max_batch"],
            "max_seq": n["max_seq"], "host_ram": n["host_ram"], "peak_phase": n["peak_phase"],
            "batch": n["setup"]["batch"], "accum": n["setup"]["accum"], "gpus": n["setup"]["gpus"],
            "case_id": n["case_id"], "measured": measured.get(n["case_id"])}


def _step_view(i: int, s: dict, page: str, measured: dict[str, dict]) -> dict:
    node = T.BY_ID[s["node"]]
    base = {"n": i, "kind": s["kind"], "stage": node.stage, "label": node.label,
            "numbers": _numbers_view(s.get("numbers"), measured)}
    if s["kind"] == "action":
        # Markdown of our own (field names and setup values, HTML-escaped by ``format``)
        changed = Markup(", ").join(Markup("`{}` {} → {}").format(f, a, b) for f, (a, b) in sorted(s["changed"].items()))
        base.update(title=node.title, result=changed or ("baseline" if s["node"] == T.ROOT else "no change"),
                    notes=s["notes"], link=technique_link(page, node.technique))
    elif s["kind"] == "check":
        base.update(title=s["question"], result=Markup("**{}**: {}").format(s["outcome"], s["explain"]), notes=[],
                    link=None)
    else:
        base.update(title=s["title"], result="", notes=[], link=None)
    return base


ADMONITION = {"fits": "success", "shorter-sequence": "warning", "beyond-one-card": "failure"}


def walk_view(doc: dict, page: str, measured: dict[str, dict], quant_pairs: list[dict] | None = None) -> dict:
    """One stored walk as the guide shows it; ``quant_pairs``: measured QLoRA/LoRA pairs
    (``reportgen.measured.qlora_pairs``) the walk's speed claim cites beside its estimate."""
    from reportgen.measured import ratio_text

    steps = [_step_view(i, s, page, measured) for i, s in enumerate(doc["steps"], 1)]
    rec = _numbers_view(doc["recommended"], measured)
    if rec is not None:
        rec = {**rec, "run_with": run_with(doc["model"], doc["recommended"]["setup"])}
    taken = [T.BY_ID[s["node"]] for s in doc["steps"] if s["kind"] == "action" and not s["skipped"]
             and T.BY_ID[s["node"]].stage in ("step1", "step2", "batch")]
    options = []
    for o in doc["options"]:
        options.append({"label": o["label"].replace("n GPUs", f"{o['gpus']} GPUs"), "fits": o["fits"],
                        "text": o["text"], "why": o["why"], "tradeoff": o["tradeoff"],
                        "link": technique_link(page, o["technique"]),
                        "numbers": _numbers_view(o["numbers"], measured)})
    notes = []
    for s in doc["steps"]:
        notes += (s.get("numbers") or {}).get("notes", [])
    notes += (doc["recommended"] or {}).get("notes", [])
    search = doc["search"]
    verdict = doc["verdict"]
    return {
        "seq": doc["seq"],
        "context_note": doc.get("context_note"),
        "sweep": doc.get("sweep"),
        "verdict": verdict["kind"],
        "admonition": ADMONITION.get(verdict["kind"], "note"),
        "title": verdict["title"],
        "summary": verdict["summary"],
        "text": verdict["text"],
        "measured_quant": ratio_text(quant_pairs or [], doc["model"]) if doc.get("quantization") else None,
        "path": " → ".join(n.label for n in taken) or "nothing beyond the defaults",
        "beyond_defaults": bool(taken),
        "steps": steps,
        "has_measured": any(st["numbers"] and st["numbers"]["measured"] for st in steps),
        "recommended": rec,
        "options": options,
        "search": {"text": search["text"], "same": search["same"],
                   "numbers": _numbers_view(search["numbers"], measured)},
        "notes": list(dict.fromkeys(notes)),
        "command": f"reportgen advise --model {doc['model']} --gpu {doc['gpu']} --seq {doc['seq']}",
    }


def run_with(model: str, setup: dict) -> list[dict]:
    """The recommended setup as the TRL, Axolotl, LLaMA-Factory and torchtune keys that run it (``reportgen.configs.reverse``,
    the ``--from`` mapping read backwards), with what each tool cannot express."""
    from reportgen.configs import reverse

    from reportgen.setup import TrainingSetup

    recipe = ("lora" if TrainingSetup.model_validate(setup).is_peft else "full") + "_finetune_single_device"
    out = []
    for name, command, write in (("TRL", "trl sft --config sft.yaml", reverse.trl_keys),
                                 ("Axolotl", "axolotl train config.yml", reverse.axolotl_keys),
                                 ("LLaMA-Factory", "llamafactory-cli train config.yaml", reverse.llamafactory_keys),
                                 ("torchtune", f"tune run {recipe} --config config.yaml", reverse.torchtune_keys)):
        keys = write(model, setup)
        out.append({"tool": name, "command": command, "yaml": keys.yaml(), "notes": keys.notes})
    return out


def faster_than_walk(w: dict) -> dict | None:
    """The search's pick where it is estimated faster than the walk's setup (None otherwise): the
    guide's summary names it next to the walk's answer, so the two never stand side by side unexplained."""
    rec, found = w["recommended"], w["search"]["numbers"]
    if w["search"]["same"] or rec is None or found is None or not rec["tokens_per_s"] or not found["tokens_per_s"]:
        return None
    rel = found["tokens_per_s"] / rec["tokens_per_s"] - 1
    if rel < 0.005:
        return None
    return {"label": found["short"] + f", micro-batch {found['batch']}", "tokens_per_s": found["tokens_per_s"],
            "rel": rel}


def _cell(w: dict) -> dict:
    """One summary-table cell: the verdict of a walk in a few words."""
    rec = w["recommended"]
    if rec is not None:
        return {"fits": True, "label": rec["short"], "tokens_per_s": rec["tokens_per_s"], "batch": rec["batch"],
                "accum": rec["accum"], "device_total": rec["device_total"], "verdict": w["verdict"],
                "faster": faster_than_walk(w)}
    fitting = [o for o in w["options"] if o["fits"]]
    return {"fits": False, "label": None, "tokens_per_s": None, "batch": None, "accum": None, "device_total": None,
            "verdict": w["verdict"], "options": ", ".join(o["label"] for o in fitting) or "none fits"}


def gpu_profile(key: str) -> dict:
    """Catalog facts of one GPU and whether it is a consumer (memory-bound) or data-center
    (compute-bound) part, as the time model classifies it (``GpuSpec.is_consumer``)."""
    g = catalog.load_gpu(key)
    dtype = "bf16" if g.supports_bf16 else "fp16"
    peak = g.peak_tflops.get(dtype)
    consumer = g.is_consumer
    return {"key": g.key, "name": g.name, "label": gpu_label(key), "memory_bytes": g.memory_bytes,
            "bandwidth_gbs": g.memory_bandwidth_gbs, "dtype": dtype, "peak_tflops": peak,
            "flops_per_byte": None if peak is None else round(peak * 1e12 / (g.memory_bandwidth_gbs * 1e9)),
            "host_link": g.host_link or "not published", "host_link_gbs": g.host_link_gbs,
            "price": g.price_usd_per_hour, "consumer": consumer,
            # the reference notes' "memory-bound consumer cards": 24 GB and less, whatever the market segment
            "small": g.memory_bytes <= SMALL_CARD_BYTES,
            "class": "consumer card" if consumer else "data-center card"}


def tree_view(page: str) -> dict:
    """The tree's nodes as tables for the index page."""
    def change(c: dict) -> Markup:
        return Markup(", ").join(Markup("`{}: {}`").format(k, v) for k, v in c.items())

    actions = [{"label": n.label, "title": n.title, "stage": T.STAGES[n.stage], "change": change(n.change),
                "why": n.why, "tradeoff": n.tradeoff, "link": technique_link(page, n.technique),
                "default": n.default} for n in T.NODES if isinstance(n, T.Action)]
    checks = [{"label": n.label, "question": n.question, "how": n.how, "stage": T.STAGES[n.stage],
               "variant": n.variant} for n in T.NODES if isinstance(n, T.Check)]
    ends = [{"label": n.label, "title": n.title, "text": n.text} for n in T.NODES if isinstance(n, T.End)]
    options = [{"label": o.label, "change": change(o.change), "why": o.why, "tradeoff": o.tradeoff,
                "link": technique_link(page, o.technique)} for o in T.OPTIONS]
    symbols = [{"symbol": k, "meaning": v} for k, v in T.SYMBOLS.items()]
    return {"actions": actions, "checks": checks, "ends": ends, "options": options, "symbols": symbols,
            "min_activations": change(T.MIN_ACTIVATIONS), "target": T.TARGET_EFFECTIVE_BATCH,
            "max_micro_batch": T.MAX_MICRO_BATCH, "gpu_counts": ", ".join(map(str, T.FSDP_GPU_COUNTS))}


#: techniques a walk may recommend whose speed and memory come from their code alone until a measurement
#: runs them: (label, technique page, does a setup use it)
UNMEASURED_CHECKS = (
    ("a fused or chunked cross-entropy", "fused-cross-entropy", lambda s: s.get("loss", "standard") != "standard"),
    ("Liger's layer kernels", "liger-kernels", lambda s: s.get("kernels", "eager") == "liger"),
)


def unmeasured_in(setups: list[dict], measured_setups: list[dict], path: str) -> list[dict]:
    """The techniques of ``UNMEASURED_CHECKS`` that some of ``setups`` use and no measured setup does,
    each with its technique page: a guide recommending them says their figures are estimates only."""
    return [{"label": label, "link": rel(path, f"techniques/{slug}.md")} for label, slug, uses in UNMEASURED_CHECKS
            if any(uses(s) for s in setups) and not any(uses(s) for s in measured_setups)]


def _gpu_page(key: str, walks: dict, measured: dict[str, dict], quant_pairs: list[dict],
              measured_setups: list[dict] = ()) -> Page:
    path = guide_path(key)
    mine = {(m, s): w for (g, m, s), w in walks.items() if g == key}
    models = sorted({m for m, _ in mine}, key=model_order)
    seqs = sorted({s for _, s in mine})
    model_views = []
    summary = []
    for name in models:
        views = {s: walk_view(mine[(name, s)], path, measured, quant_pairs) for s in seqs if (name, s) in mine}
        model_views.append({"name": name, "anchor": anchor(name), "walks": list(views.values())})
        summary.append({"name": name, "anchor": anchor(name),
                        "cells": [_cell(views[s]) if s in views else None for s in seqs]})
    uncovered = [m for m in catalog.model_names() if m not in models]
    uncovered.sort(key=model_order)
    context = {
        "root": "../",
        "gpu": gpu_profile(key),
        "diagrams": _diagrams(),
        "calculator": calculator_link(path, key),
        "seqs": seqs,
        "primary_seq": PRIMARY_SEQ if PRIMARY_SEQ in seqs else (seqs[0] if seqs else DEFAULT_SEQ),
        "summary": summary,
        "models": model_views,
        "uncovered": [{"name": m, "command": f"reportgen advise --model {m} --gpu {key} --seq {DEFAULT_SEQ}"}
                      for m in uncovered],
        "sweeps": sorted({w["sweep"] for w in mine.values() if w.get("sweep")}),
        "index": rel(path, INDEX),
        "gpu_page": rel(path, f"gpus/{key}.md"),
        "methodology": rel(path, "methodology.md"),
        "target": T.TARGET_EFFECTIVE_BATCH,
        "unmeasured": unmeasured_in([x["setup"] for w in mine.values()
                                     for x in (w.get("recommended"), (w.get("search") or {}).get("numbers")) if x],
                                    list(measured_setups), path),
    }
    return Page(path=path, template="guide.md.j2", context=context)


def guide_pages(site: SiteData) -> list[Page]:
    """``guides/index.md`` and one guide per catalog GPU with stored walks, from the stored walks only."""
    walks = stored_walks(site)
    measured = _measured_by_id(site)
    guided = guided_gpus(site)
    from reportgen.measured import cases_from_results, qlora_pairs

    quant_pairs = qlora_pairs(cases_from_results(site.all_results()))
    measured_setups = [r["case"]["setup"] for r in site.all_results() if r["id"] in measured]
    pages = [_gpu_page(key, walks, measured, quant_pairs, measured_setups) for key in guided]
    gpus = []
    for key in catalog.gpu_names():
        mine = [w for (g, _, _), w in walks.items() if g == key]
        gpus.append({**gpu_profile(key), "link": rel(INDEX, guide_path(key)) if key in guided else None,
                     "calculator": calculator_link(INDEX, key), "walks": len(mine),
                     "command": f"reportgen advise --model llama-3.1-8b --gpu {key}",
                     "fits": sum(1 for w in mine if w["verdict"]["kind"] == "fits"),
                     "models": len({w["model"] for w in mine})})
    index = Page(path=INDEX, template="guide_index.md.j2", context={
        "root": "../",
        "diagrams": _diagrams(),
        "tree": tree_view(INDEX),
        "gpus": gpus,
        "any_walks": bool(walks),
        "methodology": rel(INDEX, "methodology.md"),
        "techniques": rel(INDEX, "techniques/index.md"),
        "grpo": rel(INDEX, GRPO_INDEX) if grpo_results(site) else None,
    })
    return [index] + pages
