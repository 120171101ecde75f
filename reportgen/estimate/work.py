"""What one training step asks of the GPU and of the host: kernels launched, ATen ops dispatched,
matmul and attention FLOPs, and the HBM bytes of the memory-bound kernels, phase by phase.

The time model (``time.py``) turns this inventory into seconds: every kernel is either a large
matmul (FLOPs at the matmul efficiency), a fused attention kernel (FLOPs at the attention
efficiency) or memory-bound (its bytes at the memory bandwidth), each with a fixed device cost per
launch, and every op the host dispatches costs host time. The roofline of one summed FLOP count
against one summed byte count (``max(compute, memory)``) that this replaces hid two things our H100
measurements (``results/validation/measured/``) showed: the elementwise kernels between the
matmuls run one after another with them, not under them, and a LoRA step dispatches thousands of
tiny kernels whose host time exceeds their GPU time.

The inventory follows the ops the Hugging Face step really dispatches, listed op by op from the
traced step (``reportgen trace``; ``trace/work.py`` counts the same quantities on the meta device,
``tests/test_work_vs_trace.py`` compares them family by family):

* **RMSNorm** (``LlamaRMSNorm.forward``): ``x.to(fp32)``, ``pow``, ``mean``, ``+ eps``, ``rsqrt``, ``*``,
  ``.to(input_dtype)``, ``weight *``: 8 kernels, 6 when the stream is already fp32 (both casts are
  no-ops); its backward 14 (+2 for a trainable weight's ``mul`` and ``sum``), 2 fewer in fp32.
* **Linear** (``F.linear`` -> ``mm``): under autocast a cast of a non-16-bit input and of a non-16-bit
  weight per call (``autocast_mode.cpp``: weights that require grad are cached per forward, each use
  of the others casts again); backward: the input-gradient ``mm`` when the input needs a gradient,
  the weight-gradient ``mm`` when the weight is trainable, and the casts' backward.
* **bitsandbytes 4-bit** (``MatMul4Bit``): ``dequantize_4bit`` before the forward ``mm`` and again
  before the backward's (``bitsandbytes/autograd/_functions.py``), plus ``dequantize_blockwise`` of
  the absmax under double quantization; ``Linear4bit`` casts its input to the compute dtype and its
  output back to the input's dtype.
* **peft LoRA** (``tuners/lora/layer.py`` ``Linear.forward``): the input cast to the adapter dtype
  when they differ, dropout (``native_dropout``: output and a bool mask), autocast's casts of the
  adapter input and of both adapter weights, ``lora_A`` and ``lora_B`` (rank-``r`` GEMMs: memory-bound),
  ``* scaling`` and the add to the base output; backward: 4 small GEMMs, the scaling's ``mul``, the
  add into the input's gradient, and the casts' backward.
* **peft DoRA** (``use_dora``, ``tuners/lora/dora.py`` ``DoraLinearLayer.forward``): per forward of each
  adapted linear ``B A`` through ``lora_B(lora_A(eye))``, the weight (dequantized for 4-bit) cast to
  ``x``'s dtype, ``W + scale B A`` and its row norm (``dora_weight_work``: 11 kernels, weight-sized
  bytes); the magnitude's combination of the base and LoRA outputs, ``tokens x out`` elementwise
  (``dora_combine``: 6 kernels forward, 14 backward); with dropout a second base GEMM each way.
* **RoPE** (``apply_rotary_pos_emb``: ``q * cos + rotate_half(q) * sin``): 5 kernels for q and 5 for k
  (7 each backward), computed in the dtype of ``cos``/``sin`` (the stream's) promoted with q's.
* **Attention**: SDPA's one fused kernel (flash / memory-efficient, FLOPs from PyTorch's
  ``torch.utils.flop_counter``, halved for a causal mask), or eager's two ``bmm`` and the ``s x s``
  scale, mask, fp32 softmax and casts (``eager_attention_forward``).
* **MLP**: SwiGLU's activation and product; **residual adds**; the **embedding**; the **head and
  loss** (``ForCausalLMLoss``: ``logits.float()``, ``log_softmax``, ``nll_loss``, and their backward);
* **optimizer**: the bytes ``optimizer_bytes_moved`` counts, in one fused kernel per chunk of
  tensors for ``torch.optim.AdamW(fused=True)`` and SGD's foreach path, one Python loop iteration
  and kernel per parameter for bitsandbytes' 8-bit optimizers and transformers' Adafactor.

Not modelled: Phi-2's LayerNorm/``gelu_new`` path and MoE routing are counted as the Llama layer
with their own linears; Gemma's ``1 + weight`` adds one kernel per norm; tensors smaller than a
token's worth are left out of the bytes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from functools import lru_cache

from reportgen.estimate import params as P
from reportgen.estimate.activations import sdpa_kernel, sdpa_kv_repeated, sdpa_masked_layers
from reportgen.estimate.dtypes import Dtypes, dtypes_for
from reportgen.estimate.libraries import CURRENT, Libraries
from reportgen.estimate.liger import LIGER_MODEL_TYPES
from reportgen.estimate.logits import liger_chunk_tokens, liger_grad_weight_traffic
from reportgen.model import Linear, ModelSpec
from reportgen.setup import Attention, Kernels, Method, Optimizer, TrainingSetup

#: a GEMM whose arithmetic intensity (FLOPs per byte of its operands and output) is at most this is
#: memory-bound on the catalog's cards: its bytes count, not its FLOPs. The ridge point of a card is
#: peak FLOP/s over bandwidth at the efficiencies reached (H100 SXM ~220, A100 and RTX 4090 ~120):
#: a LoRA adapter's rank-16 product has intensity ~16, the base projections thousands
GEMM_RIDGE_FLOPS_PER_BYTE = 128
#: ``torch.optim.AdamW(fused=True)`` and the foreach paths launch one kernel per chunk of tensors
#: (``aten/src/ATen/native/cuda/MultiTensorApply.cuh``: ``depth_to_max_tensors[3] = 110`` tensor
#: lists of up to ``kChunkSize = 65536`` elements per block, ``depth_to_max_blocks = 320``)
MULTI_TENSOR_ELEMENTS_PER_LAUNCH = 65536 * 320
MULTI_TENSOR_TENSORS_PER_LAUNCH = 110
#: kernels and views of the model's forward before the first layer besides the embedding lookup
#: (transformers 5 ``LlamaModel.forward``: ``position_ids``, ``create_causal_mask``, ``rotary_emb``),
#: counted in the traced step (``trace/work.py``) of Llama, Qwen2 and Mistral
PROLOGUE_KERNELS = 18
PROLOGUE_VIEWS = 10
#: the module calls around the layers: the causal LM, its model, the embedding, the rotary embedding,
#: the final norm, the head and the loss function
MODEL_CALLS = 7
#: HBM bytes per parameter of transformers' Adafactor step (fp32 update), traced: Llama 3.2 1B cut to
#: two layers, pure bf16 (``trace/work.py``): 104 bytes per parameter
ADAFACTOR_BYTES_PER_PARAM = 104


@dataclass(frozen=True)
class Work:
    """One phase of a step: what the GPU executes and what the host dispatches."""

    kernels: float = 0.0  # CUDA kernels launched (ATen ops that run one)
    views: float = 0.0  # ATen ops without a kernel (views, reshapes, detach): host time only
    matmul_flops: float = 0.0  # GEMMs with every dimension above SMALL_GEMM_DIM
    attention_flops: float = 0.0  # fused attention kernels, as executed (causal: half the square)
    bytes: float = 0.0  # HBM bytes read and written by the memory-bound kernels (small GEMMs included)
    calls: float = 0.0  # Python-level calls around the ops: module calls, autograd Functions, optimizer loops

    def __add__(self, other: "Work") -> "Work":
        return Work(self.kernels + other.kernels, self.views + other.views, self.matmul_flops + other.matmul_flops,
                    self.attention_flops + other.attention_flops, self.bytes + other.bytes, self.calls + other.calls)

    def __mul__(self, k: float) -> "Work":
        return Work(self.kernels * k, self.views * k, self.matmul_flops * k, self.attention_flops * k,
                    self.bytes * k, self.calls * k)

    __rmul__ = __mul__

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "Work":
        return cls(**{f.name: float(d.get(f.name, 0.0)) for f in fields(cls)})


@dataclass(frozen=True)
class StepWork:
    """Per micro-batch forward and backward (recomputation under checkpointing included in the
    backward), and the optimizer step once per optimizer step."""

    forward: Work
    backward: Work
    optimizer: Work
    accum: int = 1
    #: autocast is on in the forward (and checkpointing's recomputation, which restores its state)
    autocast: bool = False
    #: kernels of ``backward`` that are checkpointing's recomputed forward (dispatched under autocast)
    recompute_kernels: float = 0.0

    @property
    def total(self) -> Work:
        return (self.forward + self.backward) * self.accum + self.optimizer

    def as_dict(self) -> dict:
        return {"forward": self.forward.as_dict(), "backward": self.backward.as_dict(),
                "optimizer": self.optimizer.as_dict(), "accum": self.accum, "autocast": self.autocast,
                "recompute_kernels": self.recompute_kernels}

    @classmethod
    def from_dict(cls, d: dict) -> "StepWork":
        return cls(Work.from_dict(d["forward"]), Work.from_dict(d["backward"]), Work.from_dict(d["optimizer"]),
                   int(d.get("accum", 1)), bool(d.get("autocast", False)), float(d.get("recompute_kernels", 0.0)))


def _k(n: float = 1, nbytes: float = 0.0, views: float = 0) -> Work:
    """``n`` kernels moving ``nbytes`` in all; none (``n`` 0 or False: a cast or copy the setup does not
    need) move nothing."""
    return Work(kernels=n, bytes=nbytes if n else 0.0, views=views)


def gemm_is_compute_bound(m: float, k: float, n: float, c: int) -> bool:
    """``(m x k) @ (k x n)`` in ``c``-byte elements: above ``GEMM_RIDGE_FLOPS_PER_BYTE``."""
    return 2.0 * m * k * n > GEMM_RIDGE_FLOPS_PER_BYTE * c * (m * k + k * n + m * n)


def gemm(m: float, k: float, n: float, c: int, views: float = 3) -> Work:
    """One GEMM ``(m x k) @ (k x n)`` in ``c``-byte elements: its FLOPs when compute-bound, else its
    bytes (both operands and the output); ``views``: the ``t``/``view``/``_unsafe_view`` around
    ``F.linear``."""
    if gemm_is_compute_bound(m, k, n, c):
        return Work(kernels=1, views=views, matmul_flops=2.0 * m * k * n)
    return Work(kernels=1, views=views, bytes=c * (m * k + k * n + m * n))


def _promote(a: int, b: int) -> int:
    return max(a, b)


def dequant_bytes_per_weight(setup: TrainingSetup) -> float:
    """HBM bytes bitsandbytes' dequantization moves per 4-bit weight per use (forward, backward,
    recompute), traced from its code: ``bnb.matmul_4bit`` -> ``MatMul4Bit`` calls
    ``F.dequantize_4bit(B, quant_state)`` in ``forward`` and again in ``backward`` (for ``grad_A``),
    and the result feeds a plain ``torch.matmul``/``F.linear`` (``bitsandbytes/autograd/_functions.py``;
    CUDA's ``gemm_4bit`` takes the same ``_dequant_linear_fallback`` for training shapes).

    * ``dequantize_4bit`` reads the packed weight, 0.5 B, and its fp32 absmax, 4 B per block of 64
      (``blocksize=64``), and writes the weight in the compute dtype, 2 B for bf16/fp16:
      ``2.5 + 4/64 = 2.5625``;
    * with double quantization (``quant_state.nested``) it first rebuilds the fp32 absmax:
      ``dequantize_blockwise`` reads the uint8 absmax (1 B per 64 weights) and the fp32 second-level
      constants (4 B per 256 blocks) and writes the fp32 absmax (4 B per 64 weights):
      ``+ 1/64 + 4/(64 x 256) + 4/64``, 2.6409 B in all."""
    per = 0.5 + 4 / P.BNB_4BIT_BLOCKSIZE + dtypes_for(setup).compute
    if setup.double_quant:
        per += (1 + 4 / P.BNB_NESTED_BLOCKSIZE + 4) / P.BNB_4BIT_BLOCKSIZE
    return per


def optimizer_bytes_moved(model: ModelSpec, setup: TrainingSetup) -> float:
    """A fused AdamW step reads parameter, gradient and both states and writes parameter and states."""
    dt = dtypes_for(setup)
    trainable = P.trainable_params(model, setup)
    pbytes = P.trainable_dtype_bytes(setup, dt)
    state, managed = P.optimizer_state_bytes(model, setup, dt)
    return trainable * 3 * pbytes + 2 * (state + managed)


# ----- units of a decoder layer ------------------------------------------------------------------
def rms_norm(t: float, width: int, x: int, trainable: bool, fp32_weighted: bool) -> tuple[Work, Work]:
    """(forward, backward) of one RMSNorm over ``width`` features of ``t`` rows in ``x``-byte input
    (see the module docstring); the output keeps ``x``'s dtype. Gemma's ``1 + weight`` and OLMo 2's
    fp32 product (``fp32_weighted``) add one kernel each way."""
    casts = x != 4
    fwd = (8 if casts else 6) + (1 if fp32_weighted else 0)
    fbytes = t * width * (8 + 4 + 8 + 2 * x + (2 * (x + 4) if casts else 0)) + t * 24
    bwd = (14 if casts else 12) + (2 if trainable else 0) + (1 if fp32_weighted else 0)
    # mul(g, w); [mul(g, normed) and its sum: the weight's gradient]; cast; the fp32 chain (mul, mul,
    # sum, div, pow, mul, mul, add: 68 bytes per feature); the three per-row ops; cast
    bbytes = t * width * (2 * x + (4 * x if trainable else 0) + 68 + (2 * (x + 4) if casts else 0)) + t * 40
    return _k(fwd, fbytes, views=1), _k(bwd, bbytes)


def rope(t: float, width: int, c: int, table: int) -> tuple[Work, Work]:
    """``q * cos + rotate_half(q) * sin`` on one projection of ``width`` per token (q or k): mul, neg
    (half), cat, mul, add in ``o = promote(c, table)``; backward: mul, neg, two ``slice_backward``, add,
    mul, add, with two casts when ``o`` is fp32. (An fp32 result is cast for SDPA in ``attention_core``.)"""
    o = _promote(c, table)
    cast = o != c  # backward: the fp32 products' gradients are cast back for the 16-bit half
    fbytes = t * width * ((c + o) + c + 2 * c + (c + o) + 3 * o)
    bbytes = t * width * ((c + o) + c + 3 * c + 3 * c + (c + o) + 3 * c + (2 * (o + c) if cast else 0))
    return _k(5, fbytes, views=4), _k(7 + 2 * cast, bbytes, views=4)


def liger_rms_norm(t: float, width: int, x: int, rows: int, w: int) -> tuple[Work, Work]:
    """(forward, backward) of Liger's RMSNorm (``liger.py``) over ``width`` features of ``t`` tokens in
    ``x``-byte input, ``rows`` groups a token, a ``w``-byte weight: one kernel reads ``X`` and writes
    ``Y`` and the fp32 ``rstd``; the backward kernel reads ``dY``, ``X``, ``rstd`` and writes ``dX``, then
    ``_dW.sum(0)`` and, for a 16-bit weight, ``.to(W.dtype)`` (the ``sm_count x width`` partials are
    under a token's worth: not counted). Each way one ``autograd.Function`` call.
    Llama 3.2 1B, bf16, 4,096 tokens: forward 4096 x (2048 x 4 + 4) = 33,570,816 bytes, 1 kernel."""
    fwd = Work(kernels=1, views=2, bytes=t * width * 2 * x + t * rows * 4, calls=1)
    bwd = Work(kernels=2 + (w != 4), views=2, bytes=t * width * 3 * x + t * rows * 4, calls=1)
    return fwd, bwd


def liger_rope(t: float, q_width: float, k_width: float, c: int, head_dim: int, table: int) -> tuple[Work, Work]:
    """Liger's RoPE (``liger.py``): one kernel rotates q and k (``c`` bytes) in place each way, reading
    half a row of ``cos`` and of ``sin`` per token (``head_dim / 2`` each, ``table`` bytes); one Function
    call each way. (A gradient handed back head-major, by eager attention or SDPA's math path, is first
    copied by the backward's ``.contiguous()``: not counted.)"""
    bytes_ = t * ((q_width + k_width) * 2 * c + head_dim * table)
    return Work(kernels=1, views=6, bytes=bytes_, calls=1), Work(kernels=1, views=6, bytes=bytes_, calls=1)


def liger_swiglu(rows: float, width: int, act: int) -> tuple[Work, Work]:
    """Liger's SwiGLU (``liger.py``): forward reads gate and up and writes the product (``3 x I``);
    the backward reads ``dc``, gate and up and writes both gradients in place (``5 x I``)."""
    return (Work(kernels=1, views=3, bytes=rows * width * 3 * act, calls=1),
            Work(kernels=1, views=3, bytes=rows * width * 5 * act, calls=1))


@dataclass(frozen=True)
class _Lin:
    """What ``linear_unit`` needs to know about one linear in this setup."""

    lin: Linear
    x: int  # bytes of its input's dtype
    adapted: bool
    input_grad: bool


def linear_unit(t: float, u: _Lin, setup: TrainingSetup, dt: Dtypes) -> tuple[Work, Work, int]:
    """(forward, backward, output dtype bytes) of one linear with everything the setup wraps around
    it: autocast's casts, bitsandbytes' 4-bit path, a LoRA adapter (module docstring)."""
    lin, x, c = u.lin, u.x, dt.compute
    n_in, n_out, w = lin.in_features, lin.out_features, lin.in_features * lin.out_features * lin.count
    fwd, bwd = Work(), Work()
    if dt.quantized and lin.count == 1:
        deq = dequant_bytes_per_weight(setup) * w
        # dequantize_4bit; double quantization: dequantize_blockwise of the absmax and + offset first
        launches = 3 if setup.double_quant else 1
        cast = x != c  # Linear4bit: x.to(compute dtype), output .to(x's dtype)
        fwd += _k(launches, deq) + gemm(t, n_in, n_out, c) + _k(2 * cast, t * (n_in + n_out) * (x + c))
        if u.input_grad:
            bwd += _k(launches, deq) + gemm(t, n_out, n_in, c) + _k(2 * cast, t * (n_in + n_out) * (x + c))
        out = x
        if u.adapted:  # peft's 4-bit LoRA layer clones the base output ("defensively", lora/bnb.py)
            fwd += _k(1, t * n_out * 2 * x)
    else:
        wd = dt.base
        in_cast = dt.autocast and x != c
        w_cast = dt.autocast and wd != c
        b_cast = w_cast and lin.bias  # addmm's bias is cast like the weight
        fwd += _k(in_cast + w_cast + b_cast, (t * n_in * (x + c) if in_cast else 0) + (w * (wd + c) if w_cast else 0))
        fwd += gemm(t, n_in, n_out * lin.count if lin.count > 1 else n_out, c)
        if u.input_grad:
            bwd += gemm(t, n_out, n_in, c) + _k(in_cast, t * n_in * (c + x) if in_cast else 0)
        if dt.trainable_base:
            bwd += gemm(n_out, t, n_in, c) + _k(w_cast, w * (c + 4) if w_cast else 0)
            if lin.bias:  # the bias gradient: a sum over the tokens (and its cast back to fp32)
                bwd += _k(1 + b_cast, t * n_out * c)
        out = c if (dt.autocast or dt.base == c) else dt.base
    if u.adapted:
        f, b, out = lora_unit(t, n_in, n_out, x, out, setup, dt, u.input_grad, dora=dt.dora and lin.count == 1)
        fwd, bwd = fwd + f, bwd + b
    return fwd, bwd, out


def lora_unit(t: float, n_in: int, n_out: int, x: int, base_out: int, setup: TrainingSetup, dt: Dtypes,
              input_grad: bool, dora: bool = False) -> tuple[Work, Work, int]:
    """(forward, backward, result dtype) of one peft LoRA adapter on a linear (module docstring); with
    ``dora``, DoRA's weight-sized forward (``dora_weight_work``) and its combination of the base and
    LoRA outputs (``dora_combine``) instead of LoRA's ``* scaling`` and add."""
    a, c, r = dt.adapter, dt.compute, setup.lora_rank
    peft_cast = x != a and not (dt.quantized and dt.autocast)
    xa = a if peft_cast else x
    drop = setup.lora_dropout > 0
    ac_in = dt.autocast and xa != c
    w_cast = dt.autocast and a != c
    mm = c if dt.autocast else a
    res = _promote(base_out, mm)
    fwd = _k(peft_cast, t * n_in * (x + a) if peft_cast else 0)
    fwd += _k(drop, t * n_in * (2 * xa + 1) if drop else 0)
    fwd += _k(ac_in, t * n_in * (xa + c) if ac_in else 0) + _k(2 * w_cast, r * (n_in + n_out) * (a + c))
    fwd += gemm(t, n_in, r, mm) + gemm(t, r, n_out, mm)
    if dora:
        f, bwd, res = dora_combine(t, n_in, n_out, xa, base_out, setup, dt, input_grad)
        fwd += dora_weight_work(n_in, n_out, xa, setup, dt) + f
    else:
        fwd += _lora_combine(t, n_out, base_out, mm)
        bwd = _k(1 + (res != mm), t * n_out * (2 * mm + ((res + mm) if res != mm else 0)))
    bwd += gemm(r, t, n_out, mm) + gemm(t, n_out, r, mm) + gemm(r, t, n_in, mm)
    bwd += _k(2 * w_cast, r * (n_in + n_out) * (a + c))
    if input_grad:
        bwd += gemm(t, r, n_in, mm)
        bwd += _k(ac_in, t * n_in * (c + xa) if ac_in else 0) + _k(drop, t * n_in * (2 * xa + 1) if drop else 0)
        bwd += _k(peft_cast, t * n_in * (a + x) if peft_cast else 0)
        bwd += _k(1, t * n_in * 3 * x)  # added into the input's gradient
    return fwd, bwd, res


def _lora_combine(t: float, n_out: int, base_out: int, mm: int) -> Work:
    """LoRA's ``* scaling`` and its add to the base output (``Linear.forward``), forward."""
    return _k(2, t * n_out * (2 * mm + base_out + mm + _promote(base_out, mm)))


def dora_weight_work(n_in: int, n_out: int, xa: int, setup: TrainingSetup, dt: Dtypes) -> Work:
    """What DoRA runs once per forward of one adapted linear whatever the tokens (peft 0.21
    ``tuners/lora/dora.py`` ``DoraLinearLayer.forward``; counted op by op on a DoRA layer under
    ``TorchDispatchMode``, ``tests/test_dora.py``). ``xa``: the dtype DoRA works in (``x.dtype``,
    ``dora.dora_input_bytes``); nothing of it runs in the backward, the norm being detached:

    * ``get_lora_weight``: ``torch.eye(in)`` in the adapter dtype (autocast casts it for ``lora_A``),
      ``lora_B(lora_A(eye)).T``: two GEMMs whose rank-``r`` side makes them memory-bound (``gemm``:
      the ``in x in`` identity read, the ``in x out`` product written), then ``.to(x.dtype)``;
    * ``dequantize_module_weight(base_layer).to(x.dtype)``: a copy when the weight's dtype is not
      ``x``'s; for 4-bit, ``dequantize_4bit`` (``dequant_bytes_per_weight``) and the copy;
    * ``get_weight_norm``: ``scaling * lora_weight`` (read, write), ``weight + `` (read two, write),
      ``linalg.norm(dim=1)`` (read); then ``magnitude / weight_norm`` and ``- 1`` on ``out`` vectors.

    Llama 3.1 8B r16 LoRA bf16-mixed, down_proj (in 14336, out 4096, 58,720,256 weights): eye
    822,083,584 B written, its cast 1,233,125,376, ``lora_A`` 2 x (14336^2 + 2 x 14336 x 16) =
    411,959,296, ``lora_B`` 2 x (14336 x 16 + 16 x 4096 + 14336 x 4096) = 118,030,336, the two fp32
    copies 2 x 6 and the norm's 6 x 4 bytes per weight, 4096 x (4 + 16) for the vectors:
    4,699,209,728 bytes in 11 kernels."""
    a, c, r = dt.adapter, dt.compute, setup.lora_rank
    mm = c if dt.autocast else a
    eye_cast = dt.autocast and a != c
    w = n_in * n_out
    work = _k(1, n_in * n_in * a) + _k(eye_cast, n_in * n_in * (a + c) if eye_cast else 0)
    # lora_A(eye) and lora_B on it: one ``t`` of each weight; ``.T`` is a permute
    work += gemm(n_in, n_in, r, mm, views=1) + gemm(n_in, r, n_out, mm, views=2)
    work += _k(mm != xa, w * (mm + xa) if mm != xa else 0)
    if dt.quantized:
        work += _k(3 if setup.double_quant else 1, dequant_bytes_per_weight(setup) * w)
    stored = c if dt.quantized else dt.base
    work += _k(stored != xa, w * (stored + xa) if stored != xa else 0)
    # scaling *, weight +, the row norm; magnitude / norm, - 1; the two ``detach`` and ``.view(1, -1)``
    return work + _k(5, w * 6 * xa + n_out * (xa + 4 * a), views=3)


def dora_combine(t: float, n_in: int, n_out: int, xa: int, base_out: int, setup: TrainingSetup, dt: Dtypes,
                 input_grad: bool) -> tuple[Work, Work, int]:
    """(forward, backward, result dtype) of DoRA's per-token combination on one adapted linear, in
    place of LoRA's ``* scaling`` and add (peft 0.21 ``DoraLinearLayer.forward``:
    ``(mag_norm_scale - 1) * base_result + mag_norm_scale * lora_result * scaling``, added to the
    base output by ``DoraLinearVariant.forward``, cast back by ``lora/layer.py`` ``Linear.forward``'s
    ``result.to(torch_result_dtype)``; peft's 4-bit layer casts back only without autocast,
    ``lora/bnb.py``). ``mag_norm_scale`` is the magnitude's dtype promoted with the norm's, so the
    products are fp32 with fp32 adapters. Forward: 3 ``mul``, 2 ``add`` and the cast, ``tokens x out``
    each; backward: per product the gradients of both operands (a ``mul`` each, the vector's summed
    over the tokens, each cast back to its operand's dtype), the scaling's ``mul``, the casts of the
    adds, the two gradients of the base output summed when its input needs a gradient, and the
    magnitude's ``div``. With ``lora_dropout`` peft computes the base output again from the
    dropped-out input (``base_result = None`` -> ``F.linear(x, weight)``): a second base GEMM each
    way, autocast's casts of ``x`` and of the weight copy, and the input's two gradients summed.

    Llama 3.1 8B LoRA bf16-mixed, gate_proj (out 14336), 2048 tokens: forward 2048 x 14336 x
    (6 + 6 + 8 + 12 + 10 + 6) = 1,409,286,144 bytes in 6 kernels, backward 2048 x 14336 x 82 +
    14336 x 12 = 2,407,702,528 bytes in 14 kernels (against LoRA's 2 kernels and 10 bytes per value
    forward, 1 and 4 backward)."""
    a, c, n = dt.adapter, dt.compute, t * n_out
    mm = c if dt.autocast else a
    fwd, bwd, res0 = Work(), Work(), base_out
    if setup.lora_dropout > 0:
        lin_dt = c if dt.autocast else xa
        cast = dt.autocast and xa != c  # x and the weight copy (in x's dtype) cast for the GEMM
        fwd += _k(2 * cast, (t * n_in + n_in * n_out) * (xa + c) if cast else 0) + gemm(t, n_in, n_out, lin_dt)
        if input_grad:
            bwd += gemm(t, n_out, n_in, lin_dt) + _k(cast, t * n_in * (c + xa) if cast else 0)
            bwd += _k(1, t * n_in * 3 * xa)  # dropout's output feeds lora_A and F.linear: its gradients summed
        base_out = lin_dt
    p1, p2, p3, p4, out = _dora_dtypes(xa, base_out, res0, dt)
    fwd += _k(1, n * (base_out + p1)) + _dora_tail(n, mm, res0, (p1, p2, p3, p4, out))
    bwd += _k(out != p4, n * (out + p4) if out != p4 else 0)
    # the adds' and lora_result's gradients cast back (the base output's only when it needs one)
    casts = [(p4, res0)] * input_grad + [(p4, p3), (p3, p1), (p3, p2), (p2, mm)]
    bwd += _k(sum(x != y for x, y in casts), n * sum(x + y for x, y in casts if x != y))
    bwd += _k(1, n * 2 * p2)  # * scaling
    bwd += _k(1, n * 2 * p2) + _k(2, n * (2 * p2 + mm + p2))  # lora_result's gradient; m/n's: mul, sum
    bwd += _k(2, n * (2 * p1 + base_out + p1))  # (m/n - 1)'s gradient: mul, sum
    if input_grad:  # base_result's gradient, cast back; without dropout summed with the add's
        bwd += _k(1, n * 2 * p1) + _k(p1 != base_out, n * (p1 + base_out) if p1 != base_out else 0)
        bwd += _k(setup.lora_dropout == 0, n * 3 * res0 if setup.lora_dropout == 0 else 0)
    return fwd, bwd + _k(2, n_out * 12), out  # m/n's two gradients summed; the div's (magnitude's)


def _dora_dtypes(xa: int, base_out: int, res0: int, dt: Dtypes) -> tuple[int, int, int, int, int]:
    """DoRA's combination's dtypes: ``(m/n - 1) * base_result``, ``m/n * lora_result`` (and its
    ``* scaling``), their sum, ``result + result_dora``, and what the layer returns (``dora_combine``);
    ``m/n`` is the magnitude's dtype promoted with the norm's (``x``'s)."""
    s = max(dt.adapter, xa)
    mm = dt.compute if dt.autocast else dt.adapter
    p1, p2 = max(s, base_out), max(s, mm)
    p3 = max(p1, p2)
    p4 = max(res0, p3)
    return p1, p2, p3, p4, (p4 if (dt.quantized and dt.autocast) else res0)


def _dora_tail(n: float, mm: int, res0: int, p: tuple[int, int, int, int, int]) -> Work:
    """The combination's forward after ``(m/n - 1) * base_result`` over ``n`` output values:
    ``m/n * lora_result``, ``* scaling``, the two adds and the cast back."""
    p1, p2, p3, p4, out = p
    return (_k(4, n * ((mm + p2) + 2 * p2 + (p1 + p2 + p3) + (res0 + p3 + p4)))
            + _k(out != p4, n * (p4 + out) if out != p4 else 0))


def recompute_tail(t: float, u: _Lin, setup: TrainingSetup, dt: Dtypes) -> Work:
    """The part of the layer's last linear (``u``, the MLP's output projection) that checkpointing's
    recomputed forward does not run. ``torch.utils.checkpoint``'s non-reentrant checkpoint (what
    transformers 5 uses by default, ``modeling_utils._activation_checkpointing_enable``:
    ``{"use_reentrant": False}``, and what the harness asks for, ``measure/build.py``) stops the
    recomputation as soon as the last tensor the forward saved has been recomputed
    (``early_stop=True``: ``_recomputation_hook.pack_hook`` raises ``_StopRecomputationError``); an
    ATen op saves its inputs before its kernel runs, so the last op that saves anything does not run
    again, nor does anything after it. Counted on the CPU (``tests/test_checkpoint_recompute.py``):
    full fine-tuning skips the down projection's GEMM, LoRA the down projection's ``lora_B`` GEMM,
    ``* scaling`` and add, DoRA ``m/n * lora_result`` and what follows it. bitsandbytes' ``MatMul4Bit``
    (a Python ``autograd.Function``) saves when its forward has run, so a 4-bit layer without an
    adapter skips only ``Linear4bit``'s cast of the output back to its input's dtype. The residual add
    after it is ``layer_recompute_tail``'s."""
    lin, c = u.lin, dt.compute
    n_in, n_out = lin.in_features, lin.out_features
    if not u.adapted:
        if dt.quantized:
            return _k(u.x != c, t * n_out * (c + u.x) if u.x != c else 0)
        return gemm(t, n_in, n_out, c)
    base_out = u.x if dt.quantized else (c if (dt.autocast or dt.base == c) else dt.base)
    mm = c if dt.autocast else dt.adapter
    if not (dt.dora and lin.count == 1):
        return gemm(t, setup.lora_rank, n_out, mm) + _lora_combine(t, n_out, base_out, mm)
    xa = dt.adapter if (u.x != dt.adapter and not (dt.quantized and dt.autocast)) else u.x
    used = (c if dt.autocast else xa) if setup.lora_dropout > 0 else base_out  # F.linear again under dropout
    return _dora_tail(t * n_out, mm, base_out, _dora_dtypes(xa, used, base_out, dt))


def attention_core(model: ModelSpec, setup: TrainingSetup, attn: Attention, batch: int, seq: int,
                   c: int, qk: int) -> tuple[Work, Work]:
    """SDPA's fused kernel (one launch each way; FLOPs ``2 * 2 * s * s * d`` per head forward, halved
    by the causal mask, 2.5 times that backward, as ``torch.utils.flop_counter`` counts them), with
    autocast's casts of q and k when RoPE left them in fp32 (``qk`` bytes); eager attention's
    ``bmm``s and its ``s x s`` elementwise traffic otherwise, and for SDPA's math path (fp32
    grouped-query attention, ``activations.sdpa_kernel``), which runs the same ops."""
    nq, d, t = model.num_heads, model.head_dim, batch * seq
    square = batch * nq * seq * seq
    if attn == Attention.sdpa and sdpa_kernel(model, setup, c) == "math":
        # fp32 grouped-query attention: SDPA's composite math path, the same bmm, mask and softmax as eager
        attn = Attention.eager
    if attn == Attention.sdpa:
        f = 4.0 * square * d * 0.5
        cast = 2 if qk != c else 0  # autocast casts an fp32 q and k (RoPE in the fp32 stream's dtype)
        cbytes = t * (model.q_dim + model.kv_dim) * (qk + c) if cast else 0
        # backward: the gradients of q and k come back in SDPA's (batch, heads, seq, dim) layout and are
        # copied to the projections' (batch, seq, heads, dim) layout (``clone``)
        clones = t * (model.q_dim + model.kv_dim) * 2 * c
        # k and v copied to every query head before the kernel (transformers' ``repeat_kv`` under a mask,
        # torchtune's ``expand(...).flatten``: ``activations.sdpa_kv_repeated``): two copies forward, and
        # backward the two sums of their gradients over each group's heads back to k and v
        rep = 2 if model.num_kv_heads != nq and sdpa_kv_repeated(model, sdpa_masked_layers(model, setup) > 0,
                                                                 setup) else 0
        rbytes = t * (model.kv_dim + model.q_dim) * c * 2 if rep else 0
        return (Work(kernels=1 + cast + rep, views=4, attention_flops=f, bytes=cbytes + rbytes),
                Work(kernels=3 + cast + rep, views=3, attention_flops=2.5 * f, bytes=cbytes + clones + rbytes))
    rep = 2 if model.num_kv_heads != nq else 0  # repeat_kv: expand + clone of k and v
    rbytes = t * model.q_dim * c * 2 * (model.num_kv_heads / nq + 1) if rep else 0
    heads = batch * nq
    qk, pv = gemm(seq, d, seq, c) * heads, gemm(seq, seq, d, c) * heads  # per head, batched by bmm
    qk, pv = Work(1, 3, qk.matmul_flops, 0, qk.bytes), Work(1, 3, pv.matmul_flops, 0, pv.bytes)
    elementwise = square * (2 * c + 3 * c + (c + 4) + 8 + (4 + c))  # scale, + mask, .float(), softmax, cast
    fwd = qk + pv + Work(kernels=5 + rep + 1, views=6, bytes=elementwise + rbytes + t * model.q_dim * 2 * c)
    back = square * ((c + 4) + 12 + (4 + c) + 3 * c)  # cast, softmax backward, cast, scale
    bwd = (qk + pv) * 2 + Work(kernels=4 + rep + 1, views=4, bytes=back + rbytes + t * model.q_dim * 2 * c)
    return fwd, bwd


def _input_group(t: float, width: int, x: int, consumers: int, grad_dtype: int) -> Work:
    """The gradient of a tensor read by ``consumers`` ops is summed: ``consumers - 1`` adds."""
    n = max(0, consumers - 1)
    return _k(n, n * t * width * 3 * grad_dtype)


def mlp_activation(model: ModelSpec, rows: float, width: int, act: int) -> tuple[Work, Work]:
    """SwiGLU / GeGLU in eager ATen ops: ``act(gate)`` and the product (Phi-2's ``fc1 -> gelu``: the
    activation only), over ``rows x width`` elements of ``act`` bytes."""
    n_act = 1 if model.family == "phi" else 2
    return (_k(n_act, rows * width * (2 * act + (3 * act if n_act == 2 else 0))),
            _k(n_act + 1, rows * width * (3 * act + (6 * act if n_act == 2 else 0))))


def layer_work(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, attn: Attention, batch: int, seq: int,
               input_grad: bool = True) -> tuple[Work, Work]:
    """(forward, backward) of one decoder layer for a micro-batch of ``batch x seq`` tokens."""
    t, h, c, s = batch * seq, model.hidden_size, dt.compute, dt.stream
    lora = set(model.lora_selection(setup.lora_targets).linears) if setup.is_peft else set()
    lins = {lin.name: lin for lin in model.layer_linears()}
    fp32w = model.family in ("gemma", "gemma2", "gemma3", "olmo2")
    norm_train = dt.trainable_base
    lg = setup.kernels is Kernels.liger and model.model_type in LIGER_MODEL_TYPES
    fwd, bwd = Work(), Work()

    def norm(width: int, x: int, rows: int = 1) -> tuple[Work, Work]:
        return liger_rms_norm(t, width, x, rows, dt.base) if lg else rms_norm(t, width, x, norm_train, fp32w)

    def add(pair):
        nonlocal fwd, bwd
        fwd, bwd = fwd + pair[0], bwd + pair[1]

    def linears(names: list[str], x: int, grad: bool) -> int:
        out = c
        for name in names:
            f, b, out = linear_unit(t, _Lin(lins[name], x, name in lora, grad), setup, dt)
            add((f, b))
        if grad:
            add((Work(), _input_group(t, lins[names[0]].in_features, x, len(names), x)))
        return out

    if model.family != "olmo2":  # Olmo2DecoderLayer has no pre-norms
        add(norm(h, s))
    if not input_grad:  # the pre-norm's backward is not run either
        bwd += norm(h, s)[1] * -1
    qkv_out = linears(model.attn_in_names(), s, input_grad)
    if model.qk_norm_widths:
        q_w, k_w = model.qk_norm_widths
        per_head = model.family != "olmo2"
        # transformers' even under Liger, whose instance patch leaves Qwen3's q/k norms (liger.QWEN3_NOTE)
        add(rms_norm(t, model.q_dim if per_head else q_w, qkv_out, norm_train, fp32w))
        add(rms_norm(t, model.kv_dim if per_head else k_w, qkv_out, norm_train, fp32w))
    rot = model.rotary_dim / model.head_dim
    table = 4 if model.family == "olmo2" else s
    if lg:
        add(liger_rope(t, model.q_dim, model.kv_dim, qkv_out, model.head_dim, table))
    else:
        for width in (model.q_dim, model.kv_dim):
            add(rope(t, width * rot, qkv_out, table))
    qk = qkv_out if lg else _promote(qkv_out, table)  # Liger rotates q and k in place, in their own dtype
    add(attention_core(model, setup, attn, batch, seq, c, qk))
    o_out = linears([model.attn_out_name], c, True)
    # residual add (stream + attention output) and the norms between attention and MLP
    add((_k(1, t * h * (s + o_out + s)), _k(1, t * h * 3 * s)))
    if model.family not in ("olmo2", "phi"):  # post_attention_layernorm (Gemma 2/3: pre_feedforward_layernorm)
        add(norm(h, s))
    i = model.intermediate_size
    rows = t  # tokens through the MLP's linears (MoE: each token through its top-k experts)
    if model.num_experts:  # the router, its softmax and top-k, the dispatch to the experts and back
        e, k = model.num_experts, model.experts_per_token
        f, b, _ = linear_unit(t, _Lin(lins["router"], s, "router" in lora, True), setup, dt)
        add((f + _k(12, t * (e * 12 + h * 2 * c * k)), b + _k(12, t * (e * 12 + h * 2 * c))))
        rows = t * k
        up_lin = dataclasses.replace(lins["experts.gate_up_proj"], count=1)
        f, b, up_out = linear_unit(rows, _Lin(up_lin, c, up_lin.name in lora, True), setup, dt)
        add((f, b))
    else:
        up_out = linears(model.mlp_in_names(), s, True)
    act = up_out if dt.quantized else c
    add(liger_swiglu(rows, i, act) if lg else mlp_activation(model, rows, i, act))
    if model.num_experts:
        down = dataclasses.replace(lins["experts.down_proj"], count=1)
        add(linear_unit(rows, _Lin(down, act, down.name in lora, True), setup, dt)[:2])
        down_out = s
    else:
        down_out = linears([model.mlp_out_name], act, True)
    # the residual add: the stream plus the MLP's output (fp32 stream + 16-bit output under autocast)
    add((_k(1, t * h * (2 * s + down_out)), _k(1, t * h * 3 * s)))
    if model.family in ("gemma2", "gemma3", "olmo2"):  # post-attention and post-feedforward norms
        add(rms_norm(t, h, c, norm_train, fp32w))
        add(rms_norm(t, h, c, norm_train, fp32w))
    f_calls, b_calls = layer_calls(model, setup, lora, input_grad)
    return fwd + Work(calls=f_calls), bwd + Work(calls=b_calls)


def layer_calls(model: ModelSpec, setup: TrainingSetup, lora: set[str], input_grad: bool) -> tuple[int, int]:
    """Python-level calls of one decoder layer (forward, backward): each ``nn.Module`` call (the layer,
    its norms, attention, MLP and activation modules and every linear; peft wraps an adapted linear
    around ``base_layer``, ``lora_A``, ``lora_B`` and ``lora_dropout``: 4 more; DoRA 3 more, peft
    ``DoraLinearLayer.forward`` calling ``lora_B(lora_A(eye))``), and bitsandbytes'
    ``MatMul4Bit`` autograd Function per 4-bit linear, whose ``forward`` and ``backward`` are Python.
    The backward's other ops are dispatched by the autograd engine in C++."""
    lins = model.layer_linears()
    norms = model.norms_per_layer + (2 if model.qk_norm_widths else 0)
    calls = 4 + norms + len(lins) + 4 * sum(lin.name in lora for lin in lins)
    if setup.is_peft and setup.dora:  # DoraLinearLayer, and lora_A and lora_B once more on the identity
        calls += 3 * sum(lin.name in lora and lin.count == 1 for lin in lins)
    quantized = sum(lin.count == 1 for lin in lins) if setup.method == Method.qlora else 0
    back = quantized - (len(model.attn_in_names()) if not input_grad and quantized else 0)
    return calls + quantized, back


def head_work(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, tokens: float) -> tuple[Work, Work]:
    """The embedding lookup, the final norm, the LM head and the loss (``logits.py``'s recipe):
    ``lm_head`` GEMM; ``logits.float()``, ``log_softmax``, ``nll_loss`` forward; their backward
    (``nll_loss_backward`` writes ``4V`` per token, ``_log_softmax_backward_data`` reads ``8V`` and
    writes ``4V``, the cast back ``4V + cV``) and the head's input (and weight) gradient GEMMs.
    Torchtune's chunked loss moves the same bytes in 8 chunks (compiled or not: the compiled chunk's
    fewer bytes are not counted apart; nor are the no-upcast loss's 16-bit ones). Liger's fused linear
    cross-entropy runs the head's GEMMs and the loss chunk by chunk in its forward (``liger_loss_work``).
    Adapters on the head and a 4-bit head (``quant_head``) are not counted here."""
    h, v, c, s, t = model.hidden_size, model.vocab_size, dt.compute, dt.stream, tokens
    lg = setup.kernels is Kernels.liger and model.model_type in LIGER_MODEL_TYPES
    norm_f, norm_b = liger_rms_norm(t, h, s, 1, dt.base) if lg else rms_norm(
        t, h, s, dt.trainable_base, model.family in ("gemma", "gemma2", "gemma3", "olmo2"))
    emb_f = _k(1 + (1 if model.family in ("gemma", "gemma2", "gemma3") else 0), t * h * s * 2)
    # the model's prologue: position ids, the causal mask's checks and the RoPE table (``rotary_emb``:
    # arange, cumsum, the inverse frequencies' outer product, cat, cos, sin, scaling, casts)
    emb_f += Work(kernels=PROLOGUE_KERNELS, views=PROLOGUE_VIEWS, bytes=t * model.head_dim * 4 * 6,
                  calls=MODEL_CALLS)
    head_w, fused = dt.embed_bytes, setup.loss.value == "fused"
    cast = dt.autocast and head_w != c
    head_f, head_b = liger_loss_work(v, h, c, dt, t, cast) if fused else (
        gemm(t, h, v, c) + _k(cast, v * h * (head_w + c)),
        gemm(t, v, h, c) + (gemm(v, t, h, c) if dt.trainable_base else Work()))
    fwd = norm_f + emb_f + head_f
    bwd = norm_b + head_b
    if dt.trainable_base:  # embedding_dense_backward: zero the V x h gradient, scatter-add the rows
        bwd += _k(3, v * h * 4 + t * h * (s + 4))
        if cast and not fused:  # the head's weight gradient cast back to its fp32 weight (Liger's is fp32)
            bwd += _k(1, v * h * (c + 4))
        if model.tie_word_embeddings:  # the head's and the embedding's gradients summed into one
            bwd += _k(1, v * h * 3 * head_w)
    if fused:
        return fwd, bwd
    chunks = 8 if setup.loss.value in ("chunked", "chunked-compiled") else 1
    soft = 3 if model.final_logit_softcapping else 0  # div, tanh, mul
    fwd += _k(chunks * (3 + soft), t * v * ((c + 4) + 8 + soft * 2 * c) + t * 16)
    bwd += _k(chunks * (4 + soft), t * v * (4 + 12 + (4 + c) + soft * 3 * c))
    return fwd, bwd


def liger_loss_work(v: int, h: int, c: int, dt: Dtypes, t: float, cast: bool) -> tuple[Work, Work]:
    """Liger's fused linear cross-entropy over ``t`` tokens (``ops/fused_linear_cross_entropy.py``), all in the
    loss's forward, ``n`` chunks of ``t / n`` rows (``logits.liger_chunk_tokens``): per chunk the logits
    GEMM, its loss kernel (reads and writes the chunk's logits in place), the input-gradient GEMM and its
    copy into ``grad_input``, and for a trainable head the weight-gradient GEMM summed into ``grad_weight``
    (``logits.liger_grad_weight_traffic``; in place, the GEMM's epilogue reads and writes it, and a
    memory-bound ``gemm`` already counts the write). Each chunk's GEMMs read the whole ``V x h`` head, so
    small chunks make them memory-bound (``gemm``). Fixed per call: the zeroed ``grad_input``, loss and
    (trainable head) ``grad_weight`` buffers, the target mask and its sum. ``cast``: the head is cast to the
    compute dtype under autocast, once for a trainable head (autocast caches the cast of a leaf that needs a
    gradient), before each of its two GEMMs a chunk for a frozen one. The loss's backward only scales the
    two gradients (``element_mul_kernel``)."""
    n, tb, w = math.ceil(t / liger_chunk_tokens(t, v, h)), dt.trainable_base, dt.embed_bytes
    rows = t / n
    gemms = gemm(rows, h, v, c) + gemm(rows, v, h, c) + (gemm(v, rows, h, c) if tb else Work())
    acc, _, sums = liger_grad_weight_traffic(v * h, c, w, dt.flce_in_place) if tb else (0, 0, 0)
    if tb and dt.flce_in_place and not gemm_is_compute_bound(v, rows, h, c):
        acc -= c * v * h
    casts = (1 if tb else 2 * n) if cast else 0
    loop = Work(kernels=5 + tb + n * (2 + sums) + casts, calls=n,
                bytes=t * v * c * 2 + 3 * t * h * c + tb * v * h * w + n * acc + casts * v * h * (w + c))
    return gemms * n + loop, _k(1 + tb, t * h * c * 2 + 2 * v * h * w * tb)


def optimizer_work(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> Work:
    """The optimizer step: ``optimizer_bytes_moved`` in the kernels each optimizer launches (module
    docstring); bitsandbytes' and transformers' optimizers loop over the parameters in Python."""
    trainable = P.trainable_params(model, setup)
    tensors = sum(count for _, count in P.trainable_shapes(model, setup))
    moved = optimizer_bytes_moved(model, setup)
    if setup.optimizer in (Optimizer.adamw, Optimizer.sgd):
        launches = max(math.ceil(trainable / MULTI_TENSOR_ELEMENTS_PER_LAUNCH),
                       math.ceil(tensors / MULTI_TENSOR_TENSORS_PER_LAUNCH))
        return Work(kernels=launches + 2, views=4, bytes=moved, calls=2)
    if setup.optimizer == Optimizer.adafactor:
        # transformers' Adafactor.step: per tensor, in Python, fp32 copies of the gradient and the
        # parameter, grad**2 + eps, the row and column means into the factored states, their rsqrt
        # product, the update's rms clipping, the parameter update and the copy back: 25 kernels and
        # ADAFACTOR_BYTES_PER_PARAM per parameter, counted in the traced step (trace/work.py)
        return Work(kernels=25 * tensors, views=2 * tensors, bytes=ADAFACTOR_BYTES_PER_PARAM * trainable, calls=tensors)
    # bitsandbytes' Optimizer8bit.step: a Python loop, one update kernel per tensor
    return Work(kernels=tensors, views=tensors, bytes=moved, calls=tensors)


def layer_recompute_tail(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, t: float) -> Work:
    """What a checkpointed layer's recomputed forward does not run (``recompute_tail``): the
    residual add that ends the layer and, where the MLP's output projection is the layer's last op
    that saves a tensor (the pre-norm layers; not Gemma 2/3 or OLMo 2, whose post-feedforward norm
    follows it, nor an MoE's expert combination), the part of that projection ``recompute_tail``
    names (Gemma 2/3 and OLMo 2: the residual add alone, their post-norm's last product left in).
    Counted on the CPU for Llama: 4 of LoRA's 94 kernels a layer, 2 of full fine-tuning's 48."""
    h, s = model.hidden_size, dt.stream
    if model.num_experts:
        return _k(1, t * h * 3 * s)
    lins = {lin.name: lin for lin in model.layer_linears()}
    lora = set(model.lora_selection(setup.lora_targets).linears) if setup.is_peft else set()
    up = model.mlp_in_names()[-1]
    up_out = linear_unit(t, _Lin(lins[up], s, up in lora, True), setup, dt)[2]
    down = _Lin(lins[model.mlp_out_name], up_out if dt.quantized else dt.compute, model.mlp_out_name in lora, True)
    down_out = linear_unit(t, down, setup, dt)[2]
    tail = _k(1, t * h * (2 * s + down_out))  # the residual add, as ``layer_work`` counts it
    if model.family in ("gemma2", "gemma3", "olmo2"):
        return tail
    return tail + recompute_tail(t, down, setup, dt)


@lru_cache(maxsize=4096)
def step_work(model: ModelSpec, setup: TrainingSetup, attn: Attention, seq: int | None = None,
              libs: Libraries | None = None) -> StepWork:
    """The whole step's inventory for micro-batches of ``setup.batch x seq`` tokens (``seq``: the
    padded length the kernels process; default ``setup.seq``; ``libs``: a published run's library
    versions, None for the harness's). Memoized: a sweep, a search or the calibration prices the same
    step many times (None keeps the memo's key cheap: a ``Libraries`` hashes in Python)."""
    dt = dtypes_for(setup, libs or CURRENT)
    seq = seq or setup.seq
    f, b = layer_work(model, setup, dt, attn, setup.batch, seq)
    L = model.num_layers
    fwd, bwd = f * L, b * (L - 1)
    # PEFT without checkpointing: the first layer's input (the frozen embedding's output) needs no
    # gradient, so its input-side backward ops are not run (``activations.layer_activations``)
    bwd += layer_work(model, setup, dt, attn, setup.batch, seq, input_grad=not setup.is_peft or setup.grad_ckpt)[1]
    # each layer's forward runs again inside the backward, up to its last saved tensor (``recompute_tail``)
    tail = layer_recompute_tail(model, setup, dt, setup.batch * seq) if setup.grad_ckpt else Work()
    recompute = (f + tail * -1) * L if setup.grad_ckpt else Work()
    hf, hb = head_work(model, setup, dt, setup.batch * seq)
    return StepWork(forward=fwd + hf, backward=bwd + recompute + hb, optimizer=optimizer_work(model, setup, dt),
                    accum=setup.accum, autocast=dt.autocast, recompute_kernels=recompute.kernels)


__all__ = ["GEMM_RIDGE_FLOPS_PER_BYTE", "StepWork", "Work", "dequant_bytes_per_weight", "gemm", "optimizer_bytes_moved",
           "step_work"]
