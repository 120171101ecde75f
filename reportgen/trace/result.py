"""One traced case: run the step on meta, replay it through the allocator simulation, and report it
with the same fields as ``reportgen estimate --format json``, labelled ``kind: "traced"``.

``memory`` holds the estimator's term names, filled with the bytes alive at the traced peak by
category (``replay.py``): weights (with the model's buffers), quant_constants, lora_adapters,
gradients, optimizer, autocast_copies, activations (with the token ids), logits, transient,
cublas_workspace; then the three totals:

* ``peak_allocated``: the simulated ``torch.cuda.max_memory_allocated`` of the measured step (block
  sizes, so 512-byte rounding and unsplit blocks count, as on CUDA);
* ``peak_reserved``: the simulated ``torch.cuda.max_memory_reserved``;
* ``cache_released``: what the replay limited to the card (below) gave back, 0 when it was not needed;
* ``device_total``: ``peak_reserved`` plus the CUDA context, which no trace can see: the
  estimator's ``CUDA_CONTEXT_BYTES``. The cuBLAS workspaces are the estimator's constants too,
  injected as allocations (``kernels.cublas_workspace``). Both are named in ``notes``.

``fits``: ``device_total`` within the card. When the unconstrained replay does not fit, the step is
replayed again with the allocator limited to the card (minus the context), as a run on that card
would be: it fits if the allocator gets by after releasing its cached segments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reportgen.estimate import constants as K
from reportgen.fingerprint import estimator_hash, trace_hash
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import TrainingSetup

GIB = 2**30
TERMS = ("weights", "quant_constants", "lora_adapters", "gradients", "optimizer", "optimizer_paged",
         "autocast_copies", "activations", "kept_outputs", "logits", "transient", "fsdp_unsharded", "cublas_workspace",
         "cuda_context")
#: categories of the trace folded into the estimator's terms
FOLDED = {"buffers": "weights", "inputs": "activations"}


@dataclass(frozen=True)
class Trace:
    model: str
    gpu: str
    setup: TrainingSetup
    model_type: str
    known_family: bool
    params_total: int
    params_trainable: int
    replay: object  # replay.Replay
    device_total: int
    fits: bool
    emulations: list[dict]
    sdpa_backends: list[str]
    environment: dict
    notes: list[str] = field(default_factory=list)
    capacity: int = 0
    context_limit: int | None = None
    cache_released: int = 0  # reserved the limited replay gave back to fit the card (0: not limited)
    time: dict | None = None  # the time model priced on the traced step's inventory (time.estimate_time)

    @property
    def terms(self) -> dict[str, int]:
        terms = dict.fromkeys(TERMS, 0)
        for cat, nbytes in self.replay.at_peak.items():
            terms[FOLDED.get(cat, cat)] += nbytes
        terms["cuda_context"] = K.CUDA_CONTEXT_BYTES
        return terms

    def as_dict(self) -> dict:
        r = self.replay
        return {
            "kind": "traced",
            "model": self.model,
            "gpu": self.gpu,
            "setup": self.setup.model_dump(mode="json"),
            "model_type": self.model_type,
            "analytic_family": self.known_family,
            "params": {"total": self.params_total, "trainable": self.params_trainable},
            "memory": {**self.terms, "peak_allocated": r.peak_allocated, "peak_reserved": r.peak_reserved,
                       "device_total": self.device_total, "host_ram": 0, "cache_released": self.cache_released},
            "peak_phase": r.peak_phase,
            "peak_op": r.peak_op,
            "timeline": r.phases,
            "at_peak": r.at_peak,
            "activations_by_op": r.activations_by_op,
            "allocator": {"segments_at_end": r.segments, "alloc_retries": r.alloc_retries,
                          "live_bytes_at_peak": r.peak_live_bytes,
                          "rounding_at_peak": r.peak_allocated - r.peak_live_bytes if r.oom is None else None},
            "time": self.time,
            "fits": self.fits,
            # a traced figure has no error band until traces are compared with measurements
            "verdict": "fits" if self.fits else "does not fit",
            "band": None,
            "capacity": self.capacity,
            "max_batch": None,
            "max_seq": None,
            "context_limit": self.context_limit,
            "emulations": self.emulations,
            "sdpa_backends": self.sdpa_backends,
            "environment": self.environment,
            "notes": self.notes,
            "trace_hash": trace_hash(),
            "estimator_hash": estimator_hash(),  # the constants the trace adds (context, cuBLAS)
        }


def _environment() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    env = {}
    for pkg in ("torch", "transformers", "peft", "bitsandbytes"):
        try:
            env[pkg] = version(pkg)
        except PackageNotFoundError:
            env[pkg] = None
    return env


def trace_case(spec: ModelSpec, gpu: GpuSpec, setup: TrainingSetup, warmup: int = 1) -> Trace:
    """Trace ``spec`` with ``setup`` and report it for ``gpu``."""
    from reportgen.estimate.memory import cublas_workspace_bytes
    from reportgen.trace.replay import replay
    from reportgen.trace.spec import is_known_family
    from reportgen.trace.step import run_trace

    per_handle = cublas_workspace_bytes(gpu) // K.CUBLAS_HANDLES
    run = run_trace(spec, setup, per_handle, K.CUBLAS_HANDLES, warmup=warmup)
    r = replay(run)
    notes = list(run.notes)
    device_total = r.peak_reserved + K.CUDA_CONTEXT_BYTES
    fits = device_total <= gpu.memory_bytes
    released = 0
    if not fits:
        limited = replay(run, limit_bytes=gpu.memory_bytes - K.CUDA_CONTEXT_BYTES)
        if limited.oom is None:
            released = max(0, r.peak_reserved - limited.peak_reserved)
            fits, r = True, limited
            device_total = r.peak_reserved + K.CUDA_CONTEXT_BYTES
            notes.append(f"fits only because the allocator releases its cached segments when {gpu.key} is full "
                         f"({r.alloc_retries} cudaMalloc retries in the replay)")
        else:
            notes.append(f"out of memory on {gpu.key} in the allocator replay: a request of "
                         f"{limited.oom.request / GIB:.2f} GiB with {limited.oom.allocated / GIB:.2f} GiB allocated "
                         f"and {limited.oom.reserved / GIB:.2f} GiB reserved")
    run.applied.use("cuda_context")
    notes.append(f"traced, not measured: the harness's step on the meta device with the emulations listed; "
                 f"cuBLAS workspaces ({K.CUBLAS_HANDLES} x {per_handle / 2**20:.0f} MiB) and the CUDA context "
                 f"({K.CUDA_CONTEXT_BYTES / 2**20:.0f} MiB) are the estimator's constants (estimate/constants.py)")
    from reportgen.estimate.time import estimate_time

    timed = estimate_time(spec, setup, gpu, work=run.work)
    known = is_known_family(spec)
    if not known:
        notes.append(f"model_type {spec.model_type!r} has no analytic formulas: this traced answer is the only one")
    return Trace(model=spec.name, gpu=gpu.key, setup=setup, model_type=spec.model_type, known_family=known,
                 params_total=run.params_total, params_trainable=run.params_trainable, replay=r,
                 device_total=device_total, fits=fits, emulations=run.applied.as_list(),
                 sdpa_backends=run.sdpa_backends, environment=_environment(), notes=notes,
                 capacity=gpu.memory_bytes, context_limit=spec.max_position_embeddings or None,
                 cache_released=released, time=timed.as_dict())
