"""Worked examples for the activation terms the families of issue 9 add (``estimate/ops.py``,
``estimate/activations.py``), each derived by hand in its docstring. The saved-tensor test
(``test_activations_vs_torch.py``) checks the same terms against autograd on tiny models."""

import dataclasses

from reportgen import catalog
from reportgen.estimate import activations as act
from reportgen.estimate import ops
from reportgen.estimate.dtypes import dtypes_for
from reportgen.setup import TrainingSetup

BF16_FULL = TrainingSetup(method="full", precision="bf16", batch=1, seq=8)


def per_token(name: str, setup: TrainingSetup = BF16_FULL, first_layer: bool = False):
    layer = act.layer_activations(catalog.load_model(name), setup, dtypes_for(setup), first_layer=first_layer)
    return layer.per_token, layer.constant


def test_gemma_7b_layer_worked_example():
    """Gemma-7B, pure bf16 full fine-tuning, SDPA, per token per layer (h=3072, I=24576, 16 heads of
    256, so q is 4096 wide): two GemmaRMSNorms keep x.float(), rsqrt and the fp32 normalised tensor
    2 x (4h + 4 + 4h) = 49,160; q/k/v and gate/up inputs 2 x 2h = 12,288; SDPA's q, k, v, output
    2 x 256 x (16 + 32) + 2 x 4096 = 32,768 and logsumexp 4 x 16 = 64; GeGLU's gate, GELU and up
    3 x 2I = 147,456; down's input 2I = 49,152. Total 290,888. Constant: both norms' fp32
    ``1 + weight``, 2 x 4h = 24,576."""
    assert per_token("gemma-7b") == (290_888, 24_576)


def test_qwen3_8b_qk_norms_per_head():
    """Qwen3RMSNorm on q (32 heads of 128) and k (8 heads): x.float() 4 x width, one fp32 rsqrt per
    head, and with a trainable weight the normalised tensor in the input's dtype (bf16):
    q 4 x 4096 + 4 x 32 + 2 x 4096 = 24,704, k 4 x 1024 + 4 x 8 + 2 x 1024 = 6,176."""
    spec = catalog.load_model("qwen3-8b")
    no_qk_norm = dataclasses.replace(spec, family="llama")
    d = dtypes_for(BF16_FULL)
    a = act.layer_activations(spec, BF16_FULL, d).per_token
    b = act.layer_activations(no_qk_norm, BF16_FULL, d).per_token
    assert a - b == 24_704 + 6_176


def test_qwen3_8b_qk_norms_under_lora_depend_on_adapters():
    """LoRA (frozen norms) keeps only x.float() and rsqrt: q 4 x 4096 + 128, k 4 x 1024 + 32. In the
    first layer of a LoRA run without checkpointing k_proj's output needs no gradient unless
    k_proj has an adapter: with q/v adapters only q_norm saves there."""
    spec = catalog.load_model("qwen3-8b")
    setup = TrainingSetup(method="lora", precision="bf16", lora_targets="qv", batch=1, seq=8)
    d = dtypes_for(setup)
    no_qk = dataclasses.replace(spec, family="llama")
    rest = act.layer_activations(spec, setup, d).per_token - act.layer_activations(no_qk, setup, d).per_token
    first = (act.layer_activations(spec, setup, d, first_layer=True).per_token
             - act.layer_activations(no_qk, setup, d, first_layer=True).per_token)
    assert rest == (4 * 4096 + 4 * 32) + (4 * 1024 + 4 * 8)
    assert first == 4 * 4096 + 4 * 32


def test_olmo2_7b_layer_worked_example():
    """OLMo-2-7B, pure bf16 full fine-tuning, SDPA (h=4096, I=11008, 32 heads of 128): no
    pre-norms, so q/k/v read the bf16 residual stream (2h = 8,192) and so do gate/up (8,192);
    q_norm and k_norm over the whole 4096-wide projections and the two post-norms are
    Olmo2RMSNorms, (w * x) in fp32: 4 x (4 x 4096 + 4 + 4 x 4096) = 131,088; SDPA 2 x 128 x 96 +
    2 x 4096 + 4 x 32 = 32,896; SwiGLU 3 x 2I = 66,048; down's input 2I = 22,016. Total 268,432."""
    assert per_token("olmo-2-7b") == (268_432, 0)


def test_rope_tables_gemma3_and_olmo2():
    """RoPE's cos and sin, (1, seq, rotary_dim) each: Gemma 3 keeps one pair per layer type (sliding
    and full, ``Gemma3TextModel``), OLMo 2 keeps them fp32, Phi-2 rotates 32 of 80 dimensions."""
    setup = TrainingSetup(method="lora", precision="bf16", batch=1, seq=1024)
    d = dtypes_for(setup)
    ckpt = setup.model_copy(update={"grad_ckpt": True})

    def rope(name):
        spec = catalog.load_model(name)
        return act.fixed_activations(spec, setup, d) - act.fixed_activations(spec, ckpt, d)

    assert catalog.load_model("gemma-3-1b").rope_tables == 2
    assert rope("gemma-3-1b") == 2 * 2 * 1024 * 256 * 2
    assert rope("olmo-2-7b") == 2 * 1024 * 128 * 4
    assert rope("phi-2") == 2 * 1024 * 32 * 2


def test_layer_norm_under_cuda_autocast():
    """Phi-2's nn.LayerNorm, LoRA on a bf16 base under bf16 autocast: CUDA's fp32 policy saves an
    fp32 copy of the input (4h) with fp32 mean and rstd (8), and fp32 copies of the bf16 weight
    and bias (8h, per layer); the output is fp32. Pure bf16: the bf16 input, mean and rstd
    in fp32 (CUDA's accumulate type), no copies."""
    h = 2560
    mixed = dtypes_for(TrainingSetup(method="lora", precision="bf16-mixed"))
    pure = dtypes_for(TrainingSetup(method="lora", precision="bf16"))
    full_mixed = dtypes_for(TrainingSetup(method="full", precision="bf16-mixed"))
    assert ops.layer_norm(h, mixed) == (4 * h + 8, 8 * h, 4)
    assert ops.layer_norm(h, full_mixed) == (4 * h + 8, 0, 4)  # fp32 weights: .float() is the weight itself
    assert ops.layer_norm(h, pure) == (2 * h + 8, 0, 2)


def test_gelu_new_under_autocast():
    """NewGELUActivation saves pow's input, tanh's output, 0.5 x and 1 + tanh. Under autocast pow
    runs in fp32: a bf16 input gives 2 + 3 x 4 = 14 bytes per element and an fp32 output; an fp32
    input (QLoRA's fc1 returns the LayerNorm's fp32 dtype) 4 x 4 = 16. Without autocast 4 x 2."""
    mixed = dtypes_for(TrainingSetup(method="lora", precision="bf16-mixed"))
    pure = dtypes_for(TrainingSetup(method="lora", precision="bf16"))
    assert ops.gelu_new(10240, 2, mixed) == (14 * 10240, 4)
    assert ops.gelu_new(10240, 4, mixed) == (16 * 10240, 4)
    assert ops.gelu_new(10240, 2, pure) == (8 * 10240, 2)


def test_phi2_dropout_masks_and_qlora_fp32_stream():
    """Phi-2 drops out the attention and MLP outputs (resid_pdrop 0.1): two 1-byte masks of h per
    token and layer. Under QLoRA with autocast the residual stream turns fp32 after the first layer
    (fc2, a 4-bit layer, returns gelu_new's fp32 dtype): checkpointing keeps the first layer's bf16
    input and 31 fp32 ones."""
    spec = catalog.load_model("phi-2")
    setup = TrainingSetup(method="lora", precision="bf16", batch=1, seq=8)
    d = dtypes_for(setup)
    no_dropout = dataclasses.replace(spec, resid_dropout=0.0)
    assert (act.layer_activations(spec, setup, d).per_token
            - act.layer_activations(no_dropout, setup, d).per_token) == 2 * 2560
    q = TrainingSetup(method="qlora", precision="bf16-mixed", grad_ckpt=True, batch=1, seq=8, kbit_prep="none")
    assert act.all_layers(spec, q, dtypes_for(q)) == (2 + 31 * 4) * 2560 * 8
    lora = q.model_copy(update={"method": "lora", "kbit_prep": None})
    assert act.all_layers(spec, lora, dtypes_for(lora)) == 32 * 2 * 2560 * 8


def test_qwen3_moe_router_worked_example():
    """Qwen3-30B-A3B (128 experts, top 8, experts 768 wide, h=2048), LoRA bf16-mixed, per token:
    router softmax 4 x 128, top-k indices 8 x 8, with norm_topk_prob the sum and the renormalised
    weights 4 + 4 x 8: 612. Per route: three int64 indices, the routing weight cast back to the
    logits' bf16 (2; Mixtral keeps fp32), gate_up, activation and expert output in bf16
    2 x (2 x 768 + 768 + 2048): 8,730. 612 + 8 x 8,730 = 70,452; without norm_topk_prob 36 less."""
    spec = catalog.load_model("qwen3-30b-a3b")
    d = dtypes_for(TrainingSetup(method="lora", precision="bf16-mixed"))
    assert act._moe(spec, d) == 70_452
    assert act._moe(dataclasses.replace(spec, norm_topk_prob=False), d) == 70_452 - 36
