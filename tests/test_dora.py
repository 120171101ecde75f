"""DoRA (peft ``LoraConfig(use_dora=True)``, issue 9): worked examples on Llama 3.1 8B (h = 4,096,
32 layers, q/o 4096 x 4096, k/v 4096 -> 1024, gate/up 4096 -> 14336, down 14336 -> 4096), LoRA r16
all-linear, bf16-mixed. The tensor-level check is the trace (tests/test_trace_agreement.py
``test_dora_agrees_with_trace``) and, for the time, the ops peft's DoRA layer dispatches on the CPU
(``test_dora_kernels_match_what_peft_dispatches``); the formulas and their sources are in
reportgen/estimate/dora.py (memory) and work.py ``dora_weight_work``/``dora_combine`` (time)."""

from __future__ import annotations

import pytest

from reportgen import catalog
from reportgen.estimate import activations as act
from reportgen.estimate import dora
from reportgen.estimate import params as P
from reportgen.estimate import work
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.memory import effective_attention, estimate_memory
from reportgen.estimate.time import dora_s_per_micro_batch, dora_work_per_micro_batch, estimate_time
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


def test_weight_sized_forward_of_the_down_projection():
    """``DoraLinearLayer.forward``'s tokens-independent work on down_proj (in 14336, out 4096), r16,
    bf16-mixed (fp32 adapters, x cast to fp32): eye 14336^2 x 4, its bf16 cast x 6, lora_A on it
    2 x (14336^2 + 2 x 14336 x 16), lora_B 2 x (14336 x 16 + 16 x 4096 + 14336 x 4096), then per weight
    B A and W cast to fp32 (6 + 6), scale, add and norm (8 + 12 + 4), and 20 bytes per out vector."""
    setup = TrainingSetup(method="lora", dora=True, seq=2048)
    w = work.dora_weight_work(14336, 4096, 4, setup, dtypes_for(setup))
    weights = 14336 * 4096
    expected = (14336 ** 2 * (4 + 6) + 2 * (14336 ** 2 + 2 * 14336 * 16) + 2 * (14336 * 16 + 16 * 4096 + weights)
                + 36 * weights + 4096 * 20)
    assert expected == 4_699_209_728
    assert (w.kernels, w.views, w.bytes, w.matmul_flops) == (11, 6, expected, 0)


def test_combination_per_token_of_the_gate_projection():
    """gate_proj (out 14336), 2048 tokens, bf16-mixed: DoRA's mul, mul, * scaling, add, add, cast write
    and read 48 bytes per output value (LoRA's * scaling and add: 10); backward 82 (+ 12 per out
    vector) in 14 kernels, LoRA's 4 in 1."""
    setup = TrainingSetup(method="lora", dora=True, seq=2048)
    dt = dtypes_for(setup)
    fwd, bwd, out = work.dora_combine(2048, 4096, 14336, 4, 2, setup, dt, True)
    assert (fwd.kernels, fwd.bytes) == (6, 2048 * 14336 * 48) == (6, 1_409_286_144)
    assert (bwd.kernels, bwd.bytes) == (14, 2048 * 14336 * 82 + 14336 * 12) == (14, 2_407_702_528)
    assert out == 2  # Linear.forward casts the result back to the base output's bf16
    fd, bd, _ = work.lora_unit(2048, 4096, 14336, 2, 2, setup, dt, True, dora=True)
    fl, bl, _ = work.lora_unit(2048, 4096, 14336, 2, 2, setup, dt, True, dora=False)
    combine = (fd + fl * -1) + work.dora_weight_work(4096, 14336, 4, setup, dt) * -1
    assert (combine.kernels, combine.bytes) == (6 - 2, 2048 * 14336 * (48 - 10))
    assert ((bd + bl * -1).kernels, (bd + bl * -1).bytes) == (14 - 1, 2048 * 14336 * (82 - 4) + 14336 * 12)


def test_dora_seconds_per_micro_batch(llama):
    """DoRA's added device seconds per micro-batch, Llama 3.1 8B r16 all-linear bf16-mixed, seq 2048,
    at 1e15 FLOP/s x 0.5, 2e12 B/s, 8 us a kernel (worked out in ``time.dora_s_per_micro_batch``)."""
    setup = TrainingSetup(method="lora", dora=True, seq=2048)
    linears = [(4096, 4096), (4096, 1024), (4096, 1024), (4096, 4096), (4096, 14336), (4096, 14336), (14336, 4096)]
    weight = sum(12 * i * i + 6 * i * 16 + 2 * 16 * o + 38 * i * o + 20 * o for i, o in linears)
    assert weight == 11_968_126_976
    per_layer = weight + 38 * 2048 * OUT_PER_LAYER + 78 * 2048 * OUT_PER_LAYER + 12 * OUT_PER_LAYER
    moved = 32 * per_layer - 26 * 2048 * (4096 + 1024 + 1024)  # the first layer's q, k, v: no input gradient
    assert moved == 709_623_808_000
    kernels = 32 * 7 * 28 - 3 * 4
    attn = effective_attention(llama, setup)[0]
    w = dora_work_per_micro_batch(llama, setup, attn)
    assert (w.bytes, w.kernels, w.matmul_flops, w.calls) == (moved, kernels, 0, 32 * 7 * 3)
    assert dora_s_per_micro_batch(llama, setup, attn, 1e15, 0.5, 2e12, 8e-6) == pytest.approx(
        709_623_808_000 / 2e12 + 6260 * 8e-6) == pytest.approx(0.404891904)
    # checkpointing recomputes each layer's forward, DoRA's weight-sized work and combination included,
    # up to the last saved tensor (work.recompute_tail): on down_proj DoRA's m/n * lora_result and what
    # follows (6 + 8 + 12 + 10 + 6 bytes a value) are not run again, where LoRA's lora_B GEMM and its
    # * scaling and add (10 bytes a value) are not; every layer's first layer needs an input gradient
    ckpt = setup.model_copy(update={"grad_ckpt": True})
    wc = dora_work_per_micro_batch(llama, ckpt, attn)
    lora_b = 2 * (2048 * 16 + 16 * 4096 + 2048 * 4096)
    per_layer_ckpt = per_layer + weight + 38 * 2048 * OUT_PER_LAYER - (42 - 10) * 2048 * 4096 + lora_b
    assert wc.bytes == 32 * per_layer_ckpt == 1_191_990_001_664
    # dropout: the adapted linears' base GEMM again, forward and input gradient (first layer's q, k, v: forward only)
    drop = dora_work_per_micro_batch(llama, setup.model_copy(update={"lora_dropout": 0.05}), attn)
    per_token = 32 * 218_103_808 * 2 - (4096 * 4096 + 2 * 4096 * 1024)
    assert drop.matmul_flops == 2 * 2048 * per_token == 57_071_525_429_248


def test_dora_time_is_in_the_step(llama):
    """The step prices DoRA's kernels in its pipeline: on the H100 a DoRA step of Llama 3.1 8B at seq
    2048 grows by its device seconds (it is device-bound), its host dispatch grows too, and
    ``parts["dora"]`` reports the share without being added twice."""
    gpu = catalog.load_gpu("h100-sxm")
    setup = TrainingSetup(method="lora", dora=True, seq=2048)
    t = estimate_time(llama, setup, gpu)
    t0 = estimate_time(llama, TrainingSetup(method="lora", seq=2048), gpu)
    assert t0.parts["dora"] == 0 and t.parts["dora"] > 0.2
    assert t.bound != "host" and t.parts["host"] > t0.parts["host"]
    grown = t.step_s - t0.step_s
    assert 0.95 * t.parts["dora"] < grown < 1.05 * t.parts["dora"]
    assert t.work["backward"]["kernels"] - t0.work["backward"]["kernels"] == 32 * 7 * 13 - 3 * 4


#: a DoRA layer small enough for the CPU: in, out, rank, tokens
SMALL = (256, 384, 8, 512)


def _dispatched(dora: bool, mixed: bool, dropout: float, input_grad: bool) -> tuple[tuple, tuple]:
    """(kernels, bytes) of the forward and of the backward of one peft LoRA (or DoRA) linear on the CPU,
    each ATen op classified as the tracer classifies it (``trace/work.py``: views and allocations no
    kernel; bytes read and written, ``torch.utils._runtime_estimation.get_num_bytes``)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from tests.op_count import op_counter

    Count = op_counter()

    n_in, n_out, r, t = SMALL
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(n_in, n_out, bias=False)).to(torch.bfloat16)
    model = get_peft_model(base, LoraConfig(r=r, target_modules=["0"], use_dora=dora, lora_dropout=dropout),
                           autocast_adapter_dtype=mixed)
    model.train()
    x = torch.randn(1, t, n_in, dtype=torch.bfloat16, requires_grad=input_grad)
    fwd, bwd = Count(), Count()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed), fwd:
        y = model(x)
    loss = y.float().sum()
    with bwd:
        loss.backward()
    return (fwd.kernels, fwd.bytes), (bwd.kernels, bwd.bytes)


@pytest.mark.parametrize("mixed", [True, False], ids=["bf16-mixed", "bf16"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("input_grad", [True, False])
def test_dora_kernels_match_what_peft_dispatches(mixed, dropout, input_grad):
    """What DoRA adds over LoRA on one linear, forward and backward, counted in peft's real DoRA layer
    (kernels exactly, bytes to 0.1%: the ``out``-sized vectors are rounded), against ``work.lora_unit``."""
    pytest.importorskip("peft")
    (fd, bd), (fl, bl) = (_dispatched(d, mixed, dropout, input_grad) for d in (True, False))
    n_in, n_out, r, t = SMALL
    setup = TrainingSetup(method="lora", dora=True, precision="bf16-mixed" if mixed else "bf16", lora_rank=r,
                          lora_dropout=dropout)
    dt = dtypes_for(setup)
    f1, b1, _ = work.lora_unit(t, n_in, n_out, 2, 2, setup, dt, input_grad, dora=True)
    f0, b0, _ = work.lora_unit(t, n_in, n_out, 2, 2, setup, dt, input_grad, dora=False)
    for real_dora, real_lora, mine in ((fd, fl, f1 + f0 * -1), (bd, bl, b1 + b0 * -1)):
        assert mine.kernels == real_dora[0] - real_lora[0]
        assert mine.bytes == pytest.approx(real_dora[1] - real_lora[1], rel=1e-3)


def test_moe_experts_are_refused_by_peft_and_said_so():
    mixtral = catalog.load_model("mixtral-8x7b")
    est = estimate_memory(mixtral, TrainingSetup(method="lora", dora=True, seq=512), catalog.load_gpu("h100-sxm"))
    assert any("ParamWrapper refuses use_dora" in n for n in est.notes)
    assert dora.adapted_linears(mixtral, TrainingSetup(method="lora", dora=True, lora_targets="qv"))
