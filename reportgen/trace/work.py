"""Count what the traced step asks of the GPU and the host, op by op (``estimate/work.py``'s
``StepWork``, measured instead of listed).

Every ATen op the recorder sees in the measured step is classified the way PyTorch's own
``torch.utils._runtime_estimation`` (the roofline behind ``RuntimeEstimator``) classifies it, and
counted in its phase (forward; backward, with checkpointing's recomputation; optimizer):

* a **view** (``OpOverload.is_view``, ``_runtime_estimation._VIEW_OPS``) or an op that allocates
  without a kernel (``empty``, ``detach``, ...): host time only;
* a **GEMM** or **attention** kernel: FLOPs (SDPA's from ``torch.utils.flop_counter.flop_registry``,
  halved: the training step's attention is causal, which the registry does not discount); a GEMM
  below ``work.GEMM_RIDGE_FLOPS_PER_BYTE`` (``work.gemm_is_compute_bound``) counts its bytes instead;
* a gather (``embedding``, ``nll_loss_forward``): the rows or values it reads and what it writes;
* any other kernel: bytes read and written, ``_runtime_estimation.get_num_bytes`` of every input
  and output (a broadcast dimension counts once); an in-place op that returns nothing counts the
  arguments its schema marks as written.

Python-level calls: every ``nn.Module`` call (a global forward pre-hook, ``module_call``) and each
bitsandbytes ``dequantize_4bit`` (one per call of its Python ``MatMul4Bit`` forward or backward).

bitsandbytes' ``gemm_4bit`` is counted as the ops its fallback runs (dequantize, ``linear``), and
``linear`` as the GEMM it lowers to.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils._runtime_estimation import _VIEW_OPS, get_num_bytes
from torch.utils.flop_counter import flop_registry

from reportgen.estimate.work import StepWork, Work, gemm_is_compute_bound

aten = torch.ops.aten
#: ops that allocate or relabel without launching a kernel
NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach", "alias",
             "lift_fresh", "set_", "resize_", "record_stream", "_record_function_enter_new",
             "_record_function_exit", "slice", "_reshape_alias", "is_same_size", "_local_scalar_dense"}
#: custom ops whose inner ops the recorder sees too (``trace/kernels.py`` runs their fallback)
WRAPPERS = {"gemm_4bit"}
ATTENTION = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"}
VIEW_PACKETS = {str(p).split(".")[-1] for p in _VIEW_OPS}
#: ops that gather by index: they read one row or value of their table per index, not the table
GATHERS = {
    "embedding": lambda args, out: 2 * get_num_bytes(out) + get_num_bytes(args[1]),
    "nll_loss_forward": lambda args, out: args[1].numel() * (args[0].element_size() + args[1].element_size()),
}


def _tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x)]
    return []


def _bytes(ts: list) -> int:
    return sum(get_num_bytes(t) for t in ts if t.device.type == "meta")


def phase_of(phase: str, recomputing: bool) -> str | None:
    if recomputing or "backward" in phase:
        return "backward"
    if phase == "forward":
        return "forward"
    if phase in ("optimizer-step", "zero-grad"):
        return "optimizer"
    return None


def _gemm_dims(name: str, args) -> tuple[int, int, int] | None:
    if name in ("mm", "addmm", "bmm", "baddbmm", "linear"):
        a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
        if name == "linear":
            return a.numel() // a.shape[-1], a.shape[-1], b.shape[0]
        if a.dim() == 3:
            return a.shape[0] * a.shape[1], a.shape[2], b.shape[-1]
        return a.shape[0], a.shape[1], b.shape[1]
    return None


class WorkCounter:
    """``op(func, args, kwargs, out, phase, recomputing)`` after every op of the measured step."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, float]] = {p: defaultdict(float) for p in ("forward", "backward", "optimizer")}
        self.recompute_kernels = 0

    def op(self, func, args, kwargs, out, phase: str, recomputing: bool) -> None:
        where = phase_of(phase, recomputing)
        if where is None:
            return
        c = self.counts[where]
        name = func.overloadpacket.__name__
        if name in WRAPPERS:
            c["views"] += 1
            return
        if getattr(func, "is_view", False) or name in VIEW_PACKETS or name in NO_KERNEL or name == "_unsafe_view":
            c["views"] += 1
            return
        c["kernels"] += 1
        if recomputing:
            self.recompute_kernels += 1
        if name == "dequantize_4bit":  # one call of bitsandbytes' Python MatMul4Bit forward or backward
            c["calls"] += 1
        if name in ATTENTION:
            flops = flop_registry[func.overloadpacket](*args, **kwargs, out_val=out) if func.overloadpacket in \
                flop_registry else 0
            c["attention_flops"] += flops * 0.5  # causal: the kernels skip the masked half of the square
            return
        dims = _gemm_dims(name, args)
        if dims is not None:
            m, k, n = dims
            if gemm_is_compute_bound(m, k, n, _tensors(out)[0].element_size()):
                c["matmul_flops"] += 2.0 * m * k * n
                return
        if name in GATHERS:  # reads one row (value) per index, not the whole table
            c["bytes"] += GATHERS[name](args, out)
            return
        written = _tensors(out)
        if not written:  # in-place ops that return nothing (``_foreach_*_``, ``_fused_adamw_``): their mutated inputs
            written = [t for a, v in zip(func._schema.arguments, args)
                       if a.alias_info is not None and a.alias_info.is_write for t in _tensors(v)]
        c["bytes"] += _bytes(_tensors((args, kwargs))) + _bytes(written)

    def module_call(self, phase: str, recomputing: bool) -> None:
        """An ``nn.Module`` call (a global forward pre-hook): a Python-level call."""
        where = phase_of(phase, recomputing)
        if where is not None:
            self.counts[where]["calls"] += 1

    def step_work(self, accum: int, autocast: bool) -> StepWork:
        """Per micro-batch, as ``work.step_work`` states it; ``autocast``: the step's forward runs under
        ``torch.autocast`` (the host's extra per kernel, ``time.host_seconds``)."""
        per = {p: Work.from_dict(v) for p, v in self.counts.items()}
        return StepWork(forward=per["forward"] * (1 / accum), backward=per["backward"] * (1 / accum),
                        optimizer=per["optimizer"], accum=accum, autocast=autocast,
                        recompute_kernels=self.recompute_kernels / accum)
