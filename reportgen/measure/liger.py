"""kernels=liger in a measured step: Liger-Kernel's RMSNorm, RoPE and SwiGLU patched into the built model
(``estimate/liger.py`` prices them). Applied by the harness after ``build.build``, on the model under any
peft wrapper, through ``liger_kernel.transformers._apply_liger_kernel_to_instance`` with the layer kernels
only, so the loss stays what ``loss`` says (``build._fuse_cross_entropy`` for loss fused). Not a trace
source: the trace refuses kernels=liger (its Triton kernels have no meta-device equivalent)."""

from __future__ import annotations

from reportgen.measure.optimizers import SetupNotSupported


def apply_layer_kernels(model, notes: list[str]) -> None:
    """Patch ``model`` (a transformers model, or a peft model around one) with Liger's layer kernels, or
    refuse: Liger-Kernel not installed, or no module of the model patched (Liger only logs when it has no
    kernels for a model type, which would measure transformers' modules recorded as Liger's)."""
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError:
        raise SetupNotSupported("kernels='liger' needs Liger-Kernel: pip install liger-kernel "
                                "(scripts/gpu_wheels.sh carries its wheel to the GPU image)") from None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    _apply_liger_kernel_to_instance(model=base, rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=False, geglu=False, layer_norm=False)
    patched = [m for m in base.modules() if str(getattr(m.forward, "__module__", "")).startswith("liger_kernel")]
    if not patched:
        raise SetupNotSupported(f"kernels='liger': Liger-Kernel patched no module of {type(base).__name__} "
                                f"(model_type {getattr(base.config, 'model_type', '?')!r})")
    notes.append(f"Liger-Kernel's RMSNorm, RoPE and SwiGLU kernels ({len(patched)} modules patched)")
