"""FSDP effects pinned to worked examples (reportgen/estimate/memory.py): the root unit and two
gathered layers during forward and backward, bitsandbytes' quantization state on every GPU, the
unshard stream's pool, and FSDP NO_SHARD."""

from reportgen import catalog
from reportgen.estimate import params as P
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.memory import estimate_memory, fsdp_gathered_bytes, root_param_bytes
from reportgen.setup import TrainingSetup

L2 = catalog.load_model("llama-2-7b")
GPU = catalog.load_gpu("rtx-3090")


def test_gathered_bytes_worked_example():
    """Llama-2-7B in pure bf16 on 2 GPUs. Root unit: embeddings and head 2 x 32,000 x 4,096 plus the
    final norm 4,096, x 2 bytes = 524,296,192. A decoder layer: 202,375,168 weights x 2 bytes =
    404,750,336. During forward and backward each GPU holds two gathered layers and the root's other
    half: 809,500,672 + 262,148,096 = 1,071,648,768 bytes beyond its shard."""
    setup = TrainingSetup(method="lora", precision="bf16", gpus=2, sharding="fsdp")
    root = root_param_bytes(L2, dtypes_for(setup))
    assert root == 524_296_192
    assert fsdp_gathered_bytes(404_750_336, root, 2) == 1_071_648_768
    mem = estimate_memory(L2, setup, GPU)
    assert mem.terms["fsdp_unsharded"] == 1_071_648_768
    # gathered for the passes, resharded for the optimizer step
    one = estimate_memory(L2, TrainingSetup(method="lora", precision="bf16"), GPU)
    assert mem.phases["optimizer-step"] < mem.phases["backward-bottom"]
    assert mem.terms["weights"] == one.terms["weights"] // 2


def test_quantization_state_is_not_sharded():
    """bitsandbytes keeps each 4-bit weight's QuantState as an attribute, which FSDP does not shard:
    every GPU holds all of it (fsdp_qlora), while the packed weights are split."""
    one = TrainingSetup(method="qlora", precision="bf16", double_quant=True)
    two = one.model_copy(update={"gpus": 2, "sharding": "fsdp"})
    quant = P.quant_constants_bytes(L2, one)
    a, b = estimate_memory(L2, one, GPU), estimate_memory(L2, two, GPU)
    assert a.terms["quant_constants"] == quant
    resident = P.weights_bytes(L2, two, dtypes_for(two)) + P.adapter_bytes(L2, two, dtypes_for(two))
    base_b = b.phases["optimizer-step"] - b.terms["gradients"] - b.terms["optimizer"] - b.terms["cublas_workspace"]
    assert base_b == resident // 2 + quant


def test_unshard_stream_pool_is_reserved_not_allocated():
    """Two more layers' all-gather buffers (404,750,336 bytes each for Llama-2-7B in bf16) stay in the
    unshard stream's pool: reserved minus allocated grows by 809,500,672 on top of the usual cached
    free blocks, which are the same as on one GPU (the working set and the logits do not shard)."""
    setup = TrainingSetup(method="lora", precision="bf16", gpus=2, sharding="fsdp")
    mem = estimate_memory(L2, setup, GPU)
    from reportgen.estimate import constants as K
    from reportgen.estimate.memory import cached_free_bytes

    usual = cached_free_bytes(mem.cache_inputs) + K.ALLOCATOR_SEGMENTS_BYTES
    assert mem.peak_reserved - mem.peak_allocated == usual + 809_500_672
    one = estimate_memory(L2, setup.model_copy(update={"gpus": 1, "sharding": "none"}), GPU)
    assert one.peak_reserved - one.peak_allocated == usual


def test_no_shard_keeps_everything_on_every_gpu():
    """FSDP NO_SHARD (fsdp_qlora's 'DDP mode'): full weights, gradients and states per GPU, gradients
    all-reduced in place, no DDP bucket copies, nothing gathered."""
    one = TrainingSetup(method="lora", precision="bf16", batch=4)
    ns = one.model_copy(update={"gpus": 2, "sharding": "no-shard"})
    ddp = one.model_copy(update={"gpus": 2, "sharding": "ddp"})
    a, b, c = (estimate_memory(L2, s, GPU) for s in (one, ns, ddp))
    assert b.peak_allocated == a.peak_allocated and b.terms["fsdp_unsharded"] == 0
    assert c.terms["gradients"] == 2 * a.terms["gradients"]  # DDP adds a bucket copy of every gradient
