"""One rank of a multi-GPU measurement: the process ``torchrun`` starts for each GPU.

A case with ``gpus > 1`` is measured by ``gpus`` processes, one per device, launched by the parent
(``isolate.py``) as ``python -m torch.distributed.run --standalone --nproc-per-node N -m
reportgen.measure.worker REQUEST ANSWER --torchrun``. Each rank runs the single-GPU harness
(``harness.run``) with a ``Rank``: it joins the process group (``nccl`` on CUDA, ``gloo`` on the
CPU), builds the model as the single-GPU recipe does (``build.py``), wraps it, runs the same
warm-up and timed steps on its own micro-batches (data seed = its rank, so rank 0 sees the
single-GPU data) and reads its own counters. Every rank writes its own answer file
(``rank_paths``); the parent merges them (``ranks.py``), so a dead or hung rank never keeps the
others' figures from being reported, and no collective is needed to report a failure.

Wrapping, per the setup's ``sharding``:

* ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` (default 25 MiB gradient buckets;
  ``find_unused_parameters`` for MoE models, whose unrouted experts get no gradient). With
  ``accum > 1`` the micro-batches before the last run under ``no_sync()`` (accelerate's and HF
  Trainer's gradient accumulation), so the gradients are all-reduced once per optimizer step.
* ``fsdp``: FSDP2, ``torch.distributed.fsdp.fully_shard`` on every decoder layer (the classes in
  the model's ``_no_split_modules``, transformers' own list, what accelerate's transformer auto-wrap
  uses) and then on the root (embeddings, final norm, head), over a 1-D mesh of all ranks.
  ``MixedPrecisionPolicy(param_dtype=<compute dtype>, reduce_dtype=fp32)`` for the mixed precisions
  (fp32 sharded master weights, layers gathered in 16 bit, gradients reduced in fp32, as torchtitan
  and torchtune configure it); the default policy (no casts) for ``fp32`` and pure ``bf16``. The
  harness' autocast stays on, as in the single-GPU recipe. FSDP2 reduce-scatters every micro-batch
  (no ``set_requires_gradient_sync(False)``: keeping unsharded gradients across micro-batches would
  undo the sharding). QLoRA stores its packed 4-bit weights in the compute dtype
  (bitsandbytes ``quant_storage``, ``build.py``), so FSDP shards and gathers them as plain tensors
  and bitsandbytes restores their quantization state from the module after each gather
  (``fix_4bit_weight_quant_state_from_module``); the state itself stays on every rank.
* ``no-shard``: FSDP2 over a ``(N, 1)`` replicate x shard mesh (HSDP with one shard): every rank
  holds all parameters and the gradients are all-reduced, FSDP1 ``NO_SHARD``'s behaviour.
* ``offload=params`` with FSDP: ``CPUOffloadPolicy`` (sharded parameters, gradients and the
  optimizer step on the host; pinned memory on CUDA).

Each rank builds the whole model on its own device before FSDP shards it, so the model must fit
one device in its storage dtype at load time (the peaks are read after the warm-up, when the
build's memory is gone).

Refused with a reason: bitsandbytes' optimizers under FSDP (their kernels refuse DTensor
parameters: "got mixed torch.Tensor and DTensor"), ``optimizer_in_backward`` (its per-parameter hooks step before DDP's
all-reduce or FSDP's reduce-scatter has produced the gradient), ``loss=chunked`` (it calls the
decoder and the head directly, bypassing the DDP/FSDP root's forward).

The rank records ``world_size``, ``rank``, ``local_rank``, ``backend`` and ``launcher`` in its
environment, so a multi-GPU measurement is never mistaken for a single-GPU one.

Test-only: ``REPORTGEN_FAULT_RANK=R`` limits ``REPORTGEN_FAULT`` (``harness.py``) to rank ``R``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from reportgen.setup import Method, Offload, Sharding, TrainingSetup

#: how a multi-GPU run is started (recorded in every rank's environment and in the settings)
LAUNCHER = "torchrun"
#: the worker's flag that says it is one rank of a torchrun launch
TORCHRUN_FLAG = "--torchrun"
FAULT_RANK_ENV = "REPORTGEN_FAULT_RANK"
#: optimizers whose kernels refuse DTensor parameters (FSDP2)
BNB_OPTIMIZERS = ("adamw-8bit", "paged-adamw-8bit", "paged-adamw")

#: words of a collective that failed because another rank went away (gloo, NCCL, the c10d store)
PEER_LOST_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused",
                     "NCCL communicator was aborted", "remote process exited", "ncclRemoteError",
                     "Socket Timeout", "Timed out waiting", "DistNetworkError", "DistBackendError")


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def rank_paths(answer: Path, rank: int) -> tuple[Path, Path]:
    """``(answer file, pid file)`` of one rank, next to the launch's answer path."""
    answer = Path(answer)
    return answer.with_name(f"{answer.stem}.rank{rank}.json"), answer.with_name(f"{answer.stem}.rank{rank}.pid")


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank when torchrun dies (``prctl(PR_SET_PDEATHSIG)``): the parent
    kills torchrun on a timeout, and torchrun starts each rank in its own session, out of reach of
    a process-group kill. The parent also kills each rank's group by the pid it wrote."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's kill by pid remains
        return
    if os.getppid() != parent:  # torchrun died before the request took effect
        os._exit(1)


@dataclass(frozen=True)
class Rank:
    """This process's place in the launch (torchrun's ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``)."""

    rank: int
    local_rank: int
    world_size: int
    backend: str

    @classmethod
    def from_env(cls, device: str) -> "Rank":
        try:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        except (KeyError, ValueError):
            raise RuntimeError(f"{TORCHRUN_FLAG}: RANK and WORLD_SIZE are not set; this worker must be started by "
                               "torchrun") from None
        return cls(rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", rank)), world_size=world,
                   backend=backend_for(device))

    def environment(self) -> dict:
        return {"world_size": self.world_size, "rank": self.rank, "local_rank": self.local_rank,
                "backend": self.backend, "launcher": LAUNCHER}

    def fault(self, fault: str | None) -> str | None:
        """The injected fault, if it is meant for this rank."""
        target = os.environ.get(FAULT_RANK_ENV)
        return fault if not target or int(target) == self.rank else None

    # ----- the process group -------------------------------------------------------------------
    def connect(self, device: str) -> None:
        import torch
        import torch.distributed as dist

        kwargs = {"device_id": torch.device("cuda", self.local_rank)} if device == "cuda" else {}
        dist.init_process_group(backend=self.backend, **kwargs)
        if dist.get_world_size() != self.world_size:
            raise RuntimeError(f"process group of {dist.get_world_size()} ranks, WORLD_SIZE={self.world_size}")

    def finish(self) -> bool:
        """Wait for every rank to be done, then leave the group; False when a peer is gone."""
        import torch.distributed as dist

        try:
            dist.barrier()
            dist.destroy_process_group()
            return True
        except Exception:  # noqa: BLE001 - another rank failed; its own answer says how
            return False

    def agree_stop(self, reason: str | None, device: str) -> str | None:
        """Stop the timed steps only when every rank's rule says stop (an all-reduce of the MIN of
        the ranks' "stop" flags, outside the timed window): the ranks' steps run collectives, so all
        must run the same number. Returns this rank's reason then, else None (go on)."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if reason else 0], dtype=torch.int32,
                            device=torch.device("cuda", self.local_rank) if device == "cuda" else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return reason if int(flag.item()) == 1 else None

    # ----- the model ---------------------------------------------------------------------------
    @staticmethod
    def quant_storage(setup: TrainingSetup) -> str | None:
        """QLoRA under FSDP stores the packed 4-bit weights in the compute dtype (module docstring)."""
        fsdp = setup.sharding in (Sharding.fsdp, Sharding.no_shard)
        return setup.compute_dtype if fsdp and setup.method == Method.qlora else None

    def wrap(self, model, setup: TrainingSetup, device: str, notes: list[str]):
        import torch

        if setup.sharding == Sharding.ddp:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.local_rank] if device == "cuda" else None
            config = getattr(model, "config", None)
            # a MoE layer's experts that no token of a micro-batch reached get no gradient
            moe = bool(getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None))
            notes.append(f"DDP over {self.world_size} ranks ({self.backend}): DistributedDataParallel, 25 MiB buckets"
                         + ("; gradient accumulation all-reduces once per step (no_sync)" if setup.accum > 1 else "")
                         + ("; find_unused_parameters (MoE experts)" if moe else ""))
            return DistributedDataParallel(model, device_ids=ids, output_device=ids[0] if ids else None,
                                           find_unused_parameters=moe)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        from reportgen.measure.optimizers import SetupNotSupported

        if setup.sharding == Sharding.no_shard:
            mesh = init_device_mesh(device, (self.world_size, 1), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(device, (self.world_size,))
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[setup.compute_dtype]
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if setup.autocast \
            else MixedPrecisionPolicy()
        offload = CPUOffloadPolicy(pin_memory=device == "cuda") if setup.offload == Offload.params else OffloadPolicy()
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        names = set(getattr(base, "_no_split_modules", None) or ())
        layers = [m for m in base.modules() if type(m).__name__ in names]
        if not layers:
            raise SetupNotSupported(f"sharding={setup.sharding.value}: {type(base).__name__} names no decoder layer "
                                    "class (_no_split_modules) to shard by")
        kind = type(layers[0]).__name__
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=offload)
        fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload)
        how = ("NO_SHARD as FSDP2 over a (N, 1) replicate x shard mesh" if setup.sharding == Sharding.no_shard
               else "FSDP2 fully_shard")
        notes.append(f"{how} over {self.world_size} ranks ({self.backend}): {len(layers)} {kind} "
                     f"units + the root; MixedPrecisionPolicy(param_dtype={mp.param_dtype}, "
                     f"reduce_dtype={mp.reduce_dtype})"
                     + ("; CPUOffloadPolicy" if setup.offload == Offload.params else ""))
        return model

    @staticmethod
    def micro_batch_sync(model, setup: TrainingSetup):
        """``sync(last)``: the context a micro-batch's forward and backward run in."""
        if setup.sharding == Sharding.ddp and setup.accum > 1:
            return lambda last: contextlib.nullcontext() if last else model.no_sync()
        return lambda last: contextlib.nullcontext()


def check_supported(setup: TrainingSetup, device: str, world_size: int, *, count_gpus: bool = True) -> None:
    """What a multi-GPU run refuses (``harness.check_supported`` calls it when ``gpus > 1``);
    ``count_gpus=False``: all but the count of visible GPUs, which imports torch."""
    from reportgen.measure.optimizers import SetupNotSupported

    if world_size != setup.gpus:
        raise SetupNotSupported(f"gpus={setup.gpus} but {world_size} processes were launched")
    if device == "cuda" and count_gpus:
        import torch

        have = torch.cuda.device_count()
        if have < setup.gpus:
            raise SetupNotSupported(f"gpus={setup.gpus} ({setup.sharding.value}) needs {setup.gpus} GPUs; "
                                    f"this machine has {have}")
    if setup.sharding not in (Sharding.ddp, Sharding.fsdp, Sharding.no_shard):
        raise SetupNotSupported(f"sharding={setup.sharding.value!r} is estimated only: the harness measures ddp, "
                                "fsdp (FSDP2 fully_shard) and no-shard")
    if setup.optimizer_in_backward:
        raise SetupNotSupported(f"optimizer_in_backward with {setup.sharding.value}: the per-parameter hooks would "
                                "step before the gradient is all-reduced/reduce-scattered; not implemented")
    if setup.sharding in (Sharding.fsdp, Sharding.no_shard) and setup.optimizer.value in BNB_OPTIMIZERS:
        raise SetupNotSupported(f"optimizer {setup.optimizer.value!r} with {setup.sharding.value}: bitsandbytes' "
                                "optimizer kernels take plain tensors, not FSDP2's sharded DTensor parameters")
    if setup.loss.value == "chunked":
        raise SetupNotSupported(f"loss='chunked' with {setup.sharding.value}: the chunked loss calls the decoder and "
                                "the head directly, bypassing the DDP/FSDP root's forward; not implemented")


def is_peer_failure(exc: BaseException) -> bool:
    """A collective failed because another rank went away (its own failure is the cause)."""
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in PEER_LOST_MARKERS)
