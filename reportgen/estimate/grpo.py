"""Reinforcement fine-tuning with generation in the loop: TRL 1.16.0's ``GRPOTrainer`` on one GPU
(``TrainingSetup.recipe == grpo``), memory per phase and time per phase.

One optimizer step of ``GRPOTrainer`` (``trl/trainer/grpo_trainer.py``, ``grpo_config.py``, TRL
1.16.0; transformers 5.24.0) runs three phases on the card, each with the model's resident state
(weights, adapters, optimizer states; gradients are ``None`` between steps, ``zero_grad(set_to_none)``):

* **generation** of ``G = generation_batch_size`` completions (default ``batch x accum``:
  ``grpo_config.py`` 1098-1100 sets ``steps_per_generation = gradient_accumulation_steps``; the
  sampler repeats each prompt ``num_generations`` times, ``get_train_dataloader`` 1269-1275), once
  every ``steps_per_generation`` micro-batches (``_prepare_inputs`` 1536-1544):

  - ``hf`` (``_generate_single_turn`` 1873: ``unwrapped_model.generate`` under ``torch.no_grad()``,
    no autocast): transformers' ``_prepare_cache_for_generation`` (``generation/utils.py`` 2326)
    builds a ``DynamicCache`` when ``cache_implementation`` is None (TRL's default,
    ``grpo_config.py`` 581); each layer's ``DynamicLayer.update`` grows keys and values by
    ``torch.cat`` (``cache_utils.py`` 136-137), so the cache of ``T`` tokens is
    ``kv_cache_bytes = 2 x layers x kv_heads x head_dim x bytes x G x T`` (bytes: the key
    projection's output dtype, the residual stream's, ``dtypes.py``) and the layer being updated
    holds its old and new tensors at once (``kv_cat_bytes``, one layer more). Each decode step keeps
    only the last position's logits (``logits_to_keep = 1``, ``utils.py`` 2955-2956), copies them to
    fp32 (3248: ``.to(copy=True, dtype=torch.float32)``) and samples through ``softmax`` (3272-3274):
    ``decode_logits_bytes = G x vocab x (compute + 4 + 4)``. The prefill runs the prompt of every
    row through each layer at once: ``prefill_working_bytes = G x P x ((3 + a) x intermediate x compute +
    4 x hidden x stream)``: the MLP's ``act(gate) x up`` holds three ``T x I`` tensors (transformers
    ``modeling_qwen3.py``/``llama`` ``MLP.forward``), a fourth (``a = 1``) when peft wraps ``up_proj``
    (``peft/tuners/lora/layer.py`` ``Linear.forward`` 1102: ``result = result + lora_B(lora_A(x)) * scaling``
    holds the base output, the scaled adapter output and their sum while ``act(gate)`` waits); beside them
    the layer's input (held by the model's layer loop), the residual, its norm, and the embedding output,
    which ``Qwen3Model.forward``/``LlamaModel.forward`` keep as ``inputs_embeds`` for the whole pass
    (the traced GRPOTrainer step, ``trace/grpo.py``, showed both: 4 and 4 on a LoRA prefill, not 3 and 3;
    scoring's forward uses the same count, an upper bound by one ``T x I`` for a reference pass that disables
    the adapters);
    plus a 4-bit layer's dequantized weight (``memory.dequant_transient_bytes``).
  - ``vllm-colocate`` (``VLLMGeneration``, ``trl/generation/vllm_generation.py`` 347-366): an
    ``LLM(gpu_memory_utilization=u, max_model_len=..., max_num_seqs=batch x steps_per_generation,
    max_num_batched_tokens=4096)`` in the training process reserves ``u x card`` for its own copy of
    the weights (bf16; 4-bit for a bitsandbytes model, ``quantization="bitsandbytes"``, 336-344) and
    its KV cache (``vllm_pool_bytes``). With ``vllm_enable_sleep_mode`` it sleeps at level 2 (weights
    and KV cache freed) outside ``generate`` (365-366, 750-752) and wakes for it (489-491, 704-705);
    without it the pool stays through scoring and the policy step. vLLM refuses to start when the KV
    room left in its pool, ``u x card - weights``, cannot hold one ``max_model_len`` sequence (its
    engine's check at start-up: "To serve at least one request with the model's max seq len ...
    Try increasing gpu_memory_utilization or decreasing max_model_len"): ``vllm_check``.
  - ``vllm-server``: another GPU generates (``vllm_mode="server"``): nothing on this card.

* **scoring**: the policy's log-probs of the completions (``old_per_token_logps``) when
  ``gradient_accumulation_steps % steps_per_generation != 0`` or vLLM with
  ``vllm_importance_sampling_correction`` (default True) generated them (2641-2655), and the
  reference model's when ``beta > 0`` (2710-2738; TRL 1.16's default ``beta`` is 0.0,
  ``grpo_config.py`` 681-682, so no reference model is loaded, 984-986): a separate model in the
  policy's dtype for full fine-tuning (1003), the adapter-disabled policy for LoRA/QLoRA (988-990,
  ``use_adapter``). Each pass runs under ``torch.no_grad()`` in chunks of ``per_device_train_batch_size``
  rows (2505; ``_get_per_token_logps_and_entropies`` 1440-1447) through the fused LM head
  (``recipes.trl_head_memory``: only the completion positions are labelled, 1495-1496), keeping one
  fp32 log-prob per completion token (``torch.cat`` of the chunks, 1506).
* **policy step**: ``accum`` micro-batches of ``batch`` rows of ``seq = prompt + completion`` tokens
  (``_compute_loss`` 3021-3025 concatenates prompt and completion), the trainer step of recipe
  ``trl-sft`` term by term (``memory.estimate_memory``: the same fused LM head, now over
  ``max_completion_length`` positions per row, ``recipes.trl_scored_tokens``; QLoRA adapters cast to
  bf16, 531-541), plus the buffered generation batch (``_buffered_inputs``: int64 ids and masks of
  every row, fp32 per-token log-probs).

Time per optimizer step (``grpo_time``): the policy step is ``time.estimate_time``; generation is
decode-bound: each of the ``max_completion_length`` decode steps reads every weight (a 4-bit
weight dequantized, ``work.dequant_bytes_per_weight``) and the KV cache once at the card's bandwidth
(``time.memory_bandwidth``: the weights are streamed, so no L2 reuse), with ``KERNEL_DEVICE_S`` per kernel; transformers' generate launches
the forward's kernels (``work.layer_work`` at one token per row) and ``SAMPLE_KERNELS`` more from
Python every step, priced at ``HOST_S_PER_KERNEL``/``HOST_S_PER_CALL`` and overlapped with the
device (``time.pipeline_seconds``); vLLM replays CUDA graphs, so its decode pays no dispatch and
``REFERENCE_PROFILE["kernel_device_s"]`` (a tiny kernel in a CUDA graph, measured) per kernel. The
prefill is the forward's work at ``G x P`` tokens, scoring the forward at ``batch x seq`` per chunk.

Approximations, said in every estimate's notes (``APPROXIMATIONS``): the generation phase's allocator
reserve is its allocated bytes (the cache's ``torch.cat`` growth fragments blocks: an underestimate);
vLLM's own activation and CUDA-graph memory inside its pool are not modelled (its KV room is an upper
bound); the kernels of a decode step are the training forward's (autocast casts included; vLLM fuses
more); the error band is the SFT steps' (no GRPO step has been measured); reward functions run on the
host (a reward model on the GPU is not modelled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reportgen.estimate import constants as K
from reportgen.estimate import params as P
from reportgen.estimate import recipes as RC
from reportgen.estimate.dtypes import Dtypes, dtypes_for
from reportgen.estimate.libraries import CURRENT
from reportgen.estimate.memory import (MemoryEstimate, cuda_context_bytes,
                                       dequant_transient_bytes, effective_attention, estimate_memory)
from reportgen.estimate.time import (TimeConstants, TimeEstimate, device_seconds, hidden_state_bytes, host_seconds,
                                    memory_bandwidth, peak_dtype, pipeline_seconds)
from reportgen.estimate.work import Work, dequant_bytes_per_weight, layer_work
from reportgen.hardware import GpuSpec
from reportgen.model import ModelSpec
from reportgen.setup import Generation, Method, SetupError, TrainingSetup

#: kernels ``_sample`` launches per decode step beside the model's forward (``generation/utils.py``
#: 3248-3285): the fp32 copy of the last logits, ``softmax``, ``multinomial``, the finished rows'
#: padding (``next_tokens * unfinished + pad * (1 - unfinished)``: 4), the ``torch.cat`` of the ids,
#: the EOS stopping criterion's ``isin`` and ``unfinished & ~done`` (2). ASSUMED one kernel per op
#: (``multinomial`` launches more on CUDA): a lower bound.
SAMPLE_KERNELS = 11
#: vLLM's ``max_num_batched_tokens`` as TRL sets it (``vllm_generation.py`` 359): prefill chunk size
VLLM_BATCHED_TOKENS = 4096
#: the phases of a GRPO step, in order
PHASES = ("generation", "scoring", "policy-step")
APPROXIMATIONS = ("GRPO (recipe grpo): the generation phase's reserve is its allocated bytes (the KV cache's "
                  "torch.cat growth fragments the allocator's blocks); vLLM's activation and CUDA-graph memory "
                  "inside its pool is not modelled; decode kernels are the training forward's; the error band "
                  "is the SFT steps' (no GRPO step measured); reward functions are assumed to run on the host")


def kv_token_bytes(model: ModelSpec, dt: Dtypes) -> int:
    """Bytes of one token's keys and values over all layers: ``2 x layers x kv_heads x head_dim x bytes``."""
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * dt.stream


def kv_cache_bytes(model: ModelSpec, dt: Dtypes, rows: int, tokens: int) -> int:
    """``DynamicCache`` of ``rows`` sequences of ``tokens`` tokens (module docstring)."""
    return kv_token_bytes(model, dt) * rows * tokens


def kv_cat_bytes(model: ModelSpec, dt: Dtypes, rows: int, tokens: int) -> int:
    """The layer being updated holds its old keys and values beside the concatenated ones."""
    return kv_cache_bytes(model, dt, rows, tokens) // model.num_layers


def decode_logits_bytes(model: ModelSpec, dt: Dtypes, rows: int) -> int:
    """The last position's logits, their fp32 copy and the fp32 probabilities, per decode step."""
    return rows * model.vocab_size * (dt.compute + 4 + 4)


def adapter_sum_rows(model: ModelSpec, setup: TrainingSetup) -> int:
    """1 when peft wraps the gated MLP's ``up_proj``: its LoRA sum adds a ``T x I`` tensor beside ``act(gate)``
    (module docstring), else 0."""
    return int(setup.is_peft and "up_proj" in model.mlp_in_names()
               and "up_proj" in set(model.lora_selection(setup.lora_targets).linears))


def prefill_working_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes, tokens: int) -> int:
    """One layer's no-grad forward temporaries over ``tokens`` tokens (module docstring), and QLoRA's
    dequantized weight."""
    inter = model.intermediate_size * max(1, model.experts_per_token)
    return (tokens * ((3 + adapter_sum_rows(model, setup)) * inter * dt.compute + 4 * model.hidden_size * dt.stream)
            + dequant_transient_bytes(model, setup, dt, CURRENT))


def vllm_weights_bytes(model: ModelSpec, setup: TrainingSetup) -> int:
    """vLLM's copy of the weights: bf16, or bitsandbytes 4-bit for a QLoRA model (TRL merges the adapters
    into it at each sync, so the adapters add nothing)."""
    if setup.method == Method.qlora:
        dt = dtypes_for(setup)
        return P.weights_bytes(model, setup, dt) + P.quant_constants_bytes(model, setup)
    return (model.total_params + (model.vision.params if model.vision else 0)) * 2


def vllm_pool_bytes(setup: TrainingSetup, gpu: GpuSpec) -> int:
    """What vLLM reserves: ``vllm_gpu_memory_utilization x`` the card's memory."""
    return int(setup.vllm_gpu_memory_utilization * gpu.memory_bytes)


def vllm_max_model_len(model: ModelSpec, setup: TrainingSetup) -> int:
    return setup.vllm_max_model_length or model.max_position_embeddings or setup.seq


def vllm_kv_token_bytes(model: ModelSpec) -> int:
    """vLLM's KV cache per token: the model's dtype (``dtype="auto"``: bf16), ``2 x layers x kv_heads x
    head_dim x 2``."""
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2


def vllm_kv_room_tokens(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec) -> int:
    """Tokens of KV cache vLLM's pool holds beside its weights (an upper bound: activations not modelled)."""
    room = vllm_pool_bytes(setup, gpu) - vllm_weights_bytes(model, setup)
    return max(0, room // vllm_kv_token_bytes(model))


def check(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec) -> None:
    """What TRL or vLLM would refuse for this model and card, as a ``SetupError`` naming what to change:
    a row (prompt + completion) past the model's context (TRL's tool loop stops at
    ``max_position_embeddings``, ``grpo_trainer.py`` 2050-2055, and the model was not trained longer),
    and a vLLM pool that cannot start (module docstring)."""
    if setup.recipe.value != "grpo":
        return
    ctx = model.max_position_embeddings
    if ctx and setup.seq > ctx:
        raise SetupError("max_completion_length", f"prompt {setup.prompt_length:,} + completion "
                         f"{setup.max_completion_length:,} = {setup.seq:,} tokens is past {model.name}'s context "
                         f"(max_position_embeddings {ctx:,}): lower max_completion_length or the prompt length")
    if setup.generation != Generation.vllm_colocate:
        return
    pool, weights = vllm_pool_bytes(setup, gpu), vllm_weights_bytes(model, setup)
    need = vllm_max_model_len(model, setup)
    room = vllm_kv_room_tokens(model, setup, gpu)
    if room < need:
        util = math.ceil(100 * (weights + need * vllm_kv_token_bytes(model)) / gpu.memory_bytes) / 100
        lower = (f" or lower vllm_max_model_length to {room:,} (at least seq {setup.seq:,})" if room >= setup.seq
                 else "")
        raise SetupError("vllm_gpu_memory_utilization", f"vLLM would refuse to start: its pool "
                         f"({setup.vllm_gpu_memory_utilization:g} x {gpu.memory_bytes / 2**30:.1f} GiB = "
                         f"{pool / 2**30:.1f} GiB) holds its weights ({weights / 2**30:.1f} GiB) and a KV cache of "
                         f"{room:,} tokens, less than one sequence of max_model_len {need:,}: raise "
                         f"vllm_gpu_memory_utilization to {util:.2f}{lower}")


def scoring_passes(setup: TrainingSetup) -> tuple[int, int]:
    """(old log-prob passes, reference passes) per generation (module docstring)."""
    steps_per_generation = setup.generation_batch // (setup.batch * setup.gpus)
    vllm = setup.generation != Generation.hf
    old = int(setup.accum % steps_per_generation != 0 or (vllm and setup.vllm_importance_sampling_correction))
    return old, int(setup.beta > 0)


def ref_model_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """``beta > 0`` with full fine-tuning: a second model, loaded in the policy's dtype (``grpo_trainer.py``
    1000-1003); LoRA/QLoRA disable the adapters instead (no bytes)."""
    if setup.beta == 0 or setup.method != Method.full:
        return 0
    return P.weights_bytes(model, setup, dt)


def buffered_bytes(setup: TrainingSetup) -> int:
    """The generation batch TRL buffers for its micro-batches: int64 prompt and completion ids and masks
    of every row, and per completion token the fp32 log-probs of each scoring pass and vLLM's."""
    old, ref = scoring_passes(setup)
    logps = old + ref + (setup.generation != Generation.hf)
    g = setup.generation_batch
    return g * setup.seq * 8 * 2 + g * setup.max_completion_length * 4 * logps


def generation_terms(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> dict[str, int]:
    """transformers' generate: the ``DynamicCache`` at the end of the longest completion, and the larger
    of the prefill's and the last decode step's transients (module docstring). vLLM: none here (its pool)."""
    if setup.generation != Generation.hf:
        return {"kv_cache": 0, "generation_transient": 0}
    g, p, seq = setup.generation_batch, setup.prompt_length, setup.seq
    kv = kv_cache_bytes(model, dt, g, seq)
    prefill = kv_cache_bytes(model, dt, g, p) + prefill_working_bytes(model, setup, dt, g * p) - kv
    decode = kv_cat_bytes(model, dt, g, seq)
    return {"kv_cache": kv, "generation_transient": max(prefill, decode) + decode_logits_bytes(model, dt, g)}


def scoring_transient(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> int:
    """One chunk's no-grad forward (``batch`` rows of ``seq`` tokens) through the fused head, and the
    log-probs of the chunks gathered so far and their ``torch.cat`` (twice)."""
    if sum(scoring_passes(setup)) == 0:
        return 0
    tokens = setup.batch * setup.seq
    head = RC.trl_head_memory(model, setup, dt, tokens).forward_live
    return (prefill_working_bytes(model, setup, dt, tokens) + head
            + 2 * setup.generation_batch * setup.max_completion_length * 4)


@dataclass(frozen=True)
class GrpoPhases:
    """Device bytes (nvidia-smi's per-process figure) of each phase, the one that decides, and the
    terms added to the policy step's."""

    device: dict[str, int]
    peak_phase: str
    terms: dict[str, int]
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"phases": self.device, "peak_phase": self.peak_phase, "terms": self.terms}


def grpo_memory(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec) -> tuple[MemoryEstimate, GrpoPhases]:
    """The run's memory: the policy step (``estimate_memory``) beside generation and scoring, each with the
    resident state, the reference model, vLLM's pool where it is awake; the phase asking most decides."""
    policy = estimate_memory(model, setup, gpu)
    dt = dtypes_for(setup)
    t = policy.terms
    resident = t["weights"] + t["quant_constants"] + t["lora_adapters"] + t["optimizer"] + t["cublas_workspace"]
    colocate = setup.generation == Generation.vllm_colocate
    pool = vllm_pool_bytes(setup, gpu) if colocate else 0
    awake = 0 if setup.vllm_enable_sleep_mode else pool  # outside generation
    gen = generation_terms(model, setup, dt)
    terms = {"ref_model": ref_model_bytes(model, setup, dt), "grpo_buffers": buffered_bytes(setup), **gen,
             "scoring_transient": scoring_transient(model, setup, dt), "vllm_pool": pool}
    base = resident + terms["ref_model"]
    fixed = cuda_context_bytes(gpu) + K.ALLOCATOR_SEGMENTS_BYTES
    device = {"generation": fixed + base + gen["kv_cache"] + gen["generation_transient"] + pool}
    if terms["scoring_transient"]:
        device["scoring"] = fixed + base + terms["grpo_buffers"] + terms["scoring_transient"] + awake
    extra = terms["ref_model"] + terms["grpo_buffers"] + awake
    device["policy-step"] = policy.device_total + extra
    peak = max(device, key=device.__getitem__)
    total = device[peak]
    demand = max(total, policy.card_demand + extra)
    notes = [APPROXIMATIONS]
    if colocate and peak != "generation" and not setup.vllm_enable_sleep_mode:
        notes.append(f"vLLM's pool ({pool / 2**30:.1f} GiB) stays allocated through the {peak}: "
                     "vllm_enable_sleep_mode frees it outside generation")
    phases = {**{k: v + extra for k, v in policy.phases.items()},
              **{k: v - fixed for k, v in device.items() if k != "policy-step"}}
    mem = MemoryEstimate(
        terms={**t, **terms}, peak_allocated=max(phases.values()),
        peak_reserved=max(policy.peak_reserved + extra, max(v - cuda_context_bytes(gpu) for v in device.values())),
        device_total=total, peak_phase=peak if peak != "policy-step" else f"policy-step ({policy.peak_phase})",
        phases=phases, host_ram=policy.host_ram, notes=policy.notes + notes,
        offloaded_activations=policy.offloaded_activations, cache_released=demand - total,
        cache_inputs=policy.cache_inputs, reserved_from_first_step=policy.reserved_from_first_step + extra)
    return mem, GrpoPhases(device=device, peak_phase=peak, terms=terms, notes=notes)


def decode_weight_bytes(model: ModelSpec, setup: TrainingSetup, dt: Dtypes) -> float:
    """HBM bytes of the weights one decode step reads: every weight once (and the adapters); a 4-bit
    weight is dequantized (``dequant_bytes_per_weight`` beyond its packed read) and its 16-bit copy read
    by the matmul. vLLM reads its own copy (bf16, or 4-bit)."""
    if setup.generation != Generation.hf:
        return float(vllm_weights_bytes(model, setup))
    moved = float(P.weights_bytes(model, setup, dt) + P.adapter_bytes(model, setup, dt))
    if setup.method == Method.qlora:
        moved += P.quantized_linear_params(model, setup) * (dequant_bytes_per_weight(setup) - 0.5 + dt.compute)
    return moved


def _priced(w: Work, gpu: GpuSpec, dtype: str, c: TimeConstants, host: bool, slices: int,
            working_bytes: float | None = None) -> float:
    """Seconds of ``w``: the device's (memory-bound kernels on tensors of ``working_bytes``, None for a
    decode step's streamed weights), overlapped with the host's dispatch (``host``: launched from Python)."""
    dev = device_seconds(w, gpu, dtype, c, working_bytes) or 0.0
    return pipeline_seconds([(host_seconds(w, c) if host else 0.0, dev)], slices)


def generation_seconds(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, dtype: str, c: TimeConstants) -> float:
    """One generation of the batch: the prefill (the forward's work at ``G x P`` tokens) and
    ``max_completion_length`` decode steps, each reading the weights and the KV cache at its mean length
    (module docstring). vLLM: as many rounds as its KV room allows rows at once (``max_num_seqs`` = G)."""
    dt = dtypes_for(setup)
    attn, _ = effective_attention(model, setup)
    g, p, n = setup.generation_batch, setup.prompt_length, setup.max_completion_length
    hf = setup.generation == Generation.hf
    rows, rounds = g, 1
    if not hf:
        rows = max(1, min(g, vllm_kv_room_tokens(model, setup, gpu) // setup.seq))
        rounds = math.ceil(g / rows)
    L = model.num_layers
    prefill = layer_work(model, setup, dt, attn, rows, p)[0] * L + Work(kernels=1, matmul_flops=2 * rows
                                                                            * model.hidden_size * model.vocab_size)
    one = layer_work(model, setup, dt, attn, rows, 1)[0] * L
    kv_per_token = kv_token_bytes(model, dt) if hf else vllm_kv_token_bytes(model)
    read = decode_weight_bytes(model, setup, dt) + kv_per_token * rows * (p + n / 2)
    kernels = one.kernels + 1 + SAMPLE_KERNELS
    if hf:
        decode = _priced(Work(kernels=kernels, views=one.views, bytes=read, calls=one.calls) * n, gpu, dtype, c,
                         True, n * L)
    else:  # CUDA graphs: no dispatch, a graph-launched kernel's device time
        decode = n * (read / memory_bandwidth(gpu, c) + kernels * K.REFERENCE_PROFILE["kernel_device_s"])
    return rounds * (_priced(prefill, gpu, dtype, c, hf, L, rows * p * model.hidden_size * dt.compute) + decode)


def scoring_seconds(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, dtype: str, c: TimeConstants) -> float:
    """The no-grad forward passes over the generation batch in chunks of ``batch`` rows (module docstring)."""
    passes = sum(scoring_passes(setup))
    if not passes:
        return 0.0
    dt = dtypes_for(setup)
    attn, _ = effective_attention(model, setup)
    chunk = layer_work(model, setup, dt, attn, setup.batch, setup.seq)[0] * model.num_layers
    chunks = setup.generation_batch // setup.batch
    return passes * chunks * _priced(chunk, gpu, dtype, c, True, model.num_layers,
                                     hidden_state_bytes(model, setup, setup.seq))


def grpo_time(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, policy: TimeEstimate) -> tuple[TimeEstimate, dict]:
    """Seconds per optimizer step by phase, and the whole step (generation and scoring happen
    ``batch x accum / G`` times per optimizer step). Tokens/s count the policy step's rows; MFU and HFU
    count its FLOPs only, over the whole step."""
    dtype, _ = peak_dtype(setup, gpu)
    c = TimeConstants.current(gpu, None, dtype)
    per_step = setup.batch * setup.gpus * setup.accum / setup.generation_batch
    sync = 2 * vllm_weights_bytes(model, setup) / memory_bandwidth(gpu, c) if setup.generation == Generation.vllm_colocate else 0.0
    times = {"generation": per_step * (generation_seconds(model, setup, gpu, dtype, c) + sync),
             "scoring": per_step * scoring_seconds(model, setup, gpu, dtype, c),
             "policy-step": policy.step_s or 0.0}
    if policy.step_s is None:
        return policy, {"times": times, "dominant": None}
    total = math.fsum(times.values())
    share = policy.step_s / total
    tps = policy.tokens_per_s * share if policy.tokens_per_s else None
    hours = policy.train_tokens / tps / 3600 if tps else None
    dollars = hours * gpu.price_usd_per_hour if hours is not None and gpu.price_usd_per_hour is not None else None
    dominant = max(times, key=times.__getitem__)
    t = TimeEstimate(**{**policy.__dict__, "step_s": total, "tokens_per_s": tps,
                        "mfu": policy.mfu * share if policy.mfu else policy.mfu,
                        "hfu": policy.hfu * share if policy.hfu else policy.hfu, "train_hours": hours,
                        "train_dollars": dollars, "parts": {**policy.parts, **{f"{k}_phase": v for k, v in times.items()}},
                        "notes": list(policy.notes)})
    return t, {"times": times, "dominant": dominant}


def max_num_generations(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec) -> int | None:
    """The most completions per prompt whose verdict is "fits", the generation batch growing with it
    (``generation_batch_size`` = its multiple of ``num_generations``, one prompt per generation batch
    when it was the default): the GRPO counterpart of ``search.max_batch``. None: not even 2."""
    def fits(n: int) -> bool:
        try:
            return _fits(model, with_generations(setup, n), gpu)
        except SetupError:  # with_generations' copy refused (the generation batch's divisibility)
            return False

    if not fits(2):
        return None
    lo, hi = 2, 4
    while hi <= 4096 and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, 4097)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


#: completion lengths the search tries are multiples of this many tokens
COMPLETION_STEP = 64


def run_verdict(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec):
    """(verdict, memory, phases, run): the phase asking the most of the card names the verdict ("... GiB at
    generation"; the policy step is the training step), and the run's other phases (``run.py``: load,
    evaluation, save) decide where they ask more than the step. The estimate's verdict and the reverse
    searches' (``_fits``) are this one."""
    from reportgen.estimate.run import estimate_run
    from reportgen.estimate.verdict import judge

    mem, phases = grpo_memory(model, setup, gpu)
    run = estimate_run(model, setup, gpu, dtypes_for(setup), mem)
    deciding = run.phases[run.deciding]
    step_phase = "train" if phases.peak_phase == "policy-step" else phases.peak_phase
    verdict = judge(mem, gpu.memory_bytes, setup.method.value, demand=deciding.gpu_demand,
                    phase=step_phase if run.deciding == "train" else run.deciding)
    return verdict, mem, phases, run


def _fits(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec) -> bool:
    """The run's verdict (``run_verdict``: every phase, evaluation included) is "fits", and TRL and vLLM
    would start it (``check``)."""
    try:
        check(model, setup, gpu)
    except SetupError:
        return False
    return run_verdict(model, setup, gpu)[0].fits


def with_completion(setup: TrainingSetup, tokens: int) -> TrainingSetup:
    """``setup`` with completions of up to ``tokens``, the prompts as long as before (``seq`` = prompt + completion)."""
    return setup.model_copy(update={"max_completion_length": tokens, "seq": setup.prompt_length + tokens})


def max_completion_length(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec) -> int | None:
    """The longest completion (a multiple of ``COMPLETION_STEP`` tokens, at most the setup's own) whose verdict is
    "fits", with the setup's prompts and generations: the GRPO counterpart of ``search.max_seq``. None: not even
    ``COMPLETION_STEP`` tokens."""
    from reportgen.estimate.search import _largest

    top = max(COMPLETION_STEP, setup.max_completion_length // COMPLETION_STEP * COMPLETION_STEP)
    return _largest(lambda c: _fits(model, with_completion(setup, c), gpu), COMPLETION_STEP, top, COMPLETION_STEP)


def turn_down(model: ModelSpec, setup: TrainingSetup, gpu: GpuSpec, generations: int | None) -> list[dict]:
    """What to turn down first when the step does not fit (issue 34), each change alone: fewer completions per
    prompt (``max_num_generations``), shorter completions (``max_completion_length``), and with vLLM colocated a
    smaller share of the card for its pool (in steps of 0.05, as long as vLLM still starts). Empty when it fits."""
    if _fits(model, setup, gpu):
        return []
    out = []
    if generations is not None and generations < setup.num_generations:
        out.append({"field": "num_generations", "value": generations})
    c = max_completion_length(model, setup, gpu)
    if c is not None and c < setup.max_completion_length:
        out.append({"field": "max_completion_length", "value": c})
    if setup.generation.value == "vllm-colocate":
        share = round(setup.vllm_gpu_memory_utilization - 0.05, 2)
        while share >= 0.05:
            if _fits(model, setup.model_copy(update={"vllm_gpu_memory_utilization": share}), gpu):
                out.append({"field": "vllm_gpu_memory_utilization", "value": share})
                break
            share = round(share - 0.05, 2)
    return out


def with_generations(setup: TrainingSetup, n: int) -> TrainingSetup:
    """``setup`` with ``n`` completions per prompt and as many prompts per generation batch as before
    (at least one): ``generation_batch_size = prompts x n``, a multiple of ``batch``."""
    prompts = max(1, setup.generation_batch // setup.num_generations)
    gbs = prompts * n
    gbs += (-gbs) % setup.batch
    while gbs % n:
        gbs += setup.batch
    return setup.model_copy(update={"num_generations": n, "generation_batch_size": gbs})
