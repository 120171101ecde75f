"""Liger-Kernel's fused linear cross-entropy (``loss: fused``) with a trainable LM head: the head's weight
gradient is summed chunk by chunk in the loss's forward (``ops/fused_linear_cross_entropy.py``, 0.6.2 to
0.8.x), traffic that a small chunk makes as large as the head's GEMMs, and a gradient plus a transient
that sit on top of the forward's peak. Worked examples from the code (``logits.liger_grad_weight_traffic``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reportgen import catalog
from reportgen.estimate import estimate
from reportgen.estimate import work as W
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.libraries import CURRENT, Libraries
from reportgen.estimate.time import estimate_time
from reportgen.estimate.logits import liger_chunk_tokens, liger_grad_weight_traffic, loss_logits_memory
from reportgen.setup import TrainingSetup

CONFIGS = Path(__file__).resolve().parents[1] / "reportgen" / "published" / "configs"
QWEN_15B = catalog.load_model(str(CONFIGS / "qwen2.5-1.5b.json"))  # V x H = 151,936 x 1,536, tied head
HEAD = 151_936 * 1_536
LIGER_064 = Libraries(liger_kernel="0.6.4")  # the llmq runs' version (December 2025)


def _setup(**kw) -> TrainingSetup:
    return TrainingSetup(**{"method": "full", "precision": "bf16", "batch": 16, "seq": 1024, "padding": "packed",
                            "loss": "fused", **kw})


def test_the_worked_example_a_bf16_head_moves_14_bytes_an_element_a_chunk():
    assert (QWEN_15B.vocab_size, QWEN_15B.hidden_size) == (151_936, 1_536)
    assert liger_chunk_tokens(16 * 1024, 151_936, 1_536) == 256  # 64 chunks
    assert liger_grad_weight_traffic(HEAD, 2, 2, in_place=False) == (14 * HEAD, 6 * HEAD, 2)
    assert 64 * 14 * HEAD == 209_102_831_616  # about 0.21 s a micro-batch at an RTX 4090's 1,008 GB/s


def test_in_place_the_gemm_reads_and_writes_the_gradient_and_an_fp32_step_moves_12():
    assert liger_grad_weight_traffic(HEAD, 2, 2, in_place=True) == (4 * HEAD, 0, 0)
    assert liger_grad_weight_traffic(HEAD, 2, 4, in_place=True) == (8 * HEAD, 0, 0)  # addmm(out_dtype=float32)
    assert liger_grad_weight_traffic(HEAD, 4, 4, in_place=False) == (12 * HEAD, 4 * HEAD, 1)  # .float() is a no-op


@pytest.mark.parametrize("version, c, w, in_place", [
    ("0.6.1", 2, 2, True), ("0.6.2", 2, 2, False), ("0.6.4", 2, 4, False), ("0.8.1", 2, 4, True),
    ("0.8.2", 2, 2, False), ("0.8.3", 2, 2, True), ("0.8.5", 4, 4, False)])
def test_which_liger_versions_sum_the_head_gradient_in_the_gemm(version, c, w, in_place):
    assert Libraries(liger_kernel=version).flce_in_place(c, w) is in_place


@pytest.mark.parametrize("libs, per_chunk, kernels", [(LIGER_064, 14, 1 + 64 * 3), (CURRENT, 4, 1 + 64)])
def test_the_fused_head_counts_the_accumulation_per_chunk_only_when_the_head_trains(libs, per_chunk, kernels):
    full, lora = _setup(), _setup(method="lora")
    t = 16 * 1024
    f_full, b_full = W.head_work(QWEN_15B, full, dtypes_for(full, libs), t)
    f_lora, b_lora = W.head_work(QWEN_15B, lora, dtypes_for(lora, libs), t)
    # the head's weight-gradient GEMM is counted as FLOPs; beyond it, the zeroed gradient and 64 chunks of the
    # accumulation's bytes (the final norm's forward differs too: a trainable weight)
    norm = W.rms_norm(t, 1_536, 2, True, False)[0].bytes - W.rms_norm(t, 1_536, 2, False, False)[0].bytes
    assert f_full.bytes - f_lora.bytes == 2 * HEAD + 64 * per_chunk * HEAD + norm
    assert b_full.bytes - b_lora.bytes > 2 * HEAD * 2  # element_mul_kernel, and the embedding's scatter-add
    assert f_full.kernels - f_lora.kernels == kernels  # zeroing grad_weight; a GEMM more a chunk (.float(), add)


def test_small_chunks_make_the_heads_gemms_read_the_whole_head_each_time():
    """Llama 3.2 1B (V x H = 128,256 x 2,048), one 2,048-token row: 32 chunks of 64 rows. Each chunk's GEMM
    reads the 0.5 GB bf16 head, 62 FLOPs a byte, below the ridge: the three GEMMs are priced by their bytes,
    about 32 x 3 x 0.5 GB, instead of as one compute-bound GEMM over the 2,048 rows."""
    llama = catalog.load_model("llama-3.2-1b")
    s = _setup(batch=1, seq=2048)
    f, _ = W.head_work(llama, s, dtypes_for(s), 2048)
    head = 128_256 * 2_048
    assert liger_chunk_tokens(2048, 128_256, 2_048) == 64
    assert f.bytes > 32 * 3 * 2 * head and f.matmul_flops == 0


def test_a_frozen_fp32_head_is_cast_before_each_of_its_gemms_a_trainable_one_once():
    """Autocast caches the cast of a leaf that needs a gradient only: Llama 3.2 1B under bf16 autocast, 32 chunks."""
    head = 128_256 * 2_048  # Llama 3.2 1B
    frozen = _setup(method="lora", precision="bf16-mixed", batch=1, seq=2048, frozen_dtype="fp32")
    trained = _setup(precision="bf16-mixed", batch=1, seq=2048)
    for s, casts in ((frozen, 64), (trained, 1)):
        dt = dtypes_for(s)
        cast = W.liger_loss_work(128_256, 2_048, 2, dt, 2048, cast=True)[0]
        plain = W.liger_loss_work(128_256, 2_048, 2, dt, 2048, cast=False)[0]
        assert (cast.kernels - plain.kernels, cast.bytes - plain.bytes) == (casts, casts * head * (4 + 2))


@pytest.mark.parametrize("libs, transient", [(LIGER_064, 6), (CURRENT, 0)])
def test_a_trainable_head_keeps_its_gradient_and_the_transient_at_the_forwards_peak(libs, transient):
    full, lora = _setup(), _setup(method="lora")
    t = 16 * 1024
    m_full = loss_logits_memory(QWEN_15B, dtypes_for(full, libs), t, "fused")
    m_lora = loss_logits_memory(QWEN_15B, dtypes_for(lora, libs), t, "fused")
    assert m_full.saved - m_lora.saved == 2 * HEAD  # grad_weight in bf16 from the loss to its backward
    assert m_full.forward_live - m_lora.forward_live == 2 * HEAD + transient * HEAD  # torch.mm's product, .float()


def test_the_accumulation_makes_a_small_chunk_step_slower_on_a_4090(monkeypatch):
    """IST-DASLab/llmq's LLaMA-Factory run (consumer_speed CS139, Liger 0.6.4): 32 micro-batches of 64 chunks
    each; the accumulation adds 32 x 209 GB of memory-bound traffic, several seconds of a 56 s step."""
    s, gpu = _setup(accum=32, grad_ckpt=True, kernels="liger", recipe="trainer"), catalog.load_gpu("rtx-4090")
    with_it = estimate_time(QWEN_15B, s, gpu, libs=LIGER_064)
    monkeypatch.setattr(W, "liger_grad_weight_traffic", lambda head, c, w, in_place: (0, 0, 0))
    W.step_work.cache_clear()
    without = estimate_time(QWEN_15B, s, gpu, libs=LIGER_064)
    W.step_work.cache_clear()
    extra = with_it.parts["memory"] - without.parts["memory"]
    assert 32 * 209.1e9 / gpu.memory_bandwidth_gbs / 1e9 < extra < 32 * 209.1e9 / (0.8 * gpu.memory_bandwidth_gbs * 1e9)


def test_a_full_fine_tune_with_the_fused_loss_says_which_liger_it_prices():
    s = _setup(accum=32, grad_ckpt=True, kernels="liger", recipe="trainer")
    notes = estimate(QWEN_15B, catalog.load_gpu("rtx-4090"), s, reverse=False).notes
    assert any("priced as Liger-Kernel 0.8.5 runs it" in n and "each of a micro-batch's 64 chunks" in n for n in notes)
    lora = estimate(QWEN_15B, catalog.load_gpu("rtx-4090"), s.model_copy(update={"method": "lora"}), reverse=False)
    assert not any("trainable LM head" in n for n in lora.notes)
