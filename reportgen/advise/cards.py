"""How many of these cards do I need? For a model, a card and a method, the smallest number of GPUs
on which some data-parallel strategy fits, the strategy that is fastest there, and its estimated
speed.

The recipe is the one the decision tree's Step 1 checks (``tree.min_activations``: activation
checkpointing, fused cross-entropy, micro-batch 1, Liger's layer kernels for Llama, Mistral, Qwen2 and
Qwen3 models, at the card's default mixed precision, AdamW;
LoRA and QLoRA rank 16 on every linear), and for QLoRA also the tree's next steps on one card,
double quantization and then paged 8-bit AdamW. So "one card" here is exactly where the tree's walk
(``reportgen advise``, the guides) finds the method fitting on one card, and the answer is a
floor: a sharding that fits at micro-batch 1. Counts are powers of two up to ``MAX_GPUS``; past the
card's NVLink domain the collectives go over the network (``comm.py``), and past one machine
(``NODE_GPUS``) the GPU pages call the count impractical for a single user. A strategy fits when
the estimate's verdict is "fits" (``estimate/verdict.py``: its whole error band inside the card).
Offload is tried last, at the same count, only where nothing fits without it.

``reportgen cards`` writes the answers for every catalog model and GPU to ``data/cards_needed.json``;
the GPU pages render that file (computing never renders).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from reportgen.advise import tree as T
from reportgen.estimate import estimate
from reportgen.estimate.search import default_precision
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import TrainingSetup

COUNTS = (1, 2, 4, 8, 16, 32, 64)
MAX_GPUS = COUNTS[-1]
#: GPUs in one machine: more cards means several machines over a network
NODE_GPUS = 8
#: tried at each count > 1, lightest first; the fastest that fits wins
STRATEGIES = ("ddp", "zero1", "zero2", "shard-grad-op", "fsdp", "zero3", "hybrid-shard")
METHODS = ("full", "lora", "qlora")


@dataclass(frozen=True)
class Fit:
    gpus: int
    sharding: str
    offload: str
    tokens_per_s: float | None  # over all GPUs (None: no peak FLOP/s in the catalog)
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


def method_setups(method: str, seq: int, precision: str = "bf16-mixed", model_type: str = "") -> list[TrainingSetup]:
    """The setups the decision tree's Step 1 checks for ``method`` on one card, in its order: the
    method with ``tree.min_activations`` (checkpointing, fused loss, micro-batch 1, Liger's kernels for
    the model types that have them); for QLoRA then with double quantization, then also with paged
    8-bit AdamW (the tree's ``double_quant`` and ``paged_8bit`` steps)."""
    base = TrainingSetup(method=method, precision=precision, seq=seq, **T.min_activations(model_type))
    if method != "qlora":
        return [base]
    dq = base.model_copy(update={"double_quant": True})
    return [base, dq, dq.model_copy(update={"optimizer": "paged-adamw-8bit"})]


def base_setup(method: str, seq: int, precision: str = "bf16-mixed") -> TrainingSetup:
    """The first of ``method_setups``: the method as the tree's Step 1 checks it first."""
    return method_setups(method, seq, precision)[0]


def _candidates(method: str, seq: int, n: int, offload: str, precision: str = "bf16-mixed", model_type: str = ""):
    for base in method_setups(method, seq, precision, model_type):
        base = base.model_copy(update={"offload": offload})
        if n == 1:
            yield base
            continue
        for s in STRATEGIES:
            if s == "hybrid-shard" and n <= NODE_GPUS:
                continue  # the same as fsdp inside one node
            if offload == "params" and s in ("ddp", "zero1", "zero2"):
                continue  # parameter offload needs parameter sharding
            yield base.model_copy(update={"gpus": n, "sharding": s})


def smallest_fit(model: ModelSpec, gpu: GpuSpec, method: str, seq: int, offload: str,
                 counts=COUNTS) -> Fit | None:
    """The smallest count whose fastest fitting strategy (verdict "fits") exists, with that strategy."""
    precision = default_precision(gpu)
    for n in counts:
        fitting = []
        for setup in _candidates(method, seq, n, offload, precision, model.model_type):
            e = estimate(model, gpu, setup, reverse=False)
            if e.fits:
                fitting.append((e.time.tokens_per_s or 0.0, setup, e))
        if fitting:
            _, setup, e = max(fitting, key=lambda t: t[0])
            tps = e.time.tokens_per_s
            return Fit(n, setup.sharding.value, offload, None if tps is None else round(tps, 1),
                       round(e.memory.device_total / 2**30, 2),
                       round(e.memory.host_ram / 2**30, 1), setup.short())
    return None


def cards_needed(model: ModelSpec, gpu: GpuSpec, method: str, seq: int = 2048) -> CardsNeeded:
    """The smallest count of ``gpu`` that fits ``method`` at micro-batch 1 without offload and the
    fastest strategy there; and, where parameter offload needs fewer cards, that answer too."""
    fit = smallest_fit(model, gpu, method, seq, "none")
    fewer = tuple(n for n in COUNTS if fit is None or n < fit.gpus)
    return CardsNeeded(method, fit, smallest_fit(model, gpu, method, seq, "params", fewer) if fewer else None)


#: this module's code and the tree's, whose recipe it applies
CODE = ("advise/cards.py", "advise/tree.py")


def cards_inputs_hash(seq: int) -> str:
    """What the whole table depends on, hashed: the estimator's code, the code of this module and of
    the tree, every catalog model's config and GPU entry, and the sequence length."""
    from reportgen.fingerprint import catalog_entries, estimator_hash, source_hash
    from reportgen.results import short_hash

    return short_hash({"estimator": estimator_hash(), "code": source_hash(CODE), "seq": seq, **catalog_entries()}, 16)


def gpu_cards_needed(key: str, seq: int = 2048) -> dict:
    """``{model: {method: CardsNeeded.as_dict()}}`` for one catalog GPU and every catalog model."""
    from reportgen import catalog

    gpu = catalog.load_gpu(key)
    return {name: {m: cards_needed(catalog.load_model(name), gpu, m, seq).as_dict() for m in METHODS}
            for name in catalog.model_names()}


def all_cards_needed(seq: int = 2048) -> dict:
    """``{gpu: {model: {method: CardsNeeded.as_dict()}}}`` for every catalog GPU and model, with the
    hash of the estimator code that computed them and ``inputs_hash`` (``cards_inputs_hash``: the GPU
    pages warn when it is not this checkout's)."""
    from reportgen import catalog
    from reportgen.fingerprint import estimator_hash

    out: dict = {"seq": seq, "counts": list(COUNTS), "estimator_hash": estimator_hash(),
                 "inputs_hash": cards_inputs_hash(seq), "gpus": {}}
    for key in catalog.gpu_names():
        out["gpus"][key] = gpu_cards_needed(key, seq)
    return out
