"""Communication of data-parallel training pinned to worked examples (reportgen/estimate/comm.py):
ring collectives, the link each GPU uses, and each framework's overlap with compute."""

import pytest

from reportgen import catalog
from reportgen.estimate import comm as C
from reportgen.estimate import estimate
from reportgen.setup import TrainingSetup

L2 = catalog.load_model("llama-2-7b")


def test_ring_collectives():
    """NCCL rings: an all-reduce moves 2 (n-1)/n of the buffer, an all-gather (n-1)/n:
    1 GB over 4 GPUs at 1 GB/s is 1.5 s; an all-gather of 1 GB over 2 GPUs is 0.5 s."""
    assert C.ring_all_reduce_s(1e9, 4, 1e9) == pytest.approx(1.5)
    assert C.all_gather_s(1e9, 2, 1e9) == pytest.approx(0.5)
    assert C.reduce_scatter_s(1e9, 8, 1e9) == pytest.approx(0.875)
    assert C.ring_all_reduce_s(1e9, 1, 1e9) == 0.0


def test_link_from_the_catalog():
    """H100 SXM: NVLink 900 GB/s (450 per direction) inside its 8-GPU board, InfiniBand beyond;
    RTX 4090: PCIe 4.0 x16 (no NVLink, no P2P); H100 NVL: a bridge pairs two cards, four use PCIe."""
    h100, g4090, nvl = (catalog.load_gpu(k) for k in ("h100-sxm", "rtx-4090", "h100-nvl"))
    assert C.link_for(h100, 8)[1] == 450 and "NVLink" in C.link_for(h100, 8)[0]
    assert C.link_for(h100, 16)[1] == C.INTERNODE_GBS_PER_GPU
    assert C.link_for(g4090, 2) == ("PCIe 4.0 x16 (no NVLink, no P2P)", 32)
    assert C.link_for(g4090, 16)[1] == C.INTERNODE_GBS_PER_GPU  # two machines
    assert C.link_for(nvl, 2)[1] == 300 and C.link_for(nvl, 4)[1] == 64
    assert catalog.load_gpu("a100-80gb").peer_link_gbs == 300 and catalog.load_gpu("b200").peer_link_gbs == 900


def test_fsdp_overlap_worked_example():
    """All-gather 1 s per pass, reduce-scatter 0.5 s, forward 2 s, backward 1 s, 10 layers: the
    forward hides its all-gathers but the first layer's (0.1 s); the backward's 1.5 s of
    collectives exceed its 1 s by 0.5 s, and the last reduce-scatter (0.05 s) waits: 0.65 s.
    SHARD_GRAD_OP does not gather again in the backward: 0.1 + 0.05 = 0.15 s."""
    assert C.fsdp_pass_exposed_s(1.0, 0.5, 2.0, 1.0, 10) == pytest.approx(0.65)
    assert C.fsdp_pass_exposed_s(1.0, 0.5, 2.0, 1.0, 10, regather=False) == pytest.approx(0.15)


def test_ddp_overlap_worked_example():
    """A 2 s all-reduce behind a 1.5 s backward leaves 0.5 s, plus the last bucket's 0.01 s."""
    assert C.ddp_exposed_s(2.0, 0.01, 1.5) == pytest.approx(0.51)


def test_forward_share_and_gathered_bytes():
    """Forward 2N of 6N (full) or of 4N + 2N recompute (LoRA with checkpointing); Llama-2-7B in bf16
    gathers 32 layers of 404,750,336 bytes and the 524,296,192-byte root: 13,476,306,944 bytes."""
    assert C.forward_share(TrainingSetup(method="full")) == pytest.approx(1 / 3)
    assert C.forward_share(TrainingSetup(method="lora", grad_ckpt=True)) == pytest.approx(1 / 3)
    assert C.forward_share(TrainingSetup(method="lora")) == pytest.approx(1 / 2)
    assert C.gathered_weight_bytes(L2, TrainingSetup(method="lora", precision="bf16")) == 13_476_306_944


def full(n, sharding, **kw):
    return TrainingSetup(method="full", precision="bf16-mixed", grad_ckpt=True, batch=1, seq=2048, gpus=n,
                         sharding=sharding, **kw)


def test_slow_link_exposes_more_and_zero12_expose_everything():
    """Full fine-tuning of Llama-2-7B with FSDP on 8 GPUs: NVLink hides what PCIe cannot; ZeRO-1/2
    (overlap_comm false by default) expose all of their collectives; 1 GPU has none."""
    h100, g4090 = catalog.load_gpu("h100-sxm"), catalog.load_gpu("rtx-4090")
    fast = C.communication(L2, full(8, "fsdp"), h100, 1.0)
    slow = C.communication(L2, full(8, "fsdp"), g4090, 1.0)
    assert slow.exposed_s > fast.exposed_s and slow.total_s > fast.total_s
    z2 = C.communication(L2, full(8, "zero2"), h100, 1.0)
    assert z2.exposed_s == z2.total_s > 0
    assert C.communication(L2, TrainingSetup(method="full"), h100, 1.0).total_s == 0.0


def test_step_time_adds_the_exposed_communication():
    """The step's transfer part is comm.py's exposed time when nothing is offloaded."""
    g4090 = catalog.load_gpu("rtx-4090")
    setup = full(2, "fsdp")
    e = estimate(L2, g4090, setup, reverse=False)
    t = e.time
    # the collectives overlap one micro-batch's forward and backward on the device (time.step_phases)
    from reportgen.estimate.memory import effective_attention
    from reportgen.estimate.time import TimeConstants, peak_dtype, step_phases
    from reportgen.estimate.work import step_work

    work = step_work(L2, setup, effective_attention(L2, setup)[0])
    phases = step_phases(work, g4090, peak_dtype(setup, g4090)[0], TimeConstants.current(g4090))
    busy = phases[0][1] + phases[1][1]
    assert t.parts["transfer"] == pytest.approx(C.communication(L2, setup, g4090, busy).exposed_s)
    assert t.parts["transfer"] > 0


def test_no_shard_all_reduces_every_micro_batch_and_ddp_once_per_step():
    """FSDP NO_SHARD all-reduces each unit's gradients in every micro-batch's backward (comm.py: the
    training loops do not wrap FSDP's micro-batches in ``no_sync``), DDP only in the micro-batch that
    syncs (``no_sync`` on the others, as HF Trainer/Accelerate do). Four
    micro-batches of Llama-2-7B on two H100s: NO_SHARD moves four ring all-reduces of the gradients,
    DDP one; with one micro-batch the two move the same."""
    h100 = catalog.load_gpu("h100-sxm")
    bw = 450e9 * C.PEER_LINK_EFFICIENCY
    ar = C.ring_all_reduce_s(C.gradient_reduce_bytes(L2, full(2, "no-shard")), 2, bw)
    four = C.communication(L2, full(2, "no-shard", accum=4), h100, 1.0)
    one = C.communication(L2, full(2, "no-shard"), h100, 1.0)
    assert four.total_s == pytest.approx(4 * ar) and one.total_s == pytest.approx(ar)
    assert four.exposed_s == pytest.approx(4 * one.exposed_s)
    assert C.communication(L2, full(2, "ddp", accum=4), h100, 1.0).total_s == pytest.approx(ar)


def test_cards_without_p2p_go_through_host_memory_at_the_published_rate():
    """GeForce cards have no GPU peer-to-peer (gpus.yaml ``peer_p2p: false``), so NCCL stages through host
    memory: the published bidirectional P2P=Disabled copies of RTX 4090s on PCIe 4.0 x16 have a median of
    25.91 GB/s both ways, 12.955 GB/s per direction, 0.405 of the 32 GB/s datasheet figure. Worked example:
    two RTX 4090s all-gather Llama-2-7B's 13,476,306,944 bf16 bytes: each card receives the other's half,
    6,738,153,472 bytes at 12.955 GB/s = 0.5201 s (at the former 0.8 of 32 GB/s it was 0.2632 s).
    A card with P2P (RTX A6000, same PCIe 4.0 x16) keeps PEER_LINK_EFFICIENCY, and so does a ring across
    nodes (InfiniBand)."""
    g4090, a6000 = catalog.load_gpu("rtx-4090"), catalog.load_gpu("rtx-a6000")
    assert C.SHM_LINK_EFFICIENCY == pytest.approx(25.91 / 2 / 32)
    assert not g4090.peer_p2p and a6000.peer_p2p
    assert C.link_efficiency(g4090, 2) == C.SHM_LINK_EFFICIENCY
    assert C.link_efficiency(a6000, 2) == C.PEER_LINK_EFFICIENCY == C.link_efficiency(g4090, 16)
    W = C.gathered_weight_bytes(L2, TrainingSetup(method="lora", precision="bf16"))
    bw = C.link_for(g4090, 2)[1] * 1e9 * C.link_efficiency(g4090, 2)
    assert bw == pytest.approx(12.955e9)
    assert C.all_gather_s(W, 2, bw) == pytest.approx(0.5201, abs=1e-4)


def test_every_geforce_card_is_marked_without_p2p():
    """Every GeForce card in the catalog says it has no peer-to-peer; no data-center or workstation card does."""
    for key in catalog.gpu_names():
        g = catalog.load_gpu(key)
        assert g.peer_p2p == (not g.is_consumer), key


def test_fsdp_step_on_two_geforce_cards_prices_the_host_staged_link():
    """The step's collectives on two RTX 4090s are those at SHM_LINK_EFFICIENCY: FSDP full fine-tuning of
    Llama-2-7B moves (2 all-gathers + 1 reduce-scatter) per micro-batch, total = that bytes-over-rate sum,
    and the note says the data goes through host memory."""
    g4090 = catalog.load_gpu("rtx-4090")
    setup = full(2, "fsdp")
    c = C.communication(L2, setup, g4090, 1.0)
    bw = 32e9 * C.SHM_LINK_EFFICIENCY
    W, G = C.gathered_weight_bytes(L2, setup), C.gradient_reduce_bytes(L2, setup)
    assert c.total_s == pytest.approx(2 * C.all_gather_s(W, 2, bw) + C.reduce_scatter_s(G, 2, bw))
    assert any("through host memory" in n for n in c.notes)
