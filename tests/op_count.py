"""Counting the ATen ops a step dispatches on the CPU, classified as the tracer classifies them (``trace/work.py``:
views and allocations no kernel; bytes read and written, ``torch.utils._runtime_estimation.get_num_bytes``).
Shared by the DoRA and the checkpoint-recompute checks of the time inventory."""

from __future__ import annotations


def op_counter(gemm_flops: bool = False):
    """A ``TorchDispatchMode`` with ``kernels`` and ``bytes``; ``gemm_flops``: a compute-bound GEMM
    (``work.gemm_is_compute_bound``) counts as a kernel without bytes, as ``work.gemm`` prices it."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._runtime_estimation import get_num_bytes

    from reportgen.estimate import work
    from reportgen.trace.work import NO_KERNEL, VIEW_PACKETS, _gemm_dims, _tensors

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.kernels, self.bytes = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if getattr(func, "is_view", False) or name in VIEW_PACKETS or name in NO_KERNEL or name == "_unsafe_view":
                return out
            self.kernels += 1
            dims = _gemm_dims(name, args) if gemm_flops else None
            if dims is None or not work.gemm_is_compute_bound(*dims, _tensors(out)[0].element_size()):
                self.bytes += sum(get_num_bytes(x) for x in _tensors((args, kwargs)) + _tensors(out))
            return out

    return Count
