"""Pin the activation inventory to what autograd really saves, tensor for tensor.

Builds tiny models of every supported family with the installed transformers/peft, runs one
forward pass on the CPU under ``saved_tensors_hooks`` and compares the bytes of all saved
tensors (activations, logits/loss, autocast's weight copies) with the estimator's prediction.
"""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from reportgen.estimate.activations import all_layers, fixed_activations, sdpa_kernel  # noqa: E402
from reportgen.estimate.dtypes import dtypes_for  # noqa: E402
from reportgen.estimate.logits import logits_memory  # noqa: E402
from reportgen.estimate.params import (  # noqa: E402
    autocast_copy_bytes_head, autocast_copy_bytes_per_layer, frozen_cast_bytes_per_layer, frozen_head_cast_bytes)
from reportgen.model import from_config  # noqa: E402
from reportgen.setup import TrainingSetup  # noqa: E402
from tests.torch_saved import TINY, saved_bytes  # noqa: E402

BATCH, SEQ, RANK = 2, 24, 8


def predicted_saved(fam: str, setup: TrainingSetup) -> int:
    spec = from_config(dict(TINY[fam]), name=fam)
    dt = dtypes_for(setup)
    # a frozen fp32 head's (QLoRA prepared by peft) and frozen fp32 layer weights' 16-bit copies are
    # saved by their matmuls
    copies = autocast_copy_bytes_head(spec, setup, dt) + frozen_head_cast_bytes(spec, setup, dt)
    if not setup.grad_ckpt:
        copies += spec.num_layers * (autocast_copy_bytes_per_layer(spec, setup, dt)
                                     + frozen_cast_bytes_per_layer(spec, dt))
    tokens = setup.batch * setup.seq
    total = all_layers(spec, setup, dt) + fixed_activations(spec, setup, dt) + logits_memory(spec, dt, tokens).saved
    return total + copies


def cpu_only_adjustment(fam: str, setup: TrainingSetup) -> int:
    """Differences between the CPU run of this test and CUDA that the estimator models for CUDA.

    * The CPU flash-attention kernel allocates its output in the query's memory layout, at every
      dtype. Phi-3's and Phi-2's query (``torch.cat`` of the rotated and the pass-through part)
      reach SDPA (b, heads, s, d)-contiguous, so ``transpose(1, 2).contiguous()`` copies the
      output for ``o_proj``/``dense``; the other families' queries are (b, s, heads, d) and the copy
      is a no-op. On CUDA the same holds for FlashAttention (``mha_fwd``: ``empty_like(q)``,
      ``cuda/flash_attn/flash_api.cpp``; the meta function and ``reportgen trace`` agree), which
      takes 16-bit inputs, and the estimator counts the copy there
      (``activations.sdpa_kernel``); fp32 inputs without grouped-query attention take the
      memory-efficient kernel, which always writes (b, s, heads, d)
      (``aten/.../transformers/cuda/attention.cu``): no copy on CUDA, a copy on the CPU. (fp32 inputs
      with grouped-query attention take the math path on CUDA, and the CPU run is held to it.)
    * LoRA under autocast: in the first layer, whose input needs no gradient, ``lora_A`` does not
      save its weight's 16-bit copy. autocast's cache still holds it until the forward pass ends,
      so the estimator counts it as live memory, but it is not a saved tensor.
    """
    spec = from_config(dict(TINY[fam]), name=fam)
    adj = 0
    bhsd_query = spec.family in ("phi3", "phi")
    # o_proj saves the copied tensor itself when its weight is trainable, or when a LoRA adapter
    # reads it without a cast or dropout (under autocast peft's non-4-bit layer makes its own copy)
    o_proj_saves = setup.method.value == "full" or (
        setup.is_peft and spec.attn_out_name in spec.lora_selection(setup.lora_targets).linears
        and not setup.lora_dropout
        and (not setup.autocast or setup.method.value == "qlora"))
    # activations.sdpa_kernel (no mask here): only the memory-efficient kernel writes (b, s, heads, d);
    # where CUDA takes the math path the CPU run is held to it too (torch_saved.cuda_sdpa_is_math)
    cuda_efficient = sdpa_kernel(spec, setup, dtypes_for(setup).compute) == "efficient"
    if setup.attn.value == "sdpa" and bhsd_query and o_proj_saves and not setup.grad_ckpt and cuda_efficient:
        # in a first layer whose q, k and v have no adapter SDPA saves nothing: the estimator counts
        # o_proj's input there already
        sel = spec.lora_selection(setup.lora_targets) if setup.is_peft else None
        quiet_first = sel is not None and not sel.embed and not sel.linears & set(spec.attn_in_names())
        adj += (spec.num_layers - quiet_first) * setup.batch * setup.seq * spec.q_dim * dtypes_for(setup).compute
    if setup.is_peft and setup.autocast and not setup.grad_ckpt and not spec.lora_selection(setup.lora_targets).embed:
        first_inputs = [lin for lin in spec.layer_linears()
                        if lin.name in first_layer_no_grad(spec, spec.lora_selection(setup.lora_targets).linears)
                        and lin.name in spec.lora_selection(setup.lora_targets).linears]
        adj -= sum(RANK * lin.in_features * 2 for lin in first_inputs)
    return adj + cpu_phi_adjustment(spec, setup)


def first_layer_no_grad(spec, lora) -> set[str]:
    """Linears of the first layer whose input needs no gradient: the readers of the layer's input;
    the attention output projection too when no attention input projection has an adapter; and
    when the stream still needs none after attention, the MLP's input projections, and its output
    projection unless an input projection has an adapter."""
    readers = first_layer_readers(spec)
    out = set(readers)
    if not lora & set(spec.attn_in_names()):
        out.add(spec.attn_out_name)
        if spec.attn_out_name not in lora and spec.family != "phi":
            out |= set(spec.mlp_in_names())
            if not lora & set(spec.mlp_in_names()):
                out.add(spec.mlp_out_name)
    return out


def first_layer_readers(spec) -> set[str]:
    """Linears that read the first layer's input (through its pre-norm): the attention's input
    projections, and in Phi-2's parallel block also ``fc1``."""
    return set(spec.attn_in_names() + (spec.mlp_in_names() if spec.family == "phi" else []))


def cpu_phi_adjustment(spec, setup: TrainingSetup) -> int:
    """Two ops of Phi-2 save differently on the CPU than on CUDA, which the estimator models:

    * ``resid_dropout`` (p > 0): CUDA's fused dropout keeps a 1-byte mask, the CPU's
      ``input * noise`` keeps the noise in the input's dtype (the compute dtype: the outputs of
      ``dense`` and ``fc2``), see ``cpu_dropout_mask_adjustment``. One per attention output and
      MLP output that requires a gradient.
    * ``native_layer_norm`` on 16-bit inputs returns mean and rstd in fp32 on CUDA
      (``layer_norm_cuda``: ``toAccumulateType(input.scalar_type(), /*is_cuda=*/true)``) but in
      the input's dtype on the CPU when the weights are 16-bit too (``layer_norm_cpu``:
      ``param_scalar_type``): pure bf16 saves 4 bytes less per row and LayerNorm.
    """
    if spec.family != "phi":
        return 0
    tokens = setup.batch * setup.seq
    # with checkpointing only the final LayerNorm's saved tensors are counted (layers keep their input)
    layers = 0 if setup.grad_ckpt else spec.num_layers
    first_free = setup.is_peft and not setup.grad_ckpt  # the first layer's input needs no gradient
    lora = set(spec.lora_selection(setup.lora_targets).linears) if setup.is_peft else set()
    mlp_dropouts = layers - (1 if first_free and "fc1" not in lora else 0)  # first MLP output: no gradient
    dt = dtypes_for(setup)
    adj = 0
    if spec.resid_dropout:  # dense's output is in the compute dtype; fc2's is gelu_new's under QLoRA
        adj += (dt.compute - 1) * spec.hidden_size * tokens * layers
        adj += (phi_input_bytes(spec, dt)["fc2"] - 1) * spec.hidden_size * tokens * mlp_dropouts
    if setup.precision.value == "bf16":
        adj -= 4 * tokens * (layers + 1 - (1 if first_free else 0))
    return adj


CASES = [
    (fam, method, prec, attn, ckpt, targets)
    for fam, method, prec, attn, ckpt, targets in itertools.product(
        sorted(TINY), ["full", "lora"], ["fp32", "bf16", "bf16-mixed"], ["sdpa", "eager"], [False, True],
        ["qv", "all-linear"])
    if not (method == "full" and targets != "qv")
    and not (fam == "gemma2" and attn == "sdpa")  # soft-capping: transformers refuses SDPA
    and not (fam in ("mixtral", "qwen3_moe") and targets == "all-linear" and method == "lora")  # see below
]


#: LoRA target lists (issue 9): single modules, the head and the embeddings, on two layouts
CASES += [(fam, "lora", prec, "sdpa", ckpt, targets)
          for fam, names in (("llama", ("q,v,lm_head", "o,down", "embed_tokens,q")),
                             ("phi3", ("qkv,lm_head", "o,down", "embed_tokens,qkv")))
          for prec in ("fp32", "bf16", "bf16-mixed") for ckpt in (False, True) for targets in names]


@pytest.mark.parametrize("fam,method,prec,attn,ckpt,targets", CASES)
def test_saved_tensors_match_inventory(fam, method, prec, attn, ckpt, targets):
    setup = TrainingSetup(method=method, precision=prec, attn=attn, grad_ckpt=ckpt, batch=BATCH, seq=SEQ,
                          lora_rank=RANK, lora_targets=targets)
    got = saved_bytes(TINY[fam], method, prec, attn, ckpt, BATCH, SEQ, rank=RANK, targets=targets)["total"]
    assert got == predicted_saved(fam, setup) + cpu_only_adjustment(fam, setup)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b"])
def test_moe_all_linear_reaches_experts_and_is_flagged(name):
    """peft's ``all-linear`` on transformers >= 5 Mixtral and Qwen3-MoE wraps the router and the 3-D
    expert parameters (``ParamWrapper``); the estimator does not model that path's activations, so
    it must say so rather than pretend."""
    from reportgen.estimate import estimate
    from reportgen.catalog import load_gpu, load_model

    est = estimate(load_model(name), load_gpu("h100-sxm"), TrainingSetup(method="lora", lora_targets="all-linear"))
    assert any("approximate" in n for n in est.notes)


def phi_input_bytes(spec, dt) -> dict[str, int]:
    """dtype bytes of what each of Phi-2's linears reads: the LayerNorm output (fp32 under CUDA
    autocast), SDPA's output and ``gelu_new``'s output (fp32 under autocast when ``fc1`` is a
    bitsandbytes 4-bit layer, which returns its fp32 input's dtype; ``ops.gelu_new``)."""
    ln = 4 if dt.autocast else dt.stream
    gelu = 4 if dt.autocast and dt.quantized else dt.compute
    return {"q_proj": ln, "k_proj": ln, "v_proj": ln, "fc1": ln, "dense": dt.compute, "fc2": gelu}


def cpu_dropout_mask_adjustment(fam: str, setup: TrainingSetup) -> int:
    """CUDA's fused dropout keeps a bool mask; on the CPU ``dropout`` is ``input * noise`` and keeps
    the noise in the input's dtype (``aten/src/ATen/native/Dropout.cpp``,
    ``is_fused_kernel_acceptable`` is true for CUDA only). One mask per adapter whose input
    requires a gradient; the input is in the adapter dtype unless peft's 4-bit layer skips the cast
    under autocast."""
    if not setup.lora_dropout or setup.grad_ckpt:  # checkpointed layers save only their input
        return 0
    spec = from_config(dict(TINY[fam]), name=fam)
    dt = dtypes_for(setup)
    targets = [lin for lin in spec.layer_linears() if lin.name in spec.lora_selection(setup.lora_targets).linears]
    first_free = first_layer_readers(spec)  # the first layer's input needs no gradient

    def x_bytes(lin) -> int:
        if not (dt.quantized and dt.autocast):
            return dt.adapter
        if spec.family == "phi":
            return phi_input_bytes(spec, dt)[lin.name]
        # a 4-bit layer passes its input's dtype on: the stream's (fp32 once peft's preparation upcast
        # the norms) into q, k, v, gate, up and, through the fp32 MLP, down; SDPA's output into o
        return dt.compute if lin.name == spec.attn_out_name else dt.stream

    per_token = sum((x_bytes(lin) - 1) * lin.in_features for lin in targets) * spec.num_layers
    per_token -= sum((x_bytes(lin) - 1) * lin.in_features for lin in targets if lin.name in first_free)
    return per_token * setup.batch * setup.seq


HARNESS_CASES = [
    (fam, method, dropout, prec, targets, ckpt)
    for fam in ("llama", "phi3", "gemma", "gemma3", "qwen3", "qwen3_moe", "phi", "olmo2")
    for method, dropout in (("qlora", 0.0), ("qlora", 0.1), ("lora", 0.1))
    for prec in ("fp32", "bf16", "bf16-mixed")
    for targets in ("qv", "all-linear")
    for ckpt in (False, True)
    if not (ckpt and (fam not in ("llama", "phi") or targets != "all-linear"))
    and not (fam == "qwen3_moe" and targets == "all-linear")  # see test_moe_all_linear_reaches_experts...
]


@pytest.mark.parametrize("fam,method,dropout,prec,targets,ckpt", HARNESS_CASES)
def test_harness_model_saves_what_the_inventory_says(fam, method, dropout, prec, targets, ckpt):
    """QLoRA (peft's bitsandbytes layers, seen as on CUDA) and LoRA dropout, on the model the
    measuring harness builds."""
    pytest.importorskip("bitsandbytes")
    from tests.torch_saved import saved_bytes_harness

    # QLoRA under mixed precision runs peft's prepare_model_for_kbit_training by default (fp32 stream);
    # for Qwen3-MoE and Phi-2 the prepared model leaves residuals of 192 B (router) and 1 KiB (Phi-2
    # with dropout) on this tiny model that the inventory does not explain yet: those two families
    # are pinned here without the preparation (the trace agreement test covers them prepared)
    kbit = "none" if method == "qlora" and prec == "bf16-mixed" and fam in ("qwen3_moe", "phi") else None
    setup = TrainingSetup(method=method, precision=prec, attn="sdpa", grad_ckpt=ckpt, batch=BATCH, seq=SEQ,
                          lora_rank=RANK, lora_alpha=2 * RANK, lora_targets=targets, lora_dropout=dropout,
                          kbit_prep=kbit)
    got = saved_bytes_harness(TINY[fam], fam, setup)
    expected = predicted_saved(fam, setup) + cpu_only_adjustment(fam, setup) + cpu_dropout_mask_adjustment(fam, setup)
    assert got == expected


DORA_CASES = [
    (fam, method, prec, dropout, ckpt)
    for fam in ("llama", "qwen3", "gemma3", "phi3")
    for method in ("lora", "qlora")
    for prec in ("fp32", "bf16", "bf16-mixed")
    for dropout in (0.0, 0.1)
    for ckpt in (False, True)
    if fam == "llama" or (dropout == 0.0 and not ckpt and prec == "bf16-mixed")
]


@pytest.mark.parametrize("fam,method,prec,dropout,ckpt", DORA_CASES)
def test_dora_saves_what_the_inventory_says(fam, method, prec, dropout, ckpt):
    """DoRA (peft use_dora=True) on the model the harness builds: the base and LoRA outputs and the
    norm vectors its combination keeps (estimate/dora.py), with dropout its weight copies. Counted at
    the forward's end: DoRA's B A graph (the identity's cast, lora_A's output) is saved and dropped
    within each layer's forward, and the CPU allocator hands its storages to later tensors."""
    pytest.importorskip("bitsandbytes")
    from tests.torch_saved import saved_bytes_harness

    setup = TrainingSetup(method=method, precision=prec, attn="sdpa", grad_ckpt=ckpt, batch=BATCH, seq=SEQ,
                          lora_rank=RANK, lora_alpha=2 * RANK, lora_targets="all-linear", lora_dropout=dropout,
                          dora=True)
    got = saved_bytes_harness(TINY[fam], fam, setup, alive_at_end=True)
    expected = predicted_saved(fam, setup) + cpu_only_adjustment(fam, setup) + cpu_dropout_mask_adjustment(fam, setup)
    assert got == expected
