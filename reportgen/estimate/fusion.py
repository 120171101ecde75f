"""What ``torch.compile`` changes: Inductor fuses the elementwise ops between the matmuls.

In eager mode every elementwise op of a decoder layer is its own kernel: it reads its inputs from
HBM and writes its output there, and autograd keeps what each op's backward needs. Compiled
(``torch.compile``, Inductor, ``mode="default"``), each chain of pointwise ops and reductions between
two matmuls becomes one Triton kernel that reads the chain's inputs once and writes its outputs
once; the matmuls still run in cuBLAS and attention in the same SDPA kernel, so the FLOPs are
unchanged. Two effects, both counted conservatively (only the ops listed here; residual adds, LoRA's
scaling, dropout, Gemma's extra norms and MoE routing are left as in eager):

* **Memory** (``saved_bytes_per_token``): AOTAutograd's default partitioner for Inductor,
  ``min_cut_rematerialization_partition`` (``torch/_functorch/partitioners.py``), saves the cheapest set
  of tensors and recomputes pointwise ops in the backward. RMSNorm's backward needs its input and
  the per-row rstd: the 16-bit input is saved instead of eager's fp32 copy (``ops.rms_norm``), saving
  ``(4 - stream bytes) x width`` per norm; SwiGLU's backward needs the gate and up outputs, and
  ``silu(gate)`` is recomputed instead of saved: ``compute bytes x intermediate`` per layer.
* **Time** (``fused_away_bytes_per_token``): the intermediates eager writes and reads back and the
  fused kernel keeps in registers. RMSNorm (``LlamaRMSNorm.forward``): ``x.to(float32)``, ``pow(2)``,
  ``x * rsqrt(...)`` (fp32 each) and ``.to(input_dtype)``: ``(12 + stream bytes) x width`` (8 x width
  when the stream is already fp32: both casts are no-ops). SwiGLU: the ``act_fn(gate)`` output. RoPE
  (``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin``, ``rotate_half`` = ``cat(-x2, x1)``): three
  full-size intermediates and a half-size one for q and for k, ``3.5 x compute bytes`` per element.
  Each is written and read once in the forward, its gradient written and read once in the backward,
  and once more in a recomputed forward. These kernels run one after another with the matmuls on
  one stream, so the bytes they no longer move are time the step no longer takes.

torchtitan's Llama 3.1 8B table (H100 96GB, FSDP on 8 GPUs) gains 15.7 % tokens/s from compile (5,762
to 6,667 tokens/s per GPU); this count gives less, as it
leaves out the other fusions (5.6 % for Llama 3.1 8B, full bf16, sequence 8,192, on an H100 SXM).
"""

from __future__ import annotations

from reportgen.estimate.dtypes import Dtypes
from reportgen.model import ModelSpec
from reportgen.setup import TrainingSetup

#: families whose pre-norms are RMSNorms on the residual stream (Phi-2: one LayerNorm, already one
#: kernel in eager; OLMo 2: no pre-norms)
_RMS_PRE_NORMS = 2


def _pre_norms(model: ModelSpec) -> int:
    return 0 if model.family in ("phi", "olmo2") else _RMS_PRE_NORMS


def _gated_width(model: ModelSpec) -> int:
    """The SwiGLU/GeGLU intermediate width of a dense gated MLP; 0 for Phi-2's ``gelu_new`` MLP and MoE
    layers (left as in eager)."""
    return 0 if model.family == "phi" or model.num_experts else model.intermediate_size


def saved_bytes_per_token(model: ModelSpec, dt: Dtypes, input_grad: bool = True) -> int:
    """Bytes per token and decoder layer that eager saves for backward and the compiled graph does
    not (module docstring): ``pre-norms x (4 - stream) x hidden + compute x intermediate``."""
    if not input_grad:
        return 0
    norms = _pre_norms(model) * max(0, 4 - dt.stream) * model.hidden_size
    return norms + dt.compute * _gated_width(model)


def fused_away_bytes_per_token(model: ModelSpec, dt: Dtypes) -> float:
    """Bytes per token and decoder layer of the forward's intermediates that fusion removes (module
    docstring): RMSNorm ``(12 + stream)`` or ``8`` x hidden each, the gated MLP's activation output and
    RoPE's ``3.5 x compute`` per q and k element."""
    per_norm = (12 + dt.stream if dt.stream < 4 else 8) * model.hidden_size
    rope = 3.5 * dt.compute * model.head_dim * (model.num_heads + model.num_kv_heads)
    return _pre_norms(model) * per_norm + dt.compute * _gated_width(model) + rope


def fusion_saved_bytes_per_micro_batch(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, tokens: float) -> float:
    """HBM traffic compile saves per micro-batch: each fused-away intermediate written and read once in
    the forward and its gradient once in the backward (``4 x``), plus ``2 x`` for the recomputed
    forward under checkpointing, in every decoder layer."""
    if not setup.compile:
        return 0.0
    per_pass_pairs = 4 + (2 if setup.grad_ckpt else 0)
    return per_pass_pairs * fused_away_bytes_per_token(model, dt) * model.num_layers * tokens


__all__ = ["fused_away_bytes_per_token", "fusion_saved_bytes_per_micro_batch", "saved_bytes_per_token"]
