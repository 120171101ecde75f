"""Record every allocation and free of one training step run on the ``meta`` device.

Meta tensors have shapes, dtypes and storages with a size, but no memory. A
``TorchDispatchMode`` sees every ATen op below autograd (forward, the autograd engine's backward
ops, the optimizer's kernels) with its outputs; an output whose storage is new is an allocation
of ``storage.nbytes()`` bytes, and a weak reference to the storage reports its free when the
last tensor using it dies (PyTorch keeps a storage's Python object alive as long as the storage,
which ``torch.distributed._tools.mem_tracker`` relies on the same way). Views and in-place ops
return storages already known and allocate nothing. Tensors on other devices (the CPU scalars
some optimizers keep) are not GPU memory and are ignored.

Each storage records its size, the op that made it, the phase of the step (set by
``train_step``'s ``mark`` and by gradient hooks on the decoder layers' outputs), and a category
when one is known at creation or tagged later (weights, adapters, gradients, optimizer states,
autocast's weight copies). ``replay.py`` turns the event list into the allocator's figures.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ALLOC, FREE, MARK, ALIAS = 0, 1, 2, 3
DEVICE = "meta"


@dataclass(slots=True)
class Storage:
    id: int
    nbytes: int
    op: str
    phase: str
    step: int
    micro: int
    shape: tuple
    dtype: str
    alloc_at: int
    free_at: int | None = None
    category: str | None = None
    recomputed: bool = False


_NAMES: dict = {}


def _op_name(func) -> str:
    name = _NAMES.get(func)
    if name is None:
        name = str(func)
        name = _NAMES[func] = name[: -len(".default")] if name.endswith(".default") else name
    return name


class Recorder(TorchDispatchMode):
    """``with recorder:`` records; ``kernels`` maps an op to a handler that replaces its meta
    kernel by an emulation of the CUDA kernel's allocations (``kernels.py``)."""

    def __init__(self, kernels: dict | None = None):
        super().__init__()
        self.kernels = kernels or {}
        self.events: list[tuple[int, object]] = []
        self.storages: list[Storage] = []
        self._live: dict[int, int] = {}  # storage key -> Storage.id
        self._refs: dict[int, weakref.ref] = {}
        self.phase = "build"
        self.step = 0
        self.micro = 0
        self.recomputing = False
        self.op_hooks: list = []  # callables (func, phase) run before each op (cuBLAS workspace)
        self._accumulation: tuple[int, int] | None = None  # (sum's storage id, first addend's key)
        self.inplace_accumulations = 0
        self.replaced: dict[int, int] = {}  # storage id -> the storage whose memory it took over
        #: ``trace/work.py``'s ``WorkCounter``, told of every op of step ``count_step`` (None: no count)
        self.counter = None
        self.count_step = -1

    # ----- events ------------------------------------------------------------------------------
    def mark(self, label: str) -> None:
        """A phase change or an allocator action (``empty_cache``, ``reset_peak``) in the stream."""
        self.events.append((MARK, label))

    def set_phase(self, phase: str) -> None:
        if phase != self.phase:
            self.phase = phase
            self.recomputing = False
            self.mark("phase:" + phase)

    def track(self, tensor, op: str, category: str | None = None) -> Storage | None:
        """Register the storage of ``tensor`` if it is new (an allocation); return its record."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != DEVICE:
            return None
        st = tensor.untyped_storage()
        key = st._cdata
        sid = self._live.get(key)
        if sid is not None:
            rec = self.storages[sid]
            if category and rec.category is None:
                rec.category = category
            return rec
        nbytes = st.nbytes()
        if nbytes == 0:
            return None
        sid = len(self.storages)
        rec = Storage(id=sid, nbytes=nbytes, op=op, phase=self.phase, step=self.step, micro=self.micro,
                      shape=tuple(tensor.shape), dtype=str(tensor.dtype).replace("torch.", ""),
                      alloc_at=len(self.events), category=category, recomputed=self.recomputing)
        self.storages.append(rec)
        self._live[key] = sid
        self.events.append((ALLOC, sid))
        self._refs[key] = weakref.ref(st, lambda _ref, key=key: self._freed(key))
        return rec

    def inject(self, nbytes: int, op: str, category: str) -> Storage:
        """An allocation no tensor shows (a library's workspace); it lives to the end."""
        rec = Storage(id=len(self.storages), nbytes=nbytes, op=op, phase=self.phase, step=self.step,
                      micro=self.micro, shape=(nbytes,), dtype="uint8", alloc_at=len(self.events),
                      category=category)
        self.storages.append(rec)
        self.events.append((ALLOC, rec.id))
        return rec

    def tag(self, tensor, category: str) -> None:
        """Set the category of ``tensor``'s storage (tracking it first if it predates the mode)."""
        rec = self.track(tensor, "existing", category)
        sid = None if rec is None else rec.id
        while sid is not None:  # an in-place sum's earlier addends were the same memory
            self.storages[sid].category = category
            sid = self.replaced.get(sid)

    def _freed(self, key: int) -> None:
        sid = self._live.pop(key, None)
        self._refs.pop(key, None)
        if sid is not None and self._accumulation is not None and self._accumulation[1] == key:
            self._in_place(sid)
        elif sid is not None:
            self.storages[sid].free_at = len(self.events)
            self.events.append((FREE, sid))

    def _in_place(self, addend: int) -> None:
        """The autograd engine summed two gradients out of place and dropped the first at once: on
        CUDA it adds in place (``accumulation_candidate``). The sum takes over the addend's memory."""
        total, _ = self._accumulation
        self._accumulation = None
        at = self.storages[total].alloc_at
        self.events[at] = (ALIAS, (total, addend))
        self.storages[addend].free_at = at
        self.replaced[total] = addend
        self.inplace_accumulations += 1

    def accumulation_candidate(self, func, args, kwargs, out) -> None:
        """Gradient accumulation in the autograd engine (``torch/csrc/autograd/input_buffer.cpp``
        ``accumulate``): two gradients for one tensor are summed ``old.add_(new)`` in place when the
        buffer holds the only reference to a dense ``old`` (``can_accumulate_inplace``), else
        ``old + new``. Meta tensors count as tensor subclasses (``ATen/TensorSubclassLikeUtils.h``
        ``kTensorSubclassLike`` includes ``MetaBit``), so on meta the sum is always out of place. An
        out-of-place ``add`` in the backward whose first operand is freed before the next op (the
        buffer held its only reference) is replayed as CUDA's in-place sum."""
        if func is not torch.ops.aten.add.Tensor or kwargs.get("alpha", 1) != 1 or self.recomputing \
                or "backward" not in self.phase or torch.is_grad_enabled():
            return
        a, b = args[0], args[1]
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and isinstance(out, torch.Tensor)):
            return
        if a.shape != out.shape or a.dtype != out.dtype or not a.is_contiguous() or b.is_sparse:
            return
        sid = self._live.get(out.untyped_storage()._cdata)
        if sid is not None and self.storages[sid].alloc_at == len(self.events) - 1:
            self._accumulation = (sid, a.untyped_storage()._cdata)

    # ----- the dispatch mode -------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._accumulation = None
        for hook in self.op_hooks:
            hook(func, self)
        handler = self.kernels.get(func)
        out = handler(self, func, args, kwargs) if handler is not None else self.run(func, args, kwargs)
        if self.counter is not None and self.step == self.count_step:
            self.counter.op(func, args, kwargs, out, self.phase, self.recomputing)
        return out

    def run(self, func, args, kwargs):
        """Run ``func`` on meta and record the storages its outputs bring."""
        out = func(*args, **kwargs)
        inputs = None
        for t in _tensors(out):
            if t.device.type != DEVICE:
                continue
            key = t.untyped_storage()._cdata
            if key in self._live:
                continue
            if inputs is None:  # an unknown storage: new, unless an input (not recorded yet) had it
                inputs = {x.untyped_storage()._cdata for x in _tensors((args, kwargs)) if x.device.type == DEVICE}
            if key not in inputs:
                self.track(t, _op_name(func))
        self.accumulation_candidate(func, args, kwargs, out)
        return out


def _tensors(obj) -> list:
    """The tensors in nested tuples, lists and dicts (a lighter ``tree_flatten`` for op arguments)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        out = []
        for x in obj:
            if isinstance(x, torch.Tensor):
                out.append(x)
            elif isinstance(x, (tuple, list, dict)):
                out += _tensors(x)
        return out
    if isinstance(obj, dict):
        return _tensors(list(obj.values()))
    return []
