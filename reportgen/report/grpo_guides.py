"""The GRPO guide pages: ``guides/grpo/index.md`` and ``guides/grpo/<model>.<gpu>.md`` for every (model, GPU)
a sweep has recipe grpo cases of (issue 34: "a guide page per model and GPU for GRPO").

Nothing here estimates. A GRPO case's stored estimate (``runner.estimate_case``) already holds the answer
for its setup: the device bytes of each phase and the phase that sets the peak, the verdict, what to turn
down first (``estimate/grpo.py`` ``turn_down``), the largest ``num_generations`` and the longest completion
that fit; the pages show them as stored. The one thing computed at render time is the TRL GRPOConfig that
runs the setup (``configs.reverse.grpo_keys``, the ``--from`` reader backwards), as the SFT guides' configs
are. A case TRL or vLLM would refuse is stored as an error naming what to change, and shown as such.
"""

from __future__ import annotations

from markupsafe import Markup

from reportgen import catalog
from reportgen.report.page import Page, SiteData
from reportgen.report.rows import gpu_label, gpu_order, is_grpo, model_order, rel
from reportgen.results import model_file_part
from reportgen.setup import TrainingSetup
from reportgen.trace.agreement import TOLERANCE

#: the most completions per prompt a setup takes, where ``grpo.max_num_generations`` stops searching
GENERATIONS_CEILING = TrainingSetup.model_fields["num_generations"].le

INDEX = "guides/grpo/index.md"
#: the phases of a GRPO step in order, and how a reader calls them (``estimate/grpo.py`` ``PHASES``)
PHASE_LABELS = {"generation": "generation", "scoring": "scoring", "policy-step": "policy step"}
GENERATION_LABELS = {"hf": "transformers generate", "vllm-colocate": "vLLM colocated",
                     "vllm-server": "vLLM server (another GPU)"}
METHOD_LABELS = {"full": "Full", "lora": "LoRA", "qlora": "QLoRA"}
TURN_DOWN_LABELS = {"num_generations": "completions per prompt (num_generations)",
                    "max_completion_length": "completion length (max_completion_length)",
                    "vllm_gpu_memory_utilization": "vLLM's share of the card (vllm_gpu_memory_utilization)"}
#: what the pages say of the estimates' standing: the README's GRPO section, the trace's tolerance (our own
#: Markdown: code spans, printed as it is)
AGREEMENT = Markup(
    "TRL's own GRPOTrainer step, traced on the meta device (`reportgen trace --recipe grpo`), agrees with these "
    "estimates within {:.0%} of peak allocated in every phase (`tests/test_trace_grpo.py`; transformers generate "
    "only: vLLM generation is estimated, not traced). No GRPO step has been measured on a GPU; the error band "
    "is the SFT steps'.").format(TOLERANCE)


def guide_path(model: str, gpu: str) -> str:
    return f"guides/grpo/{model_file_part(model)}.{gpu}.md"


def grpo_results(site: SiteData) -> dict[tuple[str, str], list[dict]]:
    """``{(model, gpu): [result, ...]}`` of every sweep's GRPO cases, once each (the first sweep by name wins),
    in setup order (method, generation, completion length)."""
    seen: set[str] = set()
    out: dict[tuple[str, str], list[dict]] = {}
    for r in site.all_results():
        if not is_grpo(r) or r["id"] in seen:
            continue
        seen.add(r["id"])
        out.setdefault((r["case"]["model"], r["case"]["gpu"]), []).append(r)
    for rs in out.values():
        rs.sort(key=lambda r: _order(r["case"]["setup"]))
    return dict(sorted(out.items(), key=lambda kv: (model_order(kv[0][0]), gpu_order(kv[0][1]))))


def _order(setup: dict) -> tuple:
    return (list(METHOD_LABELS).index(setup.get("method", "lora")), list(GENERATION_LABELS).index(
        setup.get("generation", "hf")), setup.get("max_completion_length", 512), setup.get("num_generations", 8))


def setup_text(setup: dict) -> str:
    """A GRPO setup in a few words: method, who generates, completions per prompt x their length after the prompt."""
    s = TrainingSetup.model_validate(setup)
    vllm = (f" ({s.vllm_gpu_memory_utilization:g} of the card{', sleep mode' if s.vllm_enable_sleep_mode else ''})"
            if s.generation.value == "vllm-colocate" else "")
    return (f"{METHOD_LABELS[s.method.value]}, {GENERATION_LABELS[s.generation.value]}{vllm}: {s.num_generations} × "
            f"{s.max_completion_length:,}-token completions after {s.prompt_length:,}-token prompts, micro-batch "
            f"{s.batch}{f' × {s.accum}' if s.accum > 1 else ''}")


def short_text(setup: dict) -> str:
    """The summary table's label: method, who generates, completions per prompt x their length."""
    s = TrainingSetup.model_validate(setup)
    gen = {"hf": "generate", "vllm-colocate": "vLLM", "vllm-server": "vLLM server"}[s.generation.value]
    return f"{METHOD_LABELS[s.method.value]}, {gen}, {s.num_generations} × {s.max_completion_length:,}"


def _config(model: str, setup: dict) -> dict:
    """The TRL GRPOConfig that runs the setup, and the command that estimates it back (``grpo_keys``)."""
    from reportgen.configs.reverse import grpo_keys
    from reportgen.configs.trl import PROMPT_DEFAULT

    keys = grpo_keys(model, setup)
    prompt = TrainingSetup.model_validate(setup).prompt_length
    return {"yaml": keys.yaml(), "notes": keys.notes,
            "flags": f" --max-prompt-length {prompt}" if prompt != PROMPT_DEFAULT else ""}


def case_view(r: dict) -> dict:
    """One stored GRPO case as the page shows it: the answer (verdict, the phase that sets the peak, each
    phase's GiB and seconds), what to turn down first and the largest settings that fit, or the error."""
    from reportgen.estimate.verdict import margin_label

    model, setup = r["case"]["model"], r["case"]["setup"]
    base = {"id": r["id"], "label": setup_text(setup), "short": short_text(setup), "config": _config(model, setup),
            "ok": r["status"] == "ok"}
    if not base["ok"]:
        return {**base, "error": (r.get("error") or "not estimated").split(": ", 1)[-1]}
    est = r["estimate"]
    g = est["grpo"]
    demand, capacity = est["demand"], est["capacity"]
    phases = [{"name": PHASE_LABELS[k], "device": v, "seconds": g["times"].get(k), "peak": k == g["peak_phase"]}
              for k, v in g["phases"].items()]
    return {**base, "verdict": est["verdict"], "verdict_label": margin_label(est["verdict"], capacity - demand),
            "verdict_text": est["verdict_text"], "demand": demand, "device_total": est["memory"]["device_total"],
            "capacity": capacity, "peak_phase": PHASE_LABELS[g["peak_phase"]],
            "phases": phases, "by_phase": {PHASE_LABELS[k]: v for k, v in g["phases"].items()},
            "step_s": est["time"]["step_s"], "time_phase": PHASE_LABELS.get(g["time_phase"]),
            "tokens_per_s": est["time"]["tokens_per_s"],
            "num_generations": setup.get("num_generations", 8), "completion": setup.get("max_completion_length", 512),
            "max_num_generations": g.get("max_num_generations"),
            "at_ceiling": g.get("max_num_generations") == GENERATIONS_CEILING, "max_completion_length": g.get("max_completion_length"),
            "turn_down": [{"label": TURN_DOWN_LABELS.get(t["field"], t["field"]), "field": t["field"],
                           "value": t["value"]} for t in g.get("turn_down") or []],
            "notes": [n for n in est.get("notes") or [] if not n.startswith("GRPO (recipe grpo)")]}


def _page(model: str, gpu: str, results: list[dict]) -> Page:
    path = guide_path(model, gpu)
    card = catalog.load_gpu(gpu)
    cases = [case_view(r) for r in results]
    ok = [c for c in cases if c["ok"]]
    return Page(path=path, template="grpo_guide.md.j2", context={
        "root": "../../", "model": model, "gpu": gpu, "gpu_label": gpu_label(gpu), "capacity": card.memory_bytes,
        "cases": cases, "fits": sum(c["verdict"] == "fits" for c in ok), "tight": sum(c["verdict"] == "tight" for c in ok),
        "sweeps": sorted({r["sweep"] for r in results}), "agreement": AGREEMENT,
        "index": rel(path, INDEX), "sft_guide": rel(path, f"guides/{gpu}.md"), "gpu_page": rel(path, f"gpus/{gpu}.md"),
        "model_page": rel(path, f"models/{model_file_part(model)}.md")})


def grpo_links(site: SiteData, page: str, *, gpu: str | None = None, model: str | None = None) -> list[dict]:
    """Links from ``page`` to the GRPO guides of one card or one model (the GPU and model pages' list)."""
    out = []
    for (m, g), rs in grpo_results(site).items():
        if (gpu is None or g == gpu) and (model is None or m == model):
            ok = [r for r in rs if r["status"] == "ok"]
            out.append({"model": m, "gpu": g, "gpu_label": gpu_label(g), "link": rel(page, guide_path(m, g)),
                        "cases": len(rs), "fits": sum(r["estimate"]["verdict"] == "fits" for r in ok)})
    return out


def grpo_guide_pages(site: SiteData) -> list[Page]:
    """``guides/grpo/index.md`` and one page per (model, GPU) with stored GRPO cases; nothing when there are none."""
    found = grpo_results(site)
    if not found:
        return []
    pages = [_page(m, g, rs) for (m, g), rs in found.items()]
    index = Page(path=INDEX, template="grpo_index.md.j2", context={
        "root": "../../", "guides": grpo_links(site, INDEX), "agreement": AGREEMENT,
        "sft_index": rel(INDEX, "guides/index.md")})
    return [index] + pages
