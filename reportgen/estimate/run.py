"""The whole run, not one step (issue 32): loading, the training steps, evaluation and checkpoint saves,
each with its peak on one GPU and in the node's host RAM, and the phase that decides whether the run fits.

Each phase's terms, from the libraries' code (transformers 5.24, bitsandbytes 0.50, safetensors 0.8,
PyTorch 2.x FSDP):

* **load**. ``load: device``: ``from_pretrained`` with a ``device_map`` reads each tensor from the
  checkpoint's memory-mapped safetensors file straight onto the GPU; the host holds no copy (the file's
  pages pass through the page cache, which the kernel reclaims). With QLoRA each 16-bit linear weight is
  placed on the GPU and quantized there (bitsandbytes ``Params4bit._quantize``), so the largest one is
  on the GPU in 16 bit beside its 4-bit result for a moment. ``load: cpu`` (no device_map; the Trainer
  moves the model to the GPU afterwards): every GPU process holds the whole model in host RAM in its
  load dtype. ``load: cpu-rank0`` (``FSDP_CPU_RAM_EFFICIENT_LOADING``: ``transformers/distributed/
  fsdp.py`` ``is_fsdp_enabled`` 45-51; ``modeling_utils.py`` 4862-4866 and 4898 skip the weights on
  every rank but the node's rank 0, which FSDP's ``sync_module_states`` broadcasts from): one copy on
  the node. The GPU holds the (sharded) weights once loading is done.
* **train**: the step's peak (``memory.py``) and its host terms (``host.py``) times the GPU processes
  of the node.
* **eval** (``eval_batch``): transformers' ``Trainer.prediction_step`` runs the model under
  ``torch.no_grad()`` on ``eval_batch x eval_seq`` tokens with labels, so the loss upcasts its logits
  as in training (``logits.py``'s forward terms; TRL's ``SFTTrainer.prediction_step`` calls ``compute_loss``
  and its fused LM head, ``sft_trainer.py`` 1679-1688; torchtune's validation its chunked loss; Liger's
  ``lce_forward`` skips the logits only when ``self.training``, so a fused loss evaluates on the full
  logits) while no activation is saved: one layer's tensors are
  live at a time, bounded here by what that layer saves in training (``activations.layer_activations``).
  The weights and the optimizer states stay; the gradients are gone (``zero_grad(set_to_none=True)``
  after the optimizer step). With ``eval_generate`` (evaluation by ``generate``), transformers'
  ``DynamicCache`` keeps every layer's keys and values of the prompt and the new tokens,
  ``2 x layers x kv_heads x head_dim x bytes x batch x (eval_seq + new)``, and each decoding step
  upcasts the last position's logits to fp32 (``generation/utils.py`` ``_sample``). The caching
  allocator keeps what training reserved, so evaluation asks the card for more only where its own
  peak passes the training step's reserved bytes.
* **save**. ``adapter``: peft's ``save_pretrained`` writes the adapters; safetensors' ``save_file``
  copies each GPU tensor to the host (``safetensors/torch.py`` ``_to_ndarray`` 476-479) and keeps every
  copy of the file alive until it is written (``_flatten_as_ptr`` 566-590). ``full``: the whole state
  dict the same way, one file at a time, each at most ``max_shard_size = "50GB"``
  (``modeling_utils.py`` ``save_pretrained`` 3325). ``fsdp-full``: FSDP's ``FULL_STATE_DICT`` with
  ``offload_to_cpu=True, rank0_only=True`` gathers each unit and copies it to rank 0's host: the whole
  model in its parameters' dtype there (fp32 master weights under mixed precision); safetensors then
  reads those host tensors in place. ``fsdp-sharded``: each rank writes its own shard item by item
  (``torch.distributed.checkpoint``), no whole copy on the host. ``full`` under ZeRO-3 is DeepSpeed's
  ``stage3_gather_16bit_weights_on_model_save``: ``_zero3_consolidated_16bit_state_dict`` (``engine.py``
  5631-5660) gathers each layer and copies its 16-bit weights to rank 0's host, the whole model there.
  The GPU's peak is not raised.

Not modelled, and named in every output: the training process's own resident memory (Python, torch and
the CUDA libraries), dataloader workers, the optimizer's checkpoint (``optimizer.pt``) written beside
the model, and a ``compute_metrics`` evaluation without ``eval_accumulation_steps`` (the Trainer gathers
every batch's logits on the GPU until the end of the evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reportgen.estimate import activations as act
from reportgen.estimate import params as P
from reportgen.estimate import recipes as RC
from reportgen.estimate import sharding as SH
from reportgen.estimate.dtypes import Dtypes
from reportgen.estimate.lengths import at_length
from reportgen.estimate.logits import logits_memory
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import FSDP_PARAM_SHARDING, Load, Method, Save, Sharding, TrainingSetup

#: transformers 5.24 ``PreTrainedModel.save_pretrained(max_shard_size="50GB")``: bytes of one file
MAX_SHARD_BYTES = 50 * 10**9
PHASES = ("load", "train", "eval", "save")
#: the phases as the terminal's table and the calculator name them
#: the run's phases around the training step (a GRPO step names its own phases: generation, scoring, policy step)
RUN_ONLY_PHASES = ("load", "eval", "save")
PHASE_LABELS = {"load": "load (from_pretrained)", "train": "train step", "eval": "evaluation", "save": "checkpoint save"}
NOT_COUNTED = ("the process's own memory (Python, torch, CUDA libraries), dataloader workers, the optimizer's "
               "checkpoint and the page cache of the checkpoint files")


@dataclass(frozen=True)
class Phase:
    name: str
    gpu_allocated: int  # bytes of live tensors on one GPU at the phase's peak
    gpu_demand: int  # what the process asks of the card then (the verdict's measure)
    host_terms: dict[str, int] = field(default_factory=dict)  # the node's host RAM, term by term

    @property
    def host(self) -> int:
        return sum(self.host_terms.values())

    def as_dict(self) -> dict:
        return {"gpu_allocated": self.gpu_allocated, "gpu_demand": self.gpu_demand, "host": self.host,
                "host_terms": dict(self.host_terms)}


@dataclass(frozen=True)
class RunEstimate:
    phases: dict[str, Phase]
    ranks_per_node: int
    notes: list[str] = field(default_factory=list)

    @property
    def deciding(self) -> str:
        """The phase asking the most of the card (the training step on a tie)."""
        return max(self.phases, key=lambda p: (self.phases[p].gpu_demand, p == "train"))

    @property
    def host_phase(self) -> str:
        return max(self.phases, key=lambda p: (self.phases[p].host, p == "train"))

    @property
    def host_peak(self) -> int:
        return self.phases[self.host_phase].host

    def as_dict(self) -> dict:
        return {"phases": {k: v.as_dict() for k, v in self.phases.items()}, "gpu_phase": self.deciding,
                "host_phase": self.host_phase, "host_peak": self.host_peak, "ranks_per_node": self.ranks_per_node,
                "not_counted": NOT_COUNTED, "notes": list(self.notes)}


def save_mode(setup: TrainingSetup) -> Save:
    """The setup's save, or its default (``setup.py``: adapter for LoRA/QLoRA, FSDP's full state dict
    when FSDP shards the parameters, else the whole state dict)."""
    if setup.save is not None:
        return setup.save
    if setup.is_peft:
        return Save.adapter
    return Save.fsdp_full if setup.sharding in FSDP_PARAM_SHARDING else Save.full


def load_mode(setup: TrainingSetup) -> Load:
    if setup.load is not None:
        return setup.load
    return Load.cpu_rank0 if setup.sharding in FSDP_PARAM_SHARDING else Load.device


def ranks_per_node(setup: TrainingSetup) -> int:
    """GPU processes on one node: all of them up to a node's ``sharding.NODE_GPUS``."""
    return min(setup.gpus, SH.NODE_GPUS)


def load_phase(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, mem, gpu: GpuSpec) -> Phase:
    from reportgen.estimate.memory import largest_quantized_linear, process_device_bytes

    resident = mem.terms["weights"] + mem.terms["quant_constants"]
    transient = largest_quantized_linear(model) * dt.compute if setup.method == Method.qlora else 0  # load dtype
    whole = P.weights_bytes(model, setup, dt)
    mode = load_mode(setup)
    host = {Load.device: {}, Load.cpu: {"model_copies": whole * ranks_per_node(setup)},
            Load.cpu_rank0: {"model_copy_rank0": whole}}[mode]
    allocated = resident + transient
    return Phase("load", allocated, process_device_bytes(allocated, gpu), host)


def eval_phase(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, mem, train: Phase) -> Phase:
    """The evaluation's peak (the module's list): persistent weights and states, one layer's tensors,
    the loss's logits, and the generation's KV cache."""
    seq = setup.eval_seq or setup.seq
    tokens = setup.eval_batch * seq
    # the evaluation micro-batch is not a training batch: GRPO's generation batch rule does not apply to it
    # (TRL checks the eval batch against num_generations alone, ``TrainingSetup``'s grpo checks)
    es = at_length(setup, seq, setup.eval_batch, generation_batch_size=None)
    persistent = sum(mem.terms[k] for k in ("weights", "quant_constants", "lora_adapters", "optimizer",
                                            "fsdp_unsharded", "cublas_workspace"))
    layer = act.layer_activations(model, es, dt).bytes
    if RC.fused_head(es):  # TRL's prediction_step computes the loss with its fused LM head: no full logits
        logits = RC.trl_head_memory(model, es, dt, tokens).forward_live
    else:  # Liger's forward materializes the logits outside training: its fused loss is a training-only path
        # (the compiled chunked loss is counted as the eager one: what its inference graph keeps is not traced)
        logits = logits_memory(model, dt, tokens, chunked=setup.loss.value in ("chunked", "chunked-compiled"),
                               upcast=setup.loss.value != "no-upcast").forward_live
    new = setup.eval_generate or 0
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * dt.compute * setup.eval_batch * (seq + new)
    step_logits = setup.eval_batch * model.vocab_size * 4 if new else 0
    allocated = persistent + layer + (kv + step_logits if new else logits)
    extra = max(0, allocated - mem.peak_reserved)  # the allocator serves the rest from training's cache
    return Phase("eval", allocated, train.gpu_demand + extra, dict(train.host_terms))


def save_phase(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, train: Phase) -> Phase:
    mode = save_mode(setup)
    host = dict(train.host_terms)
    if mode == Save.adapter:
        host["adapter_copy"] = P.adapter_bytes(model, setup, dt)
    elif mode == Save.full and setup.sharding == Sharding.zero3:
        # DeepSpeed's _zero3_consolidated_16bit_state_dict (engine.py 5631-5660): every layer gathered, its
        # 16-bit weights copied to rank 0's host, the whole state dict there before it is written
        host["consolidated_16bit_rank0"] = model.total_params * (4 if setup.compute_dtype == "fp32" else 2)
    elif mode == Save.full:
        host["state_dict_file"] = min(P.weights_bytes(model, setup, dt), MAX_SHARD_BYTES)
    elif mode == Save.fsdp_full:
        host["full_state_dict_rank0"] = P.weights_bytes(model, setup, dt) + P.adapter_bytes(model, setup, dt)
    return Phase("save", train.gpu_allocated, train.gpu_demand, host)


def estimate_run(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, dt: Dtypes, mem) -> RunEstimate:
    """Every phase of the run (the module's list) from the step's ``MemoryEstimate``."""
    n = ranks_per_node(setup)
    train = Phase("train", mem.peak_allocated, mem.card_demand, {k: v * n for k, v in mem.host_terms.items()})
    phases = {"load": load_phase(model, setup, dt, mem, gpu), "train": train}
    if setup.eval_batch is not None:
        phases["eval"] = eval_phase(model, setup, dt, mem, train)
    if save_mode(setup) != Save.none:
        phases["save"] = save_phase(model, setup, dt, train)
    notes = []
    if setup.sharding == Sharding.zero3:
        notes.append("ZeRO-3 loading: from_pretrained under deepspeed.zero.Init reads the checkpoint one file at a "
                     "time on every process and keeps each process's partition (transformers' zero3 path): a file "
                     "per process passes through host RAM, not counted")
    if setup.sharding == Sharding.zero3 and mem.host_terms:
        from reportgen.estimate.host import deepspeed_zero3_host_bytes

        ds = deepspeed_zero3_host_bytes(P.trainable_params(model, setup), offload_params=setup.offload.value == "params")
        notes.append(f"DeepSpeed's estimate_zero3_model_states_mem_needs: {ds / 2**30:.1f} GiB host RAM per node "
                     f"(16-18 bytes per parameter times its buffer factor 1.5); itemised here: "
                     f"{train.host / 2**30:.1f} GiB for the step's terms")
    return RunEstimate(phases, n, notes)
