"""The technique pages: ``techniques/index.md`` (the trade-off table) and one page per technique.

The prose lives in the templates (``templates/techniques/<slug>.md.j2``). This module supplies the
data: the trade-off table, the estimator functions that model each technique (their docstrings,
read from the code so the pages cannot drift from it), where the decision tree turns the technique
on, and worked examples: pairs of stored cases that differ only in the technique, from the sweeps'
results and the stored walks. Nothing here estimates.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from reportgen.advise import tree as T
from reportgen.report.guides import rel
from reportgen.report.methodology import function_doc
from reportgen.report.page import Page, SiteData
from reportgen.report.rows import (PRIMARY_SEQ, gpu_label, gpu_order, is_grpo, measured_values, model_order, setup_label,
                                    training_setup)

INDEX = "techniques/index.md"
#: worked examples shown per pair kind
EXAMPLES = 6


@dataclass(frozen=True)
class PairSpec:
    """Two stored cases that differ only in ``fields``: ``off`` without the technique, ``on`` with it."""

    caption: str
    fields: frozenset
    off: Callable[[dict], bool]
    on: Callable[[dict], bool]
    both: Callable[[dict, dict], bool] = lambda a, b: True
    commands: tuple[str, str] = ("", "")  # `reportgen estimate` without and with, when no pair is stored


@dataclass(frozen=True)
class Technique:
    slug: str
    title: str
    memory: str  # the slides' symbol: down / depends / up
    terms: str  # memory terms affected
    throughput: str
    quality: str
    when: str
    pairs: tuple[PairSpec, ...]
    functions: tuple[str, ...]  # "module:qualname" of the estimator code that models it
    #: index in ``pairs`` whose median tokens/s change is the page's speed claim (``speed_claim``):
    #: computed from the stored estimates, never written as a number in the prose
    speed_pair: int | None = None


def _fs(*names: str) -> frozenset:
    return frozenset(names)


def _cmd(model: str, flags: str, gpu: str = "rtx-4090") -> str:
    return f"reportgen estimate --model {model} --gpu {gpu} {flags}"


def _cmds(model: str, without: str, with_: str) -> tuple[str, str]:
    return _cmd(model, without), _cmd(model, with_)


TECHNIQUES: tuple[Technique, ...] = (
    Technique(
        slug="mixed-precision", title="Mixed precision (autocast)", memory="depends",
        terms="activations (16-bit), plus 16-bit weight copies; weights, gradients and AdamW states stay fp32",
        throughput="up: tensor cores (several times the fp32 rate)", quality="no change (fp16 needs loss scaling)",
        when="always, on any card with 16-bit tensor cores (bf16 from Ampere on, fp16 on the T4)",
        pairs=(PairSpec("fp32 vs mixed precision", _fs("precision"), off=lambda s: s["precision"] == "fp32",
                        on=lambda s: s["precision"] in ("bf16-mixed", "fp16-mixed"),
                        commands=_cmds("llama-3.1-8b", "--method lora --grad-ckpt --precision fp32",
                                       "--method lora --grad-ckpt --precision bf16-mixed")),),
        functions=("reportgen.estimate.dtypes", "reportgen.estimate.params:gradient_bytes",
                   "reportgen.estimate.params:autocast_copy_bytes_per_layer",
                   "reportgen.estimate.params:autocast_copy_bytes_head", "reportgen.estimate.time:peak_dtype")),
    Technique(
        slug="lora", title="LoRA (parameter-efficient fine-tuning)", memory="down",
        terms="gradients and optimizer states (adapters only); base weights in 16 bit",
        throughput="up: no weight gradients for the frozen base (4N instead of 6N FLOPs per token)",
        quality="depends: often close to full fine-tuning, sometimes below on hard tasks",
        when="whenever full fine-tuning does not fit, or you want small checkpoints",
        pairs=(PairSpec("Full fine-tuning vs LoRA", _fs("method"), off=lambda s: s["method"] == "full",
                        on=lambda s: s["method"] == "lora",
                        commands=_cmds("llama-3.2-1b", "--method full --grad-ckpt", "--method lora --grad-ckpt")),),
        functions=("reportgen.model:ModelSpec.lora_params", "reportgen.estimate.params:adapter_bytes",
                   "reportgen.estimate.params:gradient_bytes", "reportgen.estimate.time:flops_per_token",
                   "reportgen.estimate.activations:_linear_group",
                   "reportgen.estimate.activations:_adapter_input")),
    Technique(
        slug="qlora", title="QLoRA (4-bit base weights)", memory="down",
        terms="weights (the frozen base linears: 0.5 byte per parameter plus constants)",
        throughput="down at an equal setup: every matmul first dequantizes its weight",
        quality="depends: close to 16-bit LoRA in Dettmers et al. 2023",
        when="to fit: when LoRA's 16-bit base weights leave no room, or leave too little to train without "
             "checkpointing (the guides show where QLoRA without it is the faster setup); consumer cards with 1-2 GPUs",
        pairs=(PairSpec("LoRA vs QLoRA (NF4)", _fs("method"), off=lambda s: s["method"] == "lora",
                        on=lambda s: s["method"] == "qlora",
                        commands=_cmds("llama-3.1-8b", "--method lora --grad-ckpt", "--method qlora --grad-ckpt")),
               PairSpec("QLoRA vs QLoRA with double quantization", _fs("double_quant"),
                        off=lambda s: s["method"] == "qlora" and not s["double_quant"],
                        on=lambda s: s["method"] == "qlora" and s["double_quant"],
                        commands=_cmds("llama-3.1-70b", "--method qlora --grad-ckpt",
                                       "--method qlora --grad-ckpt --double-quant"))),
        functions=("reportgen.estimate.params:quantized_linear_params", "reportgen.estimate.params:weights_bytes",
                   "reportgen.estimate.params:quant_constants_bytes",
                   "reportgen.estimate.time:dequant_bytes_per_micro_batch"),
        speed_pair=0),
    Technique(
        slug="gradient-checkpointing", title="Gradient (activation) checkpointing", memory="down",
        terms="activations: one hidden state per layer instead of every saved tensor",
        throughput="down: one more forward pass (+1/3 FLOPs full, +1/2 LoRA)", quality="no change",
        when="when the activations of micro-batch 1 do not fit, or to raise the micro-batch",
        pairs=(PairSpec("Without vs with checkpointing", _fs("grad_ckpt"), off=lambda s: not s["grad_ckpt"],
                        on=lambda s: s["grad_ckpt"],
                        commands=_cmds("llama-3.1-8b", "--method qlora", "--method qlora --grad-ckpt")),),
        functions=("reportgen.estimate.activations:checkpointed_layer", "reportgen.estimate.activations:all_layers",
                   "reportgen.estimate.time:flops_per_token"),
        speed_pair=0),
    Technique(
        slug="gradient-accumulation", title="Gradient accumulation", memory="down",
        terms="activations (a smaller micro-batch); gradients stay allocated between micro-batches",
        throughput="depends: about the micro-batch's tokens/s; fewer optimizer steps and all-reduces",
        quality="no change (same effective batch)",
        when="to reach an effective batch of 16-64 sequences when only a small micro-batch fits",
        pairs=(PairSpec("The same micro-batch without and with accumulation", _fs("accum"),
                        off=lambda s: s["accum"] == 1, on=lambda s: s["accum"] > 1,
                        commands=_cmds("llama-3.1-8b", "--method qlora --grad-ckpt --batch 2",
                                       "--method qlora --grad-ckpt --batch 2 --accum 8")),
               PairSpec("A micro-batch four times larger vs the smaller one you would accumulate instead",
                        _fs("batch"), off=lambda s: s["accum"] == 1, on=lambda s: s["accum"] == 1,
                        both=lambda a, b: a["batch"] == 4 * b["batch"],
                        commands=_cmds("llama-3.1-8b", "--method qlora --grad-ckpt --batch 8",
                                       "--method qlora --grad-ckpt --batch 2"))),
        functions=("reportgen.estimate.memory",)),
    Technique(
        slug="8bit-paged-optimizers", title="8-bit and paged optimizers (bitsandbytes)", memory="down",
        terms="optimizer states: 2 bytes per trainable parameter instead of 8; paged ones can spill to host RAM",
        throughput="about the same (in-place blockwise kernel); slow while pages move",
        quality="no change reported for 8-bit AdamW (Dettmers et al. 2022)",
        when="full fine-tuning (large states); paged ones against memory spikes (the QLoRA recipe)",
        pairs=(PairSpec("AdamW vs 8-bit AdamW", _fs("optimizer"), off=lambda s: s["optimizer"] == "adamw",
                        on=lambda s: s["optimizer"] in ("adamw-8bit", "paged-adamw-8bit"),
                        commands=_cmds("llama-3.2-1b", "--method full --grad-ckpt",
                                       "--method full --grad-ckpt --optimizer paged-adamw-8bit")),),
        functions=("reportgen.estimate.params:optimizer_state_bytes", "reportgen.estimate.search:fits_memory")),
    Technique(
        slug="cpu-offload", title="CPU offload", memory="down",
        terms="optimizer states (and master weights), or parameters, gradients and states, moved to host RAM",
        throughput="down: transfers over PCIe every step, CPU optimizer step", quality="no change",
        when="when nothing else fits on the card(s) you have and host RAM is plentiful",
        pairs=(PairSpec("On the GPU vs offloaded to CPU RAM", _fs("offload"), off=lambda s: s["offload"] == "none",
                        on=lambda s: s["offload"] != "none",
                        commands=_cmds("llama-3.1-70b", "--method qlora --grad-ckpt",
                                       "--method qlora --grad-ckpt --offload params")),),
        functions=("reportgen.estimate.time:_transfer_s",)),
    Technique(
        slug="fsdp", title="FSDP (sharding over GPUs)", memory="down",
        terms="weights, gradients and optimizer states divided by the GPU count (+ gathered layers)",
        throughput="up in total with more GPUs, minus communication", quality="no change",
        when="when one card is not enough and you have several; quantization rarely needed with 4+ GPUs",
        pairs=(PairSpec("One GPU vs FSDP over several", _fs("gpus", "sharding"),
                        off=lambda s: s["gpus"] == 1, on=lambda s: s["sharding"] == "fsdp",
                        commands=_cmds("llama-3.1-70b", "--method qlora --grad-ckpt",
                                       "--method qlora --grad-ckpt --gpus 4 --sharding fsdp")),),
        functions=("reportgen.estimate.time:_transfer_s",)),
    Technique(
        slug="flash-attention", title="FlashAttention / SDPA", memory="down",
        terms="activations: no seq x seq attention probabilities", throughput="up: fused kernel, causal half skipped",
        quality="no change (exact attention)", when="always (the default in transformers where supported)",
        pairs=(PairSpec("Eager attention vs SDPA", _fs("attn"), off=lambda s: s["attn"] == "eager",
                        on=lambda s: s["attn"] == "sdpa",
                        commands=_cmds("llama-3.1-8b", "--method qlora --grad-ckpt --attn eager --seq 8192",
                                       "--method qlora --grad-ckpt --seq 8192")),),
        functions=("reportgen.estimate.memory:effective_attention", "reportgen.estimate.time:attention_flops_forward",
                   "reportgen.estimate.activations:layer_activations")),
    Technique(
        slug="fused-cross-entropy", title="Fused linear + cross-entropy", memory="down",
        terms="logits and loss: one chunk of tokens x vocabulary at a time instead of fp32 logits of all tokens",
        throughput="about the same with a frozen head; down with full fine-tuning at small micro-batches (each "
                   "chunk moves the whole head and its gradient)", quality="no change",
        when="large vocabularies (128k-256k: Llama 3, Gemma, Qwen) and long sequences",
        pairs=(PairSpec("Standard vs fused cross-entropy", _fs("loss"), off=lambda s: s["loss"] == "standard",
                        on=lambda s: s["loss"] == "fused",
                        commands=_cmds("llama-3.1-8b", "--method qlora --grad-ckpt",
                                       "--method qlora --grad-ckpt --loss fused")),),
        functions=("reportgen.estimate.logits", "reportgen.estimate.work:liger_loss_work")),
    Technique(
        slug="liger-kernels", title="Liger's layer kernels (RMSNorm, RoPE, SwiGLU)", memory="down",
        terms="activations: no fp32 copy in each norm, no activation output in the MLP; one MLP gradient "
              "instead of three in the backward",
        throughput="up where the step is memory-bound: one kernel each way instead of a chain of them",
        quality="no change (the same arithmetic, fp32 inside the kernels)",
        when="Llama, Mistral, Qwen2 and Qwen3 models, small hidden sizes and fast cards most",
        pairs=(PairSpec("transformers' modules vs Liger's kernels", _fs("kernels"),
                        off=lambda s: s.get("kernels", "eager") == "eager", on=lambda s: s.get("kernels") == "liger",
                        commands=_cmds("llama-3.2-1b", "--method full --precision bf16",
                                       "--method full --precision bf16 --kernels liger")),),
        functions=("reportgen.estimate.liger", "reportgen.estimate.work:liger_rms_norm")),
)
BY_SLUG = {t.slug: t for t in TECHNIQUES}
SYMBOL = {"down": "↓", "up": "↑", "depends": "●"}


# ----- the pool of stored cases ------------------------------------------------------------------
def _record(id: str, model: str, gpu: str, setup: dict, device_total, tokens_per_s, fits, measured, source) -> dict:
    return {"id": id, "model": model, "gpu": gpu, "setup": setup, "device_total": device_total,
            "tokens_per_s": tokens_per_s, "fits": fits, "measured": measured or None, "source": source}


def stored_cases(site: SiteData) -> list[dict]:
    """Every stored case once: sweep results first (they may carry a measurement), then the cases the
    stored walks evaluated. Sorted by id."""
    pool: dict[str, dict] = {}
    for r in site.all_results():
        est = r.get("estimate")
        if r.get("status") != "ok" or not est or r["id"] in pool or is_grpo(r):
            continue
        mem, t = est.get("memory") or {}, est.get("time") or {}
        pool[r["id"]] = _record(r["id"], r["case"]["model"], r["case"]["gpu"], r["case"]["setup"],
                                mem.get("device_total"), t.get("tokens_per_s"), est.get("fits"),
                                measured_values(r), f"sweep {r.get('sweep')}")
    advice = getattr(site, "advice", None) or {}
    for sweep in sorted(advice):
        for doc in advice[sweep]:
            numbers = [s.get("numbers") for s in doc["steps"]] + [o.get("numbers") for o in doc["options"]]
            numbers += [doc.get("recommended"), (doc.get("search") or {}).get("numbers")]
            for n in numbers:
                if n and n["case_id"] not in pool:
                    pool[n["case_id"]] = _record(n["case_id"], doc["model"], doc["gpu"], n["setup"],
                                                 n["device_total"], n["tokens_per_s"], n["fits"], None,
                                                 f"decision-tree walk ({sweep})")
    return [pool[k] for k in sorted(pool)]


def find_pairs(spec: PairSpec, cases: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs (without, with) of cases with the same model, GPU and setup apart from ``spec.fields``."""
    groups: dict[tuple, list[dict]] = {}
    for c in cases:
        rest = {k: v for k, v in c["setup"].items() if k not in spec.fields}
        groups.setdefault((c["model"], c["gpu"], json.dumps(rest, sort_keys=True)), []).append(c)
    pairs = []
    for key in sorted(groups):
        members = groups[key]
        for off in members:
            if not spec.off(off["setup"]):
                continue
            for on in members:
                if on is not off and spec.on(on["setup"]) and spec.both(off["setup"], on["setup"]):
                    pairs.append((off, on))
    return pairs


def _rel_change(a, b) -> float | None:
    return None if not a or b is None else b / a - 1


def _pair_view(off: dict, on: dict) -> dict:
    both_measured = off["measured"] and on["measured"]
    return {
        "model": off["model"], "gpu": off["gpu"], "gpu_label": gpu_label(off["gpu"]),
        "seq": off["setup"]["seq"], "batch": off["setup"]["batch"],
        "off_label": _label(off["setup"]), "on_label": _label(on["setup"]),
        "off_mem": off["device_total"], "on_mem": on["device_total"],
        "mem_change": _rel_change(off["device_total"], on["device_total"]),
        "off_tps": off["tokens_per_s"], "on_tps": on["tokens_per_s"],
        "tps_change": _rel_change(off["tokens_per_s"], on["tokens_per_s"]),
        "off_fits": off["fits"], "on_fits": on["fits"],
        "off_measured": off["measured"] if both_measured else None,
        "on_measured": on["measured"] if both_measured else None,
        "ids": [off["id"], on["id"]], "source": on["source"],
    }


def _label(setup: dict) -> str:
    s = training_setup(setup)  # setup_label names double quantization and the attention itself
    return setup_label(s) + f", micro-batch {s.batch}, seq {s.seq:,}"


def pair_examples(spec: PairSpec, cases: list[dict]) -> dict:
    """Worked examples for one pair kind: up to ``EXAMPLES`` pairs (one per model, preferring measured
    pairs, the primary sequence length, micro-batch 1 and pairs where the technique makes the case
    fit) and the median change over all pairs found."""
    pairs = find_pairs(spec, cases)

    def key(p):
        off, on = p
        return (not (off["measured"] and on["measured"]), off["setup"]["seq"] != PRIMARY_SEQ,
                off["setup"]["batch"] != 1 and "batch" not in spec.fields,
                not (on["fits"] and not off["fits"]), model_order(off["model"]), gpu_order(off["gpu"]),
                off["id"], on["id"])

    chosen, seen = [], set()
    for off, on in sorted(pairs, key=key):
        if off["model"] in seen:
            continue
        seen.add(off["model"])
        chosen.append(_pair_view(off, on))
        if len(chosen) == EXAMPLES:
            break
    mem = [c for c in (_rel_change(a["device_total"], b["device_total"]) for a, b in pairs) if c is not None]
    tps = [c for c in (_rel_change(a["tokens_per_s"], b["tokens_per_s"]) for a, b in pairs) if c is not None]
    return {
        "caption": spec.caption,
        "commands": list(spec.commands),
        "n": len(pairs),
        "examples": sorted(chosen, key=lambda v: (model_order(v["model"]), gpu_order(v["gpu"]))),
        "median_mem_change": statistics.median(mem) if mem else None,
        "mem_lower": sum(1 for c in mem if c < 0),  # a median near 0 hides a split: say how many it lowers
        "median_tps_change": statistics.median(tps) if tps else None,
        "made_fit": sum(1 for a, b in pairs if b["fits"] and not a["fits"]),
        "measured": sum(1 for a, b in pairs if a["measured"] and b["measured"]),
    }


# ----- pages -------------------------------------------------------------------------------------
def tree_uses(slug: str) -> list[dict]:
    """Where the decision tree turns the technique on."""
    out = [{"label": n.label, "stage": T.STAGES[n.stage], "title": n.title, "default": n.default}
           for n in T.NODES if isinstance(n, T.Action) and n.technique == slug]
    out += [{"label": o.label, "stage": "Beyond one card", "title": o.why, "default": False}
            for o in T.OPTIONS if o.technique == slug]
    return out


def speed_claim(t: Technique, examples: list[dict]) -> dict | None:
    """The technique's effect on tokens/s as the pages state it: the median change over the stored
    pairs of ``t.pairs[t.speed_pair]`` (estimates). None where the technique makes no speed claim or
    no pair is stored."""
    if t.speed_pair is None:
        return None
    ex = examples[t.speed_pair]
    if ex["median_tps_change"] is None:
        return None
    x = ex["median_tps_change"]
    return {"median_tps_change": x, "n": ex["n"], "caption": ex["caption"],
            "text": f"{100 * x:+.1f}% tokens/s (est.), the median over {ex['n']:,} stored pairs ({ex['caption']})"}


def _row(t: Technique, page: str, speed: dict | None = None) -> dict:
    throughput = t.throughput + (f"; {speed['text']}" if speed else "")
    return {"slug": t.slug, "title": t.title, "link": rel(page, f"techniques/{t.slug}.md"),
            "memory": SYMBOL[t.memory], "terms": t.terms, "throughput": throughput, "quality": t.quality,
            "when": t.when}


def technique_pages(site: SiteData) -> list[Page]:
    cases = stored_cases(site)
    any_measured = any(c["measured"] for c in cases)
    examples = {t.slug: [pair_examples(spec, cases) for spec in t.pairs] for t in TECHNIQUES}
    speed = {t.slug: speed_claim(t, examples[t.slug]) for t in TECHNIQUES}
    from reportgen.measured import cases_from_results, qlora_pairs, ratio_text

    measured_quant = ratio_text(qlora_pairs(cases_from_results(site.all_results())))
    pages = []
    for t in TECHNIQUES:
        path = f"techniques/{t.slug}.md"
        pages.append(Page(path=path, template=f"techniques/{t.slug}.md.j2", context={
            "root": "../",
            "t": _row(t, path, speed[t.slug]),
            "speed": speed[t.slug],
            "measured_quant": measured_quant,
            "examples": examples[t.slug],
            "functions": [function_doc(f) for f in t.functions],
            "tree": tree_uses(t.slug),
            "any_cases": bool(cases),
            "any_measured": any_measured,
            "index": rel(path, INDEX),
            "guides": rel(path, "guides/index.md"),
            "validation": rel(path, "validation.md"),
            "methodology": rel(path, "methodology.md"),
            "techniques": {x.slug: rel(path, f"techniques/{x.slug}.md") for x in TECHNIQUES},
        }))
    index = Page(path=INDEX, template="techniques/index.md.j2", context={
        "root": "../",
        "rows": [_row(t, INDEX, speed[t.slug]) for t in TECHNIQUES],
        "guides": rel(INDEX, "guides/index.md"),
        "methodology": rel(INDEX, "methodology.md"),
        "any_measured": any_measured,
    })
    return [index] + pages
