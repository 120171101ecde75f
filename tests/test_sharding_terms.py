"""Data-parallel strategies' memory effects pinned to worked examples (reportgen/estimate/sharding.py):
ZeRO's divisors, SHARD_GRAD_OP's gathered layers, ZeRO-3's fetch and prefetch, the reduction buckets,
HYBRID_SHARD's node, and a refusal for what the harness cannot run."""

import pytest

from reportgen import catalog
from reportgen.estimate import sharding as SH
from reportgen.estimate.memory import estimate_memory
from reportgen.setup import SetupError, TrainingSetup

L2 = catalog.load_model("llama-2-7b")
A100 = catalog.load_gpu("a100-80gb")
FULL = TrainingSetup(method="full", precision="bf16-mixed", batch=1, seq=2048, grad_ckpt=True)


def on(n, sharding, **kw):
    return FULL.model_copy(update={"gpus": n, "sharding": sharding, **kw})


def test_zero_paper_divisors():
    """ZeRO section 5.1: stage 1 splits the optimizer states, stage 2 the gradients too, stage 3 and
    FULL_SHARD everything; DDP and NO_SHARD nothing; HYBRID_SHARD shards inside an 8-GPU node."""
    assert SH.placement(on(4, "zero1")) == SH.Placement(1, 1, 4)
    assert SH.placement(on(4, "zero2")) == SH.Placement(1, 4, 4)
    assert SH.placement(on(4, "zero3")) == SH.Placement(4, 4, 4)
    assert SH.placement(on(4, "fsdp")) == SH.placement(on(4, "shard-grad-op")) == SH.Placement(4, 4, 4)
    assert SH.placement(on(4, "ddp")) == SH.placement(on(4, "no-shard")) == SH.Placement(1, 1, 1)
    assert SH.placement(on(32, "hybrid-shard")) == SH.Placement(8, 8, 8)
    assert SH.placement(on(4, "hybrid-shard")) == SH.Placement(4, 4, 4)


def test_zero_stages_worked_example():
    """Llama-2-7B (6,738,415,616 parameters), bf16-mixed AdamW on 4 GPUs: fp32 weights 26,953,662,464
    bytes, fp32 gradients the same, states 53,907,324,928. ZeRO-1 leaves a quarter of the states
    (13,476,831,232); ZeRO-2 a quarter of the gradients (6,738,415,616) plus the 5e8-element fp32
    reduction bucket (2,000,000,000); ZeRO-3 a quarter of the weights too."""
    z1, z2, z3 = (estimate_memory(L2, on(4, s), A100) for s in ("zero1", "zero2", "zero3"))
    assert z1.terms["optimizer"] == 13_476_831_232 and z1.terms["weights"] == 26_953_662_464
    assert z1.terms["gradients"] == 26_953_662_464
    assert z2.terms["gradients"] == 6_738_415_616 + 2_000_000_000
    assert z3.terms["weights"] == 26_953_662_464 // 4
    assert z1.peak_allocated > z2.peak_allocated > z3.peak_allocated


def test_reduce_bucket_is_capped_by_the_trainable_parameters():
    assert SH.zero_reduce_bucket_bytes(10_000_000_000, 2) == 1_000_000_000
    assert SH.zero_reduce_bucket_bytes(40_000_000, 4) == 160_000_000  # LoRA: fewer than 5e8


def test_shard_grad_op_keeps_every_layer_gathered():
    """Llama-2-7B in bf16 (a layer 404,750,336 bytes, 32 layers, root 524,296,192) on 4 GPUs:
    32 x 404,750,336 + 524,296,192 - 131,074,048 = 13,345,232,896 bytes at the forward's end, where
    FULL_SHARD holds 2 x 404,750,336 + 393,222,144 = 1,202,722,816."""
    assert SH.shard_grad_op_gathered_bytes(404_750_336, 32, 524_296_192, 4) == 13_345_232_896
    assert SH.full_shard_gathered_bytes(404_750_336, 524_296_192, 4) == 1_202_722_816
    sgo = estimate_memory(L2, TrainingSetup(method="lora", precision="bf16", gpus=4, sharding="shard-grad-op"), A100)
    fs = estimate_memory(L2, TrainingSetup(method="lora", precision="bf16", gpus=4, sharding="fsdp"), A100)
    assert sgo.terms["fsdp_unsharded"] == 13_345_232_896 and fs.terms["fsdp_unsharded"] == 1_202_722_816


def test_zero3_fetches_one_module_and_a_prefetch_bucket():
    """ZeRO-3: the largest module (the 32,000 x 4,096 embedding, 262,144,000 bytes in bf16, or a
    404,750,336-byte layer) plus the 5e7-element prefetch bucket (100,000,000 bytes)."""
    assert SH.zero3_gathered_bytes(404_750_336, 262_144_000, 2) == 504_750_336
    assert SH.zero3_gathered_bytes(10_000_000, 262_144_000, 2) == 272_144_000


def test_offload_params_needs_parameter_sharding_or_none():
    with pytest.raises(SetupError, match="zero3"):
        on(2, "zero2", offload="params")
    on(2, "zero3", offload="params")  # ZeRO-3 offload_param is fine


def test_sharding_values_are_setup_values():
    for value in ("shard-grad-op", "hybrid-shard", "zero1", "zero2", "zero3"):
        assert on(2, value).sharding.value == value
    with pytest.raises(SetupError, match="zero3"):
        on(2, "zero4")


def test_harness_refuses_estimated_only_strategies():
    from reportgen.measure.distributed import check_supported
    from reportgen.measure.optimizers import SetupNotSupported

    with pytest.raises(SetupNotSupported, match="estimated only"):
        check_supported(on(2, "zero2"), "cpu", 2)
