"""Every place where the trace does not simply run the harness's code on meta, with its source.

``EMULATIONS`` names each one; a trace lists those it applied (``Applied``), so a reader sees
exactly what the traced figure rests on. The patches below are context managers that undo
themselves; the kernel-level and function-level emulations live in ``kernels.py`` and
``autocast.py``.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Emulation:
    name: str
    what: str
    source: str


EMULATIONS = {e.name: e for e in [
    Emulation("meta_device", "the model is built and the step run on the meta device (shapes, dtypes and "
              "storage sizes, no memory); allocations and frees are read from its storages",
              "torch/utils/_python_dispatch.py TorchDispatchMode; reportgen/trace/recorder.py"),
    Emulation("cuda_autocast_policy", "torch.autocast('cuda') op lists and weight-cast cache applied to meta "
              "tensors (no autocast dispatch key covers meta)",
              "aten/src/ATen/autocast_mode.h AT_FORALL_* lists; autocast_mode.cpp cached_cast"),
    Emulation("autocast_state_queries", "torch.is_autocast_enabled()/get_autocast_dtype('cuda') report the "
              "emulated CUDA autocast state (peft's bitsandbytes LoRA layer skips its input cast under it)",
              "peft/tuners/lora/bnb.py Linear4bit.forward (requires_conversion)"),
    Emulation("maybe_autocast_meta", "transformers' maybe_autocast returns a null context for device 'meta'; "
              "it is given the region's CUDA meaning (e.g. RoPE's autocast-disabled fp32 block)",
              "transformers/utils/generic.py maybe_autocast"),
    Emulation("autocast_meta_device", "torch.autocast(device_type='meta', ...), which code derives from its "
              "tensors' device, stands for torch.autocast('cuda', ...) (e.g. peft's ParamWrapper disables "
              "autocast around its expert weights)", "torch/amp/autocast_mode.py autocast.__init__; "
              "peft/tuners/lora/layer.py ParamWrapper.forward"),
    Emulation("sdpa_flash", "F.scaled_dot_product_attention runs FlashAttention-2 as on CUDA: saves q, k, v, "
              "output and fp32 logsumexp instead of the math path's s x s scores",
              "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp select_sdp_backend; attention.cpp"),
    Emulation("sdpa_efficient", "F.scaled_dot_product_attention runs the memory-efficient kernel as on CUDA "
              "(fp32 inputs with as many k/v heads as query heads, or a mask): saves q, k, v, the additive "
              "mask, output and the padded fp32 logsumexp",
              "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp can_use_mem_efficient_attention"),
    Emulation("efficient_backward_shapes", "the memory-efficient kernel's backward allocates gradients shaped "
              "like q, k and v (its meta kernel shapes k's and v's like q, wrong for grouped-query attention)",
              "aten/src/ATen/native/transformers/cuda/attention_backward.cu _efficient_attention_backward"),
    Emulation("sdpa_math", "F.scaled_dot_product_attention takes the math path, as CUDA does for these inputs "
              "(fp32 with grouped-query attention: the memory-efficient kernel of torch 2.11 refuses fewer "
              "k/v heads): saves the s x s probabilities",
              "aten/src/ATen/native/transformers/cuda/sdp_utils.cpp select_sdp_backend"),
    Emulation("flash_backward_scratch", "FlashAttention-2 backward's softmax_d, fp32 dq accumulator and, for "
              "GQA, the expanded dk/dv buffers, allocated and freed inside the op",
              "aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp mha_bwd"),
    Emulation("cuda_fused_dropout", "F.dropout in training takes CUDA's fused native_dropout, which keeps a "
              "bool mask (meta, like the CPU, keeps the noise in the input dtype)",
              "aten/src/ATen/native/Dropout.cpp is_fused_kernel_acceptable"),
    Emulation("grouped_mm_any_dtype", "torch._grouped_mm (MoE experts) in fp32/fp16 runs CUDA's per-group "
              "fallback; the meta kernel accepts bf16 only, so the output is shaped on bf16 stand-ins",
              "aten/src/ATen/native/cuda/GroupedBlas.cpp _grouped_mm_cuda, _grouped_mm_fallback"),
    Emulation("bnb_quantize_on_meta", "Params4bit.to('meta') skips quantization; quantize_4bit is called as "
              ".to('cuda') would, on meta (bitsandbytes' fake kernels give the packed weight and absmax)",
              "bitsandbytes/nn/modules.py Params4bit.to/_quantize; bitsandbytes/_ops.py register_fake"),
    Emulation("dora_4bit_init_copy", "peft's DoRA init deepcopies a 4-bit base layer before reading its "
              "weight for the initial magnitudes (a build temporary, for FSDP); a meta Params4bit cannot be "
              "deep-copied, so the layer itself is read", "peft/tuners/lora/dora.py DoraLinearLayer.update_layer"),
    Emulation("bnb_gemm_4bit_dequant", "bitsandbytes' CUDA gemm_4bit dequantizes the whole weight to the "
              "compute dtype before F.linear for training-sized inputs",
              "bitsandbytes/backends/cuda/ops.py gemm_4bit, _dequant_linear_fallback"),
    Emulation("fused_adamw_on_meta", "torch.optim.AdamW(fused=True), as the harness builds it on CUDA, is "
              "allowed on meta (its device check lists meta too); states: exp_avg, exp_avg_sq and a "
              "device-side fp32 step per parameter",
              "torch/optim/optimizer.py _device_dtype_check_for_fused; torch/optim/adam.py _init_group"),
    Emulation("packed_sequence_check", "transformers' packed-sequence detection ends in .item(), which meta "
              "cannot answer; the step passes no position_ids, so positions are arange(seq) and the check "
              "returns None, as it does on CUDA (its tensors are still allocated)",
              "transformers/masking_utils.py find_packed_sequence_indices"),
    Emulation("grad_scaler", "fp16-mixed: GradScaler's scale/unscale/update on meta without its .item() "
              "check for infs (the scale and found_inf tensors are allocated as on CUDA)",
              "torch/amp/grad_scaler.py GradScaler.scale/unscale_/step"),
    Emulation("autograd_inplace_accumulation", "the autograd engine sums two gradients of one tensor in place "
              "on CUDA (old.add_(new)) but out of place on meta, which counts as a tensor subclass; such sums "
              "are replayed in place", "torch/csrc/autograd/input_buffer.cpp accumulate, can_accumulate_inplace; "
              "ATen/TensorSubclassLikeUtils.h kTensorSubclassLike (MetaBit)"),
    Emulation("cublas_workspace", "the cuBLAS workspace of each handle (main thread, autograd thread) "
              "allocated through the caching allocator at the first matmul; size from the estimator's "
              "named constants", "aten/src/ATen/cuda/CublasHandlePool.cpp; reportgen/estimate/constants.py"),
    Emulation("build_order", "the model's tensors after the build are replayed as allocations in build "
              "order (base weights, quantized weights with their constants, adapters); the build's own "
              "temporaries are not, as the harness frees them with empty_cache before the step",
              "reportgen/measure/harness.py (empty_cache after build); reportgen/trace/step.py"),
    Emulation("cuda_context", "the CUDA context (driver state, kernels) is outside the allocator: "
              "device_total adds the estimator's CUDA_CONTEXT_BYTES", "reportgen/estimate/constants.py"),
]}


class Applied:
    """The emulations one trace used, in first-use order."""

    def __init__(self):
        self.names: list[str] = []

    def use(self, name: str) -> None:
        if name not in EMULATIONS:
            raise KeyError(f"unknown emulation {name!r}")
        if name not in self.names:
            self.names.append(name)

    def as_list(self) -> list[dict]:
        return [asdict(EMULATIONS[n]) for n in self.names]


@contextlib.contextmanager
def _patched(obj, attr: str, value):
    old = getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield old
    finally:
        setattr(obj, attr, old)


@contextlib.contextmanager
def bnb_quantize_on_meta(applied: Applied):
    """``Params4bit.to(device)`` quantizes unless the device is meta; on meta do what ``.to('cuda')``
    does: ``_quantize(device)``."""
    import bitsandbytes as bnb

    cls = bnb.nn.Params4bit
    original = cls.to

    def to(self, *args, **kwargs):
        import torch

        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is not None and device.type == "meta" and not self.bnb_quantized:
            applied.use("bnb_quantize_on_meta")
            return self._quantize(device)
        return original(self, *args, **kwargs)

    with _patched(cls, "to", to):
        yield


@contextlib.contextmanager
def dora_4bit_init_on_meta(applied: Applied):
    """peft's ``DoraLinearLayer.update_layer`` reads the norms of ``deepcopy(base_layer)`` for a
    ``Linear4bit``; the copy is freed when it returns, and only its weight is read, so on meta the
    layer is read in place (``Params4bit.__deepcopy__`` cannot set meta data)."""
    from peft.tuners.lora import dora

    def no_copy(module, memo=None):
        if type(module).__name__ == "Linear4bit":
            applied.use("dora_4bit_init_copy")
            return module
        return dora_deepcopy(module, memo)

    dora_deepcopy = dora.deepcopy
    with _patched(dora, "deepcopy", no_copy):
        yield


@contextlib.contextmanager
def fused_optimizers_on_meta(applied: Applied):
    """Let ``fused=True`` optimizers accept meta parameters (the check only lists real devices)."""
    import torch.optim.optimizer as opt

    original = opt._get_fused_kernels_supported_devices

    def devices():
        applied.use("fused_adamw_on_meta")
        return [*original(), "meta"]

    with _patched(opt, "_get_fused_kernels_supported_devices", devices):
        yield


@contextlib.contextmanager
def packed_sequences_unpacked(applied: Applied):
    import transformers.masking_utils as mu

    original = mu.find_packed_sequence_indices

    def find_packed_sequence_indices(position_ids):
        applied.use("packed_sequence_check")
        first_dummy_value = position_ids[:, :1] - 1
        position_diff = __import__("torch").diff(position_ids, prepend=first_dummy_value, dim=-1)
        (position_diff != 1).cumsum(-1)  # the tensors the real check makes before its .item()
        return None

    with _patched(mu, "find_packed_sequence_indices", find_packed_sequence_indices):
        yield original


@contextlib.contextmanager
def autocast_as_cuda(applied: Applied, policy):
    """Route CUDA autocast queries, autocast regions opened for device 'meta', transformers'
    ``maybe_autocast`` on meta and the autocast-cache clear to the emulation (the CPU autocast state
    carries the emulated CUDA state)."""
    import torch
    from transformers.utils import generic

    real_enabled, real_dtype, real_clear = torch.is_autocast_enabled, torch.get_autocast_dtype, \
        torch.clear_autocast_cache
    original_maybe = generic.maybe_autocast

    def is_autocast_enabled(device_type=None):
        if device_type in (None, "cuda"):
            if real_enabled("cpu"):
                applied.use("autocast_state_queries")
            return real_enabled("cpu")
        return real_enabled(device_type)

    def get_autocast_dtype(device_type):
        return real_dtype("cpu" if device_type == "cuda" else device_type)

    def clear_autocast_cache():
        policy.clear_cache()
        real_clear()

    def maybe_autocast(device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type != "meta":
            return original_maybe(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        if real_enabled("cpu"):
            applied.use("maybe_autocast_meta")
        if real_enabled("cpu") or enabled:
            return torch.autocast("cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        return contextlib.nullcontext()

    autocast_cls = torch.amp.autocast_mode.autocast
    original_init = autocast_cls.__init__

    def autocast_init(self, device_type, *args, **kwargs):
        if device_type == "meta":  # code that asks for its tensors' device type gets "meta"
            applied.use("autocast_meta_device")
            device_type = "cpu"
        original_init(self, device_type, *args, **kwargs)

    holders = [m for m in list(sys.modules.values())
               if getattr(m, "maybe_autocast", None) is original_maybe and m is not None]
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(torch, "is_autocast_enabled", is_autocast_enabled))
        stack.enter_context(_patched(torch, "get_autocast_dtype", get_autocast_dtype))
        stack.enter_context(_patched(torch, "clear_autocast_cache", clear_autocast_cache))
        stack.enter_context(_patched(autocast_cls, "__init__", autocast_init))
        for module in holders:
            stack.enter_context(_patched(module, "maybe_autocast", maybe_autocast))
        yield


class MetaGradScaler:
    """``torch.amp.GradScaler`` for fp16-mixed, minus its ``.item()`` inf check (meta has no
    values): ``scale`` multiplies by the fp32 scale tensor; ``step`` unscales the gradients in place
    (``_amp_foreach_non_finite_check_and_unscale_``) with a found_inf tensor, then steps;
    ``update`` changes the scale in place. Source: ``torch/amp/grad_scaler.py``."""

    def __init__(self, applied: Applied, device: str = "meta"):
        import torch

        applied.use("grad_scaler")
        self._scale = torch.full((), 2.0**16, dtype=torch.float32, device=device)
        self._growth_tracker = torch.full((), 0, dtype=torch.int32, device=device)

    def scale(self, loss):
        return loss * self._scale.to(dtype=loss.dtype)

    def step(self, optimizer):
        import torch

        inv_scale = self._scale.double().reciprocal().float()
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=self._scale.device)
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        for g in grads:
            g.mul_(inv_scale)
        del found_inf, inv_scale
        optimizer.step()

    def update(self):
        self._scale.mul_(1.0)
