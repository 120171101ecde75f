"""Where the analytic estimator and the trace disagree on ``peak_allocated``, and why: the one list
that ``tests/test_trace_agreement.py`` (the CI check at real layer sizes) and the site's validation
page (``report/traced.py``) both read, so they cannot diverge.

Two sets of cases are checked against the same tolerance:

* the CI grid (``grid()``): every family the estimator knows at its catalog model's real widths and
  vocabulary, cut to ``LAYERS`` decoder layers, x {full, LoRA, QLoRA} x checkpointing x two
  sequence lengths x two batch sizes (the families added later at one sequence and batch), plus two
  catalog models at full depth. A case listed in ``DISAGREEMENTS`` is an ``xfail(strict=True)``: when
  the formulas are fixed it starts passing and the list must shrink; it fails outright when its gap
  leaves ``DISAGREEMENT_BOUNDS`` (the known disagreement must not grow unnoticed).
* the stored traces of ``sweeps/traced.yaml`` (whole catalog models, committed under
  ``results/traced/traced/``): a case outside the tolerance must be in ``STORED_DISAGREEMENTS``
  with its cause, and a listed case must be outside it (``tests/test_traced_results.py``).

Pure data, no torch: the page imports it. Not a source of the trace hash (``fingerprint.py``).
"""

from __future__ import annotations

import itertools

#: |analytic - traced| / traced allowed for ``peak_allocated``
TOLERANCE = 0.03
#: decoder layers of the CI grid's models (real widths, so each term is at its real size per layer)
LAYERS = 2
#: the card of the CI grid (the cuBLAS workspace size is the card's)
GPU = "h100-sxm"
FAMILIES = {"llama": "llama-3.1-8b", "qwen2": "qwen2.5-7b", "gemma2": "gemma-2-9b", "phi3": "phi-3-mini",
            "mixtral": "mixtral-8x7b"}
#: the families added later (issue 9), on a smaller grid to keep CI short: every method x
#: checkpointing at one sequence length and batch
MORE_FAMILIES = {"gemma": "gemma-7b", "gemma3": "gemma-3-1b", "qwen3": "qwen3-8b", "qwen3_moe": "qwen3-30b-a3b",
                 "phi": "phi-2", "olmo2": "olmo-2-7b"}

CAUSES = {
    "layer_backward_overlap": (
        "estimate/memory.py backward-top/backward-bottom add, for the layer being differentiated, all its "
        "fp32 weight gradients (g_layer), its autocast 16-bit weight copies, its (recomputed) activations and "
        "the backward working set at once, and backward-top keeps the head's 16-bit weight copy and the "
        "head-side saved tensors freed in the loss backward; in the real backward each weight gradient appears "
        "as its matmul finishes while the activations and copies that matmul used are freed, so the analytic "
        "layer-backward phases overshoot by 0.2-0.8 GiB (Phi-3 mini: g_layer 0.42 GiB, copies 0.21 GiB, head "
        "copy 0.18 GiB; Mixtral: fp32 expert gradients 5.3 GiB per layer)"),
    "expert_wrapper_overlap": (
        "estimate/activations.py expert_wrapper_bytes keeps a layer's merged expert tensors (peft ParamWrapper, "
        "W + B.A per wrapped 3-D parameter) until the layer's backward and memory.py adds one merged gradient "
        "to its working set; the real backward frees each merged tensor as its own gradient appears, so the "
        "analytic peak is 3-11% high for a 2-layer Mixtral, 8% for a 2-layer Qwen3-MoE with checkpointing, with "
        "LoRA all-linear (the direction that is safe for 'will it fit'); at full depth the other terms outweigh "
        "it (within 1.1% for the whole Mixtral 8x7B and Qwen3-30B-A3B)"),
}

#: disagreements the trace found and the analytic formulas now model (each in its own commit)
FIXED = {
    "tied_embedding_grad": "memory.py 'embedding-backward': a tied weight's two gradients meet at the "
                           "embedding's backward (Gemma 2 9B: +3.42 GiB)",
    "qlora_dequant_at_loss": "memory.py 'forward-last-layer': the dequantized 4-bit weight and the MLP "
                             "intermediate are freed before the logits exist",
    "peft_expert_wrapper": "activations.py expert_wrapper_bytes: peft's ParamWrapper keeps each MoE layer's "
                           "merged expert weights for the backward (Mixtral: 2.62 GiB per layer)",
    "moe_gate_up_rank": "model.py Linear.lora_rank_factor: peft gives the experts' fused gate_up tensor rank "
                        "2r (rank_pattern, so w1 and w3 keep rank r each); counted at rank r, Qwen3-30B-A3B "
                        "LoRA was 352M trainable parameters and 5.2 GiB short at full depth (-6.5%, QLoRA "
                        "-4.1%), found by the stored traces of sweeps/traced.yaml",
}


def grid_name(fam: str, method: str, ckpt: bool, seq: int, batch: int) -> str:
    """The CI grid's name of a case: ``phi3-full-ckpt-s2048-b1``."""
    return f"{fam}-{method}-{'ckpt' if ckpt else 'nockpt'}-s{seq}-b{batch}"


def grid():
    """``(family, method, ckpt, seq, batch)`` of every case of the CI grid."""
    yield from itertools.product(FAMILIES, ("full", "lora", "qlora"), (False, True), (512, 2048), (1, 2))
    yield from itertools.product(MORE_FAMILIES, ("full", "lora", "qlora"), (False, True), (512,), (1,))


#: catalog models traced at full depth in the CI check: case id -> (model, setup fields)
FULL_DEPTH = {
    "tinyllama-1.1b-lora-nockpt-s2048-b1": ("tinyllama-1.1b", dict(method="lora", seq=2048)),
    "llama-3.2-1b-full-ckpt-s1024-b1": ("llama-3.2-1b", dict(method="full", seq=1024, grad_ckpt=True)),
}

#: CI grid case -> cause; everything not listed must agree within TOLERANCE
DISAGREEMENTS = {
    grid_name("phi3", "full", False, 512, 2): "layer_backward_overlap",
    grid_name("phi3", "full", False, 2048, 1): "layer_backward_overlap",
    grid_name("phi3", "full", True, 512, 2): "layer_backward_overlap",
    grid_name("phi3", "full", True, 2048, 1): "layer_backward_overlap",
    grid_name("phi3", "full", True, 2048, 2): "layer_backward_overlap",
    grid_name("mixtral", "full", False, 2048, 2): "layer_backward_overlap",
    grid_name("mixtral", "full", True, 2048, 2): "layer_backward_overlap",
    # LoRA only: QLoRA's default preparation (peft prepare_model_for_kbit_training) upcasts the
    # 16-bit experts to fp32, and the fp32 grouped matmul's own tensors bring those cases within 3%
    **{grid_name("mixtral", "lora", ckpt, seq, b): "expert_wrapper_overlap"
       for ckpt in (False, True) for seq in (512, 2048) for b in (1, 2)},  # +3.3% to +10.8%
    # +7.9%; without checkpointing the peak is in the loss backward, where the two agree (-0.7%)
    grid_name("qwen3_moe", "lora", True, 512, 1): "expert_wrapper_overlap",
}

#: CI grid case listed above -> the largest gap (analytic - traced) / traced it may show: its gap when
#: listed, rounded up to 0.5 % and 0.5 % more. Every listed gap is positive (the analytic peak is high,
#: the safe side for "will it fit"); a listed case beyond its bound, or below zero, fails the CI check
#: like an unlisted one: the list bounds how far the known disagreements may go, not only that they exist
DISAGREEMENT_BOUNDS = {
    grid_name("phi3", "full", False, 512, 2): 0.060,  # +5.5 %
    grid_name("phi3", "full", False, 2048, 1): 0.060,  # +5.1 %
    grid_name("phi3", "full", True, 512, 2): 0.040,  # +3.1 %
    grid_name("phi3", "full", True, 2048, 1): 0.080,  # +7.1 %
    grid_name("phi3", "full", True, 2048, 2): 0.080,  # +7.4 %
    grid_name("mixtral", "full", False, 2048, 2): 0.045,  # +3.9 %
    grid_name("mixtral", "full", True, 2048, 2): 0.050,  # +4.0 %
    grid_name("mixtral", "lora", False, 512, 1): 0.080,  # +7.2 %
    grid_name("mixtral", "lora", False, 512, 2): 0.080,  # +7.0 %
    grid_name("mixtral", "lora", False, 2048, 1): 0.075,  # +6.7 %
    grid_name("mixtral", "lora", False, 2048, 2): 0.040,  # +3.4 %
    grid_name("mixtral", "lora", True, 512, 1): 0.100,  # +9.5 %
    grid_name("mixtral", "lora", True, 512, 2): 0.105,  # +9.6 %
    grid_name("mixtral", "lora", True, 2048, 1): 0.105,  # +9.9 %
    grid_name("mixtral", "lora", True, 2048, 2): 0.115,  # +10.8 %
    grid_name("qwen3_moe", "lora", True, 512, 1): 0.085,  # +7.9 %
}

#: stored traces of sweeps/traced.yaml (whole catalog models) outside TOLERANCE -> cause
STORED_DISAGREEMENTS: dict[str, str] = {}


def grid_ids() -> list[str]:
    return [grid_name(*c) for c in grid()] + list(FULL_DEPTH)


#: the phases of a GRPO step that ``reportgen trace --recipe grpo`` sets apart from the policy step's own
GRPO_PHASES = ("generation", "scoring")


def grpo_agreement(traced: dict[str, int], traced_peak: int, estimated: dict[str, int], estimated_peak: int) -> dict:
    """The traced GRPO step (``trace/grpo.py``: the largest allocated bytes of each phase) beside the estimate's
    (``estimate/grpo.grpo_memory``: ``MemoryEstimate.phases``, allocated bytes), per phase of the step: generation,
    scoring (when the estimate has one: TRL scores only with ``beta > 0`` or misaligned steps), the policy step
    (the largest of its own phases), and the peak; each gap is ``estimate / trace - 1``, judged against
    ``TOLERANCE`` on the peak, as the SFT recipes are."""
    def policy(phases: dict[str, int]) -> int:
        return max((v for k, v in phases.items() if k not in GRPO_PHASES), default=0)

    rows = {p: (traced.get(p), estimated.get(p)) for p in GRPO_PHASES}
    rows["policy-step"] = (policy(traced), policy(estimated))
    rows["peak"] = (traced_peak, estimated_peak)
    out = {name: {"traced": t, "estimated": e, "gap": e / t - 1 if t and e is not None else None}
           for name, (t, e) in rows.items() if t is not None}
    return {"phases": out, "tolerance": TOLERANCE, "agrees": abs(out["peak"]["gap"]) <= TOLERANCE}


def torchtune_agreement(traced: dict, estimated: dict, status: str) -> dict:
    """torchtune's own recipe traced (``trace/torchtune_recipe.py``) beside ``reportgen estimate --from`` the same
    file (``MemoryEstimate.as_dict``, with ``modeling`` torchtune: its attention's k/v copies, no mask on padded
    batches and its RoPE caches, ``estimate/recipes.py``): peak allocated, peak reserved and the card's total, each
    gap ``estimate / trace - 1``, judged against ``TOLERANCE`` on peak allocated as the other recipes are; ``status``
    says how the recipe's numbers are got (``torchtune_recipe.recipe_status``)."""
    rows = {k: {"traced": traced[k], "estimated": estimated[k],
                "gap": estimated[k] / traced[k] - 1 if traced[k] else None}
            for k in ("peak_allocated", "peak_reserved", "device_total")}
    return {"recipe": "lora_finetune_single_device", "status": status, "memory": rows, "tolerance": TOLERANCE,
            "agrees": rows["peak_allocated"]["gap"] is not None and abs(rows["peak_allocated"]["gap"]) <= TOLERANCE}
