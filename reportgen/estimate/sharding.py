"""What each data-parallel strategy keeps on one GPU: which of parameters, gradients and optimizer
states are split, what stays gathered while a layer computes, and the communication buffers.

ZeRO's accounting (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", section 5.1 and figure 1), for ``Psi`` parameters, ``K`` bytes of optimizer
state per parameter and ``N`` GPUs: stage 1 (P_os) splits the optimizer states, ``2 Psi + 2 Psi +
K Psi / N``; stage 2 (P_os+g) the gradients too, ``2 Psi + (2 + K) Psi / N``; stage 3 (P_os+g+p)
the parameters as well, ``(2 + 2 + K) Psi / N``. PyTorch FSDP (Zhao et al. 2023, "PyTorch FSDP:
Experiences on Scaling Fully Sharded Data Parallel", section 3.2) maps FULL_SHARD to stage 3,
SHARD_GRAD_OP to stage 2 (parameters gathered from the forward to the backward), NO_SHARD to DDP,
and HYBRID_SHARD to full sharding inside a node and replication across nodes.

``Placement.params/grads/states`` are the divisors applied to reportgen's whole-model terms
(``params.py``), so each recipe keeps its own dtypes (ZeRO's ``K`` = 12 for mixed-precision Adam
is reportgen's fp32 master weights plus AdamW's two states).
"""

from __future__ import annotations

from dataclasses import dataclass

from reportgen.setup import NODE_GPUS, FsdpParamDtype, Offload, Sharding, TrainingSetup  # noqa: F401 (NODE_GPUS: SH.NODE_GPUS)

#: DeepSpeed defaults (``deepspeed/runtime/zero/config.py``, ``DeepSpeedZeroConfig``):
#: ``reduce_bucket_size`` 5e8 elements, ``stage3_prefetch_bucket_size`` 5e7 elements.
ZERO_REDUCE_BUCKET_ELEMENTS = 500_000_000
ZERO3_PREFETCH_BUCKET_ELEMENTS = 50_000_000

FSDP_FAMILY = (Sharding.fsdp, Sharding.shard_grad_op, Sharding.hybrid_shard)


@dataclass(frozen=True)
class Placement:
    """Divisors of the whole-model parameter, gradient and optimizer-state bytes on one GPU."""

    params: int
    grads: int
    states: int

    @property
    def sharded_params(self) -> bool:
        return self.params > 1


def shard_group_size(setup: TrainingSetup) -> int:
    """GPUs one copy of the model is split over: all of them, except HYBRID_SHARD, which shards
    within a node (``NODE_GPUS``) and replicates across nodes."""
    if setup.sharding == Sharding.hybrid_shard:
        return min(setup.gpus, NODE_GPUS)
    return setup.gpus


def placement(setup: TrainingSetup) -> Placement:
    """ZeRO section 5.1 as divisors: stage 1 splits states, stage 2 states and gradients, stage 3
    and FSDP FULL_SHARD / SHARD_GRAD_OP / HYBRID_SHARD all three; DDP and NO_SHARD none."""
    g = shard_group_size(setup)
    s = setup.sharding
    if s in FSDP_FAMILY or s == Sharding.zero3:
        return Placement(g, g, g)
    if s == Sharding.zero2:
        return Placement(1, g, g)
    if s == Sharding.zero1:
        return Placement(1, 1, g)
    return Placement(1, 1, 1)


def gathers_layers(setup: TrainingSetup) -> bool:
    """The layers are all-gathered for each pass: a parameter-sharding strategy, or FSDP's CPU
    offload of parameters (even NO_SHARD copies each layer in from the host)."""
    return placement(setup).sharded_params or setup.offload == Offload.params


def gather_dtype_bytes(setup: TrainingSetup, compute_bytes: int) -> int:
    """Bytes per parameter FSDP's all-gather makes (``fsdp_param_dtype``). ``compute``: FSDP's
    ``MixedPrecision(param_dtype=...)`` / FSDP2's ``MixedPrecisionPolicy`` gathers in the compute
    dtype, so no autocast copy is made (the usual recipe: accelerate, torchtitan, fsdp_qlora). ``fp32``:
    Lightning's ``FSDPPrecision.mixed_precision_config`` (``lightning/fabric/plugins/precision/fsdp.py``)
    sets ``param_dtype = torch.float32`` for ``bf16-mixed`` and ``16-mixed`` and runs the forward under
    ``torch.autocast`` (``forward_context``): the layers are gathered in fp32 (4 bytes), and autocast
    casts each gathered weight, a leaf that requires grad, and caches the 16-bit copy until the
    autocast region ends (``aten/src/ATen/autocast_mode.cpp`` ``cached_cast``, the cache cleared when the
    outermost autocast exits): at the forward's end one 16-bit copy of every weight is live beside the
    sharded fp32 weights, as without FSDP (``timeline``'s autocast copies)."""
    return 4 if setup.fsdp_param_dtype == FsdpParamDtype.fp32 else compute_bytes


def full_shard_gathered_bytes(layer_bytes: int, root_bytes: int, n: int) -> int:
    """FULL_SHARD / HYBRID_SHARD / FSDP2 ``fully_shard``: beyond each GPU's shard, two layers' full
    parameters (the one computing and the prefetched next, ``BACKWARD_PRE``) and the root unit's
    other ``(1 - 1/n)``, which stays gathered from the first forward to the end of the backward
    (``torch/distributed/fsdp/_runtime_utils.py`` ``_post_forward_reshard``: "Do not free the
    root's parameters in the post-forward for FULL_SHARD"): ``2 layer + root - root / n``."""
    return 2 * layer_bytes + root_bytes - root_bytes // n


def shard_grad_op_gathered_bytes(layer_bytes: int, num_layers: int, root_bytes: int, n: int) -> int:
    """SHARD_GRAD_OP (ZeRO-2 style): a layer gathered for its forward is not freed afterwards
    (``_post_forward_reshard`` frees only for ``RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES`` =
    FULL_SHARD, HYBRID_SHARD), so at the end of the forward every layer is gathered, and the
    backward frees each after its gradient: ``L layer + root - root / n`` at the forward's end.
    The same figure is used for every moment of the passes (an upper bound for the last layers'
    backward)."""
    return num_layers * layer_bytes + root_bytes - root_bytes // n


def zero3_gathered_bytes(layer_bytes: int, largest_matrix_bytes: int, compute_bytes: int) -> int:
    """DeepSpeed ZeRO-3 fetches each module's parameters just before it runs and releases them
    after (``partitioned_param_coordinator.py``), prefetching up to ``stage3_prefetch_bucket_size``
    (5e7) elements of the next modules: the largest of a decoder layer and the embedding/head
    matrix, plus the prefetch bucket, ``max(layer, E) + min(5e7 c, layer)``. There is no root unit:
    the embeddings and the head are gathered only while they compute."""
    return max(layer_bytes, largest_matrix_bytes) + min(ZERO3_PREFETCH_BUCKET_ELEMENTS * compute_bytes, layer_bytes)


def zero_reduce_bucket_bytes(trainable_params: int, grad_bytes: int) -> int:
    """ZeRO-2 and ZeRO-3 copy gradients into a contiguous reduction bucket as the backward produces
    them (``contiguous_gradients`` true by default; ``stage_1_and_2.py`` ``ipg_buffer``,
    ``stage3.py`` ``__ipg_bucket_flat_buffer``), ``reduce_bucket_size`` = 5e8 elements by default
    or the trainable parameters if fewer: ``min(5e8, trainable) x gradient bytes``."""
    return min(ZERO_REDUCE_BUCKET_ELEMENTS, trainable_params) * grad_bytes


def ddp_bucket_bytes(gradient_bytes: int) -> int:
    """PyTorch DDP's reducer copies every gradient into flat buckets for the all-reduce
    (``torch/nn/parallel/distributed.py``; ``gradient_as_bucket_view=False`` by default), so a
    second copy of all gradients lives beside ``.grad``: ``= gradient bytes``."""
    return gradient_bytes
