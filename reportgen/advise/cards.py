"""How many of these cards do I need? For a model, a card and a method, the smallest number of GPUs
on which some data-parallel strategy fits, the strategy that is fastest there, and its estimated
speed.

The recipe is the tree's starting point for each method (bf16 mixed precision, AdamW, activation
checkpointing, micro-batch 1, QLoRA NF4 r16 on every linear), so the answer is a floor: a
sharding that fits at micro-batch 1. Counts are powers of two up to ``MAX_GPUS``; past the card's
NVLink domain the collectives go over the network (``comm.py``). A strategy fits when the
estimate's verdict is "fits" (its whole error band inside the card). Offload is tried last, at
the same count, only where nothing fits without it.

``reportgen cards`` writes the answers for every catalog model and GPU to ``data/cards_needed.json``;
the GPU pages render that file (computing never renders).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from reportgen.estimate import estimate
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import TrainingSetup

COUNTS = (1, 2, 4, 8, 16, 32, 64)
MAX_GPUS = COUNTS[-1]
#: tried at each count > 1, lightest first; the fastest that fits wins
STRATEGIES = ("ddp", "zero1", "zero2", "shard-grad-op", "fsdp", "zero3", "hybrid-shard")
METHODS = ("full", "lora", "qlora")


@dataclass(frozen=True)
class Fit:
    gpus: int
    sharding: str
    offload: str
    tokens_per_s: float  # over all GPUs
    device_total_gib: float
    host_ram_gib: float
    setup: str  # the setup's short label


@dataclass(frozen=True)
class CardsNeeded:
    method: str
    fit: Fit | None  # without offload; None: nothing fits on MAX_GPUS
    offload_fit: Fit | None  # with FSDP/ZeRO-3 parameter offload, only when it needs fewer cards

    def as_dict(self) -> dict:
        return asdict(self)


def base_setup(method: str, seq: int) -> TrainingSetup:
    return TrainingSetup(method=method, precision="bf16-mixed", grad_ckpt=True, batch=1, seq=seq,
                         lora_targets="all-linear")


def _candidates(method: str, seq: int, n: int, offload: str):
    base = base_setup(method, seq).model_copy(update={"offload": offload})
    if n == 1:
        yield base
        return
    for s in STRATEGIES:
        if s == "hybrid-shard" and n <= 8:
            continue  # the same as fsdp inside one node
        if offload == "params" and s in ("ddp", "zero1", "zero2"):
            continue  # parameter offload needs parameter sharding
        yield base.model_copy(update={"gpus": n, "sharding": s})


def smallest_fit(model: ModelSpec, gpu: GpuSpec, method: str, seq: int, offload: str,
                 counts=COUNTS) -> Fit | None:
    """The smallest count whose fastest fitting strategy (verdict "fits") exists, with that strategy."""
    for n in counts:
        fitting = []
        for setup in _candidates(method, seq, n, offload):
            e = estimate(model, gpu, setup, reverse=False)
            if e.verdict == "fits" and e.time.tokens_per_s:
                fitting.append((e.time.tokens_per_s, setup, e))
        if fitting:
            tps, setup, e = max(fitting, key=lambda t: t[0])
            return Fit(n, setup.sharding.value, offload, round(tps, 1), round(e.memory.device_total / 2**30, 2),
                       round(e.memory.host_ram / 2**30, 1), setup.short())
    return None


def cards_needed(model: ModelSpec, gpu: GpuSpec, method: str, seq: int = 2048) -> CardsNeeded:
    """The smallest count of ``gpu`` that fits ``method`` at micro-batch 1 without offload and the
    fastest strategy there; and, where parameter offload needs fewer cards, that answer too."""
    fit = smallest_fit(model, gpu, method, seq, "none")
    fewer = tuple(n for n in COUNTS if fit is None or n < fit.gpus)
    return CardsNeeded(method, fit, smallest_fit(model, gpu, method, seq, "params", fewer) if fewer else None)


def all_cards_needed(seq: int = 2048) -> dict:
    """``{gpu: {model: {method: CardsNeeded.as_dict()}}}`` for every catalog GPU and model."""
    from reportgen import catalog

    out: dict = {"seq": seq, "counts": list(COUNTS), "gpus": {}}
    models = {name: catalog.load_model(name) for name in catalog.model_names()}
    for key in catalog.gpu_names():
        gpu = catalog.load_gpu(key)
        out["gpus"][key] = {name: {m: cards_needed(spec, gpu, m, seq).as_dict() for m in METHODS}
                            for name, spec in models.items()}
    return out
