"""Communication time of data-parallel training: collectives over the real link, overlapped with
compute the way each framework schedules them.

Collective costs are NCCL's ring algorithms (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce
algorithms"; NCCL's ``doc/PERFORMANCE.md``: an all-reduce moves ``2 (n-1)/n`` of the buffer per GPU,
an all-gather or reduce-scatter ``(n-1)/n`` of the full buffer) over the GPU-to-GPU link of the
catalog (``peer_link_gbs``: NVLink via NVSwitch on SXM boards, a bridge for NVL pairs, PCIe for the
rest; GeForce cards have no peer-to-peer, NCCL goes through host memory, bounded by PCIe), at
``PEER_LINK_EFFICIENCY`` of the datasheet figure. A group larger than the NVLink domain (8 GPUs of
an HGX board) is bounded by the network between nodes (``INTERNODE_GBS_PER_GPU``).

Overlap, per framework (each its own function below): FSDP all-gathers the next layer while the
current one computes and reduce-scatters a layer's gradients while the next layer's backward runs
(Zhao et al. 2023, "PyTorch FSDP", section 3.3 "Communication Optimizations": prefetching and
overlapping); only what exceeds the compute, plus the first all-gather and the last reduce-scatter,
shows in the step. DDP all-reduces 25 MB buckets as the backward fills them (Li et al. 2020,
"PyTorch Distributed", section 3.2.3), so only the excess and the last bucket show. DeepSpeed
ZeRO-1/2 reduce with ``overlap_comm`` false by default (``deepspeed/runtime/zero/config.py``: "true
by default for stage 3, false otherwise"), so their reductions and the parameter all-gather after
the step are exposed; ZeRO-3 overlaps like FSDP.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from reportgen.estimate import params as P
from reportgen.estimate import sharding as SH
from reportgen.estimate.dtypes import dtypes_for
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import Method, Sharding, TrainingSetup

#: fraction of the link's datasheet bandwidth NCCL's ring collectives reach. ASSUMED 0.8, like
#: ``HOST_LINK_EFFICIENCY`` (nccl-tests report bus bandwidths of 75-90% of NVLink's per-direction figure).
PEER_LINK_EFFICIENCY = 0.8
#: Cards without GPU peer-to-peer (``gpus.yaml`` ``peer_p2p: false``: GeForce in NVIDIA's driver) move NCCL's
#: data through host memory (its SHM transport: the sender GPU writes into pinned host memory over its PCIe
#: link, the receiver reads it over its own). A two-card ring sends both ways at once, so the rate that
#: bounds it is a concurrent both-ways host-staged copy: CUDA's ``p2pBandwidthLatencyTest``
#: "Bidirectional P2P=Disabled Bandwidth Matrix" (GB/s, both directions summed), published for RTX 4090s on
#: PCIe 4.0 x16 slots: tinygrad/open-gpu-kernel-modules issue 6 (3 cards, "All slots are running GEN
#: 4@16x": 25.76 25.91 25.95 25.60 26.15 25.68) and NVIDIA/nccl issue 814 (6 cards, topology
#: ``link_speed="16.0 GT/s PCIe" link_width="16"``; GPU0's row: 21.12 to its PHB neighbour, 30.53, 29.85).
#: They are the measurements, copied; not fitted to any step time.
SHM_BIDIR_MEASURED_GBS = (25.76, 25.91, 25.95, 25.60, 26.15, 25.68, 21.12, 30.53, 29.85)
#: the datasheet per-direction figure of those cards' link (PCIe 4.0 x16, ``gpus.yaml`` ``rtx-4090``)
SHM_MEASURED_LINK_GBS = 32.0
#: fraction of the PCIe link's datasheet bandwidth per direction that collectives through host memory reach:
#: the median of ``SHM_BIDIR_MEASURED_GBS`` halved (per direction) over ``SHM_MEASURED_LINK_GBS``
#: (25.91 / 2 / 32 = 0.405). Applied to every generation's PCIe figure (Gen5 is assumed to scale alike: no
#: published Gen5 host-staged figure was found) and to the catalog's lane count (x8 cards: half).
SHM_LINK_EFFICIENCY = statistics.median(SHM_BIDIR_MEASURED_GBS) / 2 / SHM_MEASURED_LINK_GBS
#: network bandwidth per GPU between nodes, GB/s per direction: one 400 Gb/s InfiniBand NDR adapter
#: per GPU (NVIDIA DGX H100 user guide: eight ConnectX-7 "400 Gb/s" compute-fabric ports for 8 GPUs).
INTERNODE_GBS_PER_GPU = 50.0
#: DDP's first bucket (the last gradients of the backward), ``torch/nn/parallel/distributed.py``
#: ``_DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB: its all-reduce starts when the backward has ended.
DDP_LAST_BUCKET_BYTES = 2**20


@dataclass(frozen=True)
class Communication:
    link: str  # which link the collectives use
    link_gbs: float | None  # its datasheet GB/s per direction (None: not in the catalog)
    total_s: float  # collective time per optimizer step, if nothing overlapped
    exposed_s: float  # the part that adds to the step
    notes: list[str] = field(default_factory=list)


def link_for(gpu: GpuSpec, group: int) -> tuple[str, float | None]:
    """The link a collective over ``group`` GPUs is bounded by: past one machine's ``NODE_GPUS`` (8)
    the network between nodes; else the catalog's peer link inside its NVLink domain
    (``peer_link_gpus``; PCIe links have no such limit); else (H100 NVL beyond its bridged pair) the
    PCIe host link."""
    if group > SH.NODE_GPUS:  # more GPUs than one machine holds: the ring crosses the network
        return f"InfiniBand between nodes ({INTERNODE_GBS_PER_GPU:g} GB/s per GPU)", INTERNODE_GBS_PER_GPU
    if gpu.peer_link_gbs and (gpu.peer_link_gpus is None or group <= gpu.peer_link_gpus):
        return gpu.peer_link, gpu.peer_link_gbs
    return gpu.host_link, gpu.host_link_gbs


def link_efficiency(gpu: GpuSpec, group: int) -> float:
    """Fraction of ``link_for``'s datasheet figure the ring reaches: ``SHM_LINK_EFFICIENCY`` inside one
    machine of cards without peer-to-peer (``gpu.peer_p2p`` false: NCCL's data goes through host memory),
    else ``PEER_LINK_EFFICIENCY`` (NVLink, PCIe P2P, and the network between nodes)."""
    if group <= SH.NODE_GPUS and not gpu.peer_p2p:
        return SHM_LINK_EFFICIENCY
    return PEER_LINK_EFFICIENCY


def ring_all_reduce_s(nbytes: float, n: int, bytes_per_s: float) -> float:
    """Ring all-reduce: ``2 (n-1)/n x bytes / bandwidth`` (Patarasuk & Yuan 2009; NCCL busbw)."""
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bytes_per_s


def all_gather_s(nbytes: float, n: int, bytes_per_s: float) -> float:
    """Ring all-gather of a buffer of ``bytes`` in total: ``(n-1)/n x bytes / bandwidth``; a
    reduce-scatter moves the same (NCCL ``doc/PERFORMANCE.md``)."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / bytes_per_s


reduce_scatter_s = all_gather_s


def exposed_s(comm_s: float, compute_s: float) -> float:
    """Communication on its own stream hides behind compute on the other: ``max(0, comm - compute)``."""
    return max(0.0, comm_s - compute_s)


def forward_share(setup: TrainingSetup) -> float:
    """The forward's share of a micro-batch's matmul FLOPs (``time.flops_per_token``): ``2N`` of
    ``6N`` for full fine-tuning, of ``4N`` for a frozen base (LoRA, QLoRA); checkpointing's
    recomputed forward (``+2N``) runs inside the backward."""
    total = (6 if setup.method == Method.full else 4) + (2 if setup.grad_ckpt else 0)
    return 2 / total


def gathered_weight_bytes(model: ModelSpec, setup: TrainingSetup) -> int:
    """Bytes one all-gather of the whole model moves: the layers in the compute dtype (QLoRA's packed
    4-bit weights stored in the compute dtype, half a byte per weight, fsdp_qlora's
    ``quant_storage``) and the root (embeddings, head, final norm)."""
    from reportgen.estimate.memory import root_param_bytes

    dt = dtypes_for(setup)
    layer_params = sum(lin.params for lin in model.layer_linears())
    layer = layer_params // 2 if setup.method == Method.qlora else layer_params * dt.compute
    return model.num_layers * layer + root_param_bytes(model, dt)


def gradient_reduce_bytes(model: ModelSpec, setup: TrainingSetup) -> int:
    """Bytes of gradients reduced: every trainable parameter's gradient in its own dtype (fp32 under
    mixed precision, the reduce dtype of the harness's ``MixedPrecisionPolicy(reduce_dtype=fp32)``)."""
    dt = dtypes_for(setup)
    return P.trainable_params(model, setup) * P.trainable_dtype_bytes(setup, dt)


def fsdp_pass_exposed_s(gather_s: float, reduce_s: float, fwd_s: float, bwd_s: float, layers: int,
                        regather: bool = True) -> float:
    """One micro-batch of FULL_SHARD (or ZeRO-3): the forward's all-gathers hide behind the forward
    except the first layer's; the backward's all-gathers (again, ``regather``; SHARD_GRAD_OP keeps
    the forward's) and reduce-scatters hide behind the backward except the last layer's
    reduce-scatter: ``max(0, AG - fwd) + AG/L + max(0, AG + RS - bwd) + RS/L``."""
    back = (gather_s if regather else 0.0) + reduce_s
    return exposed_s(gather_s, fwd_s) + gather_s / layers + exposed_s(back, bwd_s) + reduce_s / layers


def ddp_exposed_s(all_reduce_s: float, last_bucket_s: float, bwd_s: float) -> float:
    """DDP: bucketed all-reduce overlapping the backward of the micro-batch that syncs; the last
    (1 MiB) bucket waits for the backward's end: ``max(0, AR - bwd) + AR(last bucket)``."""
    return exposed_s(all_reduce_s, bwd_s) + last_bucket_s


def communication(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, compute_mb_s: float | None) -> Communication:
    """Collective time per optimizer step and the part compute does not hide, for ``setup.sharding``.
    ``compute_mb_s``: one micro-batch's compute time (None: no overlap assumed)."""
    n, a = setup.gpus, setup.accum
    if n <= 1:
        return Communication("", None, 0.0, 0.0)
    group = SH.shard_group_size(setup)
    ring = group if setup.sharding != Sharding.ddp else n
    label, gbs = link_for(gpu, ring)
    if not gbs:
        return Communication(label or "unknown", None, 0.0, 0.0,
                             [f"{gpu.name}: no link bandwidth in the catalog; communication not estimated"])
    eff = link_efficiency(gpu, ring)
    bw = gbs * 1e9 * eff
    comp = compute_mb_s or 0.0
    fwd, bwd = comp * forward_share(setup), comp * (1 - forward_share(setup))
    W, G, L = gathered_weight_bytes(model, setup), gradient_reduce_bytes(model, setup), model.num_layers
    s = setup.sharding
    notes: list[str] = []
    if s == Sharding.ddp:  # all-reduce once per step (no_sync on the other micro-batches)
        ar = ring_all_reduce_s(G, n, bw)
        total, exposed = ar, ddp_exposed_s(ar, ring_all_reduce_s(min(G, DDP_LAST_BUCKET_BYTES), n, bw), bwd)
    elif s == Sharding.no_shard:  # FSDP NO_SHARD: each unit's gradients all-reduced every micro-batch
        ar = ring_all_reduce_s(G, n, bw)
        total, exposed = a * ar, a * (exposed_s(ar, bwd) + ar / L)
    elif s in (Sharding.fsdp, Sharding.hybrid_shard, Sharding.zero3, Sharding.shard_grad_op):
        ag, rs = all_gather_s(W, group, bw), reduce_scatter_s(G, group, bw)
        if s == Sharding.hybrid_shard and n > group:  # the shard's gradients all-reduced across nodes
            m = n // group
            rs += ring_all_reduce_s(G / group, m, INTERNODE_GBS_PER_GPU * 1e9 * PEER_LINK_EFFICIENCY)
        regather = s != Sharding.shard_grad_op
        total = a * (ag * (2 if regather else 1) + rs)
        exposed = a * fsdp_pass_exposed_s(ag, rs, fwd, bwd, L, regather)
    else:  # ZeRO-1/2: overlap_comm false by default; updated parameters all-gathered after the step
        rs = reduce_scatter_s(G, n, bw)
        dt = dtypes_for(setup)
        ag = all_gather_s(P.trainable_params(model, setup) * P.trainable_dtype_bytes(setup, dt), n, bw)
        reduces = a if s == Sharding.zero2 else 1  # stage 2 reduces every micro-batch, stage 1 at the boundary
        total = exposed = reduces * rs + ag
        notes.append(f"{s.value}: DeepSpeed's overlap_comm is false by default for stages 1 and 2, so the "
                     "gradient reduction and the parameter all-gather add to the step")
    via = " through host memory (no GPU peer-to-peer)" if eff == SHM_LINK_EFFICIENCY else ""
    notes.append(f"collectives over {label}{via} ({gbs:g} GB/s per direction at {eff:.0%}): {total:.3f} s per "
                 f"step, {exposed:.3f} s not hidden by compute")
    return Communication(label, gbs, total, exposed, notes)
