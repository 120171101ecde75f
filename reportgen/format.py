"""Number formatting with explicit units: GiB means 2**30 bytes, GB means 1e9."""

from __future__ import annotations

GIB = 2**30

TERM_LABELS = {
    "weights": "weights",
    "quant_constants": "4-bit quantization constants",
    "lora_adapters": "LoRA adapters",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "optimizer_paged": "optimizer states (paged, managed memory)",
    "autocast_copies": "autocast 16-bit weight copies",
    "activations": "activations (saved for backward)",
    "logits": "logits and loss",
    "transient": "transient buffers",
    "fsdp_unsharded": "FSDP gathered layers",
    "cublas_workspace": "cuBLAS workspace",
    "cuda_context": "CUDA context",
}


def gib(n: float | None, digits: int = 2) -> str:
    return "-" if n is None else f"{n / GIB:.{digits}f}"


def rate(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def seconds(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def money(x: float | None) -> str:
    return "-" if x is None else f"${x:,.2f}"


def demand_note(memory: dict) -> str:
    """Why what the step asks of the card (``MemoryEstimate.card_demand``, what the verdict
    compares) differs from the device total: the cached blocks the allocator would have to
    release, the paged optimizer states that may spill to host RAM."""
    parts = []
    if memory.get("cache_released"):
        parts.append("with the cached blocks it would release")
    if memory.get("optimizer_paged"):
        parts.append("without the paged optimizer states (they may spill to host RAM)")
    return ", ".join(parts)
