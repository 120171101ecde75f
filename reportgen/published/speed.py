"""Tokens per second that other projects published, against the estimator's ``tokens_per_s``.

Only figures the source states, or that follow from what it states by arithmetic:

* AnswerDotAI/fsdp_qlora ``benchmarks_03_2024.md``: the tables' "Time (s)" is the wall time to train
  the template's ``--dataset dummy --dataset_samples 1024``, i.e. 1,024 samples of the context length,
  so tokens/s (all GPUs together) = 1024 x context / time. The document's own figure confirms the
  reading: it states 2,200 tokens/s per GPU for the Mistral 7B run at context 2,048 whose table time
  is 483 s, and 1024 x 2048 / 483 / 2 GPUs = 2,171. Where the row states tokens/s (R023, R024), that
  stated figure is used, per GPU, times the GPU count. The wall time includes loading and
  quantizing the model, so these derived rates are lower bounds of the training rate. Its dual-3090
  machine has "an older motherboard and slow PCI lanes" (the 4090 machine, by contrast, "full PCIe v4
  x16 lanes"): the rows of that machine carry the link it states (``SLOW_3090_LINK``), not the
  card's catalog PCIe 4.0 x16.
* pytorch/torchtitan (tokens/s per GPU): H100 96GB HBM2e at 500 W, not in the catalog, and the
  sequence length is not stated: not compared.
* litgpt states training runtimes in minutes for N epochs of Alpaca-2k, not the tokens trained:
  no tokens/s; its LoRA and QLoRA runs of one model on one dataset give the QLoRA/LoRA slowdown
  instead (``slowdown_rows``).
* transformers' BERT rows (samples/s): an encoder, not a supported family.
* apple/ml-cross-entropy: the loss op alone, not a training step.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from reportgen import catalog
from reportgen.estimate.memory import estimate_memory
from reportgen.estimate.time import estimate_time
from reportgen.estimate.libraries import Libraries
from reportgen.hardware import GpuSpec
from reportgen.published.mapping import FSDP_QLORA_LIBS, Unmapped, fsdp_qlora_setup, row_problem
from reportgen.setup import TrainingSetup

#: fsdp_qlora's benchmark template: ``--dataset dummy --dataset_samples 1024``
FSDP_QLORA_SAMPLES = 1024
_TIME = re.compile(r"Time(?: \(s\) column =| )\s*([0-9][0-9,]*) ")
_EFFECTIVE_BATCH = 32  # the hardware table: "effective batch 32 'or the closest we could get'"
#: one lane of PCIe 3.0 per direction: 8 GT/s with 128b/130b encoding (PCI-SIG, PCI Express Base
#: Specification 3.0), 0.985 GB/s
PCIE3_LANE_GBS = 8 * 128 / 130 / 8


@dataclass(frozen=True)
class StatedLink:
    """A machine's GPU link where its source says it differs from the card's catalog figure but not by how
    much: the estimate assumes ``gbs``; ``slowest_gbs`` is the slowest link we take the source's words to
    mean (an assumption too, named where it is made), at which ``scripts/calibrate.py`` checks that a row's
    step does not hinge on the link before it fits a GEMM rate on it."""
    label: str
    gbs: float
    slowest_gbs: float
    reason: str

    def on(self, gpu: GpuSpec, slowest: bool = False) -> GpuSpec:
        """``gpu`` on this link: its host transfers (offload), and its collectives where the card has no GPU
        peer-to-peer (GeForce: NCCL's traffic crosses the same PCIe link, ``comm.link_for``); a card with
        peer-to-peer keeps its peer link (an NVLink bridge is not the host link)."""
        gbs = self.slowest_gbs if slowest else self.gbs
        peer = {} if gpu.peer_p2p else {"peer_link": self.label, "peer_link_gbs": gbs}
        return replace(gpu, host_link=self.label, host_link_gbs=gbs, **peer)


#: fsdp_qlora's dual-3090 "basement rig": "an older motherboard" with "slow PCI lanes", the document's
#: reason its FSDP rows ran slower than the 4090 machine's "full PCIe v4 x16 lanes" ("If you have two 3090s
#: and a non-workstation motherboard, you'll want NVLink. If you have two 4090s, you'll want a workstation
#: motherboard that can provide full x16 PCIe lanes to both GPUs"). Not stated further. ASSUMED PCIe 3.0
#: (the board predates the cards' PCIe 4.0) with a desktop CPU's 16 lanes split x8/x8 between the two cards
#: (the usual two-card layout of a non-workstation board); the slowest we take it to be is x4 (a second slot
#: wired to the chipset; a riser at x1 would be slower still).
SLOW_3090_LINK = StatedLink(
    "PCIe 3.0 x8 (assumed)", 8 * PCIE3_LANE_GBS, 4 * PCIE3_LANE_GBS,
    "fsdp_qlora's 3090 machine has 'an older motherboard and slow PCI lanes' (link not stated): the estimate "
    "assumes PCIe 3.0 x8 per card (two cards sharing a desktop CPU's 16 lanes), not the catalog's PCIe 4.0 x16")


@dataclass(frozen=True)
class SpeedRow:
    row_id: str
    source: str
    model: str
    gpu: str
    setup: TrainingSetup
    published_tokens_per_s: float  # all GPUs together
    derivation: str
    assumptions: list[str] = field(default_factory=list)
    libs: Libraries = FSDP_QLORA_LIBS  # the library versions the source ran
    link: StatedLink | None = None  # the machine's link where the source says it differs from the catalog's

    def card(self, slowest: bool = False) -> GpuSpec:
        """The catalog's card, on the machine's stated link (its slowest reading with ``slowest``)."""
        gpu = catalog.load_gpu(self.gpu)
        return self.link.on(gpu, slowest) if self.link else gpu


def published_tokens_per_s(row: dict) -> tuple[float, str] | None:
    """(tokens/s over all GPUs, how it follows from the row) or None when the row states no rate."""
    gpus = int(row["gpus"] or 1)
    stated = (row.get("tokens_per_s") or "").strip()
    if stated:
        return float(stated) * gpus, f"stated {stated} tokens/s per GPU x {gpus} GPUs"
    m = _TIME.search(row.get("notes", ""))
    seq = re.match(r"\s*([0-9]+)\s*$", row.get("seq_len") or "")
    if m and seq:
        seconds = float(m.group(1).replace(",", ""))
        return (FSDP_QLORA_SAMPLES * int(seq.group(1)) / seconds,
                f"{FSDP_QLORA_SAMPLES} samples x {seq.group(1)} tokens / {m.group(1)} s")
    return None


def map_speed_row(row: dict) -> SpeedRow | Unmapped:
    rid, src = row.get("id") or "?", row.get("source") or ""
    if problem := row_problem(row):
        return Unmapped(rid, src, problem)
    if "fsdp_qlora" not in src:
        reason = ("litgpt states runtimes per epochs of Alpaca-2k, not tokens: compared as QLoRA/LoRA ratios"
                  if "litgpt" in src else
                  "H100 96GB HBM2e (500 W) not in the catalog and sequence length not stated" if "torchtitan" in src
                  else "bert-large is an encoder, not a supported family" if "transformers" in src
                  else "the loss op alone, not a training step" if "cross-entropy" in src else "no tokens/s")
        return Unmapped(rid, src, reason)
    rate = published_tokens_per_s(row)
    if rate is None:
        return Unmapped(rid, src, "no time or tokens/s stated")
    got = fsdp_qlora_setup(row)
    if isinstance(got, Unmapped):
        return got
    model, gpu, setup, notes = got
    notes = [n for n in notes if "reserved" not in n]
    if "Time " in row["notes"] and "Time (s) column" not in row["notes"]:  # the hardware table
        accum = max(1, round(_EFFECTIVE_BATCH / (setup.batch * setup.gpus)))
        setup = setup.model_copy(update={"accum": accum})
        notes.append(f"accumulation {accum}: effective batch 32 'or the closest we could get'")
    if "power-limited" in row["gpu_type"]:
        notes.append("RTX 3090s power-limited to 280 W (datasheet peak assumes 350 W)")
    link = SLOW_3090_LINK if "older motherboard" in row["gpu_type"] else None
    if link:
        notes.append(link.reason)
    return SpeedRow(rid, src, model, gpu, setup, rate[0], rate[1], notes, link=link)


def estimated_tokens_per_s(r: SpeedRow) -> float | None:
    model, gpu = catalog.load_model(r.model), r.card()
    mem = estimate_memory(model, r.setup, gpu, libs=r.libs)
    t = estimate_time(model, r.setup, gpu, mem.terms["activations"], mem.terms["logits"],
                      offloaded_bytes=mem.offloaded_activations, libs=r.libs)
    return t.tokens_per_s


def display_model(model: str) -> str:
    """A mapping's model as a table shows it: a catalog name as it is, a config file by its name
    (``.../qwen2.5-0.5b.json``: ``qwen2.5-0.5b``)."""
    return Path(model).stem if model.endswith(".json") else model


def compare_speed(rows: list[dict], consumer: list | None = None) -> dict:
    """The published rows' tokens/s against the estimate's; ``consumer``: the mapped rows of
    ``data/consumer_speed.csv`` (``consumer.consumer_speed_rows``), compared the same way."""
    out, unmapped = [], []
    items = [(raw, map_speed_row(raw)) for raw in rows] + [(None, m) for m in consumer or []]
    for raw, m in items:
        if isinstance(m, Unmapped):
            if raw is None or any((raw.get(k) or "").strip() for k in ("tokens_per_s", "samples_per_s", "step_time_s")) \
                    or "Time" in raw.get("notes", "") or "runtime" in raw.get("notes", ""):
                unmapped.append({"id": m.row_id, "reason": m.reason})
            continue
        est = estimated_tokens_per_s(m)
        out.append({"id": m.row_id, "source": m.source, "model": raw["model"] if raw else display_model(m.model),
                    "technique": raw["technique"] if raw else m.setup.short(), "gpu": m.gpu,
                    "gpus": m.setup.gpus, "batch": m.setup.batch, "seq": m.setup.seq,
                    "published_tokens_per_s": round(m.published_tokens_per_s, 1), "derivation": m.derivation,
                    "estimated_tokens_per_s": None if est is None else round(est, 1),
                    "rel_error": None if est is None else round(est / m.published_tokens_per_s - 1, 4),
                    "assumptions": m.assumptions, "link": m.link.label if m.link else None,
                    "link_reason": m.link.reason if m.link else None})
    errs = [r["rel_error"] for r in out if r["rel_error"] is not None]
    return {"rows": out, "unmapped": unmapped,
            "median_abs_rel_error": round(statistics.median(abs(e) for e in errs), 4) if errs else None,
            "median_rel_error": round(statistics.median(errs), 4) if errs else None}


__all__ = ["SpeedRow", "compare_speed", "map_speed_row", "published_tokens_per_s"]


_RUNTIME = re.compile(r"Training runtime ([0-9]+(?:\.[0-9]+)?) min for ([0-9]+) epoch")


def slowdown_rows(rows: list[dict]) -> list[dict]:
    """litgpt's QLoRA and LoRA runs of one model on one GPU over the same number of Alpaca-2k epochs
    (the same tokens): the published QLoRA/LoRA runtime ratio is the LoRA/QLoRA tokens/s ratio,
    compared with the estimator's (each run at its own config's micro-batch, ``mapping._litgpt``)."""
    from reportgen.published.mapping import LITGPT_LIBS, Mapped, map_row

    runs: dict[tuple, dict] = {}
    for raw in rows:
        m = _RUNTIME.search(raw.get("notes", ""))
        mapped = map_row(raw) if "litgpt" in raw["source"] and m else None
        if not isinstance(mapped, Mapped) or mapped.setup.method.value == "full" or mapped.setup.gpus != 1:
            continue
        runs[(raw["model"], mapped.gpu, m.group(2), mapped.setup.method.value)] = {
            "raw": raw, "mapped": mapped, "minutes": m.group(1)}
    out = []
    for (name, gpu, epochs, method), q in sorted(runs.items()):
        lora = runs.get((name, gpu, epochs, "lora"))
        if method != "qlora" or lora is None:
            continue
        est = {}
        for key, run in (("lora", lora), ("qlora", q)):
            spec, card = run["mapped"].spec, catalog.load_gpu(gpu)
            mem = estimate_memory(spec, run["mapped"].setup, card, libs=LITGPT_LIBS)
            est[key] = estimate_time(spec, run["mapped"].setup, card, mem.terms["activations"],
                                     mem.terms["logits"], libs=LITGPT_LIBS).tokens_per_s
        published = float(q["minutes"]) / float(lora["minutes"])
        estimated = est["lora"] / est["qlora"] if est["lora"] and est["qlora"] else None
        out.append({"ids": [lora["raw"]["id"], q["raw"]["id"]], "model": q["raw"]["model"], "gpu": gpu,
                    "epochs": int(epochs), "batch": [lora["mapped"].setup.batch, q["mapped"].setup.batch],
                    "published": f"{q['minutes']} / {lora['minutes']} min", "published_ratio": round(published, 4),
                    "estimated_ratio": None if estimated is None else round(estimated, 4),
                    "rel_error": None if estimated is None else round(estimated / published - 1, 4),
                    "why_not": None if estimated is not None else f"{gpu}: no datasheet peak FLOP/s, no step time"})
    return out
