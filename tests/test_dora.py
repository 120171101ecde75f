"""DoRA (peft ``LoraConfig(use_dora=True)``, issue 9): worked examples on Llama 3.1 8B (h = 4,096,
32 layers, q/o 4096 x 4096, k/v 4096 -> 1024, gate/up 4096 -> 14336, down 14336 -> 4096), LoRA r16
all-linear, bf16-mixed. The tensor-level check is the trace (tests/test_trace_agreement.py
``test_dora_agrees_with_trace``); the formulas and their sources are in reportgen/estimate/dora.py."""

from __future__ import annotations

import pytest

from reportgen import catalog
from reportgen.estimate import activations as act
from reportgen.estimate import constants as K
from reportgen.estimate import dora
from reportgen.estimate import params as P
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.memory import estimate_memory
from reportgen.estimate.time import dora_s_per_micro_batch, estimate_time
from reportgen.results import case_id
from reportgen.setup import SetupError, TrainingSetup

OUT_PER_LAYER = 4096 + 1024 + 1024 + 4096 + 14336 + 14336 + 4096  # 43,008 magnitudes per layer
MAGNITUDES = 32 * OUT_PER_LAYER  # 1,376,256


@pytest.fixture(scope="module")
def llama():
    return catalog.load_model("llama-3.1-8b")


def test_dora_needs_lora_or_qlora():
    with pytest.raises(SetupError) as err:
        TrainingSetup(method="full", dora=True)
    assert err.value.field == "dora"
    with pytest.raises(SetupError):
        TrainingSetup(method="lora", dora="yes")
    assert "dora" in TrainingSetup(method="qlora", dora=True).short()
    assert "dora" not in TrainingSetup(method="lora").short()


def test_existing_case_ids_do_not_change():
    plain = TrainingSetup(method="lora").model_dump(mode="json")
    without = {k: v for k, v in plain.items() if k != "dora"}
    assert case_id("m", "g", plain) == case_id("m", "g", without)
    assert case_id("m", "g", {**plain, "dora": True}) != case_id("m", "g", plain)


def test_magnitudes_are_trainable_with_gradients_and_adamw_states(llama):
    lora, dora_setup = TrainingSetup(method="lora"), TrainingSetup(method="lora", dora=True)
    assert dora.magnitude_params(llama, dora_setup) == MAGNITUDES == 1_376_256
    assert P.trainable_params(llama, dora_setup) - P.trainable_params(llama, lora) == MAGNITUDES
    dt = dtypes_for(dora_setup)
    assert P.adapter_bytes(llama, dora_setup, dt) - P.adapter_bytes(llama, lora, dt) == 4 * MAGNITUDES
    assert P.gradient_bytes(llama, dora_setup, dt) - P.gradient_bytes(llama, lora, dt) == 4 * MAGNITUDES
    grown = P.optimizer_state_bytes(llama, dora_setup, dt)[0] - P.optimizer_state_bytes(llama, lora, dt)[0]
    assert grown == 8 * MAGNITUDES == 11_010_048


def test_saved_outputs_per_token_lora(llama):
    # per adapted linear the base output and the LoRA output, both bf16 under autocast: 43,008 x 4
    setup = TrainingSetup(method="lora", dora=True, seq=512)
    plain = TrainingSetup(method="lora", seq=512)
    grown = (act.layer_activations(llama, setup, dtypes_for(setup)).per_token
             - act.layer_activations(llama, plain, dtypes_for(plain)).per_token)
    assert grown == OUT_PER_LAYER * 4 == 172_032
    gate = next(lin for lin in llama.layer_linears() if lin.name == "gate_proj")
    assert dora.saved_bytes_per_token(gate, 2, dtypes_for(setup)) == 14_336 * 4 == 57_344
    # m/norm, m/norm - 1 and the norm, fp32, per adapted linear
    const = (act.layer_activations(llama, setup, dtypes_for(setup)).constant
             - act.layer_activations(llama, plain, dtypes_for(plain)).constant)
    assert const == 3 * 4 * OUT_PER_LAYER == 516_096


def test_saved_outputs_per_token_qlora(llama):
    # a 4-bit layer returns its input's dtype: fp32 behind the peft-prepared (fp32) stream for q, k, v,
    # gate, up and down; o_proj reads the bf16 attention output. LoRA outputs are bf16.
    setup = TrainingSetup(method="qlora", dora=True, seq=512)
    plain = TrainingSetup(method="qlora", seq=512)
    grown = (act.layer_activations(llama, setup, dtypes_for(setup)).per_token
             - act.layer_activations(llama, plain, dtypes_for(plain)).per_token)
    assert grown == (4096 + 1024 + 1024 + 14336 + 14336 + 4096) * (4 + 2) + 4096 * (2 + 2) == 249_856


def test_forward_transient_of_the_down_projection(llama):
    setup = TrainingSetup(method="lora", dora=True, seq=512)
    dt = dtypes_for(setup)
    down = next(lin for lin in llama.layer_linears() if lin.name == "down_proj")
    eye = 14336 * 14336 * 4 + 14336 * 14336 * 2 + 14336 * 16 * 2 + 14336 * 4096 * 2
    norm = 14336 * 14336 * 2 + 14336 * 16 * 2 + 4 * 4096 * 14336 * 4
    assert eye == norm == 1_351_024_640
    x_cast = 512 * 14336 * 4
    assert dora.forward_transient_bytes(llama, down, dt, 16, 512) == 1_351_024_640 + x_cast == 1_380_384_768
    # the largest of the layer (gate_proj's: 33,554,432 + 131,072 + 939,524,096 + 8,388,608)
    assert dora.layer_forward_transient_bytes(llama, setup, dt) == 1_380_384_768
    gate = next(lin for lin in llama.layer_linears() if lin.name == "gate_proj")
    assert dora.forward_transient_bytes(llama, gate, dt, 16, 512) == 981_598_208
    est, plain = estimate_memory(llama, setup, catalog.load_gpu("h100-sxm")), estimate_memory(
        llama, TrainingSetup(method="lora", seq=512), catalog.load_gpu("h100-sxm"))
    grown = est.phases["forward-last-layer"] - plain.phases["forward-last-layer"]
    # the saved outputs and vectors of every layer; the first layer's q, k and v read an input that needs
    # no gradient (LoRA without checkpointing), so their base outputs do not and m/norm - 1 is not kept
    stack = 32 * (172_032 * 512 + 516_096) - (4096 + 1024 + 1024) * 4
    params = 4 * MAGNITUDES + 8 * MAGNITUDES  # magnitudes and their AdamW states (gradients come later)
    assert grown == 1_380_384_768 + stack + params


def test_extra_flops_and_time(llama):
    setup = TrainingSetup(method="lora", dora=True, seq=2048)
    down = 2 * 16 * 14336 * (14336 + 4096) + 3 * 14336 * 4096
    assert down == 8_631_877_632
    assert dora.extra_flops_per_forward(llama, setup) == 32 * 17_431_527_424 == 557_808_877_568
    # bytes per forward: the identities (in^2 x (4 written + 4 read + 2 written)) and 38 bytes per
    # weight (B A written 2, read 2, fp32 copy 4; W read 2, fp32 copy 4; scale 4 + 4; add 8 + 4; norm 4)
    weights = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336  # 218,103,808 per layer
    per_layer = 6 * 10 * 4096 ** 2 + 10 * 14336 ** 2 + 38 * weights
    assert per_layer == 11_349_786_624
    assert dora.extra_bytes_per_forward(llama, setup, dtypes_for(setup)) == 32 * per_layer == 363_193_171_968
    assert dora_s_per_micro_batch(llama, setup, 1e15, 0.5, 2e12) == pytest.approx(
        557_808_877_568 / 5e14 + 363_193_171_968 / 2e12)
    gpu = catalog.load_gpu("h100-sxm")
    t = estimate_time(llama, setup, gpu, 0, 0)
    t0 = estimate_time(llama, TrainingSetup(method="lora", seq=2048), gpu, 0, 0)
    assert t.parts["dora"] > 0 and t0.parts["dora"] == 0
    # the step grows by the dora part and the magnitudes' AdamW traffic (work.optimizer_bytes_moved:
    # parameter, gradient and parameter written, 3 x 4 bytes, both states read and written, 2 x 8),
    # which the device runs after the backward (this step is GPU-bound: the host keeps ahead)
    bw = gpu.memory_bandwidth_gbs * 1e9 * K.DRAM_EFFICIENCY  # the optimizer streams: no L2 reuse
    grown_opt = t.parts["memory"] - t0.parts["memory"]
    assert grown_opt == pytest.approx(28 * MAGNITUDES / bw, rel=1e-9)
    assert t.bound != "host" and t0.bound != "host"
    launches = (t.parts["launch"] - t0.parts["launch"])  # the magnitudes' share of AdamW's multi-tensor launches
    assert t.step_s - t0.step_s == pytest.approx(t.parts["dora"] + grown_opt + launches, rel=1e-9)
    ckpt = estimate_time(llama, setup.model_copy(update={"grad_ckpt": True}), gpu, 0, 0)
    assert ckpt.parts["dora"] == pytest.approx(2 * t.parts["dora"])  # the recomputed forward again


def test_moe_experts_are_refused_by_peft_and_said_so():
    mixtral = catalog.load_model("mixtral-8x7b")
    est = estimate_memory(mixtral, TrainingSetup(method="lora", dora=True, seq=512), catalog.load_gpu("h100-sxm"))
    assert any("ParamWrapper refuses use_dora" in n for n in est.notes)
    assert dora.adapted_linears(mixtral, TrainingSetup(method="lora", dora=True, lora_targets="qv"))
