"""Walk the decision tree (``tree.py``) for one model, GPU and sequence length with real estimates.

The walk is estimator work: every check is answered from ``reportgen.estimate.estimate`` of the
setup at that point. Its result is plain data (``walk()`` returns a JSON-ready dict): the path,
each step with its numbers, the verdict, the recommended setup, the options beyond one card and
the comparison with ``estimate.cheapest.cheapest_setup``. ``reportgen advise`` prints it and
``store.py`` writes it next to a sweep's results so the guide pages only read it.
"""

from __future__ import annotations

import math

from reportgen import catalog
from reportgen.advise import claims as C
from reportgen.advise import tree as T
from reportgen.estimate import Estimate, context_note, estimate
from reportgen.fingerprint import estimator_hash
from reportgen.estimate.cheapest import cheapest_setup
from reportgen.estimate.search import default_precision
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.results import case_id
from reportgen.setup import TrainingSetup

#: bump when the layout of a walk changes (stored walks carry it)
ADVICE_SCHEMA_VERSION = 2

#: parameter-side memory terms: what Step 1 targets
PARAM_TERMS = ("weights", "quant_constants", "lora_adapters", "gradients", "optimizer")


class _Estimates:
    """estimate() with a cache: the walk asks about the same setup several times."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, train_tokens: int):
        self.model, self.gpu, self.train_tokens = model, gpu, train_tokens
        self._cache: dict[str, Estimate] = {}

    def __call__(self, setup: TrainingSetup, reverse: bool = True) -> Estimate:
        """``reverse=False``: without the largest-batch/longest-sequence searches (a cached full
        estimate of the same setup is returned where there is one)."""
        key = setup.model_dump_json()
        if key in self._cache:
            return self._cache[key]
        if not reverse:
            return self._cache.setdefault("fwd:" + key, estimate(self.model, self.gpu, setup, reverse=False,
                                                                 train_tokens=self.train_tokens))
        self._cache[key] = estimate(self.model, self.gpu, setup, train_tokens=self.train_tokens)
        return self._cache[key]

    def numbers(self, setup: TrainingSetup, reverse: bool = True) -> dict:
        return numbers(self(setup, reverse), self.gpu)


def free_bytes(est: Estimate, gpu: GpuSpec) -> int:
    """GPU memory left over (negative: missing): the verdict's margin (``estimate.verdict``)."""
    return est.judgement.margin


def numbers(est: Estimate, gpu: GpuSpec) -> dict:
    """The figures of one estimate a walk shows (bytes, seconds, tokens/s; all estimates)."""
    mem, t = est.memory, est.time
    setup = est.setup
    dump = setup.model_dump(mode="json")
    return {
        "case_id": case_id(est.model, est.gpu, dump),
        "setup": dump,
        "label": setup.short(),
        "technique": setup.technique(),
        "fits": est.fits,
        "verdict": est.verdict,
        "demand": est.judgement.demand,
        "margin": est.judgement.margin,
        "range": None if est.judgement.range is None else list(est.judgement.range),
        "verdict_text": est.judgement.text(),
        "device_total": mem.device_total,
        "peak_allocated": mem.peak_allocated,
        "peak_reserved": mem.peak_reserved,
        "peak_phase": mem.peak_phase,
        "param_side": sum(mem.terms.get(k, 0) for k in PARAM_TERMS),
        "optimizer_paged": mem.terms.get("optimizer_paged", 0),
        "activations": mem.terms.get("activations", 0),
        "logits": mem.terms.get("logits", 0),
        "host_ram": mem.host_ram,
        "capacity": gpu.memory_bytes,
        "free": free_bytes(est, gpu),
        "tokens_per_s": t.tokens_per_s,
        "mfu": t.mfu,
        "step_s": t.step_s,
        "compute_s": t.compute_s,
        "memory_s": t.memory_s,
        "transfer_s": t.transfer_s,
        "host_s": (t.parts or {}).get("host"),
        "bound": t.bound,
        "train_tokens": t.train_tokens,
        "train_hours": t.train_hours,
        "train_dollars": t.train_dollars,
        "max_batch": est.max_batch,
        "max_seq": est.max_seq,
        "notes": list(est.notes),
    }


def _gib(n: int | float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _fit_text(n: dict) -> str:
    """The verdict's own words (``estimate.verdict.Verdict.text``): fits, tight or does not fit."""
    return n["verdict_text"] + " (est.)"


# ----- resolving symbolic changes --------------------------------------------------------------
def _with(setup: TrainingSetup, values: dict) -> TrainingSetup:
    """A validated copy of ``setup`` with ``values`` (``model_copy`` would skip validation)."""
    return TrainingSetup(**{**setup.model_dump(), **values})


def _accumulate(setup: TrainingSetup, ev: _Estimates, notes: list[str]) -> dict:
    """``@accum-to-target``: accumulate to the target effective batch; where the gradients kept
    between micro-batches no longer fit, lower the micro-batch to the largest that fits."""
    batch = setup.batch
    for _ in range(8):
        accum = math.ceil(T.TARGET_EFFECTIVE_BATCH / batch)
        trial = _with(setup, {"batch": batch, "accum": accum})
        est = ev(trial)
        if est.fits:
            if batch != setup.batch:
                notes.append(f"with accumulation the gradients stay allocated between micro-batches: micro-batch "
                             f"{setup.batch} no longer fits, {batch} does (est.)")
            return {"batch": batch, "accum": accum}
        if est.max_batch is None or est.max_batch >= batch:
            break
        batch = est.max_batch
    notes.append("gradient accumulation does not fit (gradients stay allocated between micro-batches): "
                 "kept at one micro-batch per step (est.)")
    return {}


def _resolve(change: dict, setup: TrainingSetup, ev: _Estimates, notes: list[str]) -> dict:
    values: dict = {}
    for field, value in change.items():
        if not (isinstance(value, str) and value.startswith("@")):
            values[field] = value
        elif value == "@default-precision":
            values[field] = default_precision(ev.gpu)
        elif value == "@max-batch":
            mb = ev(setup).max_batch
            if mb is not None:
                values[field] = min(mb, T.MAX_MICRO_BATCH)
        elif value == "@accum-to-target":
            values.update(_accumulate(setup, ev, notes))
        elif value == "@max-seq":
            ms = ev(setup).max_seq
            if ms is not None:
                values[field] = ms
        else:
            raise ValueError(f"unknown symbol {value!r} in the decision tree")
    return values


# ----- predicates of the checks -----------------------------------------------------------------
def _p_fits(n: dict, setup: TrainingSetup, ev: _Estimates) -> tuple[str, str]:
    return ("yes" if n["fits"] else "no"), _fit_text(n)


def _p_larger_batch(n: dict, setup: TrainingSetup, ev: _Estimates) -> tuple[str, str]:
    mb = n["max_batch"]
    return ("yes" if mb is not None and mb > 1 else "no"), f"largest micro-batch that fits: {mb or 'none'} (est.)"


def _p_below_target(n: dict, setup: TrainingSetup, ev: _Estimates) -> tuple[str, str]:
    eff = setup.batch * setup.accum
    return ("yes" if eff < T.TARGET_EFFECTIVE_BATCH else "no"), (
        f"{setup.batch} x {setup.accum} = {eff} sequences per optimizer step")


def _p_compute_bound(n: dict, setup: TrainingSetup, ev: _Estimates) -> tuple[str, str]:
    if n["bound"] is None:
        return "unknown", "no peak FLOP/s in the GPU catalog: no time estimate"
    parts = ", ".join(f"{k} {n[k + '_s']:.2f} s" for k in ("compute", "memory", "transfer"))
    if n["bound"] == "host":
        return "host", f"per optimizer step (est.): {parts}; the host's dispatch {n['host_s']:.2f} s is longer"
    return ("yes" if n["bound"] == "compute" else "no"), f"per optimizer step (est.): {parts}"


def _p_liger_supported(n: dict, setup: TrainingSetup, ev: _Estimates) -> tuple[str, str]:
    from reportgen.estimate.liger import LIGER_MODEL_TYPES

    t = ev.model.model_type
    return ("yes" if t in LIGER_MODEL_TYPES else "no"), f"model_type {t!r}"


PREDICATES = {"fits": _p_fits, "larger_batch": _p_larger_batch, "below_target": _p_below_target,
              "compute_bound": _p_compute_bound, "liger_supported": _p_liger_supported}


# ----- options beyond one card -------------------------------------------------------------------
def _options(end: T.End, setup: TrainingSetup, ev: _Estimates) -> list[dict]:
    base = _with(setup, T.min_activations(ev.model.model_type))
    out = []
    for oid in end.options:
        opt = T.OPTION_BY_ID[oid]
        row = {"id": opt.id, "label": opt.label, "why": opt.why, "tradeoff": opt.tradeoff,
               "technique": opt.technique, "fits": False, "numbers": None, "gpus": 1, "text": ""}
        if "@gpus" in opt.change.values():
            for n in T.FSDP_GPU_COUNTS:
                s = _with(base, {k: (n if v == "@gpus" else v) for k, v in opt.change.items()})
                row.update(gpus=n, numbers=ev.numbers(s), fits=ev(s).fits)
                if row["fits"]:
                    break
            nums = row["numbers"]
            row["text"] = (f"fits on {row['gpus']} GPUs: {_gib(nums['capacity'] - nums['free'])} per GPU (est.)"
                           if row["fits"] else f"does not fit on {row['gpus']} GPUs either (est.)")
        else:
            values = _resolve(opt.change, base, ev, [])
            if not values:  # @max-seq found nothing
                row["text"] = "not even 128 tokens fit (est.)"
            else:
                s = _with(base, values)
                row.update(numbers=ev.numbers(s), fits=ev(s).fits)
                nums = row["numbers"]
                if "seq" in values:
                    row["text"] = f"fits up to {values['seq']:,} tokens per sequence (est.)"
                else:
                    host = f", host RAM {_gib(nums['host_ram'])}" if nums["host_ram"] else ""
                    row["text"] = _fit_text(nums) + host
        out.append(row)
    return out


# ----- the comparison with cheapest_setup --------------------------------------------------------
COMPARED_FIELDS = ("method", "optimizer", "double_quant", "grad_ckpt", "loss", "batch", "accum")


def _compare(recommended: dict | None, model: ModelSpec, gpu: GpuSpec, seq: int, ev: _Estimates) -> dict:
    cheap = cheapest_setup(model, gpu, seq, max_micro_batch=T.MAX_MICRO_BATCH)
    found = ev.numbers(cheap.setup) if cheap is not None else None
    out = {"numbers": found, "same": False, "differences": [], "text": ""}
    if found is None and recommended is None:
        out.update(same=True, text="The search finds no single-GPU recipe that fits either.")
        return out
    if found is None:
        out["text"] = ("A search of every single-GPU candidate (full fine-tuning, also with 8-bit AdamW, LoRA and QLoRA, "
                       "each with and without checkpointing) finds nothing that fits: the walk's setup uses techniques "
                       f"outside those candidates ({recommended['label']}).")
        return out
    if recommended is None:
        out["text"] = (f"The search finds {found['label']} fitting where the tree stops: the tree checks Step 1 at "
                       "micro-batch 1 only.")
        return out
    diffs = [{"field": f, "tree": recommended["setup"][f], "search": found["setup"][f]}
             for f in COMPARED_FIELDS if recommended["setup"][f] != found["setup"][f]]
    out["differences"] = diffs
    if not diffs:
        out.update(same=True, text="The search picks the same setup.")
        return out
    out["effects"] = C.search_differences(recommended, found, ev)
    out["text"] = C.search_text(recommended, found, out["effects"], T.TARGET_EFFECTIVE_BATCH)
    return out


# ----- the walk ----------------------------------------------------------------------------------
def _act(node, setup: TrainingSetup, ev) -> tuple[TrainingSetup, dict]:
    """An action node applied to ``setup``: the new setup and the walk's step (the fields it changed,
    before and after; skipped when it changed none)."""
    notes: list[str] = []
    before = setup
    setup = _with(setup, _resolve(node.change, setup, ev, notes))
    changed = {} if node.id == T.ROOT else {
        f: [getattr(before, f), getattr(setup, f)] for f in TrainingSetup.model_fields
        if getattr(before, f) != getattr(setup, f)}
    changed = {f: [v.value if hasattr(v, "value") else v for v in pair] for f, pair in changed.items()}
    return setup, {"kind": "action", "node": node.id, "stage": node.stage, "title": node.title, "why": node.why,
                   "tradeoff": node.tradeoff, "technique": node.technique, "changed": changed,
                   "skipped": node.id != T.ROOT and not changed, "label": setup.short(), "notes": notes,
                   "numbers": None, "delta": None}


def walk(model: ModelSpec | str, gpu: GpuSpec | str, seq: int = 2048, train_tokens: int = 100_000_000) -> dict:
    """Walk the tree for one model, GPU and sequence length; a JSON-ready dict (all numbers are
    estimates)."""
    model = catalog.load_model(model) if isinstance(model, str) else model
    gpu = catalog.load_gpu(gpu) if isinstance(gpu, str) else gpu
    ev = _Estimates(model, gpu, train_tokens)
    setup = TrainingSetup(seq=seq)
    steps: list[dict] = []
    path: list[str] = []
    last: dict[str, dict] = {}  # the last numbers per variant, for "what changed"
    node_id = T.ROOT
    for _ in range(len(T.NODES) + 1):
        node = T.BY_ID[node_id]
        path.append(node_id)
        if isinstance(node, T.Action):
            setup, step = _act(node, setup, ev)
            if node.evaluate:
                step["numbers"] = ev.numbers(setup)
                step["delta"] = _delta(last.get("as-is"), step["numbers"])
                last["as-is"] = step["numbers"]
            steps.append(step)
            node_id = node.next
        elif isinstance(node, T.Check):
            evaluated = setup if node.variant == "as-is" else _with(setup, T.min_activations(ev.model.model_type))
            nums = ev.numbers(evaluated)
            outcome, explain = PREDICATES[node.test](nums, setup, ev)
            if node.variant != "as-is":
                explain = (f"weights + gradients + optimizer states {_gib(nums['param_side'])}; at micro-batch 1 "
                           f"with checkpointing and the fused loss: {explain}")
            steps.append({"kind": "check", "node": node.id, "stage": node.stage, "question": node.question,
                          "how": node.how, "variant": node.variant, "outcome": outcome, "explain": explain,
                          "numbers": nums, "next": node.edges[outcome],
                          "delta": _delta(last.get(node.variant), nums) if node.variant != "as-is" else None})
            if node.variant != "as-is":
                last[node.variant] = nums
            node_id = node.edges[outcome]
        else:
            break
    else:  # pragma: no cover - the tree is a DAG (tests check it)
        raise RuntimeError("the decision tree walk did not reach an end")
    end: T.End = node
    recommended = ev.numbers(setup) if end.verdict == "fits" else None
    options = _options(end, setup, ev)
    steps.append({"kind": "end", "node": end.id, "stage": end.stage, "verdict": end.verdict, "title": end.title,
                  "text": end.text})
    search = _compare(recommended, model, gpu, seq, ev)
    quant = C.quantization_effect(recommended, ev)
    text = end.text + ("" if quant is None else " " + quant["text"])
    return {
        "schema_version": ADVICE_SCHEMA_VERSION,
        "model": model.name,
        "gpu": gpu.key,
        "gpu_name": gpu.name,
        "gpu_memory_bytes": gpu.memory_bytes,
        "seq": seq,
        "context_note": (context_note(model, seq) if model.max_position_embeddings
                         and seq > model.max_position_embeddings else None),
        "train_tokens": train_tokens,
        "estimator_hash": estimator_hash(),
        "tree_hash": T.tree_hash(),
        "path": path,
        "steps": steps,
        "verdict": {"kind": end.verdict, "node": end.id, "title": end.title, "text": text,
                    "summary": _summary(end, recommended, options, gpu, search)},
        "recommended": recommended,
        "options": options,
        "search": search,
        "quantization": quant,
        "turned_on": [s["node"] for s in steps if s["kind"] == "action" and not s["skipped"]
                      and T.BY_ID[s["node"]].stage in ("step1", "step2")],
    }


def _delta(before: dict | None, after: dict) -> dict | None:
    if before is None:
        return None
    tps0, tps1 = before["tokens_per_s"], after["tokens_per_s"]
    return {"device_total": after["device_total"] - before["device_total"],
            "param_side": after["param_side"] - before["param_side"],
            "tokens_per_s_rel": (tps1 / tps0 - 1) if tps0 and tps1 else None}


def _summary(end: T.End, recommended: dict | None, options: list[dict], gpu: GpuSpec, search: dict) -> str:
    if recommended is not None:
        s = recommended["setup"]
        tps = recommended["tokens_per_s"]
        speed = f", {tps:,.0f} tokens/s" if tps else ""
        effective = s["batch"] * s["accum"]
        short = (f" (below the {T.TARGET_EFFECTIVE_BATCH} the tree aims for: accumulation does not fit)"
                 if effective < T.TARGET_EFFECTIVE_BATCH else "")
        faster = ""
        found = search.get("numbers")
        if not search["same"] and found and tps and found["tokens_per_s"] and found["tokens_per_s"] > 1.005 * tps:
            faster = (f"; the fastest setup that fits is {found['label']} at {found['tokens_per_s']:,.0f} tokens/s "
                      f"({100 * (found['tokens_per_s'] / tps - 1):+.0f} %): see the comparison with the search")
        rng = recommended.get("range")
        expected = f", expected up to {_gib(rng[1])} with the error band" if rng else ""
        return (f"fits with {recommended['label']}: needs {_gib(recommended['demand'])} of "
                f"{_gib(recommended['capacity'])}{expected}{speed}, effective batch {effective}{short} (est.){faster}")
    fitting = [o for o in options if o["fits"]]
    if not fitting:
        return f"does not fit on one {gpu.name}, and none of the options fits either (est.)"
    parts = []
    for o in fitting:
        tps = o["numbers"]["tokens_per_s"]
        parts.append(f"{o['label'].replace('n GPUs', str(o['gpus']) + ' GPUs')}"
                     + (f" ({tps:,.0f} tokens/s)" if tps else ""))
    head = "fits only with a shorter sequence" if end.verdict == "shorter-sequence" else \
        f"does not fit on one {gpu.name}"
    return head + "; options: " + "; ".join(parts) + " (est.)"
