"""Build the case's model on meta with the harness's builder and run the harness's training step
(``measure/step.py``) under the recorder: ``warmup`` untimed steps (the optimizer states appear in
the first), a ``reset_peak`` mark (the harness's ``reset_peak_memory_stats``), one measured step.
One warm-up step reaches the steady state: two or three give the same allocated and reserved
peaks (checked on TinyLlama full and LoRA, Llama 3.2 3B QLoRA with checkpointing, 1B with
accumulation; ``tests/test_trace_units.py`` pins it on a tiny model).

Order of events, as the harness on CUDA: the built model's tensors (``build_order``), an
``empty_cache`` mark, the optimizer (its states are created lazily in the first step), the token
batches, then the steps. Phases come from ``train_step``'s marks and from gradient hooks on the
decoder layers' outputs (the backward of layer ``i`` starts when the gradient of its output is
ready): ``forward``, ``loss-backward`` (loss, head and final norm), ``backward-top`` (last layer),
``backward-middle``, ``backward-bottom`` (first layer and the embedding), ``optimizer-step``,
``zero-grad``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from reportgen.errors import UserError
from reportgen.model import ModelSpec
from reportgen.setup import Method, Offload, Optimizer, Precision, TrainingSetup
from reportgen.trace.emulations import Applied

DEVICE = "meta"


@dataclass
class TraceRun:
    """What one traced run produced: the recorder's events and what replay and report need."""

    recorder: object
    applied: Applied
    vocab_size: int
    params_total: int
    params_trainable: int
    num_layers: int
    attn_implementation: str
    sdpa_backends: list[str]
    saved_bytes: list[int] = field(default_factory=list)  # per forward of the measured step
    work: object = None  # estimate.work.StepWork of the measured step (trace/work.py)
    notes: list[str] = field(default_factory=list)


def check_traceable(setup: TrainingSetup) -> None:
    """Refuse, with the reason, what the tracer does not emulate."""
    if setup.gpus > 1:
        raise UserError(f"reportgen trace: gpus={setup.gpus} ({setup.sharding.value}) is not traced; "
                        "the trace runs the harness's one-GPU step")
    if setup.offload != Offload.none:
        raise UserError(f"reportgen trace: offload={setup.offload.value} is not traced (host copies and "
                        "CUDA streams of torchao/FSDP offload have no meta equivalent)")
    if setup.loss.value == "fused":
        raise UserError("reportgen trace: loss=fused runs Liger-Kernel's Triton kernels, which the trace "
                        "does not emulate")
    if setup.optimizer == Optimizer.paged_adamw_8bit:
        raise UserError("reportgen trace: paged-adamw-8bit keeps its states in CUDA managed memory, which "
                        "the trace does not emulate", hint="trace with --optimizer adamw-8bit for the "
                        "allocator-side memory")


def decoder_layers(model) -> list:
    """The decoder blocks: the longest ``nn.ModuleList`` whose children share one class."""
    from torch import nn

    best: list = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > len(best):
            kinds = {type(m) for m in module}
            if len(kinds) == 1:
                best = list(module)
    return best


def _quant_state_tensors(qs) -> list:
    out = [qs.absmax, qs.code]
    if getattr(qs, "nested", False):
        out += [qs.offset, qs.state2.absmax, qs.state2.code]
    return [t for t in out if t is not None]


def register_model(rec, model, setup: TrainingSetup, applied: Applied) -> None:
    """The built model's tensors as allocations, in the order the harness's build makes them on
    CUDA: for QLoRA the quantized linears first (each packed weight with its constants), then the
    other base parameters and buffers, then the LoRA adapters (``peft`` adds them last)."""
    applied.use("build_order")
    quantized, base, adapters = [], [], []
    for mname, module in model.named_modules():
        weight = getattr(module, "weight", None)
        qs = getattr(weight, "quant_state", None)
        for pname, p in module.named_parameters(recurse=False):
            name = f"{mname}.{pname}"
            if "lora_" in name and p.requires_grad:
                adapters.append((name, p, "lora_adapters"))
            elif p is weight and qs is not None:
                quantized.append((name, p, "weights"))
                quantized += [(f"{name} quant_state", t, "quant_constants") for t in _quant_state_tensors(qs)]
            else:
                base.append((name, p, "weights"))
        for bname, b in module.named_buffers(recurse=False):
            if b is not None:
                base.append((f"{mname}.{bname}", b, "buffers"))
    for name, tensor, category in quantized + base + adapters:
        rec.track(tensor, f"build: {name}", category)


def _trainable_counts(model) -> tuple[int, int]:
    """(parameters of the base model, trainable parameters), as the estimator counts them: the total
    excludes LoRA adapters; a 4-bit weight counts its unpacked elements (``quant_state.shape``)."""
    seen, total, trainable = set(), 0, 0
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        qs = getattr(p, "quant_state", None)
        n = 1
        for d in (qs.shape if qs is not None else p.shape):
            n *= int(d)
        total += 0 if "lora_" in name else n
        trainable += n if p.requires_grad else 0
    return total, trainable


def _install_layer_hooks(rec, layers: list) -> list:
    """Phase marks: the backward of layer ``i`` starts when the gradient of its output is ready."""
    n = len(layers)

    def label(i: int) -> str:
        return "backward-bottom" if i == 0 else "backward-top" if i == n - 1 else "backward-middle"

    def post(module, args, output, i):
        if rec.phase != "forward" or output is None:
            return
        t = output[0] if isinstance(output, (tuple, list)) else output
        if getattr(t, "requires_grad", False):
            t.register_hook(lambda grad: rec.set_phase(label(i)))

    return [layer.register_forward_hook(lambda m, a, o, i=i: post(m, a, o, i)) for i, layer in enumerate(layers)]


def _wrap_checkpointing(model, rec, functions) -> list:
    """Run checkpointing's recomputation under the CUDA function emulation and mark what it makes.

    transformers checkpoints each layer's ``forward`` through ``module._gradient_checkpointing_func``
    (``modeling_layers.GradientCheckpointingLayer``); non-reentrant ``torch.utils.checkpoint`` calls that
    function again during the backward to recompute the layer. The autograd engine carries dispatch
    modes into the backward but not function modes, so the recomputation is wrapped to re-enter it.
    """
    restore = []
    for module in model.modules():
        original = module.__dict__.get("_gradient_checkpointing_func")
        if original is None:
            continue

        def checkpointed(fn, *args, _original=original, **kwargs):
            def run(*a, **k):
                if "backward" not in rec.phase:
                    return fn(*a, **k)
                rec.recomputing = True
                try:
                    with functions:
                        return fn(*a, **k)
                finally:
                    rec.recomputing = False

            return _original(run, *args, **kwargs)

        module._gradient_checkpointing_func = checkpointed
        restore.append((module, original))
    return restore


def run_trace(spec: ModelSpec, setup: TrainingSetup, cublas_per_handle: int, cublas_handles: int,
              warmup: int = 1, count_saved: bool = False) -> TraceRun:
    """Trace one case: build on meta, ``warmup`` steps, ``reset_peak``, one measured step."""
    import torch

    from reportgen.measure.build import build
    from reportgen.measure.optimizers import SetupNotSupported, make_optimizer
    from reportgen.measure.step import train_step
    from reportgen.trace import emulations as E
    from reportgen.trace import kernels
    from reportgen.trace.autocast import CudaAutocastPolicy
    from reportgen.trace.functions import CudaFunctions
    from reportgen.trace.recorder import Recorder

    check_traceable(setup)
    applied = Applied()
    applied.use("meta_device")
    torch.manual_seed(0)
    try:
        # LoRA: the device context makes peft create its adapters on meta instead of on the CPU (time
        # only); not for QLoRA, whose bitsandbytes build computes code books on the CPU
        with torch.device(DEVICE) if setup.method == Method.lora else contextlib.nullcontext(), \
                E.bnb_quantize_on_meta(applied) if setup.method == Method.qlora else contextlib.nullcontext(), \
                E.dora_4bit_init_on_meta(applied) if setup.method == Method.qlora and setup.dora \
                else contextlib.nullcontext():
            built = build(spec, setup, DEVICE)
    except SetupNotSupported as exc:
        raise UserError(f"reportgen trace: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the config and setup are the user's: say what failed
        raise UserError(f"{spec.name}: cannot build {setup.method.value} for model_type {spec.model_type!r}: "
                        f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
                        hint=_build_hint(str(exc))) from exc
    model = built.model
    vocab = int(getattr(model.config, "vocab_size", 0) or spec.vocab_size)
    layers = decoder_layers(model)
    total, trainable = _trainable_counts(model)

    rec = Recorder(kernels={
        torch.ops.aten._scaled_dot_product_flash_attention_backward.default: _used(
            applied, "flash_backward_scratch", kernels.flash_backward_scratch),
        torch.ops.aten._scaled_dot_product_efficient_attention_backward.default: _used(
            applied, "efficient_backward_shapes", kernels.efficient_backward),
        torch.ops.aten._grouped_mm.default: _used(applied, "grouped_mm_any_dtype", kernels.grouped_mm_any_dtype),
    })
    if setup.method == Method.qlora:
        import bitsandbytes  # noqa: F401 - registers torch.ops.bitsandbytes

        rec.kernels[torch.ops.bitsandbytes.gemm_4bit.default] = _used(
            applied, "bnb_gemm_4bit_dequant", kernels.bnb_gemm_4bit)
    rec.op_hooks.append(kernels.cublas_workspace(cublas_per_handle, cublas_handles))
    from reportgen.trace.work import WorkCounter

    rec.counter, rec.count_step = WorkCounter(), warmup + 1
    applied.use("cublas_workspace")
    register_model(rec, model, setup, applied)
    rec.mark("empty_cache")

    trainable_params = [p for p in model.parameters() if p.requires_grad]
    policy = CudaAutocastPolicy(on_cached_cast=lambda t: rec.tag(t, "autocast_copies"))
    functions = CudaFunctions(policy, applied.use)
    amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(setup.compute_dtype)
    saved: list[int] = []
    run = TraceRun(recorder=rec, applied=applied, vocab_size=vocab, params_total=total,
                   params_trainable=trainable, num_layers=len(layers),
                   attn_implementation=built.attn_implementation, sdpa_backends=[], saved_bytes=saved,
                   notes=[n.replace("measured with", "traced with") for n in built.notes])

    def autocast():
        stack = contextlib.ExitStack()
        if setup.autocast:
            applied.use("cuda_autocast_policy")
            stack.enter_context(torch.autocast("cpu", dtype=amp_dtype))
        if count_saved and rec.step == warmup + 1:
            stack.enter_context(_saved_tensor_counter(rec, saved))
        return stack

    with contextlib.ExitStack() as stack:
        stack.enter_context(E.fused_optimizers_on_meta(applied))
        stack.enter_context(E.packed_sequences_unpacked(applied))
        stack.enter_context(E.autocast_as_cuda(applied, policy))
        try:
            optimizer = make_optimizer(trainable_params, setup, "cuda")
        except SetupNotSupported as exc:
            raise UserError(f"reportgen trace: {exc}") from None
        stack.enter_context(rec)
        stack.enter_context(functions)
        hooks = _install_layer_hooks(rec, layers)
        from torch.nn.modules.module import register_module_forward_pre_hook

        hooks.append(register_module_forward_pre_hook(
            lambda module, args: rec.counter.module_call(rec.phase, rec.recomputing) if rec.step == rec.count_step
            else None))
        wrapped = _wrap_checkpointing(model, rec, functions)
        rec.set_phase("setup")
        scaler = E.MetaGradScaler(applied) if setup.precision == Precision.fp16_mixed else None
        if scaler is not None:
            rec.tag(scaler._scale, "optimizer")
        batches = [torch.empty((setup.batch, setup.seq), dtype=torch.long, device=DEVICE)
                   for _ in range(setup.accum)]
        for ids in batches:
            rec.tag(ids, "inputs")

        def mark(phase: str) -> None:
            if phase == "forward":
                rec.micro += 1
                rec.set_phase("forward")
            elif phase == "backward":
                rec.set_phase("loss-backward")
            elif phase == "optimizer-step":
                for p in trainable_params:
                    if p.grad is not None:
                        rec.tag(p.grad, "gradients")
                rec.set_phase("optimizer-step")
            elif phase == "zero-grad":
                for state in optimizer.state.values():
                    for value in state.values():
                        if isinstance(value, torch.Tensor):
                            rec.tag(value, "optimizer")
                rec.set_phase("zero-grad")
            else:
                rec.set_phase(phase)

        kept: list = []  # keep_outputs: what the loop holds between steps, as the harness does
        forward = None
        if setup.loss.value == "chunked":
            from reportgen.measure.harness import chunked_loss

            def forward(ids, mask, labels):
                return chunked_loss(model, ids, mask, labels, spec)

        try:
            for step in range(1, warmup + 2):
                rec.step, rec.micro = step, 0
                if step == warmup + 1:
                    rec.mark("reset_peak")
                train_step(model, optimizer, batches, setup.accum, autocast, scaler, None, mark=mark,
                           keep=setup.keep_outputs.value, kept=kept, forward=forward)
        except Exception as exc:  # noqa: BLE001 - say what failed and where, not a traceback
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise UserError(f"{spec.name}: the training step failed on the meta device in phase {rec.phase}: "
                            f"{type(exc).__name__}: {first}",
                            hint="an op without a meta kernel or emulation (reportgen/trace/kernels.py), or a "
                                 "transformers/peft incompatibility that CUDA would hit as well") from exc
        finally:
            for h in hooks:
                h.remove()
            for module, original in wrapped:
                module._gradient_checkpointing_func = original
    run.work = rec.counter.step_work(setup.accum, setup.autocast)
    if rec.inplace_accumulations:
        applied.use("autograd_inplace_accumulation")
    run.sdpa_backends = sorted(functions.sdpa_backends)
    if built.attn_implementation == "sdpa" and not functions.sdpa_backends:
        run.notes.append("attention 'sdpa' was requested but the model never called "
                         "F.scaled_dot_product_attention")
    return run


def _build_hint(message: str) -> str | None:
    if "Target modules" in message:
        return "--lora-targets all-linear works for any architecture"
    if "attention implementation" in message or "scaled_dot_product" in message:
        return "try --attn eager"
    if "nn.Linear" in message:
        return "QLoRA quantizes torch.nn.Linear layers only (bitsandbytes Linear4bit), as the harness does"
    return None


def _used(applied: Applied, name: str, handler):
    def wrapped(rec, func, args, kwargs):
        applied.use(name)
        return handler(rec, func, args, kwargs)

    return wrapped


@contextlib.contextmanager
def _saved_tensor_counter(rec, out: list):
    """Bytes of the distinct non-parameter storages autograd saves in one forward (the measure
    ``tests/torch_saved.py`` takes on the CPU), for the comparison with real autograd."""
    import torch

    seen: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.device.type == DEVICE:
            sid = rec._live.get(t.untyped_storage()._cdata)
            if sid is not None and rec.storages[sid].category not in ("weights", "lora_adapters", "buffers",
                                                                     "quant_constants"):
                seen.setdefault(sid, rec.storages[sid].nbytes)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield
    out.append(sum(seen.values()))
