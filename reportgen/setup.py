"""TrainingSetup: everything about one fine-tuning run except the model and the GPU.

The recipes behind each choice (what ``bf16-mixed`` or ``qlora`` means in code) are the ones the
measuring harness runs (``reportgen/measure/harness.py``) and the methodology page describes:

* precision ``fp32``: fp32 weights, no autocast.
  ``fp16-mixed``/``bf16-mixed``: ``torch.autocast`` to 16 bit; trainable weights stay fp32
  (master weights), frozen base weights of LoRA/QLoRA are stored in 16 bit.
  ``bf16``: everything in bf16, no autocast ("pure bf16"; optimizer states in bf16 too).
* method ``lora``: peft LoRA on the target linears, adapters in fp32 except under pure bf16.
  ``qlora``: the same with the base linears quantized by bitsandbytes 4-bit (NF4/FP4, blocksize 64),
  embeddings, norms and the head left in the 16-bit compute dtype.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Method(str, Enum):
    full = "full"
    lora = "lora"
    qlora = "qlora"


class Precision(str, Enum):
    fp32 = "fp32"
    fp16_mixed = "fp16-mixed"
    bf16_mixed = "bf16-mixed"
    bf16 = "bf16"


class Optimizer(str, Enum):
    adamw = "adamw"
    adamw_8bit = "adamw-8bit"
    paged_adamw_8bit = "paged-adamw-8bit"
    sgd = "sgd"
    adafactor = "adafactor"


class LoraTargets(str, Enum):
    qv = "qv"
    attn = "attn"
    all_linear = "all-linear"


class Quant(str, Enum):
    nf4 = "nf4"
    fp4 = "fp4"


class Attention(str, Enum):
    sdpa = "sdpa"
    eager = "eager"


class Loss(str, Enum):
    standard = "standard"
    fused = "fused"


class Offload(str, Enum):
    none = "none"
    optimizer = "optimizer"
    params = "params"


class Sharding(str, Enum):
    none = "none"
    ddp = "ddp"
    fsdp = "fsdp"


class TrainingSetup(BaseModel):
    """One run's choices. Field names are the sweep YAML keys and (with dashes) the CLI flags."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)

    method: Method = Method.full
    precision: Precision = Precision.bf16_mixed
    optimizer: Optimizer = Optimizer.adamw
    lora_rank: int = Field(16, ge=1, le=4096)
    lora_alpha: int = Field(32, ge=1)
    lora_targets: LoraTargets = LoraTargets.all_linear
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="peft lora_dropout: each adapter drops its own "
                                "copy of its input and keeps a mask for backward")
    quant: Quant = Quant.nf4
    double_quant: bool = False
    grad_ckpt: bool = False
    attn: Attention = Attention.sdpa
    loss: Loss = Field(Loss.standard, description="standard: transformers' fp32 cross-entropy over full logits; "
                       "fused: chunked linear+cross-entropy kernel (Liger-Kernel)")
    batch: int = Field(1, ge=1, le=4096, description="micro-batch size per GPU")
    seq: int = Field(2048, ge=8, le=1_048_576, description="sequence length in tokens")
    accum: int = Field(1, ge=1, le=65536, description="gradient accumulation steps")
    offload: Offload = Offload.none
    gpus: int = Field(1, ge=1, le=1024)
    sharding: Sharding = Sharding.none

    @model_validator(mode="after")
    def _consistent(self) -> "TrainingSetup":
        if self.gpus > 1 and self.sharding == Sharding.none:
            raise ValueError(f"gpus={self.gpus} needs sharding 'ddp' or 'fsdp' (got 'none')")
        if self.gpus == 1 and self.sharding != Sharding.none:
            raise ValueError(f"sharding {self.sharding.value!r} needs gpus > 1 (got gpus=1)")
        if self.offload == Offload.params and self.sharding == Sharding.ddp:
            raise ValueError("offload 'params' is FSDP's CPU offload: use sharding 'fsdp' or 'none', not 'ddp'")
        return self

    # ----- derived facts the estimator uses ------------------------------------------------
    @property
    def is_peft(self) -> bool:
        return self.method in (Method.lora, Method.qlora)

    @property
    def autocast(self) -> bool:
        return self.precision in (Precision.fp16_mixed, Precision.bf16_mixed)

    @property
    def compute_dtype(self) -> str:
        """dtype of matmul inputs/outputs: ``fp32``, ``fp16`` or ``bf16``."""
        return {"fp32": "fp32", "fp16-mixed": "fp16", "bf16-mixed": "bf16", "bf16": "bf16"}[self.precision.value]

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.batch * self.seq

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step over all GPUs."""
        return self.batch * self.seq * self.accum * self.gpus

    def short(self) -> str:
        """A compact human label, e.g. ``qlora-nf4-dq r16 all-linear bf16-mixed ckpt b4 s2048``."""
        parts = [self.method.value]
        if self.method == Method.qlora:
            parts[0] += f"-{self.quant.value}" + ("-dq" if self.double_quant else "")
        if self.is_peft:
            parts.append(f"r{self.lora_rank} {self.lora_targets.value}")
            if self.lora_dropout:
                parts.append(f"dropout {self.lora_dropout:g}")
        parts.append(self.precision.value)
        if self.optimizer != Optimizer.adamw:
            parts.append(self.optimizer.value)
        if self.grad_ckpt:
            parts.append("ckpt")
        if self.attn != Attention.sdpa:
            parts.append(self.attn.value)
        if self.loss != Loss.standard:
            parts.append(f"{self.loss.value}-ce")
        parts.append(f"b{self.batch} s{self.seq}")
        if self.accum > 1:
            parts.append(f"ga{self.accum}")
        if self.offload != Offload.none:
            parts.append(f"offload-{self.offload.value}")
        if self.gpus > 1:
            parts.append(f"{self.gpus}x {self.sharding.value}")
        return " ".join(parts)

    def technique(self) -> str:
        """The technique label used for colours and grouping on the site."""
        label = {"full": "Full", "lora": "LoRA", "qlora": "QLoRA"}[self.method.value]
        return label + (" + ckpt" if self.grad_ckpt else "")
