"""torch.compile as a setup field: off by default (HF Trainer's torch_compile=False), a flag, a sweep
key and a label; the harness refuses it until it runs it."""

import pytest

from reportgen.estimate import constants as K
from reportgen.measure.harness import SetupNotSupported, check_supported
from reportgen.results import case_id
from reportgen.setup import TrainingSetup


def test_off_by_default_and_labelled():
    assert TrainingSetup().compile is False
    assert "compile" in TrainingSetup(compile=True).short()


def test_default_keeps_existing_case_ids():
    setup = TrainingSetup().model_dump(mode="json")
    without = {k: v for k, v in setup.items() if k != "compile"}
    assert case_id("llama-3.2-1b", "rtx-4090", setup) == case_id("llama-3.2-1b", "rtx-4090", without)


def test_the_harness_refuses_it_with_a_reason():
    with pytest.raises(SetupNotSupported, match="torch.compile"):
        check_supported(TrainingSetup(compile=True), "cpu")


# ----- the estimator's model of compile (reportgen/estimate/fusion.py) -----------------------------
from reportgen import catalog  # noqa: E402
from reportgen.estimate import estimate  # noqa: E402
from reportgen.estimate.activations import layer_activations  # noqa: E402
from reportgen.estimate.dtypes import dtypes_for  # noqa: E402
from reportgen.estimate.fusion import fused_away_bytes_per_token, saved_bytes_per_token  # noqa: E402

L8 = catalog.load_model("llama-3.1-8b")
H100 = catalog.load_gpu("h100-sxm")


def test_fused_away_intermediates_of_a_llama_layer():
    """bf16 Llama 3.1 8B (hidden 4,096, intermediate 14,336, 32 q + 8 kv heads of 128): two RMSNorms of
    (12 + 2) x 4,096 B, the SiLU output 2 x 14,336 B, RoPE 3.5 x 2 x 128 x 40 B = 179,200 B per token."""
    dt = dtypes_for(TrainingSetup(method="full", precision="bf16"))
    assert fused_away_bytes_per_token(L8, dt) == 2 * 14 * 4096 + 2 * 14336 + 3.5 * 2 * 128 * 40 == 179_200


def test_saved_tensors_compile_drops():
    """Per token and layer: each pre-norm saves its bf16 input instead of the fp32 copy (2 x 4,096 B
    less), SwiGLU recomputes silu(gate) (2 x 14,336 B less): 45,056 B; nothing when the stream is fp32."""
    bf16 = dtypes_for(TrainingSetup(method="lora", precision="bf16"))
    assert saved_bytes_per_token(L8, bf16) == 2 * 2 * 4096 + 2 * 14336 == 45_056
    s = TrainingSetup(method="lora", precision="bf16", batch=2, seq=512)
    eager = layer_activations(L8, s, bf16)
    compiled = layer_activations(L8, s.model_copy(update={"compile": True}), bf16)
    assert eager.bytes - compiled.bytes == 45_056 * 2 * 512


def test_compile_time_is_the_fused_traffic_over_bandwidth():
    """Full bf16, batch 1 x 8,192, no checkpointing: 4 x 179,200 B x 32 layers x 8,192 tokens over
    3.35 TB/s x DRAM_EFFICIENCY, less the L2's share (``time.memory_bandwidth``), less per step, everything else
    unchanged: 6.9 % more tokens/s."""
    s = TrainingSetup(method="full", precision="bf16", batch=1, seq=8192)
    eager = estimate(L8, H100, s, reverse=False).time
    compiled = estimate(L8, H100, s.model_copy(update={"compile": True}), reverse=False).time
    from reportgen.estimate.time import TimeConstants, memory_bandwidth

    # the fused tensors are the micro-batch's: 8,192 x 4,096 x 2 B = 64 MiB, beyond the H100's 50 MB L2 in part
    bw = memory_bandwidth(H100, TimeConstants.current(H100), 8192 * 4096 * 2)
    assert bw == pytest.approx(3.35e12 * K.DRAM_EFFICIENCY / (1 - K.L2_REUSE * 50 / 64))
    assert compiled.parts["compile"] == pytest.approx(-4 * 179_200 * 32 * 8192 / bw, rel=1e-3)
    assert eager.parts["compile"] == 0
    assert compiled.step_s == pytest.approx(eager.step_s + compiled.parts["compile"], rel=1e-9)
    assert compiled.tokens_per_s / eager.tokens_per_s == pytest.approx(1.069, abs=0.002)


def test_compile_is_a_sweep_key(tmp_path):
    from reportgen.sweep import load_sweep

    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\ngrids:\n  - model: llama-3.2-1b\n    gpu: rtx-4090\n    compile: [false, true]\n")
    assert sorted(c.setup.compile for c in load_sweep(spec).cases) == [False, True]
