"""Which dtype each kind of tensor has under a TrainingSetup (bytes per element).

Source: the recipes in ``reportgen/setup.py`` and what the libraries do with them:
* ``torch.autocast`` casts matmul inputs to the 16-bit dtype and caches the casts of leaf fp32
  weights (PyTorch docs, "Automatic Mixed Precision"; ``aten/src/ATen/autocast_mode.cpp``).
* peft keeps adapters in fp32 unless ``autocast_adapter_dtype=False`` (peft ``get_peft_model``);
  TRL 1.16's ``SFTTrainer`` (recipe ``trl-sft``) casts a 4-bit model's adapters to bf16
  (``trl/trainer/sft_trainer.py`` 904-911).
* transformers runs the residual stream in the dtype of the embedding weight; a norm whose weight
  is fp32 returns fp32 (``LlamaRMSNorm``: ``weight * hidden_states.to(input_dtype)``), so fp32 norms
  make the stream fp32 from the first layer on.
* Frozen weights: in the compute dtype (transformers' ``from_pretrained(torch_dtype=bfloat16)``)
  unless ``frozen_dtype=fp32`` (Lightning's ``bf16-mixed`` keeps parameters fp32) or the QLoRA
  preparation upcasts them: ``peft.prepare_model_for_kbit_training`` casts every 16-bit parameter
  that is not ``Params4bit`` to fp32 (peft ``utils/other.py``); older TRL's ``SFTTrainer`` with
  ``bf16`` then cast ``lm_head`` and ``embed_tokens`` back to bf16 and the norms to fp32
  (``peft_module_casting_to_bf16``, ``kbit_prep trl``; TRL 1.16 calls neither, ``recipes.py``). autocast does not cache the cast of a weight
  that does not require grad (``autocast_mode.cpp``: ``arg.requires_grad()``), so each use makes a
  new 16-bit copy, which the matmul saves for the backward when its input requires grad.

It also carries the few library behaviours that decide whether a tensor is a new copy or an
existing one (``activations.py``): QLoRA under autocast, LoRA dropout, bitsandbytes' version.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from reportgen.estimate.libraries import CURRENT, Libraries
from reportgen.setup import FrozenDtype, KbitPrep, Method, Precision, Recipe, TrainingSetup

BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "uint8": 1, "int64": 8}


@dataclass(frozen=True)
class Dtypes:
    base: int  # storage of the (trainable or frozen) unquantized base parameters
    stream: int  # residual stream / norm inputs (= dtype of the embedding output)
    compute: int  # matmul inputs and outputs
    adapter: int  # LoRA adapter weights
    autocast: bool
    trainable_base: bool  # full fine-tuning: every base parameter needs a gradient
    quantized: bool = False  # QLoRA: base linears are bitsandbytes 4-bit layers
    lora_dropout: bool = False  # peft lora_dropout > 0
    quant_holds_input: bool = False  # bitsandbytes <= 0.43.1: 4-bit linears keep their input
    embed: int = 0  # storage of the (unquantized) embedding and LM head weights; 0: same as base
    frozen_cast: bool = False  # frozen fp32 layer weights cast to the compute dtype per use (LoRA)
    head_cast: bool = False  # a frozen fp32 LM head cast to the compute dtype per forward (PEFT)
    dora: bool = False  # peft use_dora: DoRA's saved tensors and transients (``dora.py``)
    flce_in_place: bool = True  # Liger's fused loss sums the head's gradient in the GEMM (``Libraries.flce_in_place``)

    @property
    def embed_bytes(self) -> int:
        return self.embed or self.base

    @property
    def master_copy(self) -> bool:
        """Mixed-precision full fine-tuning keeps fp32 weights and casts them per forward."""
        return self.autocast and self.trainable_base


@lru_cache(maxsize=8192)
def dtypes_for(setup: TrainingSetup, libs: Libraries = CURRENT) -> Dtypes:
    c = BYTES[setup.compute_dtype]
    if setup.method == Method.full:
        base = 2 if setup.precision == Precision.bf16 else 4
    else:
        # Frozen base weights need no fp32 master copy: stored in the 16-bit dtype unless fp32.
        upcast = setup.frozen_dtype == FrozenDtype.fp32 or setup.kbit in (KbitPrep.peft, KbitPrep.trl)
        base = 4 if setup.precision == Precision.fp32 or upcast else 2
    # TRL 1.16's SFTTrainer casts a quantized model's trainable parameters to bf16 (recipes.py), and so
    # does its GRPOTrainer (``trl/trainer/grpo_trainer.py`` 531-541)
    adapter = 2 if setup.precision == Precision.bf16 or (
        setup.recipe in (Recipe.trl_sft, Recipe.grpo) and setup.method == Method.qlora) else 4
    quantized = setup.method == Method.qlora
    embed = c if setup.kbit == KbitPrep.trl and setup.frozen_dtype != FrozenDtype.fp32 else 0
    cast = setup.is_peft and setup.autocast and base == 4
    return Dtypes(base=base, stream=base, compute=c, adapter=adapter, autocast=setup.autocast,
                  trainable_base=setup.method == Method.full, quantized=quantized,
                  lora_dropout=setup.is_peft and setup.lora_dropout > 0,
                  quant_holds_input=quantized and libs.bnb_4bit_holds_input, embed=embed,
                  frozen_cast=cast and not quantized, head_cast=cast and (embed or base) == 4,
                  dora=setup.is_peft and setup.dora, flce_in_place=libs.flce_in_place(c, embed or base))
