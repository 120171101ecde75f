"""How much slower QLoRA trains than LoRA, from the one time model (``time.py``).

``qlora_slowdown(model, gpu, setup)`` estimates the same setup twice, once with 16-bit base weights
(LoRA) and once with 4-bit ones (QLoRA, the setup's quant type and double quantization), and
returns QLoRA's step time over LoRA's at equal tokens. The difference is what bitsandbytes adds to
every use of a 4-bit weight (``work.linear_unit``): the dequantization kernel's traffic
(``work.dequant_bytes_per_weight``: read 0.5 B + absmax, write 2 B per weight per pass), Linear4bit's
casts, peft's defensive clone of the base output, and MatMul4Bit's Python forward and backward on the
host. The slowdown is large where the matmuls are short (small micro-batches, fast tensor cores, slow
memory, a host-bound step) and small where they are long.
The site's prose and tables call this one function, so the words and the numbers agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from reportgen.estimate.memory import estimate_memory
from reportgen.estimate.time import estimate_time
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import Method, TrainingSetup


@dataclass(frozen=True)
class QloraSlowdown:
    lora_tokens_per_s: float
    qlora_tokens_per_s: float
    dequant_s: float  # per optimizer step, QLoRA
    qlora_step_s: float

    @property
    def ratio(self) -> float:
        """QLoRA time / LoRA time for the same tokens (1.25 = QLoRA takes 25 % longer)."""
        return self.lora_tokens_per_s / self.qlora_tokens_per_s

    @property
    def dequant_share(self) -> float:
        """Share of QLoRA's step spent dequantizing."""
        return self.dequant_s / self.qlora_step_s


def qlora_slowdown(model: ModelSpec, gpu: GpuSpec, setup: TrainingSetup) -> QloraSlowdown | None:
    """QLoRA against LoRA for ``setup`` with everything but the base weights' storage unchanged; None
    where the card has no datasheet peak (no step time). ``setup.method`` may be either."""
    times = {}
    for method in (Method.lora, Method.qlora):
        s = setup.model_copy(update={"method": method, "quant_head": setup.quant_head and method == Method.qlora})
        mem = estimate_memory(model, s, gpu)
        times[method] = estimate_time(model, s, gpu, mem.terms["activations"], mem.terms["logits"],
                                      offloaded_bytes=mem.offloaded_activations)
    lora, qlora = times[Method.lora], times[Method.qlora]
    if not lora.tokens_per_s or not qlora.tokens_per_s:
        return None
    return QloraSlowdown(lora_tokens_per_s=lora.tokens_per_s, qlora_tokens_per_s=qlora.tokens_per_s,
                         dequant_s=qlora.parts["dequant"], qlora_step_s=qlora.step_s)


__all__ = ["QloraSlowdown", "qlora_slowdown"]
