"""The time model's physics terms pinned to worked examples: bitsandbytes' dequantization bytes,
QLoRA's slowdown against LoRA from them."""

import pytest

from reportgen import catalog
from reportgen.estimate import params as P
from reportgen.estimate.slowdown import qlora_slowdown
from reportgen.estimate.time import dequant_bytes_per_micro_batch, estimate_time
from reportgen.estimate.work import dequant_bytes_per_weight
from reportgen.setup import TrainingSetup

L8 = catalog.load_model("llama-3.1-8b")
H100 = catalog.load_gpu("h100-sxm")
RTX4090 = catalog.load_gpu("rtx-4090")


def test_dequant_bytes_per_weight_follow_bitsandbytes_kernels():
    """dequantize_4bit: read 0.5 B + fp32 absmax per 64, write 2 B (bf16) = 2.5625 B; double
    quantization first rebuilds the absmax: + (1 + 4/256 + 4) / 64 = 2.640869140625 B."""
    base = TrainingSetup(method="qlora", precision="bf16")
    assert dequant_bytes_per_weight(base) == 2.5625
    dq = base.model_copy(update={"double_quant": True})
    assert dequant_bytes_per_weight(dq) == pytest.approx(2.640869140625)


def test_dequant_runs_once_per_pass():
    """Llama 3.1 8B, QLoRA, checkpointing: forward, recompute and backward each dequantize the
    6,979,321,856 decoder-layer linear weights (8,030,261,248 - embeddings and head 2 x 525,336,576
    - norms): 3 x 6,979,321,856 x 2.5625 B."""
    s = TrainingSetup(method="qlora", precision="bf16", grad_ckpt=True)
    q = P.quantized_linear_params(L8, s)
    assert q == 6_979_321_856
    assert dequant_bytes_per_micro_batch(L8, s) == pytest.approx(3 * q * 2.5625)
    assert dequant_bytes_per_micro_batch(L8, s.model_copy(update={"method": "lora"})) == 0


def test_qlora_slowdown_is_the_ratio_of_the_two_estimated_steps():
    """QLoRA's step is LoRA's plus what bitsandbytes adds (dequantization kernels before every use of a
    4-bit weight, Linear4bit's casts, peft's defensive clone, MatMul4Bit's Python forward and
    backward): the slowdown is the ratio of the two estimated steps at equal tokens. Our H100
    measurements of Llama 3.1 8B at batch 1 x 2048 give 1.16-1.25 (NF4 against LoRA, 5-step medians)."""
    s = TrainingSetup(method="lora", batch=1, seq=2048)
    sd = qlora_slowdown(L8, H100, s)
    lora = estimate_time(L8, s, H100)
    qlora = estimate_time(L8, s.model_copy(update={"method": "qlora"}), H100)
    assert sd.ratio == pytest.approx(qlora.step_s / lora.step_s, rel=1e-9)
    assert 1.1 < sd.ratio < 1.3
    assert 0 < sd.dequant_share < 0.1  # the dequantization's bytes alone are a few percent of the step


def test_slowdown_shrinks_with_longer_matmuls():
    """The dequantization cost is per weight, the matmul per token: more tokens per micro-batch,
    smaller slowdown."""
    small = qlora_slowdown(L8, RTX4090, TrainingSetup(method="qlora", precision="bf16", batch=1, seq=256))
    large = qlora_slowdown(L8, RTX4090, TrainingSetup(method="qlora", precision="bf16", batch=8, seq=2048))
    assert small.ratio > large.ratio > 1.0


def test_no_peak_no_slowdown():
    assert qlora_slowdown(L8, catalog.load_gpu("a10g"), TrainingSetup(method="qlora", precision="bf16")) is None


def test_optimizer_offload_overlaps_the_copies_as_torchao_does(monkeypatch):
    """torchao's CPUOffloadOptimizer copies each gradient to the host during the backward and each
    updated parameter back while the host steps the next: per step, the gradient copies the backward
    did not hide plus the longer of the host's AdamW and the copies back (``time._transfer_s``).
    Llama 3.2 1B, full bf16-mixed: 1,235,814,400 fp32 parameters, 4.94 GB each way over PCIe 5 at
    64 GB/s x 0.8."""
    from reportgen.estimate import constants as K
    from reportgen.estimate.time import _transfer_s

    m1 = catalog.load_model("llama-3.2-1b")
    s = TrainingSetup(method="full", precision="bf16-mixed", offload="optimizer")
    copies = 1_235_814_400 * 4 / (H100.host_link_gbs * 1e9 * K.HOST_LINK_EFFICIENCY)
    cpu = 1_235_814_400 / K.CPU_ADAM_PARAMS_PER_S
    assert _transfer_s(m1, s, H100, [], backward_s=0.04) == pytest.approx((copies - 0.04) + max(cpu, copies))
    assert _transfer_s(m1, s, H100, [], backward_s=1.0) == pytest.approx(max(cpu, copies))  # fully hidden
    monkeypatch.setattr(K, "CPU_ADAM_PARAMS_PER_S", 1e15)  # an instant host step: the copies back remain
    assert _transfer_s(m1, s, H100, [], backward_s=1.0) == pytest.approx(copies)


def test_a_gemms_arithmetic_intensity_counts_bytes_not_elements():
    """The roofline (Williams, Waterman and Patterson 2009): a GEMM is compute-bound when its FLOPs
    per byte moved exceed the ridge R (``work.GEMM_RIDGE_FLOPS_PER_BYTE``, 128 today). A square
    GEMM of side 4R does 2 (4R)^3 FLOPs over 3 (4R)^2 elements: 4R/3 FLOPs per byte in bf16 (above
    the ridge: its FLOPs count) and 2R/3 in fp32 (below it: its bytes count). With R = 128: side
    512, 170.7 and 85.3 FLOPs per byte."""
    from reportgen.estimate.work import GEMM_RIDGE_FLOPS_PER_BYTE, gemm

    n = 4 * GEMM_RIDGE_FLOPS_PER_BYTE
    bf16, fp32 = gemm(n, n, n, 2), gemm(n, n, n, 4)
    assert bf16.matmul_flops == 2 * n**3 and bf16.bytes == 0
    assert fp32.matmul_flops == 0 and fp32.bytes == 4 * 3 * n**2


def test_a_cast_the_setup_does_not_need_moves_no_bytes():
    """bitsandbytes' Linear4bit casts its input to the compute dtype and its output back only when they differ
    (``x.to(compute dtype)``): a bf16 QLoRA step's 4-bit linears, bf16 in and out, launch no cast and move no
    bytes for one. Before ``_k`` dropped the bytes of zero kernels, each such linear was charged two casts'
    traffic, ``t x (in + out) x 4`` bytes each way (330 GB a 16k-token micro-batch of Llama-2 7B)."""
    from reportgen.estimate import work as W
    from reportgen.estimate.dtypes import dtypes_for

    assert W._k(False, 1e9).bytes == 0 and W._k(2, 1e9).bytes == 1e9
    llama = catalog.load_model("llama-2-7b")
    lin = llama.layer_linears()[0]
    for x, stream in ((2, "bf16"), (4, "fp32")):
        s = TrainingSetup(method="qlora", precision="bf16-mixed" if x == 4 else "bf16")
        f, _, _ = W.linear_unit(1024, W._Lin(lin, x, False, True), s, dtypes_for(s))
        casts = 1024 * (lin.in_features + lin.out_features) * (x + 2) if x != 2 else 0
        assert f.bytes == W.dequant_bytes_per_weight(s) * lin.in_features * lin.out_features + casts, stream
