"""The decision tree "what should I turn on first?" as data.

The tree follows the reference notes (``/work/shared/reference``):

* Hegde, "Efficient Finetuning of LLMs", the decision-tree slides: *Step 1* targets weights,
  optimizer states and gradients (can I train at batch size 1? "0 -> 1"); *Step 2* targets the
  activations (0 -> 1, then 1 -> n); "at each step, calculate total memory (bs=1) minus available
  memory"; "Flash Attention should be the default"; quantization costs throughput (the
  dequantization step; the slides quote ~30 % on a single GPU, the walk computes its own figure), so
  quantize only to fit; quantization is almost never
  needed with 4+ GPUs; "larger batch size != more throughput"; LLM fine-tuning tolerates small
  batches.
* Whitaker, "Napkin math for fine-tuning": on memory-bound machines (slow memory or links) larger
  batches and quantized weights pay off; on compute-bound ones (H100) they barely change the run
  time; use gradient accumulation to reach an effective batch of 16-64.

Nothing here estimates. ``walk.py`` walks the tree for one model and GPU with the estimator's
numbers, ``pages.py`` draws it (Mermaid) and ``reportgen advise`` prints a walk. Values of
``change`` that start with ``@`` are resolved by the walk (see ``SYMBOLS``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from reportgen.results import short_hash

#: the micro-batch the walk starts from and checks Step 1 at
START_BATCH = 1
#: effective batch (sequences per optimizer step) gradient accumulation aims for: the talk notes'
#: "use gradient accumulation to reach a reasonable effective batch size (16, 32, 64)"
TARGET_EFFECTIVE_BATCH = 16
#: the largest micro-batch the walk raises to (same cap as ``estimate.cheapest.cheapest_setup``)
MAX_MICRO_BATCH = 64
#: GPU counts the multi-GPU options try, smallest first
FSDP_GPU_COUNTS = (2, 4, 8)
#: Step 1 asks whether the parameter side leaves room for batch 1, i.e. whether the setup fits once
#: Step 2 has made the activations as small as it can without shortening the sequence
MIN_ACTIVATIONS = {"grad_ckpt": True, "loss": "fused", "batch": START_BATCH, "accum": 1}


def min_activations(model_type: str) -> dict:
    """``MIN_ACTIVATIONS`` for a model: with Liger's layer kernels where Step 2 would turn them on
    (``estimate/liger.py``: Llama, Mistral, Qwen2, Qwen3), so Step 1 looks ahead to all of Step 2."""
    from reportgen.estimate.liger import LIGER_MODEL_TYPES

    return {**MIN_ACTIVATIONS, "kernels": "liger"} if model_type in LIGER_MODEL_TYPES else MIN_ACTIVATIONS

#: symbolic values in ``change``, resolved by the walk for the model and GPU at hand
SYMBOLS = {
    "@default-precision": "bf16-mixed where the GPU has bf16 tensor cores, else fp16-mixed "
                          "(estimate.search.default_precision)",
    "@max-batch": f"the largest micro-batch that fits (estimate.search.max_batch), at most {MAX_MICRO_BATCH}",
    "@accum-to-target": f"ceil({TARGET_EFFECTIVE_BATCH} / micro-batch) accumulation steps; if the gradients "
                        "kept alive between micro-batches no longer fit, the micro-batch drops to the largest "
                        "that fits with accumulation",
    "@max-seq": "the longest sequence (a multiple of 128 tokens) that fits at micro-batch 1 "
                "(estimate.search.max_seq)",
    "@gpus": f"the smallest of {', '.join(map(str, FSDP_GPU_COUNTS))} GPUs that fits",
}

STAGES = {
    "defaults": "Defaults: always on",
    "step1": "Step 1: weights, gradients, optimizer states fit at batch 1? (0 to 1)",
    "step2": "Step 2a: activations of micro-batch 1 fit? (0 to 1)",
    "batch": "Step 2b: from micro-batch 1 to n",
    "result": "Result",
}


@dataclass(frozen=True)
class Action:
    """Turn something on: a change of TrainingSetup fields."""

    id: str
    label: str  # a few words, for the flowchart
    title: str  # what the step does, for tables and the terminal
    change: dict  # TrainingSetup field -> value (or a ``@`` symbol)
    why: str  # why it helps, i.e. what it takes off the bill
    tradeoff: str  # what it costs (speed, quality, dependencies)
    next: str
    stage: str
    technique: str | None = None  # slug of the technique page
    evaluate: bool = True  # estimate the setup as it stands after the change (Step 1: the next check does)
    default: bool = False  # applied unconditionally
    kind: str = "action"


@dataclass(frozen=True)
class Check:
    """A question answered from an estimate; ``edges`` maps the outcome to the next node."""

    id: str
    label: str
    question: str
    test: str  # the predicate's name in ``walk.PREDICATES``
    how: str  # how the answer is computed
    edges: dict  # "yes" / "no" / "unknown" -> node id
    stage: str
    variant: str = "as-is"  # "as-is" or "min-activations" (MIN_ACTIVATIONS applied)
    kind: str = "check"


@dataclass(frozen=True)
class End:
    """Where a walk stops."""

    id: str
    label: str
    verdict: str  # fits | shorter-sequence | beyond-one-card
    title: str
    text: str
    stage: str = "result"
    options: tuple[str, ...] = ()  # ids in OPTIONS, evaluated by the walk
    kind: str = "end"


@dataclass(frozen=True)
class Option:
    """Something to do when one card is not enough, evaluated from the last single-card setup
    (with ``MIN_ACTIVATIONS``)."""

    id: str
    label: str
    change: dict
    why: str
    tradeoff: str
    technique: str | None = None


_PARAMS_HOW = ("the setup with the smallest activation footprint Step 2 can reach without a shorter sequence "
               "(activation checkpointing, fused cross-entropy, micro-batch 1) fits in the GPU's memory "
               "(device total, what nvidia-smi shows)")
_FITS_HOW = "device total (what nvidia-smi shows) of the setup as it stands <= the GPU's memory"


def _params_check(id: str, no: str) -> Check:
    return Check(id=id, label="fits?",
                 question="Do weights, gradients and optimizer states fit, leaving room for micro-batch 1?",
                 test="fits", how=_PARAMS_HOW, edges={"yes": "fit_b1", "no": no}, stage="step1",
                 variant="min-activations")


NODES: tuple = (
    # ----- defaults ------------------------------------------------------------------------------
    Action(id="start", label="full fine-tuning, fp32", stage="defaults",
           title="Start: full fine-tuning in fp32 with eager attention, AdamW, micro-batch 1",
           change={"method": "full", "precision": "fp32", "attn": "eager", "optimizer": "adamw", "grad_ckpt": False,
                   "loss": "standard", "batch": START_BATCH, "accum": 1, "offload": "none", "gpus": 1,
                   "sharding": "none", "double_quant": False},
           why="the naive baseline every technique is measured against",
           tradeoff="none: nothing is turned on yet",
           next="mixed_precision", default=True),
    Action(id="mixed_precision", label="mixed precision", stage="defaults", technique="mixed-precision",
           title="Mixed precision: autocast matmuls to 16 bit",
           change={"precision": "@default-precision"},
           why="tensor cores run 16-bit matmuls several times faster than fp32, and saved activations "
               "take 2 bytes per element instead of 4",
           tradeoff="not a memory saver for weights: fp32 master weights, fp32 gradients (4 B/param) and fp32 "
                    "AdamW states stay, and autocast adds 16-bit copies of the weights; fp16 (T4) needs "
                    "loss scaling",
           next="sdpa", default=True),
    Action(id="sdpa", label="SDPA / FlashAttention", stage="defaults", technique="flash-attention",
           title="Fused attention (PyTorch SDPA: FlashAttention / memory-efficient kernels)",
           change={"attn": "sdpa"},
           why="no seq x seq attention matrix is stored: attention memory grows linearly with the sequence, "
               "and causal kernels skip the masked half of the FLOPs",
           tradeoff="none worth naming; models with attention soft-capping (Gemma 2) stay on eager attention "
                    "in transformers",
           next="fit_params_full", default=True),
    # ----- step 1: parameter side ---------------------------------------------------------------
    _params_check("fit_params_full", no="lora"),
    Action(id="lora", label="LoRA", stage="step1", technique="lora", evaluate=False,
           title="LoRA: freeze the base weights, train low-rank adapters (rank 16, all linear layers)",
           change={"method": "lora"},
           why="gradients and optimizer states exist only for the adapters (well under 1 % of the "
               "parameters), and the frozen base weights are stored in 16 bit",
           tradeoff="fewer FLOPs per token (no weight gradients of the base); quality usually close to full "
                    "fine-tuning, sometimes below it on hard tasks",
           next="fit_params_lora"),
    _params_check("fit_params_lora", no="qlora"),
    Action(id="qlora", label="QLoRA (4-bit base)", stage="step1", technique="qlora", evaluate=False,
           title="QLoRA: quantize the frozen base linears to 4-bit NF4",
           change={"method": "qlora", "quant": "nf4"},
           why="the base linears take 0.5 byte per parameter (+ 0.5 bit of quantization constants) "
               "instead of 2",
           tradeoff="every matmul first dequantizes its weight (extra memory traffic in every pass), so at an "
                    "equal setup it is slower than LoRA; the walk's verdict gives the estimate for this model and "
                    "card; quality close to 16-bit LoRA",
           next="fit_params_qlora"),
    _params_check("fit_params_qlora", no="double_quant"),
    Action(id="double_quant", label="double quantization", stage="step1", technique="qlora", evaluate=False,
           title="Double quantization of the 4-bit constants",
           change={"double_quant": True},
           why="the fp32 absmax per 64 weights becomes 8 bit: 0.5 -> 0.127 bit per parameter",
           tradeoff="a little more dequantization work; no measurable quality loss reported (Dettmers et al. 2023)",
           next="fit_params_dq"),
    _params_check("fit_params_dq", no="paged_8bit"),
    Action(id="paged_8bit", label="paged 8-bit AdamW", stage="step1", technique="8bit-paged-optimizers",
           evaluate=False,
           title="Paged 8-bit AdamW (bitsandbytes)",
           change={"optimizer": "paged-adamw-8bit"},
           why="optimizer states take 2 bytes per trainable parameter instead of 8, and the large ones live in "
               "CUDA managed memory that can page out to host RAM instead of failing",
           tradeoff="with LoRA the states are already small, so little is left to win; paging to the host is slow "
                    "when it happens",
           next="fit_params_8bit"),
    _params_check("fit_params_8bit", no="beyond_one_card"),
    # ----- step 2: activations, 0 -> 1 -----------------------------------------------------------
    Check(id="fit_b1", label="b1 fits?", stage="step2",
          question="Does micro-batch 1 fit as it is (activations and logits included)?",
          test="fits", how=_FITS_HOW, edges={"yes": "larger_batch", "no": "fused_ce"}),
    Action(id="fused_ce", label="fused cross-entropy", stage="step2", technique="fused-cross-entropy",
           title="Fused linear + cross-entropy (Liger-Kernel): no full fp32 logits",
           change={"loss": "fused"},
           why="transformers upcasts the tokens x vocabulary logits to fp32 for the loss; with 128k-256k "
               "vocabularies they outweigh a whole layer's activations. A chunked kernel keeps one chunk at a time",
           tradeoff="an extra dependency (Liger-Kernel; Trainer: use_liger_kernel=True); no extra FLOPs",
           next="fit_b1_fused"),
    Check(id="fit_b1_fused", label="b1 fits?", stage="step2",
          question="Does micro-batch 1 fit with the fused loss?",
          test="fits", how=_FITS_HOW, edges={"yes": "larger_batch", "no": "liger_model"}),
    Check(id="liger_model", label="Liger model?", stage="step2",
          question="Does Liger-Kernel have modelled layer kernels for this model (Llama, Mistral, Qwen2, Qwen3)?",
          test="liger_supported", how="the model's model_type (estimate/liger.py LIGER_MODEL_TYPES)",
          edges={"yes": "liger", "no": "grad_ckpt"}),
    Action(id="liger", label="Liger's layer kernels", stage="step2", technique="liger-kernels",
           title="Liger-Kernel's RMSNorm, RoPE and SwiGLU: less kept for the backward, fewer bytes moved",
           change={"kernels": "liger"},
           why="transformers' RMSNorm keeps an fp32 copy of its input and SwiGLU its activation's output for the "
               "backward; Liger's kernels keep neither and hold one MLP gradient instead of three",
           tradeoff="an extra dependency (Liger-Kernel; Trainer/TRL: use_liger_kernel=True); faster where the "
                    "step is memory-bound, no extra FLOPs",
           next="fit_b1_liger"),
    Check(id="fit_b1_liger", label="b1 fits?", stage="step2",
          question="Does micro-batch 1 fit with Liger's kernels?",
          test="fits", how=_FITS_HOW, edges={"yes": "larger_batch", "no": "grad_ckpt"}),
    Action(id="grad_ckpt", label="gradient checkpointing", stage="step2", technique="gradient-checkpointing",
           title="Activation (gradient) checkpointing: keep each layer's input, recompute the rest",
           change={"grad_ckpt": True},
           why="saved activations drop from every tensor of every layer to one hidden state per layer",
           tradeoff="one more forward pass per step: about a third more FLOPs for full fine-tuning, half more "
                    "for LoRA (estimate.time.flops_per_token); the tokens/s it costs is in the step's numbers",
           next="fit_b1_ckpt"),
    Check(id="fit_b1_ckpt", label="b1 fits?", stage="step2",
          question="Does micro-batch 1 fit with checkpointing?",
          test="fits", how=_FITS_HOW, edges={"yes": "larger_batch", "no": "shorter_sequence"}),
    # ----- step 2: 1 -> n -----------------------------------------------------------------------
    Check(id="larger_batch", label="b > 1 fits?", stage="batch",
          question="Does a micro-batch larger than 1 fit?",
          test="larger_batch", how="the largest micro-batch that fits (estimate.search.max_batch) is above 1",
          edges={"yes": "raise_batch", "no": "below_target"}),
    Action(id="raise_batch", label="larger micro-batch", stage="batch", technique="gradient-accumulation",
           title="Raise the micro-batch to the largest that fits",
           change={"batch": "@max-batch"},
           why="more tokens per weight read: fewer bytes moved per token and fewer kernel launches, so tokens/s "
               "rises where the step is memory-bound; fewer accumulation steps",
           tradeoff="on compute-bound cards tokens/s barely moves ('larger batch size != more throughput'); "
                    "the largest batch the estimate fits leaves no headroom: step down one if you see OOM",
           next="below_target"),
    Check(id="below_target", label=f"b < {TARGET_EFFECTIVE_BATCH}?", stage="batch",
          question=f"Is the micro-batch below the effective batch of {TARGET_EFFECTIVE_BATCH} sequences?",
          test="below_target", how=f"micro-batch x accumulation steps < {TARGET_EFFECTIVE_BATCH}",
          edges={"yes": "accumulate", "no": "compute_bound"}),
    Action(id="accumulate", label="gradient accumulation", stage="batch", technique="gradient-accumulation",
           title=f"Gradient accumulation up to an effective batch of {TARGET_EFFECTIVE_BATCH} sequences",
           change={"accum": "@accum-to-target"},
           why="the optimizer sees the gradient of the whole effective batch while only one micro-batch's "
               "activations are in memory",
           tradeoff="no quality change; tokens/s about as at the micro-batch; gradients stay allocated through "
                    "the next micro-batches' forward passes (full fine-tuning: 4 bytes per parameter more at the peak)",
           next="compute_bound"),
    Check(id="compute_bound", label="compute-bound?", stage="result",
          question="Is the step bound by compute (rather than by moving bytes or by the host's kernel launches)?",
          test="compute_bound", how="the host's dispatch against the GPU's work, then the largest of compute, "
                                    "memory and transfer time (time.py)",
          edges={"yes": "fits_compute_bound", "no": "fits_memory_bound", "host": "fits_host_bound",
                 "unknown": "fits_unknown_bound"}),
    # ----- ends ---------------------------------------------------------------------------------
    End(id="fits_compute_bound", label="fits: compute-bound", verdict="fits",
        title="Fits on one card; the step is compute-bound",
        text="Speed comes from FLOPs now: larger micro-batches add little tokens/s, and every extra pass costs "
             "time (checkpointing recomputes the forward pass, QLoRA dequantizes every weight)."),
    End(id="fits_memory_bound", label="fits: memory-bound", verdict="fits",
        title="Fits on one card; the step is bound by moving bytes (memory or host link)",
        text="Bytes per token are the bottleneck: larger micro-batches (more tokens per weight read or "
             "transfer) raise tokens/s here, unlike on a compute-bound card."),
    End(id="fits_host_bound", label="fits: host-bound", verdict="fits",
        title="Fits on one card; the step waits for the host to launch its kernels",
        text="The CPU dispatches the step's many small kernels more slowly than the GPU runs them (a LoRA step "
             "of a small model launches thousands): a larger micro-batch adds tokens at almost no extra time "
             "per step, pure bf16 drops autocast's casts, LoRA on fewer linears launches fewer kernels, and a "
             "faster host CPU helps more than a faster GPU."),
    End(id="fits_unknown_bound", label="fits: speed unknown", verdict="fits",
        title="Fits on one card; no speed estimate",
        text="The GPU catalog has no datasheet peak FLOP/s for this card, so the estimator gives memory but no "
             "tokens/s."),
    End(id="shorter_sequence", label="shorter sequence", verdict="shorter-sequence",
        title="Fits on one card only with a shorter sequence",
        text="Even with checkpointing micro-batch 1 does not fit: shorten the sequence (or pack shorter samples).",
        options=("shorter-seq",)),
    End(id="beyond_one_card", label="does not fit on one card", verdict="beyond-one-card",
        title="Does not fit on one card",
        text="Every single-card technique is on and the parameter side still does not leave room for micro-batch "
             "1. Options: offload to CPU RAM, shard over more GPUs (FSDP), or a shorter sequence.",
        options=("shorter-seq", "offload-optimizer", "offload-params", "fsdp-lora", "fsdp-qlora")),
)

OPTIONS: tuple[Option, ...] = (
    Option(id="shorter-seq", label="shorter sequence", change={"seq": "@max-seq"}, technique=None,
           why="activations and logits shrink with the sequence", tradeoff="long samples get truncated or split"),
    Option(id="offload-optimizer", label="CPU offload of optimizer states", change={"offload": "optimizer"},
           technique="cpu-offload",
           why="optimizer states (and an fp32 copy of the trainable parameters) live in host RAM; the CPU "
               "runs the optimizer step",
           tradeoff="gradients go to the host and parameters come back every step over PCIe; the CPU step is slow "
                    "for many trainable parameters"),
    Option(id="offload-params", label="CPU offload of parameters (FSDP)", change={"offload": "params"},
           technique="cpu-offload",
           why="parameters, gradients and optimizer states live in host RAM; one layer at a time comes to the GPU",
           tradeoff="every weight crosses PCIe once per pass: slow, but a 70B QLoRA fits a 24 GB card"),
    Option(id="fsdp-lora", label="FSDP over n GPUs, LoRA", technique="fsdp",
           change={"method": "lora", "double_quant": False, "optimizer": "adamw", "gpus": "@gpus",
                   "sharding": "fsdp"},
           why="weights, gradients and optimizer states are sharded over the GPUs; without quantization "
               "('almost never needed with 4+ GPUs')",
           tradeoff="all-gathers and reduce-scatters every step (estimated over PCIe, pessimistic for NVLink parts)"),
    Option(id="fsdp-qlora", label="FSDP over n GPUs, QLoRA", change={"gpus": "@gpus", "sharding": "fsdp"},
           technique="fsdp",
           why="sharding plus 4-bit base weights: the answer.ai FSDP+QLoRA recipe (70B on two 24 GB cards "
               "with offload)",
           tradeoff="communication as above plus dequantization"),
)

ROOT = "start"
BY_ID: dict = {n.id: n for n in NODES}
OPTION_BY_ID: dict[str, Option] = {o.id: o for o in OPTIONS}


def successors(node) -> list[str]:
    if isinstance(node, Action):
        return [node.next]
    if isinstance(node, Check):
        return list(node.edges.values())
    return []


def as_dict() -> dict:
    """The whole tree as plain data (for JSON, hashing and the pages)."""
    return {
        "root": ROOT,
        "nodes": [asdict(n) for n in NODES],
        "options": [asdict(o) for o in OPTIONS],
        "stages": STAGES,
        "symbols": SYMBOLS,
        "constants": {"start_batch": START_BATCH, "target_effective_batch": TARGET_EFFECTIVE_BATCH,
                      "max_micro_batch": MAX_MICRO_BATCH, "fsdp_gpu_counts": list(FSDP_GPU_COUNTS),
                      "min_activations": MIN_ACTIVATIONS},
    }


def tree_hash() -> str:
    """Changes whenever the tree's data changes: stored walks record it and are redone when it differs."""
    return short_hash(as_dict(), 12)


# ----- Mermaid -----------------------------------------------------------------------------------
def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")


def option_node_id(option_id: str) -> str:
    return "opt_" + option_id.replace("-", "_")


def mermaid(highlight: list[str] | None = None) -> str:
    """A Mermaid flowchart of the tree, one subgraph per stage; ``highlight`` marks a walked path."""
    lines = ["flowchart TD"]
    for stage, title in STAGES.items():
        members = [n for n in NODES if n.stage == stage]
        if not members:
            continue
        lines.append(f'    subgraph {stage}["{_mermaid_text(title)}"]')
        for n in members:
            label = _mermaid_text(n.label)
            if isinstance(n, Check):
                lines.append(f'        {n.id}{{"{label}"}}')
            elif isinstance(n, End):
                lines.append(f'        {n.id}(["{label}"])')
            else:
                lines.append(f'        {n.id}["{label}"]')
        lines.append("    end")
    lines.append('    subgraph options["Options beyond one card"]')
    for o in OPTIONS:
        lines.append(f'        {option_node_id(o.id)}["{_mermaid_text(o.label)}"]')
    lines.append("    end")
    for n in NODES:
        if isinstance(n, Action):
            lines.append(f"    {n.id} --> {n.next}")
        elif isinstance(n, Check):
            for outcome, target in n.edges.items():
                lines.append(f"    {n.id} -- {outcome} --> {target}")
    for n in NODES:
        if isinstance(n, End):
            for oid in n.options:
                lines.append(f"    {n.id} -.-> {option_node_id(oid)}")
    lines.append("    classDef check fill:#fff8e1,stroke:#f9a825")
    lines.append("    classDef done fill:#e8f5e9,stroke:#2e7d32")
    lines.append("    classDef stop fill:#ffebee,stroke:#c62828")
    checks = [n.id for n in NODES if isinstance(n, Check)]
    lines.append(f"    class {','.join(checks)} check")
    lines.append(f"    class {','.join(n.id for n in NODES if isinstance(n, End) and n.verdict == 'fits')} done")
    lines.append(f"    class {','.join(n.id for n in NODES if isinstance(n, End) and n.verdict != 'fits')} stop")
    if highlight:
        lines.append("    classDef walked stroke-width:3px,stroke:#1565c0")
        lines.append(f"    class {','.join(dict.fromkeys(highlight))} walked")
    return "\n".join(lines)


__all__ = ["Action", "Check", "End", "Option", "NODES", "OPTIONS", "ROOT", "BY_ID", "OPTION_BY_ID", "STAGES",
           "SYMBOLS", "MIN_ACTIVATIONS", "TARGET_EFFECTIVE_BATCH", "MAX_MICRO_BATCH", "FSDP_GPU_COUNTS",
           "START_BATCH", "successors", "as_dict", "tree_hash", "mermaid"]
