"""Measured figures the prose may cite, read from the committed measurement files.

Two readers need measurements outside the site's tables:

* ``reportgen estimate`` ends by saying whether the exact setup it estimated was measured
  (``footer``), instead of pointing at a page that may hold nothing for it;
* the speed claims in prose (``reportgen advise``, the guides, the QLoRA page) cite QLoRA's measured
  step time against LoRA's where a pair of measured cases differs only in the base weights'
  format (``qlora_pairs``, ``ratio_text``), next to the estimator's ratio for the same pairs.

Which measured figure counts for which case is decided by the one provenance rule
(``reportgen.provenance``): memory for the card it ran on or was capped to, speed only for the card
that ran it. Nothing here estimates; the estimated ratio comes with the cases (the result files'
estimates, or the caller's ``estimate()``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path

from reportgen.provenance import provenance_of

#: setup fields in which a QLoRA case may differ from its LoRA partner: the base weights' format
QUANT_FIELDS = ("method", "quant", "double_quant", "quant_head", "kbit_prep")


def measured_blocks(results_dir: Path, cid: str) -> list[dict]:
    """The current measurement of case ``cid`` in every sweep under ``results_dir`` (newest settled
    attempt, as the pages show it)."""
    from reportgen import store

    out = []
    for folder in sorted(Path(results_dir).glob(f"*/{store.MEASURED_DIR}")):
        # this case's files only: reading (and checking) every measurement of the folder cost every
        # `reportgen estimate` call about 0.1 s
        attempts = store.load_case_measurements(folder.parent, cid, warn=lambda _: None)
        block = store.current_measurement(attempts)
        if block is not None:
            out.append(block)
    return out


def footer(results_dir: Path, cid: str, gpu: str) -> str:
    """The last line of ``reportgen estimate``: the measurement of this exact setup on this card
    where one counts for it, else that there is none."""
    for block in measured_blocks(results_dir, cid):
        prov = provenance_of(block)
        valid = prov.valid_quantities(gpu)
        if block.get("status") == "oom" and prov.memory_counts_for(gpu):
            return f"measured too: out of memory ({prov.label(gpu)}; reportgen show {cid})"
        fig = block.get("measurement") or {}
        parts = []
        if "device_total" in valid and isinstance(fig.get("device_used"), (int, float)):
            parts.append(f"device total {fig['device_used'] / 2**30:.2f} GiB")
        if "tokens_per_s" in valid and isinstance(fig.get("tokens_per_s"), (int, float)):
            parts.append(f"{fig['tokens_per_s']:,.0f} tokens/s")
        if block.get("status") == "ok" and parts:
            return f"measured too: {', '.join(parts)} ({prov.label(gpu)}; reportgen show {cid})"
    return f"estimate only: this setup ({cid}) has no measurement that counts for this card"


def _key(case: dict) -> tuple:
    setup = case["setup"]
    return (case["model"], case["gpu"], tuple(sorted((k, repr(v)) for k, v in setup.items() if k not in QUANT_FIELDS)))


def qlora_pairs(cases: Iterable[dict]) -> list[dict]:
    """Pairs of measured cases that differ only in the base weights' format (16-bit LoRA against
    QLoRA). ``cases``: ``{"id", "model", "gpu", "setup", "measured_tokens_per_s",
    "estimated_tokens_per_s"}``, the measured speed already judged by the provenance rule (None
    where it does not count). Each pair: ``measured`` and ``estimated`` QLoRA time / LoRA time for
    the same tokens (1.25 = QLoRA takes 25 % longer; ``estimated`` None without both estimates)."""
    lora, qlora = {}, []
    for c in cases:
        if not c.get("measured_tokens_per_s"):
            continue
        method = c["setup"].get("method")
        if method == "lora":
            lora.setdefault(_key(c), c)
        elif method == "qlora":
            qlora.append(c)
    out = []
    for q in sorted(qlora, key=lambda c: c["id"]):
        partner = lora.get(_key(q))
        if partner is None:
            continue
        est_l, est_q = partner.get("estimated_tokens_per_s"), q.get("estimated_tokens_per_s")
        out.append({"model": q["model"], "gpu": q["gpu"], "lora": partner["id"], "qlora": q["id"],
                    "lora_setup": partner["setup"], "qlora_setup": q["setup"],
                    "measured": partner["measured_tokens_per_s"] / q["measured_tokens_per_s"],
                    "estimated": est_l / est_q if est_l and est_q else None})
    return out


def cases_from_results(results: Iterable[dict]) -> list[dict]:
    """``qlora_pairs``' input from result documents (``store.load_results``: case, estimate and the
    current measurement joined), with the provenance rule applied to the measured speed."""
    out = []
    for r in results:
        m = r.get("measurement")
        if not m or m.get("status") != "ok":
            continue
        fig = m.get("measurement") or {}
        tps = fig.get("tokens_per_s") if "tokens_per_s" in provenance_of(m).valid_quantities(r["case"]["gpu"]) else None
        est = ((r.get("estimate") or {}).get("time") or {}).get("tokens_per_s")
        out.append({"id": r["id"], **r["case"], "measured_tokens_per_s": tps, "estimated_tokens_per_s": est})
    return out


def cases_from_files(results_dir: Path) -> list[dict]:
    """``qlora_pairs``' input from the measurement files alone (every sweep under ``results_dir``,
    the current attempt of each case), without estimates: for ``reportgen advise``, which estimates
    the pairs itself (``with_estimates``)."""
    from reportgen import store

    out = []
    for folder in sorted(Path(results_dir).glob(f"*/{store.MEASURED_DIR}")):
        for cid, attempts in sorted(store.load_measurements(folder.parent, warn=lambda _: None).items()):
            m = store.current_measurement(attempts)
            if not m or m.get("status") != "ok" or not isinstance(m.get("case"), dict):
                continue
            case = m["case"]
            fig = m.get("measurement") or {}
            tps = fig.get("tokens_per_s") if "tokens_per_s" in provenance_of(m).valid_quantities(case["gpu"]) else None
            out.append({"id": cid, **case, "measured_tokens_per_s": tps, "estimated_tokens_per_s": None})
    return out


def with_estimates(pairs: list[dict]) -> list[dict]:
    """The pairs with the estimator's QLoRA/LoRA ratio for the same setups
    (``estimate.slowdown.qlora_slowdown``, the function the tables and technique pages use)."""
    from reportgen import catalog
    from reportgen.estimate.slowdown import qlora_slowdown
    from reportgen.setup import TrainingSetup

    out = []
    for p in pairs:
        sd = qlora_slowdown(catalog.load_model(p["model"]), catalog.load_gpu(p["gpu"]), TrainingSetup(**p["qlora_setup"]))
        out.append({**p, "estimated": None if sd is None else sd.ratio})
    return out


def _range(xs: list[float]) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}x to {hi:.2f}x"


def _gpu_name(key: str) -> str:
    from reportgen import catalog

    try:
        return catalog.load_gpu(key).name
    except Exception:  # a card this machine's catalog does not have
        return key


def ratio_text(pairs: list[dict], model: str | None = None, gpu_label=_gpu_name) -> str | None:
    """One sentence citing the measured QLoRA/LoRA ratio, preferring pairs of ``model``; None where
    no pair was measured. The estimate for the same pairs is given beside it."""
    mine = [p for p in pairs if p["model"] == model] if model else []
    chosen = mine or pairs
    if not chosen:
        return None
    models = sorted({p["model"] for p in chosen})
    gpus = ", ".join(gpu_label(g) for g in sorted({p["gpu"] for p in chosen}))
    est = [p["estimated"] for p in chosen if p["estimated"]]
    est_text = f"; the estimate for the same pairs: {_range(est)}" if est else ""
    return (f"Measured on the {gpus}: QLoRA took {_range([p['measured'] for p in chosen])} LoRA's time for the "
            f"same tokens ({len(chosen)} pair{'s' if len(chosen) > 1 else ''} of {', '.join(models)} differing only "
            f"in the base weights{est_text}).")


def median_ratio(pairs: list[dict], key: str = "measured") -> float | None:
    xs = [p[key] for p in pairs if p.get(key)]
    return statistics.median(xs) if xs else None


__all__ = ["QUANT_FIELDS", "cases_from_files", "cases_from_results", "footer", "with_estimates", "measured_blocks",
           "median_ratio", "qlora_pairs",
           "ratio_text"]
