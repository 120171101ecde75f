"""The analytic estimator against the trace at real layer sizes: ``peak_allocated`` within 3%.

Grid: every family the estimator knows (the catalog's Llama 3.1 8B, Qwen2.5 7B, Gemma 2 9B,
Phi-3 mini and Mixtral 8x7B configs at their real widths and vocabularies, cut to 2 decoder
layers so the whole grid traces in about a minute) x {full, LoRA, QLoRA} x checkpointing
{off, on} x seq {512, 2048} x batch {1, 2}, bf16-mixed, AdamW, on an H100; the families added
later (Gemma, Gemma 3, Qwen3, Qwen3-MoE, Phi-2, OLMo 2) x {full, LoRA, QLoRA} x checkpointing at
seq 512, batch 1; plus two catalog models at full depth.

Where the two disagree by more than 3%, the case is in ``DISAGREEMENTS`` with the cause found
(which analytic term is off, and the physical effect behind it). Those cases are
``xfail(strict=True)``: when the analytic formulas are fixed they start passing and the strict
xfail fails, so the list must shrink with the fix. Every other case must agree.
"""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from reportgen import catalog  # noqa: E402
from reportgen.estimate.memory import estimate_memory  # noqa: E402
from reportgen.model import from_config  # noqa: E402
from reportgen.setup import TrainingSetup  # noqa: E402
from reportgen.trace.result import trace_case  # noqa: E402

TOLERANCE = 0.03
LAYERS = 2
GPU = "h100-sxm"
FAMILIES = {"llama": "llama-3.1-8b", "qwen2": "qwen2.5-7b", "gemma2": "gemma-2-9b", "phi3": "phi-3-mini",
            "mixtral": "mixtral-8x7b"}

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
        "analytic peak is 4-10% high for a 2-layer Mixtral, 3-4% for Qwen3-MoE, with LoRA all-linear (the "
        "direction that is safe for 'will it fit')"),
}
#: disagreements the trace found and the analytic formulas now model (each in its own commit)
FIXED = {
    "tied_embedding_grad": "memory.py 'embedding-backward': a tied weight's two gradients meet at the "
                           "embedding's backward (Gemma 2 9B: +3.42 GiB)",
    "qlora_dequant_at_loss": "memory.py 'forward-last-layer': the dequantized 4-bit weight and the MLP "
                             "intermediate are freed before the logits exist",
    "peft_expert_wrapper": "activations.py expert_wrapper_bytes: peft's ParamWrapper keeps each MoE layer's "
                           "merged expert weights for the backward (Mixtral: 2.62 GiB per layer)",
}


def case_id(fam: str, method: str, ckpt: bool, seq: int, batch: int) -> str:
    return f"{fam}-{method}-{'ckpt' if ckpt else 'nockpt'}-s{seq}-b{batch}"


#: case -> cause; everything not listed must agree within TOLERANCE
DISAGREEMENTS = {
    case_id("phi3", "full", False, 512, 2): "layer_backward_overlap",
    case_id("phi3", "full", False, 2048, 1): "layer_backward_overlap",
    case_id("phi3", "full", True, 512, 2): "layer_backward_overlap",
    case_id("phi3", "full", True, 2048, 1): "layer_backward_overlap",
    case_id("phi3", "full", True, 2048, 2): "layer_backward_overlap",
    case_id("mixtral", "full", False, 2048, 2): "layer_backward_overlap",
    case_id("mixtral", "full", True, 2048, 2): "layer_backward_overlap",
    # LoRA only: QLoRA's default preparation (peft prepare_model_for_kbit_training) upcasts the
    # 16-bit experts to fp32, and the fp32 grouped matmul's own tensors bring those cases within 3%
    **{case_id("mixtral", "lora", ckpt, seq, b): "expert_wrapper_overlap"
       for ckpt in (False, True) for seq in (512, 2048) for b in (1, 2)
       if (ckpt, seq, b) != (False, 2048, 2)},  # there the activations outweigh the overlap: within 3%
    **{case_id("qwen3_moe", "lora", ckpt, 512, 1): "expert_wrapper_overlap"
       for ckpt in (False, True)},  # +3.3% to +4.1%
}


#: the families added later (issue 9), on a smaller grid to keep CI short: every method x
#: checkpointing at one sequence length and batch
MORE_FAMILIES = {"gemma": "gemma-7b", "gemma3": "gemma-3-1b", "qwen3": "qwen3-8b", "qwen3_moe": "qwen3-30b-a3b",
                 "phi": "phi-2", "olmo2": "olmo-2-7b"}


def _grid():
    yield from itertools.product(FAMILIES, ("full", "lora", "qlora"), (False, True), (512, 2048), (1, 2))
    yield from itertools.product(MORE_FAMILIES, ("full", "lora", "qlora"), (False, True), (512,), (1,))


def _params():
    out = []
    for fam, method, ckpt, seq, batch in _grid():
        cid = case_id(fam, method, ckpt, seq, batch)
        cause = DISAGREEMENTS.get(cid)
        marks = [pytest.mark.xfail(strict=True, reason=f"{cause}: {CAUSES[cause]}")] if cause else []
        out.append(pytest.param(fam, method, ckpt, seq, batch, id=cid, marks=marks))
    return out


def test_every_listed_disagreement_is_in_the_grid_and_named():
    grid = {p.id for p in _params()} | set(FULL_DEPTH)
    assert set(DISAGREEMENTS) <= grid
    assert set(DISAGREEMENTS.values()) <= set(CAUSES)


def _relative_gap(spec, setup) -> float:
    gpu = catalog.load_gpu(GPU)
    traced = trace_case(spec, gpu, setup).replay.peak_allocated
    analytic = estimate_memory(spec, setup, gpu).peak_allocated
    return (analytic - traced) / traced


@pytest.mark.parametrize("fam,method,ckpt,seq,batch", _params())
def test_analytic_peak_agrees_with_trace(fam, method, ckpt, seq, batch):
    name = {**FAMILIES, **MORE_FAMILIES}[fam]
    config = dict(catalog.load_model(name).config, num_hidden_layers=LAYERS)
    if "layer_types" in config:  # Gemma 3 / OLMo-style per-layer lists follow the layer count
        config["layer_types"] = config["layer_types"][:LAYERS]
    spec = from_config(config, name=f"{name}-{LAYERS}-layers")
    setup = TrainingSetup(method=method, grad_ckpt=ckpt, seq=seq, batch=batch)
    assert abs(_relative_gap(spec, setup)) <= TOLERANCE


FULL_DEPTH = {
    "tinyllama-1.1b-lora-nockpt-s2048-b1": ("tinyllama-1.1b", dict(method="lora", seq=2048)),
    "llama-3.2-1b-full-ckpt-s1024-b1": ("llama-3.2-1b", dict(method="full", seq=1024, grad_ckpt=True)),
}


def _full_depth_params():
    return [pytest.param(model, kw, id=cid, marks=[pytest.mark.xfail(
        strict=True, reason=f"{DISAGREEMENTS[cid]}: {CAUSES[DISAGREEMENTS[cid]]}")] if cid in DISAGREEMENTS else [])
        for cid, (model, kw) in FULL_DEPTH.items()]


@pytest.mark.parametrize("model,kw", _full_depth_params())
def test_analytic_peak_agrees_with_trace_at_full_depth(model, kw):
    assert abs(_relative_gap(catalog.load_model(model), TrainingSetup(**kw))) <= TOLERANCE


#: the dtype recipes of issue 9 on a few families: QLoRA without the preparation (fsdp_qlora,
#: litgpt) and with TRL's cast back to bf16, LoRA on fp32 frozen weights (Lightning's bf16-mixed);
#: the grid above runs QLoRA with peft's prepare_model_for_kbit_training, the default
RECIPES = {"qlora-kbit-none": dict(method="qlora", kbit_prep="none"),
           "qlora-kbit-trl": dict(method="qlora", kbit_prep="trl"),
           "lora-frozen-fp32": dict(method="lora", frozen_dtype="fp32")}
RECIPE_FAMILIES = ("llama", "gemma3", "qwen3", "phi")


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("ckpt", (False, True), ids=("nockpt", "ckpt"))
@pytest.mark.parametrize("fam", RECIPE_FAMILIES)
def test_recipe_dtypes_agree_with_trace(fam, ckpt, recipe):
    name = {**FAMILIES, **MORE_FAMILIES}[fam]
    config = dict(catalog.load_model(name).config, num_hidden_layers=LAYERS)
    if "layer_types" in config:
        config["layer_types"] = config["layer_types"][:LAYERS]
    spec = from_config(config, name=f"{name}-{LAYERS}-layers")
    setup = TrainingSetup(grad_ckpt=ckpt, seq=512, **RECIPES[recipe])
    assert abs(_relative_gap(spec, setup)) <= TOLERANCE


#: DoRA (peft use_dora=True, issue 9): the magnitude vectors, the base and LoRA outputs the DoRA
#: combination keeps, and the forward's transient W + scale B A with its identity input (estimate/dora.py)
DORA_FAMILIES = ("llama", "qwen3", "gemma3")


@pytest.mark.parametrize("method", ("lora", "qlora"))
@pytest.mark.parametrize("ckpt", (False, True), ids=("nockpt", "ckpt"))
@pytest.mark.parametrize("fam", DORA_FAMILIES)
def test_dora_agrees_with_trace(fam, ckpt, method):
    name = {**FAMILIES, **MORE_FAMILIES}[fam]
    config = dict(catalog.load_model(name).config, num_hidden_layers=LAYERS)
    if "layer_types" in config:
        config["layer_types"] = config["layer_types"][:LAYERS]
    spec = from_config(config, name=f"{name}-{LAYERS}-layers")
    setup = TrainingSetup(method=method, grad_ckpt=ckpt, seq=512, dora=True)
    assert abs(_relative_gap(spec, setup)) <= TOLERANCE


@pytest.mark.parametrize("method", ("lora", "qlora"))
@pytest.mark.parametrize("ckpt", (False, True), ids=("nockpt", "ckpt"))
@pytest.mark.parametrize("precision", ("bf16-mixed", "bf16", "fp32"))
def test_dora_recipes_agree_with_trace(precision, ckpt, method):
    """DoRA on Llama with lora_dropout 0.1 (the base output recomputed from the dropped input, keeping
    the weight for its input gradient) under each precision (without autocast peft's 4-bit layer
    casts x to the adapter dtype; the 4-bit weight dequantized in the base matmul is freed first)."""
    name = FAMILIES["llama"]
    spec = from_config(dict(catalog.load_model(name).config, num_hidden_layers=LAYERS), name=f"{name}-{LAYERS}-layers")
    setup = TrainingSetup(method=method, grad_ckpt=ckpt, seq=512, dora=True, lora_dropout=0.1, precision=precision)
    assert abs(_relative_gap(spec, setup)) <= TOLERANCE
