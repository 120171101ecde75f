"""Which SDPA kernel CUDA runs, and what it keeps, pinned to worked examples and to the H100
measurements they explain (``results/validation/measured``, immutable).

* fp32 inputs of a grouped-query model without a mask take the math path (torch 2.11: flash is
  16-bit only, the memory-efficient kernel refuses k/v with fewer heads): the ``s x s``
  probabilities per head are kept.
* a sliding window shorter than the sequence makes transformers pass a mask (Phi-3 mini, window
  2,047): the memory-efficient kernel runs and keeps SDPA's additive copy of the mask per layer.
"""

import json
from pathlib import Path

import pytest

from reportgen import catalog
from reportgen.estimate import activations as act
from reportgen.estimate import estimate
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.memory import sdpa_mask_bytes
from reportgen.setup import Attention, TrainingSetup

MEASURED = Path(__file__).resolve().parent.parent / "results" / "validation" / "measured"
L1 = catalog.load_model("llama-3.2-1b")  # 32 query heads, 8 k/v heads of 64
PHI3 = catalog.load_model("phi-3-mini")  # 32 heads of 96, no GQA, sliding window 2,047


def measured(case_id: str) -> dict:
    (path,) = MEASURED.glob(f"{case_id}.*.json")
    return json.loads(path.read_text())["measurement"]


@pytest.mark.parametrize("model,precision,seq,expected", [
    (L1, "bf16-mixed", 2048, "flash"),
    (L1, "bf16", 2048, "flash"),
    (L1, "fp32", 2048, "math"),  # GQA in fp32: neither fused kernel takes it
    (PHI3, "fp32", 1024, "efficient"),  # fp32 without GQA
    (PHI3, "bf16-mixed", 2046, "flash"),  # shorter than the window: is_causal, no mask
    (PHI3, "bf16-mixed", 2047, "efficient"),  # the window cuts the sequence: a mask, flash refuses it
])
def test_sdpa_kernel(model, precision, seq, expected):
    setup = TrainingSetup(method="lora", precision=precision, seq=seq)
    assert act.sdpa_kernel(model, setup, dtypes_for(setup).compute) == expected


def test_math_path_keeps_the_probabilities_worked_example(monkeypatch):
    """Llama-3.2-1B LoRA all-linear, fp32, one layer past the first at 2,048 tokens. Math path per
    token: scaled q, repeated-and-scaled k and repeated v at all 32 heads, 3 x 4 x 64 x 32 = 24,576
    bytes, and o_proj's adapter keeps its own contiguous copy of the output, 4 x 2,048 = 8,192; per
    sequence squared the fp32 probabilities, 4 x 32 = 128 bytes (512 MiB at 2,048 tokens). Had the
    memory-efficient kernel run: q, k, v at their own heads, the output (which o_proj's adapter
    shares) and the logsumexp, 4 x 64 x (32 + 16) + 4 x 2,048 + 4 x 32 = 20,608 per token.
    Difference: 24,576 + 8,192 - 20,608 = 12,160 bytes per token and the probabilities."""
    setup = TrainingSetup(method="lora", precision="fp32", seq=2048)
    dt = dtypes_for(setup)
    math = act.layer_activations(L1, setup, dt)
    monkeypatch.setattr(act, "sdpa_kernel", lambda *a, **k: "efficient")
    efficient = act.layer_activations(L1, setup, dt)
    assert math.per_seq_sq - efficient.per_seq_sq == 128
    assert (math.per_seq_sq - efficient.per_seq_sq) * 2048 ** 2 == 512 * 2**20
    assert math.per_token - efficient.per_token == 12_160


def test_fp32_lora_matches_the_h100_measurement():
    """The measured fp32 step (21.74 GiB) was 8.4 GiB above the memory-efficient estimate: 16 layers
    x 512 MiB of probabilities, and the math path's other tensors."""
    m = measured("llama-3.2-1b.h100-sxm.lora.afb26703")
    est = estimate(L1, catalog.load_gpu("h100-sxm"), TrainingSetup(method="lora", precision="fp32", seq=2048),
                   reverse=False)
    assert est.memory.peak_allocated == pytest.approx(m["peak_allocated"], rel=0.002)


def test_sliding_window_mask_worked_example():
    """Phi-3 mini at 2,048 tokens (window 2,047): every layer gets transformers' boolean mask, and
    SDPA keeps a bf16 additive copy of it per layer, 2 x 2,048^2 = 8 MiB (32 layers: the 256 MiB the
    estimate lacked against the measurement). The per-token inventory is unchanged here: under
    autocast peft's adapter on o_proj saves its own fp32 cast of the attention output whichever
    layout the kernel wrote. The boolean mask itself (1 byte x 2,048^2 = 4 MiB) lives only while the
    forward runs."""
    masked_setup = TrainingSetup(method="lora", seq=2048)
    plain_setup = TrainingSetup(method="lora", seq=2046)
    dt = dtypes_for(masked_setup)
    assert act.sdpa_masked_layers(PHI3, masked_setup) == 32 and act.sdpa_masked_layers(PHI3, plain_setup) == 0
    masked = act.layer_activations(PHI3, masked_setup, dt)
    plain = act.layer_activations(PHI3, masked_setup, dt, masked=False)
    assert masked.per_seq_sq - plain.per_seq_sq == 2
    assert masked.bytes - plain.bytes == 2 * 2048 ** 2
    assert sdpa_mask_bytes(PHI3, masked_setup, Attention.sdpa) == 2048 ** 2
    assert sdpa_mask_bytes(PHI3, plain_setup, Attention.sdpa) == 0


def test_phi3_sliding_window_matches_the_h100_measurement():
    m = measured("phi-3-mini.h100-sxm.lora.453de8e9")
    est = estimate(PHI3, catalog.load_gpu("h100-sxm"), TrainingSetup(method="lora", seq=2048), reverse=False)
    assert est.memory.peak_allocated == pytest.approx(m["peak_allocated"], rel=0.002)


def test_gemma3_masks_its_sliding_layers_only():
    """Gemma 3 1B: 22 of 26 layers slide over 512 tokens; at 2,048 tokens those get a mask (and k, v
    repeated to all heads, as transformers does when it passes one), the 4 full-attention layers none."""
    g3 = catalog.load_model("gemma-3-1b")
    setup = TrainingSetup(method="full", seq=2048)
    assert g3.sliding_layers == 22
    assert act.sdpa_masked_layers(g3, setup) == 22
    dt = dtypes_for(setup)
    one_masked = act.layer_activations(g3, setup, dt, masked=True).bytes
    one_plain = act.layer_activations(g3, setup, dt, masked=False).bytes
    first = act.layer_activations(g3, setup, dt, first_layer=True, masked=True).bytes
    assert act.all_layers(g3, setup, dt) == first + 21 * one_masked + 4 * one_plain
