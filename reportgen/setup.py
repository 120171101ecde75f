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

The setup is a frozen dataclass validated on construction, with no dependency beyond the standard
library, so the estimator core loads anywhere Python runs (the site's in-browser calculator runs
it under Pyodide, where pydantic's compiled core is not available). It keeps the names of the
pydantic API the rest of the code uses: ``model_validate``, ``model_validate_json``,
``model_dump(mode="json")``, ``model_copy(update=...)`` and ``model_fields``. A bad value raises
``SetupError`` (a ``ValueError``) naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar


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
    paged_adamw = "paged-adamw"
    sgd = "sgd"
    adafactor = "adafactor"


class Quant(str, Enum):
    nf4 = "nf4"
    fp4 = "fp4"


class Attention(str, Enum):
    sdpa = "sdpa"
    eager = "eager"


class Loss(str, Enum):
    standard = "standard"
    fused = "fused"
    chunked = "chunked"
    chunked_compiled = "chunked-compiled"
    no_upcast = "no-upcast"


class FsdpParamDtype(str, Enum):
    compute = "compute"
    fp32 = "fp32"


class Modeling(str, Enum):
    transformers = "transformers"
    torchtune = "torchtune"


class Kernels(str, Enum):
    eager = "eager"
    liger = "liger"


class KeepOutputs(str, Enum):
    none = "none"
    step = "step"
    next_step = "next-step"


class Offload(str, Enum):
    none = "none"
    optimizer = "optimizer"
    params = "params"


class Sharding(str, Enum):
    none = "none"
    ddp = "ddp"
    fsdp = "fsdp"
    no_shard = "no-shard"
    shard_grad_op = "shard-grad-op"
    hybrid_shard = "hybrid-shard"
    zero1 = "zero1"
    zero2 = "zero2"
    zero3 = "zero3"


class FrozenDtype(str, Enum):
    compute = "compute"
    fp32 = "fp32"


class KbitPrep(str, Enum):
    none = "none"
    peft = "peft"
    trl = "trl"


class Padding(str, Enum):
    max = "max"
    longest = "longest"
    packed = "packed"


class Recipe(str, Enum):
    loop = "loop"
    trainer = "trainer"
    trl_sft = "trl-sft"
    grpo = "grpo"


class Generation(str, Enum):
    hf = "hf"
    vllm_colocate = "vllm-colocate"
    vllm_server = "vllm-server"


class Save(str, Enum):
    none = "none"
    adapter = "adapter"
    full = "full"
    fsdp_full = "fsdp-full"
    fsdp_sharded = "fsdp-sharded"


class Load(str, Enum):
    device = "device"
    cpu = "cpu"
    cpu_rank0 = "cpu-rank0"


#: GPUs in one node: an HGX/DGX board has 8 GPUs on one NVSwitch (NVIDIA DGX H100 user guide: "8x NVIDIA H100
#: GPUs"; DGX A100 likewise). The estimates place ranks this many to a node (``estimate/comm.py``: a collective
#: over more crosses the network; FSDP's ``HYBRID_SHARD`` shards within ``torch.cuda.device_count()`` GPUs of a
#: node, ``_init_intra_and_inter_node_groups``), and a launch file's ``num_machines`` must agree (``configs/launch.py``)
NODE_GPUS = 8

#: the shardings whose parameters FSDP holds (its state dict types and its CPU-RAM-efficient loading)
FSDP_PARAM_SHARDING = (Sharding.fsdp, Sharding.shard_grad_op, Sharding.hybrid_shard)


class SetupError(ValueError):
    """A value a setup cannot take: ``field`` names it (None for a rule across fields)."""

    def __init__(self, field: str | None, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field, self.message = field, message


@dataclass(frozen=True)
class FieldSpec:
    """What one field accepts: its type (an Enum, int, float or bool), bounds and meaning."""

    annotation: type
    ge: float | None = None
    le: float | None = None
    lt: float | None = None
    description: str = ""
    optional: bool = False  # None is a value (the default's meaning is in the description)
    pattern: str | None = None  # a str field's syntax (a regular expression the whole value matches)

    def check(self, name: str, value: Any) -> Any:
        t = self.annotation
        if value is None and self.optional:
            return None
        if isinstance(t, type) and issubclass(t, Enum):
            if isinstance(value, t):
                return value
            try:
                return t(value)
            except ValueError:
                raise SetupError(name, f"must be one of {', '.join(m.value for m in t)} (got {value!r})") from None
        if t is bool:
            if not isinstance(value, bool):
                raise SetupError(name, f"must be true or false (got {value!r})")
            return value
        if t is str:
            if isinstance(value, Enum):
                value = value.value
            if not isinstance(value, str) or (self.pattern and not re.fullmatch(self.pattern, value)):
                raise SetupError(name, f"{value!r} is not valid here: {self.description}")
            return ",".join(part.strip() for part in value.split(",")) if "," in value else value
        if t is int:
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                else:
                    raise SetupError(name, f"must be a whole number (got {value!r})")
        elif t is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SetupError(name, f"must be a number (got {value!r})")
            value = float(value)
        if self.ge is not None and not value >= self.ge:
            raise SetupError(name, f"must be >= {_bound(self.ge)} (got {value!r})")
        if self.le is not None and not value <= self.le:
            raise SetupError(name, f"must be <= {_bound(self.le)} (got {value!r})")
        if self.lt is not None and not value < self.lt:
            raise SetupError(name, f"must be < {_bound(self.lt)} (got {value!r})")
        return value


def _bound(x: float) -> str:
    """A bound as a person writes it: ``1048576``, not ``1.04858e+06``."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


#: fields that mean something only for some methods: ``reportgen estimate/measure/trace`` refuse one
#: given for another method (it would change nothing), and the calculator greys it out
METHOD_FIELDS = {"lora_rank": ("lora", "qlora"), "lora_alpha": ("lora", "qlora"), "lora_targets": ("lora", "qlora"),
                 "lora_dropout": ("lora", "qlora"), "dora": ("lora", "qlora"), "quant": ("qlora",),
                 "double_quant": ("qlora",), "quant_head": ("qlora",), "kbit_prep": ("qlora",),
                 "frozen_dtype": ("lora", "qlora")}


@dataclass(frozen=True)
class TrainingSetup:
    """One run's choices. Field names are the sweep YAML keys and (with dashes) the CLI flags."""

    method: Method = Method.full
    precision: Precision = Precision.bf16_mixed
    optimizer: Optimizer = Optimizer.adamw
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_targets: str = "all-linear"
    lora_dropout: float = 0.0
    dora: bool = False
    quant: Quant = Quant.nf4
    double_quant: bool = False
    grad_ckpt: bool = False
    attn: Attention = Attention.sdpa
    loss: Loss = Loss.standard
    batch: int = 1
    seq: int = 2048
    accum: int = 1
    offload: Offload = Offload.none
    gpus: int = 1
    sharding: Sharding = Sharding.none
    padding: Padding = Padding.longest
    seq_mean: int | None = None
    seq_padded: int | None = None
    keep_outputs: KeepOutputs = KeepOutputs.none
    optimizer_in_backward: bool = False
    act_offload: bool = False
    quant_head: bool = False
    frozen_dtype: FrozenDtype = FrozenDtype.compute
    kbit_prep: KbitPrep | None = None
    compile: bool = False
    recipe: Recipe = Recipe.loop
    eval_batch: int | None = None
    eval_seq: int | None = None
    eval_generate: int | None = None
    save: Save | None = None
    load: Load | None = None
    # recipe grpo (TRL 1.16's GRPOTrainer, ``estimate/grpo.py``): meaningless for every other recipe
    num_generations: int = 8
    max_completion_length: int = 512
    max_prompt_length: int | None = None
    generation_batch_size: int | None = None
    generation: Generation = Generation.hf
    vllm_gpu_memory_utilization: float = 0.3
    vllm_enable_sleep_mode: bool = False
    vllm_max_model_length: int | None = None
    vllm_importance_sampling_correction: bool = True
    beta: float = 0.0
    fsdp_param_dtype: FsdpParamDtype = FsdpParamDtype.compute
    modeling: Modeling = Modeling.transformers
    rope_positions: int | None = None
    kernels: Kernels = Kernels.eager

    #: fields ``model_dump`` leaves out while they hold this value: added after result files were
    #: stored, whose setups (and the ids, hashes and pages made from them) must stay as they were
    DUMPED_ONLY_WHEN_SET: ClassVar[dict[str, Any]] = {
        "recipe": Recipe.loop, "seq_padded": None, "eval_batch": None, "eval_seq": None, "eval_generate": None,
        "save": None, "load": None, "num_generations": 8, "max_completion_length": 512, "max_prompt_length": None,
        "generation_batch_size": None, "generation": Generation.hf, "vllm_gpu_memory_utilization": 0.3,
        "vllm_enable_sleep_mode": False, "vllm_max_model_length": None, "vllm_importance_sampling_correction": True,
        "beta": 0.0, "fsdp_param_dtype": FsdpParamDtype.compute, "modeling": Modeling.transformers,
        "rope_positions": None, "kernels": Kernels.eager}
    #: the fields of recipe grpo (TRL GRPOConfig's names; their defaults are TRL 1.16's)
    GRPO_FIELDS: ClassVar[tuple[str, ...]] = (
        "num_generations", "max_completion_length", "max_prompt_length", "generation_batch_size", "generation",
        "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "vllm_max_model_length",
        "vllm_importance_sampling_correction", "beta")

    #: the accepted values of every field (the validation rules and the sweep's/CLI's help)
    model_fields: ClassVar[dict[str, FieldSpec]] = {
        "method": FieldSpec(Method, description="full fine-tuning, LoRA (peft), or QLoRA (peft on bitsandbytes "
                            "4-bit base linears)"),
        "precision": FieldSpec(Precision, description="fp32; fp16-/bf16-mixed: torch.autocast with fp32 trainable "
                               "weights; bf16: everything in bf16"),
        "optimizer": FieldSpec(Optimizer, description="torch AdamW, bitsandbytes 8-bit, paged 8-bit or paged "
                               "32-bit AdamW, SGD without momentum, transformers' Adafactor"),
        "lora_rank": FieldSpec(int, ge=1, le=4096, description="LoRA rank r"),
        "lora_alpha": FieldSpec(int, ge=1, le=65536, description="LoRA alpha (scaling alpha/r; no effect on memory)"),
        "lora_targets": FieldSpec(str, pattern=r"[A-Za-z0-9_.-]+( *, *[A-Za-z0-9_.-]+)*",
                                  description="which modules get adapters: a preset (qv, attn, all-linear: every "
                                  "linear of the decoder layers) or a comma list of module names (q,k,v,o,gate,up,"
                                  "down, the model's own names such as qkv_proj, and lm_head, embed_tokens)"),
        "lora_dropout": FieldSpec(float, ge=0.0, lt=1.0, description="peft lora_dropout: each adapter drops its "
                                  "own copy of its input and keeps a mask for backward"),
        "dora": FieldSpec(bool, description="LoRA/QLoRA: weight-decomposed adapters (DoRA, peft LoraConfig("
                          "use_dora=True)): a trainable magnitude per output row of each adapted linear; each "
                          "forward forms the full W + scale B A (the dequantized W for 4-bit) for its row norms"),
        "quant": FieldSpec(Quant, description="QLoRA 4-bit data type"),
        "double_quant": FieldSpec(bool, description="QLoRA double quantization of the 4-bit constants"),
        "grad_ckpt": FieldSpec(bool, description="activation (gradient) checkpointing of every decoder layer"),
        "attn": FieldSpec(Attention, description="SDPA (flash / memory-efficient kernels) or eager attention"),
        "loss": FieldSpec(Loss, description="standard: transformers' fp32 cross-entropy over full logits; "
                          "fused: chunked linear+cross-entropy kernel (Liger-Kernel); chunked: 16-bit logits, "
                          "upcast to fp32 one chunk at a time (torchtune CEWithChunkedOutputLoss); chunked-compiled: "
                          "the same with each chunk's cross-entropy under torch.compile (torchtune compile: true), "
                          "which keeps the 16-bit logits and two fp32 numbers per token instead of the fp32 "
                          "log-softmax; no-upcast: cross-entropy on the 16-bit logits, no fp32 copy "
                          "(reportgen/estimate/logits.py)"),
        "batch": FieldSpec(int, ge=1, le=4096, description="micro-batch size per GPU"),
        "seq": FieldSpec(int, ge=8, le=1_048_576, description="sequence length in tokens: the longest sample "
                         "(after truncation), or the packed length"),
        "accum": FieldSpec(int, ge=1, le=65536, description="gradient accumulation steps"),
        "offload": FieldSpec(Offload, description="CPU offload: none, the optimizer states (torchao "
                             "CPUOffloadOptimizer), or the parameters (FSDP CPUOffload)"),
        "gpus": FieldSpec(int, ge=1, le=1024, description="data-parallel GPUs"),
        "sharding": FieldSpec(Sharding, description="none (one GPU), DDP, FSDP full sharding (FULL_SHARD, FSDP2 "
                              "fully_shard), FSDP NO_SHARD (every GPU holds everything, gradients all-reduced in "
                              "place; fsdp_qlora's 'DDP mode'), FSDP SHARD_GRAD_OP (parameters stay gathered from "
                              "forward to backward), FSDP HYBRID_SHARD (full sharding inside a node of 8 GPUs, "
                              "replicated across nodes), or DeepSpeed ZeRO stage 1, 2 or 3 (estimated only: the "
                              "harness runs ddp, fsdp and no-shard)"),
        "padding": FieldSpec(Padding, description="how samples of different lengths become batches: padded to seq "
                             "(max), to the longest sample of each micro-batch (longest, the default of transformers' "
                             "and TRL's collators), or packed into rows of seq tokens"),
        "seq_mean": FieldSpec(int, ge=1, le=1_048_576, optional=True, description="mean sample length in tokens "
                              "(default: every sample is seq tokens long); sets the real tokens per step and, with "
                              "padding=longest, the padded length of a micro-batch"),
        "seq_padded": FieldSpec(int, ge=1, le=1_048_576, optional=True, description="with padding=longest and "
                                "seq_mean: the mean padded length of a micro-batch, when the dataset's lengths are "
                                "known (--lengths FILE sets it; default: from an exponential length distribution of "
                                "that mean, estimate/lengths.py)"),
        "keep_outputs": FieldSpec(KeepOutputs, description="how long the training loop keeps the model's outputs "
                                  "(logits): none (transformers' Trainer drops them before backward), step (until "
                                  "the optimizer step, e.g. fsdp_qlora's train.py), next-step (until the next "
                                  "forward returns, e.g. litgpt's loop)"),
        "optimizer_in_backward": FieldSpec(bool, description="step each parameter's optimizer in its gradient "
                                           "hook and free the gradient at once (torchtune optimizer_in_bwd); needs "
                                           "accum 1"),
        "act_offload": FieldSpec(bool, description="offload saved activations to host RAM during forward and bring "
                                 "them back in backward (torchtune enable_activation_offloading)"),
        "quant_head": FieldSpec(bool, description="QLoRA: quantize the LM head to 4 bit too (Lightning Fabric's "
                                "BitsandbytesPrecision, litgpt; transformers leaves lm_head in 16 bit)"),
        "frozen_dtype": FieldSpec(FrozenDtype, description="LoRA/QLoRA under mixed precision: the dtype of the "
                                  "frozen, unquantized base weights: compute (transformers' from_pretrained("
                                  "torch_dtype=bfloat16), the default) or fp32 (Lightning's bf16-mixed keeps "
                                  "every parameter in fp32 and autocast casts each one per use)"),
        "kbit_prep": FieldSpec(KbitPrep, optional=True, description="QLoRA: the Hugging Face recipe's "
                               "preparation of the 4-bit model: peft (prepare_model_for_kbit_training: every "
                               "parameter that is not 4-bit, embeddings, norms and LM head, upcast to fp32), trl "
                               "(older TRL SFTTrainer: peft's, then peft_module_casting_to_bf16's bf16 cast back "
                               "of embeddings and head, norms kept fp32; TRL 1.16's SFTTrainer calls neither, "
                               "see recipe trl-sft) or none (fsdp_qlora, litgpt, torchtune, TRL 1.16 on a "
                               "16-bit load); default: peft under mixed precision (none with recipe trl-sft), "
                               "none under pure bf16 and fp32"),
        "compile": FieldSpec(bool, description="torch.compile the model (Inductor fuses norms, activations and "
                             "RoPE; off by default, as HF Trainer's torch_compile=False)"),
        "recipe": FieldSpec(Recipe, description="the training code around the model: loop (the harness's plain "
                            "PyTorch loop, the default), trainer (transformers' Trainer, as Axolotl runs it: the "
                            "same memory as the loop, term by term) or trl-sft (TRL 1.16's SFTTrainer on "
                            "transformers' Trainer, as trl sft runs it: its fused LM head computes the loss, "
                            "entropy and token accuracy in tiles without the full logits, and it casts a 4-bit "
                            "model's adapters to bf16; reportgen/estimate/recipes.py) or grpo (TRL 1.16's "
                            "GRPOTrainer: generate num_generations completions per prompt, score them, step the "
                            "policy on prompt + completion rows, seq long; reportgen/estimate/grpo.py)"),
        "num_generations": FieldSpec(int, ge=2, le=4096, description="recipe grpo: completions sampled per prompt "
                                     "(TRL GRPOConfig num_generations, default 8; GRPO needs at least 2)"),
        "max_completion_length": FieldSpec(int, ge=1, le=1_048_576, description="recipe grpo: the longest "
                                           "completion in tokens (TRL max_completion_length, default 512)"),
        "max_prompt_length": FieldSpec(int, ge=1, le=1_048_576, optional=True, description="recipe grpo: the "
                                       "longest prompt in tokens (TRL 1.16 has no such key: truncate the data set); "
                                       "default: seq - max_completion_length. Given, seq must be (or is set to) "
                                       "max_prompt_length + max_completion_length"),
        "generation_batch_size": FieldSpec(int, ge=1, le=1_048_576, optional=True, description="recipe grpo: "
                                           "completions generated at once (TRL generation_batch_size); default batch "
                                           "x accum x gpus; a multiple of batch x gpus and of num_generations"),
        "generation": FieldSpec(Generation, description="recipe grpo: who generates: hf (transformers' generate "
                                "on the policy, TRL's default), vllm-colocate (vLLM in the training process, "
                                "use_vllm=True, vllm_mode='colocate') or vllm-server (vLLM on another GPU, "
                                "vllm_mode='server': not on this card)"),
        "vllm_gpu_memory_utilization": FieldSpec(float, ge=0.01, lt=1.0, description="recipe grpo, vllm-colocate: "
                                                 "the share of the card vLLM reserves for its weights and KV cache "
                                                 "(TRL default 0.3)"),
        "vllm_enable_sleep_mode": FieldSpec(bool, description="recipe grpo, vllm-colocate: vLLM frees its weights "
                                            "and KV cache (sleep level 2) outside generation (TRL "
                                            "vllm_enable_sleep_mode, default off)"),
        "vllm_max_model_length": FieldSpec(int, ge=8, le=1_048_576, optional=True, description="recipe grpo, "
                                           "vllm-colocate: vLLM's max_model_len (default: the model's "
                                           "max_position_embeddings); its KV cache must hold one such sequence"),
        "vllm_importance_sampling_correction": FieldSpec(bool, description="recipe grpo, vLLM: TRL recomputes the "
                                                         "policy's log-probs of every completion to correct for "
                                                         "vLLM's sampling (default on): one more forward pass"),
        "beta": FieldSpec(float, ge=0.0, le=1e6, description="recipe grpo: KL coefficient (TRL default 0.0: no "
                          "reference model); > 0 scores every completion with a reference model (a second copy of "
                          "the weights for full fine-tuning, the adapter-disabled policy for LoRA/QLoRA)"),
        "fsdp_param_dtype": FieldSpec(FsdpParamDtype, description="FSDP under fp16-/bf16-mixed: the dtype its "
                                      "all-gather makes the parameters in: compute (MixedPrecision(param_dtype=the "
                                      "compute dtype): accelerate, torchtitan; the default) or fp32 (Lightning's "
                                      "FSDPPrecision: param_dtype float32 under torch.autocast, which caches a 16-bit "
                                      "copy of every gathered weight until the forward ends: one 16-bit copy of the "
                                      "weights beside the fp32 gathered layers; reportgen/estimate/sharding.py)"),
        "modeling": FieldSpec(Modeling, description="whose model code runs the layers: transformers (its "
                              "modeling files, the default) or torchtune (the TransformerDecoder its builders make: "
                              "k and v copied to every query head before SDPA, no attention mask on padded "
                              "batches, fp32 RoPE caches at the builder's max_seq_len; "
                              "reportgen/estimate/recipes.py)"),
        "kernels": FieldSpec(Kernels, description="the layers' elementwise kernels: eager (transformers' RMSNorm, "
                             "RoPE and SwiGLU modules, the default) or liger (Liger-Kernel's Triton RMSNorm, RoPE and "
                             "SwiGLU: one kernel each way, less saved; TRL use_liger_kernel, LLaMA-Factory "
                             "enable_liger_kernel; Llama, Mistral, Qwen2 and Qwen3 models; reportgen/estimate/liger.py)"),
        "rope_positions": FieldSpec(int, ge=1, le=16_777_216, optional=True, description="modeling torchtune: "
                                    "the positions its RoPE caches are built for (the builder's max_seq_len; "
                                    "default: the model config's max_position_embeddings)"),
        "eval_batch": FieldSpec(int, ge=1, le=4096, optional=True, description="the whole run: evaluation "
                                "micro-batch per GPU (per_device_eval_batch_size; default: no evaluation phase; "
                                "reportgen/estimate/run.py)"),
        "eval_seq": FieldSpec(int, ge=8, le=1_048_576, optional=True, description="evaluation sequence length "
                              "(default: seq)"),
        "eval_generate": FieldSpec(int, ge=1, le=1_048_576, optional=True, description="evaluation by generate(): "
                                   "new tokens per sample, with their KV cache (default: loss only)"),
        "save": FieldSpec(Save, optional=True, description="what a checkpoint save writes: none, adapter (peft's "
                          "save_pretrained), full (the whole state dict), fsdp-full (FSDP FULL_STATE_DICT gathered on "
                          "rank 0's host) or fsdp-sharded (each rank its shard); default: adapter for LoRA/QLoRA, "
                          "fsdp-full when FSDP shards the parameters, else full"),
        "load": FieldSpec(Load, optional=True, description="how the checkpoint is loaded: device (from_pretrained "
                          "with a device_map: each tensor read straight onto the GPU), cpu (into host RAM, then moved: "
                          "every rank holds the whole model for a while) or cpu-rank0 (FSDP_CPU_RAM_EFFICIENT_LOADING: "
                          "rank 0 loads, the others receive its broadcast); default: cpu-rank0 when FSDP shards the "
                          "parameters, else device"),
    }

    def __post_init__(self) -> None:
        for name, spec in self.model_fields.items():
            object.__setattr__(self, name, spec.check(name, getattr(self, name)))
        if self.gpus > 1 and self.sharding == Sharding.none:
            raise SetupError("sharding", f"gpus={self.gpus} needs sharding "
                             + ", ".join(repr(m.value) for m in Sharding if m != Sharding.none) + " (got 'none')")
        if self.gpus == 1 and self.sharding != Sharding.none:
            raise SetupError("sharding", f"sharding {self.sharding.value!r} needs gpus > 1 (got gpus=1)")
        if self.sharding == Sharding.hybrid_shard and self.gpus > NODE_GPUS and self.gpus % NODE_GPUS:
            raise SetupError("gpus", f"{self.gpus} GPUs for hybrid-shard, which shards within nodes of {NODE_GPUS} and "
                             f"replicates across them: a multiple of {NODE_GPUS} (or {NODE_GPUS} or fewer)")
        if self.offload == Offload.params and self.sharding in (Sharding.ddp, Sharding.zero1, Sharding.zero2):
            raise SetupError("offload", "offload 'params' is FSDP's CPU offload or ZeRO-3's offload_param: use "
                             f"sharding 'fsdp', 'shard-grad-op', 'hybrid-shard', 'no-shard', 'zero3' or 'none', "
                             f"not {self.sharding.value!r}")
        if self.optimizer_in_backward and self.accum > 1:
            raise SetupError("optimizer_in_backward", "steps the optimizer during each backward, so it cannot "
                             f"accumulate gradients over micro-batches (accum={self.accum}); use accum 1")
        if self.optimizer_in_backward and self.offload != Offload.none:
            raise SetupError("optimizer_in_backward", "is not combined with CPU offload")
        if self.quant_head and self.method != Method.qlora:
            raise SetupError("quant_head", "quantizes the LM head with the other 4-bit linears: needs method qlora")
        if self.dora and self.method == Method.full:
            raise SetupError("dora", "decomposes the LoRA adapters' weight update: needs method lora or qlora")
        peft_mixed = self.method != Method.full and self.precision in (Precision.fp16_mixed, Precision.bf16_mixed)
        if self.frozen_dtype == FrozenDtype.fp32 and not peft_mixed:
            raise SetupError("frozen_dtype", "fp32 frozen weights are a LoRA/QLoRA mixed-precision choice: needs "
                             "method lora or qlora and precision fp16-mixed or bf16-mixed")
        if self.kbit_prep is not None and self.method != Method.qlora:
            raise SetupError("kbit_prep", "prepares a 4-bit model: needs method qlora")
        if self.kbit_prep not in (None, KbitPrep.none) and not peft_mixed:
            raise SetupError("kbit_prep", f"{self.kbit_prep.value!r} is the mixed-precision recipe (TRL/Trainer "
                             "bf16=True); with precision bf16 or fp32 use 'none'")
        self._check_loss_and_gather()
        if self.rope_positions is not None and self.modeling != Modeling.torchtune:
            raise SetupError("rope_positions", "is the length torchtune's RoPE caches are built at: needs modeling "
                             "torchtune (transformers' model computes its rotations per step)")
        if self.kernels == Kernels.liger and self.modeling != Modeling.transformers:
            raise SetupError("kernels", "liger patches transformers' modules; modeling torchtune runs torchtune's own "
                             "layers (use kernels eager)")
        if self.modeling == Modeling.torchtune and self.attn != Attention.sdpa:
            raise SetupError("modeling", "torchtune's attention is SDPA (its recipes read no attention setting): "
                             f"attn {self.attn.value} is transformers'")
        if self.modeling == Modeling.torchtune and self.recipe != Recipe.loop:
            raise SetupError("modeling", "torchtune's model runs in torchtune's own recipes (recipe loop); "
                             f"{self.recipe.value} runs transformers' models")
        if self.recipe != Recipe.loop:
            self._check_trainer()
        if self.recipe == Recipe.trl_sft:
            self._check_trl_sft()
        self._check_grpo()
        self._check_seq_mean()
        self._check_run()
        # derived facts the estimator reads thousands of times per search: computed once
        d = self.__dict__
        d["is_peft"] = self.method in (Method.lora, Method.qlora)
        d["autocast"] = self.precision in (Precision.fp16_mixed, Precision.bf16_mixed)
        # the preparation the QLoRA recipe applies (kbit_prep; None = the recipe's default)
        # (TRL 1.16's SFTTrainer prepares nothing: its default is the load dtype, ``none``)
        trl = self.recipe in (Recipe.trl_sft, Recipe.grpo)
        d["kbit"] = (self.kbit_prep or (KbitPrep.peft if peft_mixed and not trl
                                        else KbitPrep.none)) if self.method == Method.qlora else KbitPrep.none
        d["compute_dtype"] = {"fp32": "fp32", "fp16-mixed": "fp16", "bf16-mixed": "bf16",
                              "bf16": "bf16"}[self.precision.value]

    def _check_loss_and_gather(self) -> None:
        """The loss variants and FSDP's gather dtype where they mean something (``estimate/logits.py``,
        ``estimate/sharding.py``)."""
        if self.loss == Loss.no_upcast and self.precision == Precision.fp32:
            raise SetupError("loss", "'no-upcast' computes the cross-entropy on 16-bit logits; under precision fp32 "
                             "the logits are fp32 already: use loss standard")
        if self.fsdp_param_dtype == FsdpParamDtype.fp32:
            if self.sharding not in FSDP_PARAM_SHARDING:
                raise SetupError("fsdp_param_dtype", "is the dtype FSDP gathers the parameters in: needs sharding "
                                 f"fsdp, shard-grad-op or hybrid-shard (got {self.sharding.value!r})")
            if self.method != Method.full:
                raise SetupError("fsdp_param_dtype", "'fp32' is modelled for full fine-tuning (Lightning's "
                                 "bf16-mixed keeps every weight fp32, so LoRA's frozen weights would be gathered "
                                 "in fp32 too): use method full, or compute")
            if self.precision not in (Precision.fp16_mixed, Precision.bf16_mixed):
                raise SetupError("fsdp_param_dtype", "'fp32' is FSDP's gather under autocast (fp16-/bf16-mixed); "
                                 f"under precision {self.precision.value} FSDP gathers the weights' own dtype: use "
                                 "compute")

    def _check_run(self) -> None:
        """The run's phases (``estimate/run.py``): what each of its choices needs."""
        if self.eval_batch is None and (self.eval_seq is not None or self.eval_generate is not None):
            field = "eval_seq" if self.eval_seq is not None else "eval_generate"
            raise SetupError(field, "describes the evaluation phase: give eval_batch (the evaluation micro-batch) too")
        if self.save == Save.adapter and self.method == Method.full:
            raise SetupError("save", "'adapter' saves LoRA/QLoRA adapters: a full fine-tune saves full, fsdp-full or "
                             "fsdp-sharded")
        if self.save in (Save.fsdp_full, Save.fsdp_sharded) and self.sharding not in FSDP_PARAM_SHARDING:
            raise SetupError("save", f"{self.save.value!r} is FSDP's state dict: needs sharding fsdp, shard-grad-op or "
                             f"hybrid-shard (got {self.sharding.value!r})")
        if self.load == Load.cpu and self.method == Method.qlora:
            raise SetupError("load", "QLoRA quantizes the weights while from_pretrained places them on the GPU "
                             "(bitsandbytes needs a device_map): use load device")
        if self.load == Load.cpu_rank0 and self.sharding not in FSDP_PARAM_SHARDING:
            raise SetupError("load", "'cpu-rank0' is FSDP's CPU-RAM-efficient loading (rank 0 loads, FSDP broadcasts "
                             f"with sync_module_states): needs FSDP sharding (got {self.sharding.value!r})")

    def _check_seq_mean(self) -> None:
        if self.seq_mean is not None and self.seq_mean > self.seq:
            raise SetupError("seq_mean", f"the mean sample length ({self.seq_mean}) cannot exceed seq, the longest "
                             f"({self.seq})")
        if self.seq_padded is None:
            return
        if self.seq_mean is None or self.padding != Padding.longest:
            raise SetupError("seq_padded", "is the mean padded length of batches padded to their longest sample: "
                             "needs padding longest and seq_mean")
        if not self.seq_mean <= self.seq_padded <= self.seq:
            raise SetupError("seq_padded", f"the mean padded length ({self.seq_padded}) lies between seq_mean "
                             f"({self.seq_mean}) and seq ({self.seq})")

    def _check_trainer(self) -> None:
        """What transformers' ``Trainer`` (and so ``SFTTrainer``) does not do: ``training_step``
        returns the loss only (``trainer.py``: ``compute_loss`` drops the outputs), and the optimizer
        steps after the backward."""
        if self.keep_outputs != KeepOutputs.none:
            raise SetupError("keep_outputs", f"transformers' Trainer keeps only the loss: use none with recipe "
                             f"{self.recipe.value}")
        if self.optimizer_in_backward:
            raise SetupError("optimizer_in_backward", "transformers' Trainer steps the optimizer after the "
                             f"backward: not with recipe {self.recipe.value}")

    def _check_trl_sft(self) -> None:
        """What TRL 1.16's ``SFTTrainer`` cannot run (``trl/trainer/sft_trainer.py``)."""
        if self.loss != Loss.standard:
            raise SetupError("loss", f"{self.loss.value!r} with recipe trl-sft: SFTTrainer computes its loss with its "
                             "own fused LM head (add_fused_lm_head) and refuses Liger's fused_linear_cross_entropy; "
                             "use loss standard (the recipe's own loss)")
        if self.kbit_prep == KbitPrep.trl:
            raise SetupError("kbit_prep", "'trl' is older TRL's preparation; TRL 1.16's SFTTrainer (recipe trl-sft) "
                             "calls neither prepare_model_for_kbit_training nor peft_module_casting_to_bf16: use "
                             "none (16-bit load) or peft (a float32 load leaves the same fp32 weights)")
        if self.quant_head:
            raise SetupError("quant_head", "transformers' 4-bit loading keeps lm_head in 16 bit: not with recipe "
                             "trl-sft")
        if self.is_peft_targets_head():
            raise SetupError("lora_targets", "SFTTrainer refuses a LoRA adapter on lm_head (its fused LM head "
                             "reads lm_head.weight directly); remove lm_head")

    def _check_grpo(self) -> None:
        """Recipe grpo's rules, TRL 1.16's own (``trl/trainer/grpo_config.py`` ``__post_init__`` 1096-1141),
        and its fields refused with any other recipe (they would change nothing)."""
        if self.recipe != Recipe.grpo:
            for name in self.GRPO_FIELDS:
                if getattr(self, name) != self.DUMPED_ONLY_WHEN_SET[name]:
                    raise SetupError(name, f"applies only to recipe grpo (got recipe {self.recipe.value})")
            return
        if self.gpus > 1:
            raise SetupError("gpus", "recipe grpo is modelled on one GPU (gpus 1)")
        if self.loss != Loss.standard:
            raise SetupError("loss", f"{self.loss.value!r} with recipe grpo: GRPOTrainer computes its log-probs with "
                             "its own fused LM head (add_fused_lm_head); use loss standard")
        if self.quant_head or self.is_peft_targets_head() or self.kbit_prep == KbitPrep.trl:
            raise SetupError("recipe", "grpo shares trl-sft's limits: no 4-bit or LoRA lm_head, no kbit_prep trl")
        c = self.max_completion_length
        if self.max_prompt_length is not None and self.seq != self.max_prompt_length + c:
            raise SetupError("seq", f"under recipe grpo seq is the prompt plus the completion: max_prompt_length "
                             f"{self.max_prompt_length} + max_completion_length {c} = {self.max_prompt_length + c} "
                             f"(got seq {self.seq}); drop seq or max_prompt_length")
        if self.seq <= c:
            raise SetupError("max_completion_length", f"{c} leaves no room for a prompt in seq {self.seq} (seq is "
                             "prompt + completion under recipe grpo)")
        if self.vllm_max_model_length is not None and self.vllm_max_model_length < self.seq:
            raise SetupError("vllm_max_model_length", f"{self.vllm_max_model_length} is shorter than seq "
                             f"{self.seq} (prompt + completion): vLLM refuses a longer prompt and cuts completions "
                             f"at it; give at least {self.seq}, or a shorter seq")
        per_step = self.batch * self.gpus
        if self.generation_batch_size is not None and self.generation_batch_size % per_step:
            raise SetupError("generation_batch_size", f"({self.generation_batch_size}) must be divisible by the "
                             f"global batch size ({per_step}) (TRL GRPOConfig)")
        if self.eval_batch is not None and (self.eval_batch * self.gpus) % self.num_generations:
            raise SetupError("eval_batch", f"the global eval batch ({self.eval_batch} x {self.gpus} GPU) must be "
                             f"divisible by num_generations ({self.num_generations}) (TRL GRPOConfig: evaluation "
                             "generates whole prompt groups)")
        if self.generation_batch % self.num_generations:
            src = ("generation_batch_size" if self.generation_batch_size is not None
                   else f"batch x accum = {self.batch} x {self.accum}")
            raise SetupError("num_generations", f"the generation batch ({src} = {self.generation_batch}) must be "
                             f"divisible by num_generations ({self.num_generations}) (TRL GRPOConfig: whole prompt "
                             f"groups only); e.g. batch {self.num_generations} (GRPOConfig's default "
                             "per_device_train_batch_size is 8), accum "
                             f"{self.num_generations // math.gcd(self.num_generations, self.batch * self.gpus)}, or "
                             "a num_generations of at least 2 that divides it")

    @property
    def generation_batch(self) -> int:
        """Sequences generated at once (TRL ``generation_batch_size``; default ``batch x gpus x accum``,
        ``steps_per_generation`` defaulting to ``gradient_accumulation_steps``)."""
        return self.generation_batch_size or self.batch * self.gpus * self.accum

    @property
    def prompt_length(self) -> int:
        """Recipe grpo: the longest prompt (``seq - max_completion_length``)."""
        return self.seq - self.max_completion_length

    def is_peft_targets_head(self) -> bool:
        return self.method != Method.full and "lm_head" in self.lora_targets.split(",")

    # ----- the pydantic-style API the rest of the code uses -------------------------------------
    @classmethod
    def model_validate(cls, data: "dict | TrainingSetup") -> "TrainingSetup":
        """A setup from a dict of field values; unknown keys are refused (like a sweep file's)."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise SetupError(None, f"a setup is a mapping of field names to values, not {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            raise SetupError(unknown[0], f"unknown setup field; fields: {', '.join(cls.model_fields)}")
        return cls(**data)

    @classmethod
    def model_validate_json(cls, text: str) -> "TrainingSetup":
        return cls.model_validate(json.loads(text))

    def model_dump(self, mode: str = "python") -> dict:
        """Field values; ``mode="json"``: enums as their string values."""
        out = {name: getattr(self, name) for name in self.model_fields
               if name not in self.DUMPED_ONLY_WHEN_SET or getattr(self, name) != self.DUMPED_ONLY_WHEN_SET[name]}
        if mode == "json":
            out = {k: v.value if isinstance(v, Enum) else v for k, v in out.items()}
        return out

    @classmethod
    def defaults_json(cls) -> dict:
        """Every field's default, enums as their string values (``model_dump`` of the default setup
        leaves out the fields of ``DUMPED_ONLY_WHEN_SET``)."""
        return {name: v.value if isinstance(v, Enum) else v
                for name, v in ((f.name, f.default) for f in dataclasses.fields(cls))}

    def model_dump_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    #: fields that no rule of ``__post_init__`` but ``_check_seq_mean`` relates to another, and that no
    #: derived fact reads: a copy changing only these is checked by those rules alone
    _FREE_FIELDS: ClassVar[frozenset] = frozenset({"batch", "seq"})

    def model_copy(self, update: dict | None = None) -> "TrainingSetup":
        """A copy with some fields changed, validated. The reverse searches make thousands of copies
        that change the batch or the length only (``estimate/search.py``): those are checked by the
        rules that read them, not by the whole ``__post_init__`` (which made half of a cold sweep's
        setup time)."""
        update = update or {}
        if not update or not update.keys() <= self._FREE_FIELDS or self.recipe == Recipe.grpo:
            return dataclasses.replace(self, **update)
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        for name, value in update.items():
            new.__dict__[name] = self.model_fields[name].check(name, value)
        new._check_seq_mean()
        return new

    # ----- derived facts the estimator uses (set in __post_init__) -----------------------------
    #: LoRA or QLoRA
    is_peft: ClassVar[bool]
    #: fp16/bf16 autocast (mixed precision)
    autocast: ClassVar[bool]
    #: dtype of matmul inputs/outputs: ``fp32``, ``fp16`` or ``bf16``
    compute_dtype: ClassVar[str]
    #: the QLoRA preparation in effect (``kbit_prep`` or its default; ``none`` for other methods)
    kbit: ClassVar[KbitPrep]

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
            parts.append(f"r{self.lora_rank} {self.lora_targets}")
            if self.lora_dropout:
                parts.append(f"dropout {self.lora_dropout:g}")
            if self.dora:
                parts.append("dora")
        parts.append(self.precision.value)
        if self.optimizer != Optimizer.adamw:
            parts.append(self.optimizer.value)
        if self.grad_ckpt:
            parts.append("ckpt")
        if self.attn != Attention.sdpa:
            parts.append(self.attn.value)
        if self.loss != Loss.standard:
            parts.append(f"{self.loss.value}-ce")
        if self.kernels == Kernels.liger:
            parts.append("liger")
        parts.append(f"b{self.batch} s{self.seq}")
        if self.accum > 1:
            parts.append(f"ga{self.accum}")
        if self.offload != Offload.none:
            parts.append(f"offload-{self.offload.value}")
        if self.gpus > 1:
            parts.append(f"{self.gpus}x {self.sharding.value}")
        if self.seq_mean is not None:
            parts.append(f"mean {self.seq_mean} {self.padding.value}"
                         + (f" to {self.seq_padded}" if self.seq_padded is not None else ""))
        elif self.padding == Padding.packed:
            parts.append("packed")
        if self.keep_outputs != KeepOutputs.none:
            parts.append(f"outputs-kept-{self.keep_outputs.value}")
        if self.optimizer_in_backward:
            parts.append("opt-in-bwd")
        if self.act_offload:
            parts.append("act-offload")
        if self.quant_head:
            parts.append("4bit-head")
        if self.frozen_dtype == FrozenDtype.fp32:
            parts.append("fp32-frozen")
        if self.eval_batch is not None:
            parts.append(f"eval b{self.eval_batch}" + (f" s{self.eval_seq}" if self.eval_seq else "")
                         + (f" gen{self.eval_generate}" if self.eval_generate else ""))
        if self.save is not None:
            parts.append(f"save-{self.save.value}")
        if self.load is not None:
            parts.append(f"load-{self.load.value}")
        if self.kbit_prep is not None:
            parts.append(f"kbit-prep-{self.kbit_prep.value}")
        if self.compile:
            parts.append("compile")
        if self.fsdp_param_dtype == FsdpParamDtype.fp32:
            parts.append("fsdp-fp32-gather")
        if self.modeling != Modeling.transformers:
            parts.append(f"{self.modeling.value}-modeling")
        if self.recipe != Recipe.loop:
            parts.append(self.recipe.value)
        if self.recipe == Recipe.grpo:
            parts.append(f"{self.num_generations}x{self.max_completion_length} {self.generation.value}")
            if self.generation == Generation.vllm_colocate:
                parts.append(f"util {self.vllm_gpu_memory_utilization:g}" + (" sleep" if self.vllm_enable_sleep_mode
                                                                          else ""))
            if self.beta:
                parts.append(f"beta {self.beta:g}")
        return " ".join(parts)

    def technique(self) -> str:
        """The technique label used for colours and grouping on the site."""
        label = {"full": "Full", "lora": "LoRA", "qlora": "QLoRA"}[self.method.value]
        return label + (" + ckpt" if self.grad_ckpt else "")
