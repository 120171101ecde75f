"""Host RAM of the training step, term by term, per GPU process (issue 32: "ZeRO-3 / optimizer offload
runs out of CPU RAM").

What each offload keeps in host RAM, from the libraries' code:

* **torchao ``CPUOffloadOptimizer``** (``offload: optimizer`` on one GPU or under DDP/FSDP;
  ``torchao/optim/cpu_offload.py`` 98-100): for each trainable parameter a pinned host copy
  ``p_host = torch.empty_like(p_device, device="cpu", pin_memory=True)`` and a pinned host gradient
  ``p_host.grad = torch.empty_like(p_host, pin_memory=True)``, both in the parameter's dtype (fp32
  master weights under mixed precision); the wrapped optimizer (``torch.optim.AdamW``) keeps its
  states beside them on the host.
* **DeepSpeed ZeRO-Offload** (``offload: optimizer`` with ``zero1``/``zero2``/``zero3``; DeepSpeed
  0.19.8): each rank's partition of the fp32 master weights, of the Adam states
  (``DeepSpeedCPUAdam``: exp_avg, exp_avg_sq), and of fp32 gradients kept on the host
  (``stage_1_and_2.py`` ``initialize_optimizer_states`` 934-941; ``stage3.py`` 1337-1342, which
  ``_release_sub_group`` does not free under offload, 2729-2731). ZeRO-3 adds its gradient partition
  buffer ``grad_partitions_flat_buffer`` on the offload device (``stage3.py`` 791-795) in the
  gradient-accumulation dtype, the model's dtype unless ``data_types.grad_accum_dtype`` says
  otherwise (``engine.py`` ``get_data_types`` 1799-1810): 4 + 8 + 4 + 2 = 18 bytes per parameter of
  the partition under bf16.
* **FSDP ``CPUOffload(offload_params=True)`` / ZeRO-3 ``offload_param``** (``offload: params``):
  the parameters, their gradients and the optimizer states of each rank's shard
  (``memory.device_placement``).
* **Activation offload** (``act_offload``): the saved activations of all but two layers, in pinned
  host memory (``memory.step_activations``).

DeepSpeed's own estimator, ``estimate_zero3_model_states_mem_needs`` (``stage3.py`` 4016-4052),
counts 16 bytes per parameter per node with the optimizer offloaded (18 with the parameters too)
and multiplies by ``additional_buffer_factor = 1.5``; ``deepspeed_zero3_host_bytes`` reproduces it
so the two can be set side by side: its 16 are the fp32 master weights, the two Adam states and the
fp32 gradients, and it leaves out the gradient partition buffer (2 bytes under bf16), which its
factor of 1.5 covers among other things.

Not counted: the training process's own resident memory (Python, torch, the CUDA libraries),
dataloader workers and the checkpoint's file pages in the page cache while loading; ``run.py``
names them beside the total.
"""

from __future__ import annotations

from reportgen.estimate import params as P
from reportgen.estimate import sharding as SH
from reportgen.estimate.dtypes import Dtypes
from reportgen.model import ModelSpec
from reportgen.setup import Offload, Sharding, TrainingSetup

ZERO = (Sharding.zero1, Sharding.zero2, Sharding.zero3)
#: ``estimate_zero3_model_states_mem_needs``'s default ``additional_buffer_factor``
DEEPSPEED_BUFFER_FACTOR = 1.5


def offload_optimizer_terms(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, states: int,
                            place: SH.Placement) -> dict[str, int]:
    """Host bytes of one process with its optimizer offloaded (the module's list); ``states``: the
    optimizer states' bytes before sharding (``params.optimizer_state_bytes``)."""
    n = P.trainable_params(model, setup) // place.states
    if setup.sharding in ZERO:
        terms = {"master_weights": 4 * n, "optimizer_states": states // place.states, "gradients": 4 * n}
        if setup.sharding == Sharding.zero3:
            terms["gradient_partition_buffer"] = n * (4 if setup.compute_dtype == "fp32" else 2)
        return terms
    param = P.trainable_dtype_bytes(setup, dt)
    return {"master_weights": param * n, "optimizer_states": states // place.states, "gradients": param * n}


def step_host_terms(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, states: int, place: SH.Placement,
                    params_on_host: int, offloaded_activations: int) -> dict[str, int]:
    """Every host term of one GPU process's training step, in bytes (zero terms left out)."""
    terms: dict[str, int] = {}
    if setup.offload == Offload.optimizer:
        terms.update(offload_optimizer_terms(model, setup, dt, states, place))
    elif setup.offload == Offload.params:
        terms["offloaded_parameters_gradients_states"] = params_on_host
    if offloaded_activations:
        terms["offloaded_activations"] = offloaded_activations
    return {k: v for k, v in terms.items() if v}


def deepspeed_zero3_host_bytes(total_params: int, nodes: int = 1, offload_params: bool = False) -> int:
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs(..., cpu_offload=True, zero_init=True)``
    host figure per node: ``total_params * (18 if offload_params else 16) / nodes * 1.5``
    (``stage3.py`` 4029-4044; the GPUs per node do not enter it with ``zero_init``)."""
    per_param = 18 if offload_params else 16
    return int(total_params * per_param * (1 / nodes) * DEEPSPEED_BUFFER_FACTOR)
