"""``reportgen trace`` of recipes ``trainer`` and ``trl-sft``: the tracer's step (``step.py``) with the
real trainer in it (``measure/sft.py``: the trainer's own model preparation, optimizer and
``compute_loss``), plus what TRL's fused LM head needs on the meta device.

Kept apart from the loop's tracer: ``fingerprint.trace_hash(recipe)`` covers this module and
``measure/sft.py`` only for these recipes, so editing them leaves every stored trace of the plain
loop current. ``recipe_trace(setup)`` is entered around ``trace_case`` and the result's ``as_dict`` by
their callers (``cli.py``, ``runner.py``, the tests); it hands ``run_trace`` the trainer through the
three functions it imports when it runs (``measure.build.build``, ``measure.optimizers.make_optimizer``,
``measure.step.train_step``); ``recipe_dict`` gives the result this recipe's ``trace_hash`` and TRL's
version.

Emulations (what CUDA does that meta cannot, each as the CUDA path behaves):

* ``trl_compact_tiles``: TRL picks the compact path and its Triton fold kernels on CUDA
  (``trl/kernels/chunked_logprob.py`` ``_use_triton``); on meta it would take the torch fallback,
  which materialises fp32 copies of every tile. Here the CUDA path runs: ``hidden_states[mask]``,
  the tile GEMMs into ``mm_buf``, and the fold kernels as no-ops (Triton writes its per-row
  statistics in place, allocating nothing); ``_addmm_fp32`` accumulates in place as CUDA's
  ``torch.addmm(out_dtype=float32, out=acc)`` does, without fp32 copies of its inputs.
* ``data_dependent_scalars``: the labels mask's ``nonzero`` (torch's
  ``meta_nonzero_assume_all_nonzero``: every label valid, as with the harness's random tokens and
  labels = ids) and ``.item()`` of the metrics and of transformers' mask
  check (a non-zero count, an all-ones mask) on meta tensors.
"""

from __future__ import annotations

import contextlib

from reportgen.setup import Recipe, TrainingSetup
from reportgen.trace.emulations import EMULATIONS, Emulation

#: this module's emulations, listed with the tracer's so a trace names them like the others
for _e in (Emulation("trl_compact_tiles", "TRL's fused LM head takes its CUDA path on meta: the compact "
                     "hidden_states[mask], the tile GEMMs into mm_buf, the Triton fold kernels as no-ops (they "
                     "write in place) and the fp32 gradient GEMMs accumulated in place (addmm out_dtype)",
                     "trl/kernels/chunked_logprob.py _use_triton, _forward_kernel, _backward_kernel, _addmm_fp32"),
           Emulation("data_dependent_scalars", "nonzero of the labels mask (every label valid, as the harness's "
                     "random tokens) and .item() of the trainer's metrics and transformers' mask check on meta",
                     "trl/trainer/sft_trainer.py compute_loss; transformers/masking_utils.py")):
    EMULATIONS.setdefault(_e.name, _e)


def _dispatch_mode(host_reads=None):
    """A data-dependent scalar of a meta tensor (``.item()``, ``_local_scalar_dense``) is 1 (True for a bool);
    with ``host_reads`` (the trace's ``use``, GRPO's scoring on the host), a copy of a meta tensor to the CPU is
    zeros there, reported as the ``host_reads_of_meta`` emulation."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class DataDependent(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            t = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if t is not None and t.device.type == "meta":
                if func is torch.ops.aten._local_scalar_dense.default:
                    return True if t.dtype == torch.bool else 1 if not t.is_floating_point() else 1.0
                device = kwargs.get("device")
                if host_reads is not None and func is torch.ops.aten._to_copy.default and device is not None \
                        and torch.device(device).type == "cpu":
                    host_reads("host_reads_of_meta")
                    return torch.zeros(t.shape, dtype=kwargs.get("dtype") or t.dtype, device="cpu")
            return func(*args, **kwargs)

    return DataDependent()


@contextlib.contextmanager
def _trl_on_meta(use):
    """The CUDA path of TRL's fused LM head on meta (module docstring: ``trl_compact_tiles``)."""
    import types

    import torch
    import trl.kernels.chunked_logprob as CL
    import trl.trainer.utils as TU


    class NoOpKernel:  # ``kernel[grid](...)``: Triton writes in place, allocating nothing
        def __getitem__(self, grid):
            use("trl_compact_tiles")
            return lambda *a, **k: None

    def addmm_fp32(acc, a, b):
        acc.add_(torch.empty_like(acc)) if acc.device.type == "meta" else saved["addmm"](acc, a, b)

    saved = {"tu": TU._use_triton, "cl": CL._use_triton, "fwd": getattr(CL, "_forward_kernel", None),
             "bwd": getattr(CL, "_backward_kernel", None), "addmm": CL._addmm_fp32,
             "triton": getattr(CL, "triton", None)}
    class TorchMetaAsCuda:  # the kernel asks autocast about its tensors' device: meta stands for cuda
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def is_autocast_enabled(device_type=None):
            return torch.is_autocast_enabled("cuda" if device_type == "meta" else device_type)

        @staticmethod
        def get_autocast_dtype(device_type):
            return torch.get_autocast_dtype("cuda" if device_type == "meta" else device_type)

    saved["torch"] = CL.torch
    CL.torch = TorchMetaAsCuda()
    triton_like = lambda device: device.type in ("cuda", "xpu", "meta")  # noqa: E731
    TU._use_triton, CL._use_triton = triton_like, triton_like
    CL._forward_kernel, CL._backward_kernel, CL._addmm_fp32 = NoOpKernel(), NoOpKernel(), addmm_fp32
    if saved["triton"] is None:
        CL.triton = types.SimpleNamespace(cdiv=lambda a, b: -(-a // b))
    try:
        yield
    finally:
        TU._use_triton, CL._use_triton, CL._addmm_fp32, CL.torch = saved["tu"], saved["cl"], saved["addmm"], \
            saved["torch"]
        CL._forward_kernel, CL._backward_kernel = saved["fwd"], saved["bwd"]
        if saved["triton"] is None:
            del CL.triton


def emulation_hooks(state: dict):
    """What a recipe's patches report their emulations through: an ``Applied`` (the trace's own list of
    emulations, ``trace/emulations.py``) that keeps every instance in ``state["applied"]``, and ``use(name)`` that
    marks an emulation used on each of them (also ``state["use"]``). Shared by the Trainer, GRPO and torchtune
    recipe traces."""
    import reportgen.trace.emulations as E

    state["applied"] = []

    class Applied(E.Applied):  # the trace's own list of emulations, to add the recipe's to
        def __init__(self):
            super().__init__()
            state["applied"].append(self)

    def use(name: str) -> None:
        for a in state["applied"]:
            a.use(name)

    state["use"] = use
    return Applied, use


@contextlib.contextmanager
def patched(*patches):
    """Set ``(module, attribute, value)`` for the length of a recipe's trace (the harness's build, optimizer and
    step, the tracer's hooks) and put every original back on exit, also on an error."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, value in patches:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


@contextlib.contextmanager
def recipe_trace(setup: TrainingSetup):
    """Run ``trace_case`` of ``setup`` through its recipe's trainer (nothing for the loop)."""
    if setup.recipe == Recipe.loop:
        yield
        return
    import tempfile

    import reportgen.measure.build as B
    import reportgen.measure.optimizers as O
    import reportgen.measure.step as S
    from reportgen.measure.sft import make_trainer, trainer_optimizer
    import reportgen.trace.step as T

    state: dict = {}
    Applied, use = emulation_hooks(state)
    build, make_optimizer, train_step = B.build, O.make_optimizer, S.train_step

    def built(spec, s, device, **kw):
        out = build(spec, s, device, **kw)
        state["recipe"] = make_trainer(out.model, s, device, state["dir"])
        out.model = state["recipe"].model
        out.notes.append(f"traced through {'TRL SFTTrainer' if s.recipe == Recipe.trl_sft else 'Trainer'}")
        return out

    def optimizer(params, s, device):
        opt = trainer_optimizer(state["recipe"], s) if "recipe" in state else None
        return opt if opt is not None else make_optimizer(params, s, device)

    def step(model, opt, batches, accum, autocast, *args, forward=None, **kwargs):
        from torch.fx.experimental import _config as fx_config

        use("data_dependent_scalars")
        # torch's own meta nonzero that assumes every element non-zero: every label valid
        with _dispatch_mode(), fx_config.patch(meta_nonzero_assume_all_nonzero=True):
            return train_step(model, opt, batches, accum, autocast, *args, forward=state["recipe"].forward, **kwargs)

    with tempfile.TemporaryDirectory() as out, \
            _trl_on_meta(use) if setup.recipe == Recipe.trl_sft else contextlib.nullcontext():
        state["dir"] = out
        with patched((B, "build", built), (O, "make_optimizer", optimizer), (S, "train_step", step),
                     (T, "Applied", Applied)):
            yield


def recipe_dict(setup: TrainingSetup, d: dict) -> dict:
    """A trace's ``as_dict()`` with its recipe's ``trace_hash`` and TRL's version (the loop's as it is)."""
    if setup.recipe == Recipe.loop:
        return d
    from importlib.metadata import PackageNotFoundError, version

    from reportgen.fingerprint import trace_hash

    try:
        trl = version("trl")
    except PackageNotFoundError:
        trl = None
    return {**d, "trace_hash": trace_hash(setup.recipe.value), "environment": {**(d.get("environment") or {}),
                                                                                "trl": trl}}
