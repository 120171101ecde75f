"""The speed claims a walk makes, computed from the estimator instead of written as prose.

Two claims used to be hard-coded and contradicted the numbers next to them (issue 12):

* "quantization only costs speed here": whether 4-bit base weights cost or gain tokens/s depends on
  what they make room for. ``quantization_effect`` evaluates the walk's recommended setup with the
  other base-weight format (LoRA <-> QLoRA, everything else equal) and reports both figures.
* the walk's recommendation and the cheapest-setup search's pick are two "best" answers.
  ``search_differences`` says, field by field, what each of the search's choices is worth: the
  search's setup with that one field set as the walk has it, estimated again (tokens/s, and whether
  it still fits). So a reader sees why the two differ in the estimator's own numbers.

Everything here is estimator work done when the walk runs (``walk.py``); the pages only read it.
``ev`` is the walk's cached estimator (``walk._Estimates``): ``ev.numbers(setup, reverse=False)`` is a
dict of the figures of one estimate (without the largest-batch search, which these claims do not use).
"""

from __future__ import annotations

from reportgen.estimate.slowdown import qlora_slowdown
from reportgen.setup import TrainingSetup

#: the fields the search and the walk may choose differently, in the order they are explained
EXPLAINED_FIELDS = ("method", "grad_ckpt", "loss", "optimizer", "double_quant", "batch", "accum")
#: setup fields that go with ``method`` when it is switched (QLoRA's quantization settings)
METHOD_FIELDS = ("method", "quant", "double_quant")


def _with(setup: TrainingSetup, values: dict) -> TrainingSetup:
    return TrainingSetup(**{**setup.model_dump(), **values})


def _gib(n: int | float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _rel(a: float | None, b: float | None) -> float | None:
    """b relative to a (b / a - 1), None where either has no speed estimate."""
    return (b / a - 1) if a and b else None


def _pct(x: float) -> str:
    return f"{100 * x:+.0f} %"


def quantization_effect(recommended: dict | None, ev) -> dict | None:
    """The walk's recommended setup with the other base-weight format: a LoRA recommendation as
    QLoRA (NF4) and a QLoRA one as 16-bit LoRA, everything else equal. None for full fine-tuning or
    no recommendation. ``tokens_per_s_rel`` is QLoRA relative to LoRA (negative: QLoRA slower), from
    ``estimate.slowdown.qlora_slowdown`` (the function the technique pages use); where measured
    pairs exist, ``reportgen advise`` and the guides cite them beside it (``reportgen.measured``)."""
    if recommended is None or recommended["setup"]["method"] not in ("lora", "qlora"):
        return None
    setup = TrainingSetup(**recommended["setup"])
    if setup.method.value == "lora":
        lora, qlora = recommended, ev.numbers(_with(setup, {"method": "qlora", "quant": "nf4"}), reverse=False)
        other = qlora
    else:
        qlora, lora = recommended, ev.numbers(_with(setup, {"method": "lora", "double_quant": False}), reverse=False)
        other = lora
    # the ratio of the one function the tables and technique pages use (estimate.slowdown)
    sd = qlora_slowdown(ev.model, ev.gpu, setup)
    rel = None if sd is None else 1 / sd.ratio - 1
    if other is qlora:
        speed = "" if rel is None else (f": {qlora['tokens_per_s']:,.0f} vs {lora['tokens_per_s']:,.0f} tokens/s "
                                        f"({_pct(rel)}, the dequantization of every 4-bit weight in every pass)")
        text = (f"The same setup with a 4-bit base (QLoRA) needs {_gib(qlora['device_total'])} instead of "
                f"{_gib(lora['device_total'])}{speed} (est.).")
    else:
        fit = lora.get("verdict") or ("fits" if lora["fits"] else "does not fit")
        fit = "is tight" if fit == "tight" else fit
        speed = "" if rel is None else (f"; it would run at {lora['tokens_per_s']:,.0f} tokens/s, QLoRA's "
                                        f"{qlora['tokens_per_s']:,.0f} is {_pct(rel)}")
        text = (f"The same setup with a 16-bit base (LoRA) needs {_gib(lora.get('demand', lora['device_total']))}: "
                f"it {fit}{speed} "
                f"(est.).")
    return {"lora": lora, "qlora": qlora, "tokens_per_s_rel": rel, "text": text}


def search_differences(recommended: dict, found: dict, ev) -> list[dict]:
    """For each field where the search's pick differs from the walk's recommendation: the search's
    setup with that field (and, for ``method``, QLoRA's quantization fields) as the walk has it,
    estimated again. ``tokens_per_s_rel`` is that variant relative to the search's pick."""
    tree, search = recommended["setup"], found["setup"]
    base = TrainingSetup(**search)
    out = []
    for field in EXPLAINED_FIELDS:
        if tree[field] == search[field] or (field == "double_quant" and tree["method"] != search["method"]):
            continue
        fields = METHOD_FIELDS if field == "method" else (field,)
        variant = ev.numbers(_with(base, {f: tree[f] for f in fields}), reverse=False)
        out.append({"field": field, "tree": tree[field], "search": search[field], "variant": variant,
                    "tokens_per_s_rel": _rel(found["tokens_per_s"], variant["tokens_per_s"])})
    return out


def _effect_text(d: dict) -> str:
    v = d["variant"]
    name = {"method": "method", "grad_ckpt": "checkpointing", "loss": "loss", "optimizer": "optimizer",
            "double_quant": "double quantization", "batch": "micro-batch", "accum": "accumulation steps"}[d["field"]]
    what = ("on" if d["tree"] else "off") if isinstance(d["tree"], bool) else d["tree"]  # 1 == True in a dict
    head = f"{name} {what} as in the walk"
    if not v["fits"]:  # the verdict's word: tight or does not fit (estimate/verdict.py)
        return f"{head}: needs {_gib(v.get('demand', v['device_total']))}, {v.get('verdict') or 'does not fit'}"
    if d["tokens_per_s_rel"] is None:
        return f"{head}: fits ({_gib(v['device_total'])})"
    return f"{head}: {v['tokens_per_s']:,.0f} tokens/s ({_pct(d['tokens_per_s_rel'])})"


def search_text(recommended: dict, found: dict, differences: list[dict], target_batch: int) -> str:
    """One paragraph: which setup is faster, by how much, and what each difference is worth."""
    tps_tree, tps_search = recommended["tokens_per_s"], found["tokens_per_s"]
    rel = _rel(tps_tree, tps_search)
    if rel is None:
        speed = ""
    elif abs(rel) < 0.005:
        speed = f" at the same estimated speed ({tps_search:,.0f} tokens/s)"
    else:
        speed = (f", {'faster' if rel > 0 else 'slower'} by the estimate: {tps_search:,.0f} vs {tps_tree:,.0f} "
                 f"tokens/s ({_pct(rel)})")
    effects = "; ".join(_effect_text(d) for d in differences)
    reasons = []
    fields = {d["field"] for d in differences}
    if fields & {"method", "grad_ckpt", "optimizer", "double_quant"}:
        reasons.append("the walk turns a technique on only when the setup before it does not fit, in the reference "
                       "order (full fine-tuning, then LoRA, then 4-bit quantization; the fused loss, then "
                       "checkpointing when micro-batch 1's activations do not fit), and keeps the first setup that "
                       "fits; the search tries every candidate and keeps the fastest")
    if "loss" in fields:
        reasons.append("fused cross-entropy is not among the search's candidates")
    if fields & {"batch", "accum"}:
        reasons.append(f"the walk accumulates to an effective batch of {target_batch} sequences, the search takes "
                       "the largest micro-batch without accumulation")
    return (f"A search of every single-GPU candidate at its largest micro-batch that fits (full fine-tuning, also "
            f"with 8-bit AdamW, LoRA and QLoRA, each with and without checkpointing) picks {found['label']}{speed}. "
            f"Its setup with one choice changed back to the walk's (est.): {effects}. "
            f"Why they differ: {'; '.join(reasons)}.")
