"""Behaviour of the peak-memory timeline that users rely on."""

import pytest

from reportgen import catalog
from reportgen.estimate import estimate
from reportgen.estimate.memory import estimate_memory
from reportgen.estimate.search import fits
from reportgen.setup import TrainingSetup

M = catalog.load_model("llama-3.1-8b")
SMALL = catalog.load_model("llama-3.2-1b")
H100 = catalog.load_gpu("h100-sxm")
RTX = catalog.load_gpu("rtx-4090")


def mem(model=M, gpu=H100, **kw):
    return estimate_memory(model, TrainingSetup(**kw), gpu)


def test_three_totals_are_ordered():
    e = mem(method="lora", batch=2, seq=2048)
    assert e.peak_allocated < e.peak_reserved < e.device_total


def test_full_finetune_small_batch_peaks_at_optimizer_with_16_bytes_per_param():
    e = mem(method="full", precision="bf16-mixed", batch=1, seq=512, grad_ckpt=True)
    assert e.peak_phase in ("optimizer-step", "backward-bottom")
    assert e.peak_allocated == pytest.approx(16 * M.total_params, rel=0.03)


def test_long_sequence_lora_peaks_in_the_loss_or_forward():
    e = mem(method="lora", batch=4, seq=8192)
    assert e.peak_phase in ("loss-backward", "forward-end", "backward-top")


def test_peak_is_not_the_sum_of_all_terms():
    e = mem(method="full", precision="bf16-mixed", batch=4, seq=2048)
    summed = sum(v for k, v in e.terms.items() if k != "cuda_context")
    assert e.peak_allocated < summed


def test_gradient_accumulation_keeps_gradients_through_forward():
    one = mem(method="full", precision="bf16", batch=4, seq=2048)
    acc = mem(method="full", precision="bf16", batch=4, seq=2048, accum=8)
    assert acc.phases["forward-end"] - one.phases["forward-end"] == pytest.approx(2 * M.total_params, rel=1e-6)


def test_the_top_layers_backward_holds_the_heads_and_its_own_gradients():
    """Without accumulation the gradients appear as autograd reaches each parameter (AccumulateGrad):
    during the top layer's backward the head's gradient (made by the loss backward) and the top
    layer's own exist, nothing else. With accumulation every gradient is there from the start. So
    the two timelines differ at the forward's end by all gradients and at the top layer's backward
    by all gradients but those two. Llama-3.2-1B, full fine-tuning under bf16-mixed (fp32
    gradients), worked by hand from its config: a layer is q, o 2048 x 2048, k, v 2048 x 512,
    gate, up, down 2048 x 8192 and two 2048 norms = 60,821,504 parameters; the (tied) head
    128,256 x 2048 = 262,668,288."""
    one = mem(model=SMALL, method="full", precision="bf16-mixed", batch=1, seq=512)
    acc = mem(model=SMALL, method="full", precision="bf16-mixed", batch=1, seq=512, accum=2)
    all_grads = acc.phases["forward-end"] - one.phases["forward-end"]
    assert all_grads == 4 * SMALL.total_params
    at_top = all_grads - (acc.phases["backward-top"] - one.phases["backward-top"])
    assert at_top == 4 * (262_668_288 + 60_821_504)


@pytest.mark.parametrize("method", ["lora", "full"])
def test_from_the_forwards_end_to_the_loss_backward_only_the_logits_change(method):
    """Between the forward's end and the loss backward nothing is freed or made but the loss's own
    tensors: the layers' saved activations and the embedding side's (its output, the mask, the
    positions) are held at both moments. Pure bf16 (no autocast copies), outputs not kept."""
    from reportgen.estimate.dtypes import dtypes_for
    from reportgen.estimate.logits import logits_memory

    setup = TrainingSetup(method=method, precision="bf16", batch=2, seq=1024)
    e = estimate_memory(SMALL, setup, H100)
    lm = logits_memory(SMALL, dtypes_for(setup), 2 * 1024)
    assert e.phases["forward-end"] - e.phases["loss-backward"] == lm.forward_live - lm.backward_live


def test_checkpointing_trades_activations():
    plain = mem(method="lora", batch=4, seq=4096)
    ckpt = mem(method="lora", batch=4, seq=4096, grad_ckpt=True)
    assert ckpt.terms["activations"] < plain.terms["activations"] / 10
    assert ckpt.peak_allocated < plain.peak_allocated


def test_qlora_smaller_than_lora_smaller_than_full():
    kw = dict(batch=1, seq=1024, grad_ckpt=True)
    full, lora, qlora = (mem(method=m, **kw).peak_allocated for m in ("full", "lora", "qlora"))
    assert qlora < lora < full


def test_memory_monotonic_in_batch_and_seq():
    prev = 0
    for b in (1, 2, 4, 8):
        cur = mem(method="qlora", batch=b, seq=1024).device_total
        assert cur > prev
        prev = cur


def test_fsdp_shards_states():
    one = mem(method="full", precision="bf16-mixed", grad_ckpt=True, seq=2048)
    eight = mem(method="full", precision="bf16-mixed", grad_ckpt=True, seq=2048, gpus=8, sharding="fsdp")
    assert eight.terms["optimizer"] == one.terms["optimizer"] // 8
    assert eight.peak_allocated < one.peak_allocated / 4


def test_ddp_adds_gradient_buckets():
    one = mem(method="lora", seq=2048)
    ddp = mem(method="lora", seq=2048, gpus=2, sharding="ddp")
    assert ddp.terms["gradients"] == 2 * one.terms["gradients"]


def test_optimizer_offload_moves_states_to_host():
    """torchao's CPUOffloadOptimizer keeps AdamW's two fp32 states, a pinned fp32 copy of each
    trainable parameter and a pinned fp32 gradient beside it on the host (``torchao/optim/cpu_offload.py``
    98-100): 8 + 4 + 4 bytes per parameter of a full fine-tune under mixed precision. ZeRO-Offload keeps
    the same per parameter of its partition, and ZeRO-3 its bf16 gradient partition buffer too (DeepSpeed
    0.19.8 ``stage3.py`` 791-795): 18 bytes, where DeepSpeed's own estimator counts 16 (times 1.5)."""
    e = mem(method="full", precision="bf16-mixed", grad_ckpt=True, offload="optimizer")
    assert e.terms["optimizer"] == 0 and e.host_ram == 16 * M.total_params
    assert e.host_terms == {"master_weights": 4 * M.total_params, "optimizer_states": 8 * M.total_params,
                            "gradients": 4 * M.total_params}
    z3 = mem(method="full", precision="bf16-mixed", grad_ckpt=True, offload="optimizer", gpus=2, sharding="zero3")
    half = M.total_params // 2
    assert z3.host_terms == {"master_weights": 4 * half, "optimizer_states": 8 * half, "gradients": 4 * half,
                             "gradient_partition_buffer": 2 * half}
    from reportgen.estimate.host import deepspeed_zero3_host_bytes

    # DeepSpeed's figure for the node (two ranks): 16 bytes per parameter, times its buffer factor 1.5
    assert deepspeed_zero3_host_bytes(M.total_params) == int(M.total_params * 16 * 1.5)
    assert 2 * z3.host_ram - M.total_params * 16 == 2 * M.total_params  # the buffer it leaves out


def test_gemma2_sdpa_falls_back_to_eager_with_a_note():
    e = estimate_memory(catalog.load_model("gemma-2-9b"), TrainingSetup(method="qlora"), H100)
    assert any("soft-capping" in n for n in e.notes)


def test_max_batch_is_the_boundary():
    setup = TrainingSetup(method="qlora", grad_ckpt=True, seq=2048)
    est = estimate(M, RTX, setup)
    assert est.max_batch and est.max_batch >= 1
    assert fits(M, setup.model_copy(update={"batch": est.max_batch}), RTX)
    assert not fits(M, setup.model_copy(update={"batch": est.max_batch + 1}), RTX)


def test_max_seq_is_the_boundary():
    setup = TrainingSetup(method="qlora", grad_ckpt=True, batch=1)
    est = estimate(M, RTX, setup)
    assert est.max_seq and est.max_seq % 128 == 0
    assert fits(M, setup.model_copy(update={"seq": est.max_seq}), RTX)
    assert not fits(M, setup.model_copy(update={"seq": est.max_seq + 128}), RTX)


def test_70b_full_does_not_fit_a_4090_and_has_no_batch():
    est = estimate(catalog.load_model("llama-3.1-70b"), RTX, TrainingSetup(method="full"))
    assert not est.fits and est.max_batch is None


def test_time_fields_and_consistency():
    est = estimate(SMALL, H100, TrainingSetup(method="full", batch=4, seq=2048))
    t = est.time
    assert t.tokens_per_s == pytest.approx(4 * 2048 / t.step_s)
    # MFU is PaLM's model FLOPs at the estimated rate over the card's bf16 datasheet peak
    assert t.mfu == pytest.approx(t.model_flops_per_token * t.tokens_per_s / H100.peak_flops("bf16"), rel=1e-12)
    assert t.train_hours == pytest.approx(1e8 / t.tokens_per_s / 3600)
    assert t.train_dollars == pytest.approx(t.train_hours * H100.price_usd_per_hour)


def test_qlora_slower_than_lora_on_memory_bound_card():
    lora = estimate(M, RTX, TrainingSetup(method="lora", batch=1, seq=512, grad_ckpt=True), reverse=False)
    qlora = estimate(M, RTX, TrainingSetup(method="qlora", batch=1, seq=512, grad_ckpt=True), reverse=False)
    assert qlora.time.memory_s > lora.time.memory_s


def test_no_peak_means_no_time_but_a_note():
    est = estimate(M, catalog.load_gpu("a10g"), TrainingSetup(method="qlora"), reverse=False)
    assert est.time.step_s is None and any("no datasheet peak" in n for n in est.notes)


def test_t4_bf16_is_flagged():
    est = estimate(SMALL, catalog.load_gpu("t4"), TrainingSetup(method="lora", precision="bf16-mixed"), reverse=False)
    assert any("no bf16" in n for n in est.notes)
