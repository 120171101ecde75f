"""What CUDA kernels allocate that their meta kernels do not show, one small function each.

A meta kernel gives an op's outputs; the CUDA kernel the harness runs may choose another
algorithm (SDPA's flash kernel instead of the math path meta takes), keep other tensors for
backward (the fused dropout's bool mask) or allocate scratch through the caching allocator while
it runs (FlashAttention-2's backward accumulators, bitsandbytes' dequantized weight, cuBLAS
workspaces). Each function here reproduces those allocations on meta, with its source; the
tracer lists the ones a trace used (``emulations.py``).

Two kinds: function-level replacements called from ``functions.CudaFunctions`` (above autograd,
so autograd saves what the CUDA op saves), and kernel-level handlers for ``Recorder.kernels``
(below autograd, so their scratch tensors are allocated and freed inside the op).
"""

from __future__ import annotations

import torch

DEVICE = "meta"
#: bitsandbytes' CUDA ``gemm_4bit`` takes its fused kernel up to this many rows and always for
#: M <= 4 (``backends/cuda/ops.py`` ``_GEMM_4BIT_CUSTOM_FLOOR_M``); training shapes (M = batch x seq
#: tokens > ``_gemm_4bit_custom_max_m`` = 1536) always take the dequantize + ``F.linear`` fallback.
BNB_GEMM_4BIT_FUSED_MAX_M = 4
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "_scaled_mm"})


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


# ----- function level (above autograd) -------------------------------------------------------
def sdpa_backend(query, key, value, attn_mask, dropout_p: float, enable_gqa: bool = False) -> str:
    """The backend CUDA's ``select_sdp_backend`` takes for these inputs on sm80+ (H100, A100, L4,
    RTX 30xx/40xx), ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` as of torch 2.11 (the
    harness's), priority flash > efficient > math:

    * flash (``can_use_flash_attention``): fp16/bf16, no ``attn_mask``, q/k/v head dims equal and
      <= 256; k/v may have fewer heads only with ``enable_gqa`` (``check_batch_size_and_num_heads_dense
      <true>``: grouped-query attention);
    * memory-efficient (``can_use_mem_efficient_attention``): fp16/bf16/fp32, masks allowed, head dim
      a multiple of the GEMM alignment (8 for 16-bit, 4 for fp32 on sm80+), and the same number of
      heads in q, k and v (``check_batch_size_and_num_heads_dense<false>``: no grouped-query
      attention, whatever ``enable_gqa`` says);
    * else math. So fp32 inputs of a grouped-query model, which transformers passes with
      ``enable_gqa=True`` when there is no mask (``integrations/sdpa_attention.py``
      ``use_gqa_in_sdpa``), take the math path and keep the ``s x s`` probabilities. (PyTorch PR
      #191085, July 2026, adds grouped-query attention to the memory-efficient kernel for a later
      release; torch 2.11 falls back to math, as measured: ``results/validation``, Llama-3.2-1B
      LoRA fp32.)

    cuDNN attention is tried first on sm90/sm100 when the runtime cuDNN is newer than 9.15
    (``check_prefer_cudnn_attention``); it takes 16-bit inputs only and saves the same tensors as
    flash (q, k, v, output and the fp32 softmax statistics), so the forward is the same; its
    backward scratch is not modelled.
    """
    d_q, d_k, d_v = query.shape[-1], key.shape[-1], value.shape[-1]
    h_q, h_k, h_v = query.shape[-3], key.shape[-3], value.shape[-3]
    same_heads = h_q == h_k == h_v
    grouped = enable_gqa and h_k == h_v and h_q % h_k == 0
    half = query.dtype in (torch.float16, torch.bfloat16)
    if half and attn_mask is None and d_q == d_k == d_v and d_q <= 256 and (same_heads or grouped):
        return "flash"
    align = 8 if half else 4
    if query.dtype in (torch.float16, torch.bfloat16, torch.float32) and d_q == d_k and d_q % align == 0 \
            and d_v % align == 0 and same_heads:
        return "efficient"
    return "math"


def cuda_sdpa(original, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
    """``F.scaled_dot_product_attention`` as CUDA runs it: through the fused kernel
    ``sdpa_backend`` picks, so autograd saves that kernel's tensors (flash: q, k, v, the output in
    (b, s, h, d) layout and the fp32 logsumexp (b, h, s); memory-efficient: the same with the
    logsumexp padded to a multiple of 32 queries) instead of the math path's ``s x s`` scores.
    Source: ``aten/src/ATen/native/transformers/attention.cpp`` ``scaled_dot_product_attention``
    (flash: ``_scaled_dot_product_flash_attention``; efficient: ``_scaled_dot_product_efficient_attention``
    with ``compute_log_sumexp`` when an input requires grad; a boolean mask is first turned into an
    additive one in the query dtype, ``convert_boolean_attn_mask``)."""
    backend = sdpa_backend(query, key, value, attn_mask, dropout_p, enable_gqa)
    if backend == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale)[0], backend
    if backend == "efficient":
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
        lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, lse, dropout_p, is_causal, scale=scale)[0], backend
    kwargs = dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    if enable_gqa:
        kwargs["enable_gqa"] = True
    return original(query, key, value, **kwargs), backend


def cuda_dropout(x, p: float):
    """``F.dropout`` in training on CUDA: ``at::dropout`` takes the fused kernel
    (``aten/src/ATen/native/Dropout.cpp`` ``is_fused_kernel_acceptable``: CUDA input, 0 < p < 1),
    ``native_dropout``, which returns the output and a bool mask that autograd keeps. On meta (as on
    the CPU) ``dropout`` is ``input * noise`` and keeps the noise in the input's dtype."""
    return torch.ops.aten.native_dropout(x, p, True)[0]


# ----- kernel level (below autograd, Recorder.kernels) ----------------------------------------------
def flash_backward_scratch(rec, func, args, kwargs):
    """FlashAttention-2's backward (``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp``
    ``mha_bwd``) allocates, after dq, dk, dv: ``softmax_d`` fp32 (b, h, round128(s_q)), ``dq_accum``
    fp32 (b, round128(s_q), h, round(d, 32 if d <= 128 else 64)) and, for grouped-query attention,
    ``dk_expanded`` and ``dv_expanded`` (b, s_k, h, d) in the input dtype, summed into dk and dv over
    the groups; all are freed when the op returns."""
    out = rec.run(func, args, kwargs)
    q, k = args[1], args[2]
    b, h, s_q, d = q.shape
    h_k, s_k = k.shape[1], k.shape[2]
    with rec:
        scratch = [torch.empty((b, h, _round_up(s_q, 128)), dtype=torch.float32, device=DEVICE),
                   torch.empty((b, _round_up(s_q, 128), h, _round_up(d, 32 if d <= 128 else 64)),
                               dtype=torch.float32, device=DEVICE)]
        if h_k != h:
            scratch += [torch.empty((b, s_k, h, d), dtype=q.dtype, device=DEVICE) for _ in range(2)]
        del scratch
    return out


def efficient_backward(rec, func, args, kwargs):
    """The memory-efficient kernel's backward returns gradients shaped like q, k and v
    (``_scaled_dot_product_efficient_attention_backward``: grad_query, grad_key, grad_value,
    grad_bias). Its meta kernel shapes all three like the query, which is wrong for grouped-query
    attention (k and v have fewer heads) and fails autograd's shape check; the gradients are
    allocated with the inputs' shapes instead. The CUDA kernel's internal scratch is not modelled."""
    out = func(*args, **kwargs)  # not recorded: replaced below
    refs = (args[1], args[2], args[3])
    with rec:
        grads = [None if g is None else torch.empty_like(ref) for g, ref in zip(out[:3], refs)]
        rest = [None if g is None else torch.empty_like(g) for g in out[3:]]
    return tuple(grads + rest)


def grouped_mm_any_dtype(rec, func, args, kwargs):
    """``torch._grouped_mm`` on CUDA (``aten/src/ATen/native/cuda/GroupedBlas.cpp``) takes CUTLASS's
    bf16 kernel on sm90/sm100 and otherwise ``_grouped_mm_fallback`` (one output, ``mm_out`` per
    group), so fp32 and fp16 experts run there; the meta kernel accepts bf16 only. For other
    dtypes the output's shape is taken from the meta kernel on bf16 stand-ins (not recorded) and
    the output is allocated in the real dtype."""
    a, b = args[0], args[1]
    if a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16:
        return rec.run(func, args, kwargs)
    out_dtype = kwargs.get("out_dtype") or torch.promote_types(a.dtype, b.dtype)
    stand_in = [x.to(torch.bfloat16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                for x in args]
    shape = func(*stand_in, **{k: v for k, v in kwargs.items() if k != "out_dtype"}).shape
    with rec:
        return torch.empty(shape, dtype=out_dtype, device=DEVICE)


def bnb_gemm_4bit(rec, func, args, kwargs):
    """bitsandbytes' CUDA ``gemm_4bit`` (``backends/cuda/ops.py``): for more than
    ``_gemm_4bit_custom_max_m`` rows (and per-architecture thresholds below it) it runs
    ``_dequant_linear_fallback``: the nested absmax dequantized to fp32 (when double-quantized), the
    whole weight dequantized to the input dtype, then ``F.linear``; the dequantized weight is freed
    after the matmul. The fused kernel for tiny M writes only the output. The meta kernel gives only
    the output, so the fallback is run here on meta through bitsandbytes' own default
    implementation (``backends/default/ops.py`` ``_gemm_4bit_default_impl``: the same tensors)."""
    a = args[0]
    rows = a.numel() // a.shape[-1]
    if rows <= BNB_GEMM_4BIT_FUSED_MAX_M:
        return rec.run(func, args, kwargs)
    from bitsandbytes.backends.default.ops import _gemm_4bit_default_impl

    with rec:
        return _gemm_4bit_default_impl(*args, **kwargs)


def cublas_workspace(per_handle: int, handles: int):
    """cuBLAS workspaces go through the caching allocator (``aten/src/ATen/cuda/CublasHandlePool.cpp``
    ``getCurrentCUDABlasHandle``: one workspace of ``getChosenWorkspaceSize()`` per handle and stream,
    allocated at the handle's first use and kept). One handle serves the main thread (forward,
    optimizer), another the autograd engine's device thread (backward): ``estimate/constants.py``
    ``CUBLAS_HANDLES`` of ``CUBLAS_WORKSPACE_*`` bytes each, injected at the first matmul of the
    forward and of the backward. A meta trace has no handles, so these are the estimator's constants."""
    done: set[str] = set()

    def hook(func, rec) -> None:
        if len(done) >= handles or func.__name__.split(".")[0] not in MATMUL_OPS:
            return
        side = "backward" if "backward" in rec.phase else "forward"
        if side in done:
            return
        done.add(side)
        rec.inject(per_handle, f"cuBLAS workspace ({side} thread's handle)", "cublas_workspace")

    return hook
