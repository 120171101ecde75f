"""The trace against real autograd: bytes saved for backward in one forward pass.

The same tiny models (``tests/torch_saved.py``) run for real on the CPU under
``saved_tensors_hooks`` (the ground truth) and traced on the meta device with the CUDA
emulations. Both count the distinct non-parameter storages autograd saves. They must differ by
exactly what CUDA's kernels save differently from the CPU's, each difference named below with its
source; everything else (casts, norms, MLPs, LoRA, MoE routing, checkpointing, QLoRA) must match
byte for byte.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from reportgen.model import from_config  # noqa: E402
from reportgen.setup import TrainingSetup  # noqa: E402
from reportgen.trace.step import run_trace  # noqa: E402
from tests.torch_saved import TINY, saved_bytes, saved_bytes_harness  # noqa: E402

BATCH, SEQ, RANK = 2, 24, 8
#: FlashAttention-2 on CUDA keeps its RNG state on the device: ``rng_state`` uint64[2] and ``_unused``
#: uint64[] (``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp`` mha_fwd, "[Note] BC
#: breaking change to flash seed/offset"), saved for backward; the CPU flash kernel has none
FLASH_RNG_BYTES = 16 + 8
#: the memory-efficient kernel's philox seed and offset, int64 scalars
EFFICIENT_RNG_BYTES = 8 + 8
#: the memory-efficient kernel pads its logsumexp to a multiple of 32 queries (``kAlignLSE``)
LSE_ALIGN = 32


def cuda_minus_cpu(fam: str, setup: TrainingSetup) -> int:
    """Bytes a CUDA run saves minus what the CPU run saves, for one forward of the same model.

    * SDPA: CUDA takes FlashAttention-2 (16-bit), the memory-efficient kernel (fp32 with as many KV
      heads as query heads) or the math path (fp32 with grouped-query attention,
      ``activations.sdpa_kernel``), the CPU its own flash kernel, or the math path where CUDA takes it
      (``torch_saved.cuda_sdpa_is_math``: the same composite on both, no difference). Flash adds its
      device RNG state; the efficient kernel adds its seed and offset and pads the fp32 logsumexp
      (b, heads, s) to 32 queries (``attention.cu`` ``_efficient_attention_forward``), and the CPU's
      fp32 flash output is (b, heads, s, d), so ``transpose(1, 2).contiguous()`` copies it for
      ``o_proj``, which saves the copy when it saves its input; CUDA's output is already
      (b, s, heads, d).
    * Gemma 2 scales the embeddings by ``torch.tensor(sqrt(h), dtype)``, a 0-dim CPU tensor: the
      multiply saves it when the embedding is trainable; on CUDA it stays host memory.
    * LoRA dropout: CUDA's fused dropout keeps a bool mask, the CPU keeps the noise in the input's
      dtype (``tests/test_activations_vs_torch.py`` ``cpu_dropout_mask_adjustment``).
    """
    spec = from_config(dict(TINY[fam]), name=fam)
    layers, b, s = spec.num_layers, setup.batch, setup.seq
    diff = 0
    from tests.torch_saved import cuda_sdpa_is_math

    math_path = cuda_sdpa_is_math(TINY[fam], setup.precision.value, setup.method.value)
    if setup.attn.value == "sdpa" and fam != "gemma2" and not setup.grad_ckpt and not math_path:
        if setup.compute_dtype == "fp32":
            diff += layers * (b * spec.num_heads * (math.ceil(s / LSE_ALIGN) * LSE_ALIGN - s) * 4 + EFFICIENT_RNG_BYTES)
            o_proj_saves = setup.method.value == "full" or (
                setup.is_peft and spec.attn_out_name in spec.lora_selection(setup.lora_targets).linears
                and not setup.lora_dropout)
            if o_proj_saves:
                diff -= layers * b * s * spec.q_dim * 4
        else:
            diff += layers * FLASH_RNG_BYTES
    if fam == "gemma2" and setup.method.value == "full":
        diff -= 2 if setup.precision.value == "bf16" else 4
    if setup.lora_dropout:
        from tests.test_activations_vs_torch import cpu_dropout_mask_adjustment

        diff -= cpu_dropout_mask_adjustment(fam, setup)
    return diff


def traced_saved(fam: str, setup: TrainingSetup) -> int:
    run = run_trace(from_config(dict(TINY[fam]), name=fam), setup, 1024, 2, count_saved=True)
    return run.saved_bytes[0]


CASES = [
    (fam, method, prec, attn, ckpt)
    for fam in ("llama", "qwen2", "phi3", "gemma2", "mixtral")
    for method in ("full", "lora")
    for prec, ckpt in (("bf16-mixed", False), ("fp32", False), ("bf16-mixed", True))
    for attn in (("eager",) if fam == "gemma2" else ("sdpa",))
] + [("llama", "lora", "bf16-mixed", "eager", False), ("phi3", "full", "bf16", "sdpa", False)]


@pytest.mark.parametrize("fam,method,prec,attn,ckpt", CASES)
def test_traced_saved_bytes_match_cpu_autograd(fam, method, prec, attn, ckpt):
    targets = "qv" if fam == "mixtral" else "all-linear"  # peft's expert wrapper is not in the inventory
    setup = TrainingSetup(method=method, precision=prec, attn=attn, grad_ckpt=ckpt, batch=BATCH, seq=SEQ,
                          lora_rank=RANK, lora_alpha=2 * RANK, lora_targets=targets)
    cpu = saved_bytes(TINY[fam], method, prec, attn, ckpt, BATCH, SEQ, rank=RANK, targets=targets)["total"]
    assert traced_saved(fam, setup) == cpu + cuda_minus_cpu(fam, setup)


HARNESS_CASES = [("llama", "bf16-mixed", False, 0.0), ("llama", "bf16-mixed", False, 0.1),
                 ("llama", "fp32", True, 0.1), ("phi3", "fp32", False, 0.0), ("phi3", "bf16", False, 0.1)]


@pytest.mark.parametrize("fam,prec,ckpt,dropout", HARNESS_CASES)
def test_traced_qlora_saved_bytes_match_cpu_autograd(fam, prec, ckpt, dropout):
    """QLoRA through bitsandbytes (CPU backend for the ground truth, its fake kernels on meta) and
    LoRA dropout, on the model the measuring harness builds."""
    pytest.importorskip("bitsandbytes")
    setup = TrainingSetup(method="qlora", precision=prec, grad_ckpt=ckpt, batch=BATCH, seq=SEQ, lora_rank=RANK,
                          lora_alpha=2 * RANK, lora_targets="all-linear", lora_dropout=dropout)
    cpu = saved_bytes_harness(TINY[fam], fam, setup)
    assert traced_saved(fam, setup) == cpu + cuda_minus_cpu(fam, setup)
