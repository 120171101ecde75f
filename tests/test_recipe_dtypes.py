"""Frozen-weight dtypes of the recipes people run (issue 9): peft's prepare_model_for_kbit_training,
TRL's bf16 cast back, Lightning's fp32 frozen weights. Worked examples on Llama 3.1 8B (V = 128,256,
h = 4,096, untied head, 32 layers); the tensor-level check is the trace agreement test
(tests/test_trace_agreement.py ``test_recipe_dtypes_agree_with_trace``)."""

from __future__ import annotations

import pytest

from reportgen import catalog
from reportgen.estimate import params as P
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.memory import estimate_memory
from reportgen.setup import KbitPrep, SetupError, TrainingSetup

V, H, LAYERS = 128_256, 4_096, 32
EMBED_AND_HEAD = 2 * V * H  # 1,050,673,152 parameters
NORMS = LAYERS * 2 * H + H  # 266,240


@pytest.fixture(scope="module")
def llama():
    return catalog.load_model("llama-3.1-8b")


def _weights(model, **kw) -> int:
    setup = TrainingSetup(**kw)
    return P.weights_bytes(model, setup, dtypes_for(setup))


def test_the_qlora_recipe_default_follows_the_precision():
    assert TrainingSetup(method="qlora").kbit == KbitPrep.peft  # the HF recipe: Trainer bf16=True
    assert TrainingSetup(method="qlora", precision="bf16").kbit == KbitPrep.none  # fsdp_qlora, torchtune
    assert TrainingSetup(method="lora").kbit == KbitPrep.none


def test_peft_upcasts_every_parameter_that_is_not_4_bit(llama):
    # embeddings, LM head and norms go from 2 to 4 bytes: +2 bytes each
    grown = _weights(llama, method="qlora", kbit_prep="peft") - _weights(llama, method="qlora", kbit_prep="none")
    assert grown == 2 * (EMBED_AND_HEAD + NORMS) == 2_101_878_784


def test_trl_casts_embeddings_and_head_back_and_keeps_norms_fp32(llama):
    grown = _weights(llama, method="qlora", kbit_prep="trl") - _weights(llama, method="qlora", kbit_prep="none")
    assert grown == 2 * NORMS == 532_480


def test_a_frozen_fp32_head_keeps_a_16_bit_copy_for_its_backward(llama):
    setup = TrainingSetup(method="qlora", kbit_prep="peft")
    assert P.frozen_head_cast_bytes(llama, setup, dtypes_for(setup)) == V * H * 2 == 1_050_673_152
    trl = TrainingSetup(method="qlora", kbit_prep="trl")
    assert P.frozen_head_cast_bytes(llama, trl, dtypes_for(trl)) == 0
    head4 = TrainingSetup(method="qlora", kbit_prep="peft", quant_head=True)
    assert P.frozen_head_cast_bytes(llama, head4, dtypes_for(head4)) == 0  # a 4-bit head is dequantized


def test_lightning_fp32_frozen_weights_cost_4_bytes_plus_a_saved_16_bit_copy_per_layer(llama):
    assert _weights(llama, method="lora", frozen_dtype="fp32") == 2 * _weights(llama, method="lora")
    setup = TrainingSetup(method="lora", frozen_dtype="fp32")
    # q, o: 4096 x 4096; k, v: 4096 x 1024; gate, up, down: 4096 x 14336 -> 218,103,808 weights x 2 bytes
    assert P.frozen_cast_bytes_per_layer(llama, dtypes_for(setup)) == 436_207_616
    plain = estimate_memory(llama, TrainingSetup(method="lora"), catalog.load_gpu("h100-sxm"))
    fp32 = estimate_memory(llama, setup, catalog.load_gpu("h100-sxm"))
    # without checkpointing every layer's copy is saved until its backward
    assert fp32.terms["autocast_copies"] - plain.terms["autocast_copies"] == LAYERS * 436_207_616 + V * H * 2


@pytest.mark.parametrize("kw,field", [
    (dict(method="lora", kbit_prep="peft"), "kbit_prep"),
    (dict(method="qlora", precision="bf16", kbit_prep="trl"), "kbit_prep"),
    (dict(method="full", frozen_dtype="fp32"), "frozen_dtype"),
    (dict(method="lora", precision="bf16", frozen_dtype="fp32"), "frozen_dtype"),
])
def test_combinations_that_do_not_exist_are_refused_naming_the_field(kw, field):
    with pytest.raises(SetupError) as err:
        TrainingSetup(**kw)
    assert err.value.field == field
