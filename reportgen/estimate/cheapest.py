"""The cheapest setup that fits: every single-GPU recipe at its largest fitting micro-batch, estimated
in full (``reportgen.estimate.estimate``), the highest tokens/s wins. Above the estimator: the
decision-tree walk (``advise/walk.py``) compares its answer with this search."""

from __future__ import annotations

from reportgen.estimate import estimate
from reportgen.estimate.liger import LIGER_MODEL_TYPES
from reportgen.estimate.search import default_precision, max_batch
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import TrainingSetup


def candidate_setups(gpu: GpuSpec, seq: int) -> list[TrainingSetup]:
    """The single-GPU recipes the cheapest-setup search compares: full fine-tuning (AdamW or
    8-bit AdamW), LoRA and QLoRA (rank 16, all linear layers), each with and without activation
    checkpointing, at micro-batch 1 (the batch is then raised as far as memory allows)."""
    prec = default_precision(gpu)
    out = []
    for method in ("full", "lora", "qlora"):
        optimizers = ("adamw", "adamw-8bit") if method == "full" else ("adamw",)
        for opt in optimizers:
            for ckpt in (False, True):
                out.append(TrainingSetup(method=method, precision=prec, optimizer=opt, grad_ckpt=ckpt, seq=seq,
                                         batch=1))
    return out


def cheapest_setup(model: ModelSpec, gpu: GpuSpec, seq: int, max_micro_batch: int = 64):
    """For a (model, GPU, sequence length): the setup that fits and trains at the lowest cost per
    token, i.e. the highest estimated tokens/s on one GPU. Each candidate recipe runs at its
    largest fitting micro-batch (capped at ``max_micro_batch``), with Liger's layer kernels where the
    model has them (``liger.py``: less memory and time, as the decision tree turns them on). Returns the
    winning ``Estimate``, or None when no single-GPU recipe fits (then offload or more GPUs are needed)."""
    best = None
    kernels = "liger" if model.model_type in LIGER_MODEL_TYPES else "eager"
    for cand in candidate_setups(gpu, seq):
        cand = cand.model_copy(update={"kernels": kernels}) if kernels == "liger" else cand
        b = max_batch(model, cand, gpu)
        if b is None:
            continue
        b = min(b, max_micro_batch)
        est = estimate(model, gpu, cand.model_copy(update={"batch": b}), reverse=False)
        tps = est.time.tokens_per_s or 0.0
        key = (tps, -est.memory.device_total)
        if best is None or key > best[0]:
            best = (key, est)
    return None if best is None else best[1]
