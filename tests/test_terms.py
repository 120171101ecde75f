"""Each memory and time term pinned to a worked example (numbers derived by hand below)."""

import pytest

from reportgen import catalog
from reportgen.estimate import activations as act
from reportgen.estimate import params as P
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.logits import logits_memory
from reportgen.estimate.time import flops_per_token, matmul_params_per_token
from reportgen.setup import Attention, TrainingSetup

L2 = catalog.load_model("llama-2-7b")
L3 = catalog.load_model("llama-3.1-8b")
# Llama-2-7B decoder linears: 32 x (4 x 4096^2 + 3 x 4096 x 11008) = 6,476,005,376 weights
L2_LINEAR = 6_476_005_376


def s(**kw):
    return TrainingSetup(**kw)


def test_weights_full_bf16_is_2_bytes_per_param():
    setup = s(method="full", precision="bf16")
    assert P.weights_bytes(L2, setup, dtypes_for(setup)) == 6_738_415_616 * 2


def test_weights_full_mixed_keeps_fp32_master():
    setup = s(method="full", precision="bf16-mixed")
    assert P.weights_bytes(L2, setup, dtypes_for(setup)) == 6_738_415_616 * 4


def test_weights_qlora_packs_linears_keeps_rest_16bit():
    setup = s(method="qlora", kbit_prep="none")  # without peft's fp32 upcast (tests/test_recipe_dtypes.py)
    assert P.quantized_linear_params(L2) == L2_LINEAR
    # 4-bit linears (half a byte each) + embeddings, head and norms in bf16
    assert P.weights_bytes(L2, setup, dtypes_for(setup)) == L2_LINEAR // 2 + (6_738_415_616 - L2_LINEAR) * 2


def test_quant_constants_half_a_bit_per_param_without_double_quant():
    # one fp32 absmax per 64 weights = 0.5 bit/param, + a 16-entry fp32 code per weight (224 weights)
    assert P.quant_constants_bytes(L2, s(method="qlora")) == L2_LINEAR // 16 + 224 * 64


def test_double_quant_matches_qlora_paper_0127_bits():
    bits = 8 * P.quant_constants_bytes(L2, s(method="qlora", double_quant=True)) / L2_LINEAR
    assert bits == pytest.approx(0.127, abs=0.002)  # Dettmers et al. 2023, section 3


def test_lora_adapters_fp32_under_mixed_and_bf16_under_pure():
    mixed, pure = s(method="lora", lora_rank=8, lora_targets="qv"), s(method="lora", precision="bf16", lora_rank=8,
                                                                         lora_targets="qv")
    assert P.adapter_bytes(L2, mixed, dtypes_for(mixed)) == 4_194_304 * 4
    assert P.adapter_bytes(L2, pure, dtypes_for(pure)) == 4_194_304 * 2


def test_gradients_are_fp32_under_autocast():
    setup = s(method="full", precision="bf16-mixed")
    assert P.gradient_bytes(L2, setup, dtypes_for(setup)) == 6_738_415_616 * 4


def test_frozen_weights_have_no_gradients():
    setup = s(method="lora", lora_rank=8, lora_targets="qv")
    assert P.gradient_bytes(L2, setup, dtypes_for(setup)) == 4_194_304 * 4


@pytest.mark.parametrize("precision,per_param", [("bf16-mixed", 8), ("fp32", 8), ("bf16", 4)])
def test_adamw_two_states_in_param_dtype(precision, per_param):
    setup = s(method="full", precision=precision)
    torch_bytes, managed = P.optimizer_state_bytes(L2, setup, dtypes_for(setup))
    assert torch_bytes == 6_738_415_616 * per_param and managed == 0


def test_adamw_8bit_about_two_bytes_per_param():
    setup = s(method="full", optimizer="adamw-8bit")
    torch_bytes, managed = P.optimizer_state_bytes(L2, setup, dtypes_for(setup))
    # 2 x (1 byte + 4/256 bytes of absmax); the 65 norm vectors (4096 < min_8bit_size) keep fp32 states
    assert torch_bytes / 6_738_415_616 == pytest.approx(2 * (1 + 4 / 256), rel=1e-3)
    assert managed == 0


def test_adamw_8bit_states_worked_to_the_byte():
    """bitsandbytes' blockwise 8-bit AdamW (``Optimizer2State``): two uint8 states and one fp32
    absmax per 256 values each, fp32 states for tensors under ``min_8bit_size`` (4,096 elements), and
    the two shared 256-entry fp32 quantization maps (qmap1, qmap2: 2,048 bytes).

    * Llama-2-7B: every tensor has at least 4,096 elements (the norms exactly 4,096) and a multiple of
      256: 2 x 6,738,415,616 + 8 x 6,738,415,616 / 256 + 2,048 = 13,687,408,768 bytes.
    * Llama-3.2-1B (hidden 2,048): its 33 norm vectors (2 x 16 layers + the final one, 67,584
      values) keep fp32 states, 540,672 bytes; the other 1,235,746,816 values 2 + 8/256 bytes each:
      2,471,493,632 + 38,617,088 + 540,672 + 2,048 = 2,510,653,440 bytes."""
    setup = s(method="full", optimizer="adamw-8bit")
    assert P.optimizer_state_bytes(L2, setup, dtypes_for(setup)) == (13_687_408_768, 0)
    assert P.optimizer_state_bytes(catalog.load_model("llama-3.2-1b"), setup, dtypes_for(setup)) == (2_510_653_440, 0)


def test_paged_optimizer_states_leave_the_torch_allocator():
    setup = s(method="full", optimizer="paged-adamw-8bit")
    torch_bytes, managed = P.optimizer_state_bytes(L2, setup, dtypes_for(setup))
    assert managed > 13e9 and torch_bytes < 0.3e9


def test_paged_states_are_not_in_the_process_figure():
    """nvidia-smi's per-process figure (NVML usedGpuMemory) leaves CUDA managed memory out: device_total
    is reserved + the CUDA context, the paged states are their own term, and the fit check (card_demand)
    does not count them either. Measured: the paged-AdamW-8bit step of Llama-3.2-1B (2.5 GB of paged
    states) shows the same device_used - peak_reserved as the other steps."""
    import json
    from pathlib import Path

    from reportgen.estimate import constants as K
    from reportgen.estimate.memory import estimate_memory

    setup = s(method="full", precision="bf16", optimizer="paged-adamw-8bit", seq=2048)
    m1 = catalog.load_model("llama-3.2-1b")
    mem = estimate_memory(m1, setup, catalog.load_gpu("h100-sxm"))
    assert mem.terms["optimizer_paged"] > 2e9
    assert mem.device_total == mem.peak_reserved + K.CUDA_CONTEXT_BYTES
    assert mem.card_demand == mem.device_total
    root = Path(__file__).resolve().parent.parent / "results" / "validation" / "measured"
    gaps = {}
    for name in ("llama-3.2-1b.h100-sxm.full.ab4c58fc", "llama-3.2-1b.h100-sxm.full.54e56fe8"):  # paged, not paged
        (path,) = root.glob(f"{name}.*.json")
        f = json.loads(path.read_text())["measurement"]
        gaps[name] = f["device_used"] - f["peak_reserved"]
    assert len(set(gaps.values())) == 1


def test_sgd_has_no_state_and_adafactor_is_factored():
    sgd = s(method="full", optimizer="sgd")
    assert P.optimizer_state_bytes(L2, sgd, dtypes_for(sgd)) == (0, 0)
    ada = s(method="full", optimizer="adafactor")
    torch_bytes, _ = P.optimizer_state_bytes(L2, ada, dtypes_for(ada))
    assert torch_bytes < 0.01 * 6_738_415_616 * 8  # rows + columns only


def test_layer_activations_llama2_7b_bf16_worked_example():
    """Pure bf16, full fine-tuning, SDPA, per token per layer (h=4096, I=11008, 32 heads of 128):
    two RMSNorms 2 x (4h + 4 + 2h) = 49,160; q/k/v input and gate/up input 2 x 2h = 16,384;
    q, k, v, output 2 x 128 x 128 = 32,768 and the fp32 logsumexp 4 x 32 = 128;
    gate, SiLU, up 3 x 2I = 66,048; down's input 2I = 22,016. Total 186,504 bytes."""
    setup = s(method="full", precision="bf16", batch=1, seq=8)
    assert act.layer_activations(L2, setup, dtypes_for(setup)).bytes == 8 * 186_504


def test_eager_attention_adds_s_squared_terms():
    sdpa = s(method="full", precision="bf16", batch=1, seq=2048)
    eager = sdpa.model_copy(update={"attn": "eager"})
    d = dtypes_for(sdpa)
    diff = act.layer_activations(L2, eager, d).bytes - act.layer_activations(L2, sdpa, d).bytes
    # fp32 softmax + its bf16 cast: 6 bytes x 32 heads x 2048^2, minus SDPA's logsumexp
    assert diff == 6 * 32 * 2048 * 2048 - 4 * 32 * 2048


def test_checkpointing_keeps_only_layer_inputs():
    setup = s(method="full", precision="bf16", grad_ckpt=True, batch=2, seq=1024)
    assert act.checkpointed_layer(L2, setup, dtypes_for(setup)) == 2 * 4096 * 2 * 1024


def test_logits_fp32_upcast_for_llama3_vocab():
    setup = s(method="lora", batch=1, seq=2048)
    lm = logits_memory(L3, dtypes_for(setup), 2048)
    tv = 2048 * 128_256
    assert lm.saved == 4 * tv + 8 * 2048 + 4
    assert lm.forward_live == lm.saved + 6 * tv  # bf16 logits + fp32 copy
    assert lm.backward_live == 12 * tv + 8 * 2048


def test_logits_in_fp32_are_not_copied_again():
    """Full fp32 training: the head already writes fp32 logits and ``.float()`` returns the same
    tensor, so the forward holds them once beside the saved log-softmax output."""
    setup = s(method="full", precision="fp32", batch=1, seq=2048)
    lm = logits_memory(L3, dtypes_for(setup), 2048)
    tv = 2048 * 128_256
    assert lm.saved == 4 * tv + 8 * 2048 + 4 and lm.forward_live == lm.saved + 4 * tv


def test_fused_cross_entropy_avoids_full_logits():
    """Liger's chunk for Llama 3.1 8B at 2,048 tokens: ceil(128,256 / 4,096) = 32 chunks' worth,
    next_pow2(2,048 / 32) = 64 tokens; one chunk's bf16 logits, their gradient written over them (Liger
    0.5.0 on), 64 x 128,256 x 2 = 16,416,768 bytes, beside the hidden states' gradient, 2,048 x 4,096 x 2 =
    16,777,216 bytes."""
    setup = s(method="lora", batch=1, seq=2048)
    fused = logits_memory(L3, dtypes_for(setup), 2048, fused=True)
    plain = logits_memory(L3, dtypes_for(setup), 2048)
    assert (fused.saved, fused.forward_live, fused.backward_live) == (16_777_216, 33_193_984, 16_777_216)
    assert fused.backward_live < plain.backward_live / 10


def test_flops_full_is_6n_lora_4n_worked_example():
    """Llama-2-7B (32 layers, hidden 4096, MLP 11008, 32 heads of 128, vocab 32000), seq 8, SDPA.
    Decoder weights per layer: q, k, v, o 4 x 4096^2 = 67,108,864 and gate, up, down
    3 x 4096 x 11008 = 135,266,304, so 32 x 202,375,168 = 6,476,005,376; the head 32000 x 4096 =
    131,072,000; N = 6,607,077,376. Attention forward, full square: 4 T H Q L = 4 x 8 x 32 x 128 x 32
    = 4,194,304 per token; PaLM's 12 L H Q T = 3 x that = 12,582,912; a causal SDPA kernel executes
    half the square forward, 2,097,152, and 2.5 times that backward (FlashAttention-2's five GEMMs to the
    forward's two): 3.5 x 2,097,152 = 7,340,032. LoRA r8 on q and v: 32 x 2 x 8 x (4096 + 4096) =
    4,194,304 adapter weights."""
    n = matmul_params_per_token(L2)
    assert n == 6_607_077_376
    hw, model = flops_per_token(L2, s(method="full", seq=8), s().attn)
    assert model == 6 * 6_607_077_376 + 12_582_912 == 39_655_047_168  # PaLM: 6N + 12 L H Q T
    assert hw == 6 * 6_607_077_376 + 7_340_032 == 39_649_804_288
    hw, model = flops_per_token(L2, s(method="lora", seq=8, lora_rank=8, lora_targets="qv"), s().attn)
    assert model == 4 * 6_607_077_376 + 6 * 4_194_304 + 12_582_912 == 26_466_058_240
    assert hw == 4 * 6_607_077_376 + 6 * 4_194_304 + 7_340_032 == 26_460_815_360


def test_model_flops_do_not_depend_on_the_attention_kernel():
    """PaLM's model FLOPs count the full attention square whatever the kernel; only the hardware
    count differs: eager executes 3 x 4,194,304 = 12,582,912, causal SDPA 3.5 x 2,097,152 = 7,340,032."""
    sdpa_hw, sdpa_model = flops_per_token(L2, s(seq=8), Attention.sdpa)
    eager_hw, eager_model = flops_per_token(L2, s(seq=8, attn="eager"), Attention.eager)
    assert sdpa_model == eager_model
    assert eager_hw - sdpa_hw == 12_582_912 - 7_340_032


def test_checkpointing_recomputes_the_decoder_layers_not_the_head():
    """Full bf16, seq 8: the recomputed forward is the decoder layers' matmuls, 2 x 6,476,005,376 =
    12,952,010,752, plus SDPA's causal attention forward 2,097,152, not the head's 2 x 131,072,000
    (transformers checkpoints decoder layers only). Model FLOPs (MFU) do not count it. With LoRA r8
    on q and v the adapters' forward is recomputed too: + 2 x 4,194,304."""
    hw, model = flops_per_token(L2, s(seq=8, grad_ckpt=True), s().attn)
    assert hw == 39_649_804_288 + 12_952_010_752 + 2_097_152 == 52_603_912_192
    assert model == 39_655_047_168
    hw, _ = flops_per_token(L2, s(method="lora", seq=8, lora_rank=8, lora_targets="qv", grad_ckpt=True), s().attn)
    assert hw == 26_460_815_360 + 12_952_010_752 + 2 * 4_194_304 + 2_097_152 == 39_423_311_872


def test_lora_dropout_worked_example():
    """Llama-2-7B, LoRA r16 on q and v, pure bf16, one 1024-token micro-batch (a middle layer).
    Without dropout the q and v adapters save the norm output itself (one 2-byte copy of 4096
    features per token, shared). With dropout each adapter saves its own dropped copy (2 x 4096 x
    2 bytes) plus a bool mask (2 x 4096 x 1 byte): 24576 - 8192 = 16384 bytes more per token."""
    base = dict(method="lora", precision="bf16", lora_rank=16, lora_targets="qv", batch=1, seq=1024)
    plain, dropped = TrainingSetup(**base), TrainingSetup(**base, lora_dropout=0.1)
    a = act.layer_activations(L2, plain, dtypes_for(plain))
    b = act.layer_activations(L2, dropped, dtypes_for(dropped))
    assert b.per_token - a.per_token == 2 * 4096 * 2 + 2 * 4096 * 1 - 4096 * 2
    assert b.bytes - a.bytes == 16384 * 1024


def test_qlora_under_autocast_shares_the_adapters_input():
    """peft's 4-bit LoRA layer skips the fp32 cast under autocast, so lora_A's autocast cast of the
    bf16 input is a no-op: q and v adapters save the one norm output (4096 x 2 bytes per token)
    where LoRA on a 16-bit base saves a 16-bit copy per adapter (2 x 4096 x 2 bytes)."""
    base = dict(precision="bf16-mixed", lora_rank=16, lora_targets="qv", batch=1, seq=1024)
    lora, qlora = TrainingSetup(method="lora", **base), TrainingSetup(method="qlora", kbit_prep="none", **base)
    a = act.layer_activations(L2, lora, dtypes_for(lora))
    b = act.layer_activations(L2, qlora, dtypes_for(qlora))
    assert a.per_token - b.per_token == 2 * 4096 * 2 - 4096 * 2


def test_bitsandbytes_0_43_keeps_each_4bit_input():
    """bitsandbytes <= 0.43.1 ``MatMul4Bit`` held its input on ctx (``libraries.py``). Llama-2-7B
    QLoRA, pure bf16, r16 on q and v, 1024 tokens: q/k/v read the norm output the adapters save
    anyway and o_proj reads SDPA's saved output, so only gate/up (norm output, 4096 features) and
    down (the SwiGLU product, 11008) add a bf16 tensor: 2 x (4096 + 11008) = 30208 bytes per token
    and layer, 32 layers at the end of the forward pass. 0.43.2 and later add nothing."""
    from reportgen.estimate.libraries import Libraries
    from reportgen.estimate.memory import estimate_memory

    setup = TrainingSetup(method="qlora", precision="bf16", lora_rank=16, lora_targets="qv", batch=1, seq=1024)
    gpu = catalog.load_gpu("rtx-4090")
    new = estimate_memory(L2, setup, gpu)
    old = estimate_memory(L2, setup, gpu, libs=Libraries(bitsandbytes="0.43.1"))
    assert old.phases["forward-end"] - new.phases["forward-end"] == 32 * 30208 * 1024
    assert estimate_memory(L2, setup, gpu, libs=Libraries(bitsandbytes="0.43.2")).phases == new.phases
    with pytest.raises(ValueError, match="0.43.1"):
        Libraries(bitsandbytes="latest").bnb_4bit_holds_input
