"""The recipe field (``estimate/recipes.py``): TRL 1.16 SFTTrainer's terms by worked examples, and
the default recipe leaving every existing setup, id and estimate as it was."""

from __future__ import annotations

import pytest

from reportgen import catalog
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.memory import estimate_memory
from reportgen.estimate.recipes import trl_head_memory
from reportgen.results import case_id
from reportgen.setup import SetupError, TrainingSetup

H100 = catalog.load_gpu("h100-sxm")
LLAMA_1B = catalog.load_model("llama-3.2-1b")  # hidden 2048, vocabulary 128,256, tied embeddings


def test_trl_fused_head_lora_bf16_worked_example():
    """LoRA bf16-mixed (frozen bf16 weights), batch 1 x 2048: 2047 scored positions, a bf16 residual
    stream, a bf16 head: no casts. The tile is 2047 x 32768 bf16 (TRL's mm_buf)."""
    s = TrainingSetup(method="lora", recipe="trl-sft", seq=2048)
    m = trl_head_memory(LLAMA_1B, s, dtypes_for(s), 2048)
    n = 2047
    gathered = n * 2048 * 2 + 8 * n  # hidden_states[mask] (bf16) and labels[mask] (int64)
    assert m.saved == gathered + 4 * n + 4 * n + n  # + log_z, entropy (fp32) and the bool label mask
    tile = n * 32768 * 2
    assert m.forward_live == gathered + n + 7 * 4 * n + tile == 142_612_443
    # the backward's return: the fp32 grad_hidden, its bf16 copy (grad_hidden.to(hidden.dtype)) and mm_buf at once
    assert m.backward_live == m.saved + n * 2048 * 4 + n * 2048 * 2 + tile + 4 * n == 167_733_227


def test_trl_fused_head_full_bf16_mixed_worked_example():
    """Full fine-tuning under bf16 autocast: fp32 weights and residual stream, so each token chunk and
    each vocabulary chunk of the weight is cast to bf16, and the backward fills an fp32 V x h
    grad_weight (the head's gradient), which its return hands back as it is (``.to(float32)``: no copy)."""
    s = TrainingSetup(method="full", recipe="trl-sft", seq=1024, batch=2)
    m = trl_head_memory(LLAMA_1B, s, dtypes_for(s), 2048)
    n, h, v = 2046, 2048, 128_256
    casts = n * h * 2 + 32768 * h * 2
    tile = n * 32768 * 2
    gathered = n * h * 4 + 8 * n
    assert m.forward_live == gathered + (2048 - 2) + 28 * n + tile + casts
    saved = gathered + 8 * n + (2048 - 2)
    # the backward binds each chunk's cast to ``w_chunk``: the second one is made while the first is bound
    two_chunks = casts + 32768 * h * 2
    assert m.backward_live == saved + n * h * 4 + v * h * 4 + tile + two_chunks + 4 * n


def test_trl_fused_head_full_bf16_holds_the_heads_gradient_in_fp32_and_bf16_at_its_return():
    """Full fine-tuning with bf16 weights (Llama 3.2 1B, tied head), batch 8 x 160: 1,272 scored positions.
    ``ChunkedLogProbFunction.backward`` returns ``grad_hidden.to(bf16)`` and ``grad_weight.to(bf16)`` while
    its fp32 accumulators and ``mm_buf`` are still alive, so the 128,256 x 2,048 head gradient is held
    twice (4 + 2 bytes): the peak ``reportgen trace --recipe trl-sft`` finds at ``aten._to_copy``
    (10.63 GiB, the step's; the estimate was 4.7% low counting the fp32 one only)."""
    s = TrainingSetup(method="full", precision="bf16", recipe="trl-sft", seq=160, batch=8)
    m = trl_head_memory(LLAMA_1B, s, dtypes_for(s), 1280)
    n, h, v = 1272, 2048, 128_256
    assert m.saved == n * h * 2 + 8 * n + 8 * n + n == 5_231_736  # no casts: bf16 stream, weight and compute
    fp32 = n * h * 4 + v * h * 4
    bf16_copies = n * h * 2 + v * h * 2
    assert m.backward_live == m.saved + fp32 + bf16_copies + n * 32768 * 2 + 4 * n == 1_680_238_680


def test_trl_sft_replaces_the_fp32_logits_and_casts_qlora_adapters_to_bf16():
    loop = TrainingSetup(method="qlora", grad_ckpt=True, kbit_prep="none")
    trl = loop.model_copy(update={"recipe": "trl-sft"})
    a, b = estimate_memory(LLAMA_1B, loop, H100), estimate_memory(LLAMA_1B, trl, H100)
    # the loop's loss holds 2048 x 128,256 fp32 log-softmax outputs; TRL's tiles are 2047 x 32,768 bf16
    assert a.terms["logits"] > 2 * 2**30 > 200 * 2**20 > b.terms["logits"]
    assert b.terms["logits"] == max(trl_head_memory(LLAMA_1B, trl, dtypes_for(trl), 2048).forward_live,
                                    trl_head_memory(LLAMA_1B, trl, dtypes_for(trl), 2048).backward_live)
    assert b.terms["lora_adapters"] * 2 == a.terms["lora_adapters"]  # sft_trainer.py: adapters to bf16
    assert b.terms["optimizer"] * 2 == a.terms["optimizer"]
    # TRL 1.16 prepares nothing: the default preparation is none under trl-sft, peft under the loop
    assert TrainingSetup(method="qlora", recipe="trl-sft").kbit.value == "none"
    assert TrainingSetup(method="qlora").kbit.value == "peft"


def test_the_trainer_recipe_is_the_loop_term_by_term():
    for kw in ({"method": "full"}, {"method": "lora", "grad_ckpt": True}, {"method": "qlora", "loss": "fused"}):
        loop = TrainingSetup(**kw)
        assert estimate_memory(LLAMA_1B, loop.model_copy(update={"recipe": "trainer"}), H100).terms == \
            estimate_memory(LLAMA_1B, loop, H100).terms


def test_the_default_recipe_leaves_setups_and_ids_unchanged():
    s = TrainingSetup(method="lora")
    assert "recipe" not in s.model_dump(mode="json")
    assert case_id("llama-3.2-1b", "h100-sxm", s.model_dump(mode="json")) == \
        case_id("llama-3.2-1b", "h100-sxm", {**s.model_dump(mode="json"), "recipe": "loop"})
    trl = s.model_copy(update={"recipe": "trl-sft"})
    assert trl.model_dump(mode="json")["recipe"] == "trl-sft"
    assert case_id("llama-3.2-1b", "h100-sxm", trl.model_dump(mode="json")) != \
        case_id("llama-3.2-1b", "h100-sxm", s.model_dump(mode="json"))
    assert TrainingSetup.model_validate(trl.model_dump(mode="json")) == trl


@pytest.mark.parametrize("update, field", [({"loss": "fused"}, "loss"), ({"keep_outputs": "step"}, "keep_outputs"),
                                           ({"lora_targets": "q,v,lm_head"}, "lora_targets"),
                                           ({"method": "qlora", "kbit_prep": "trl"}, "kbit_prep")])
def test_trl_sft_refuses_what_sfttrainer_does_not_run(update, field):
    with pytest.raises(SetupError) as exc:
        TrainingSetup(**{"method": "lora", "recipe": "trl-sft", **update})
    assert exc.value.field == field


def test_every_recipe_validation_case_pairs_with_a_plain_loop_case():
    """sweeps/validation-trl.yaml measures each recipe beside a plain-loop case of validation.yaml of
    the same setup, under the same measuring settings, so the recipe's difference is one card's."""
    from pathlib import Path

    from reportgen.sweep import load_sweep

    root = Path(__file__).resolve().parents[1]
    loop, trl = load_sweep(root / "sweeps" / "validation.yaml"), load_sweep(root / "sweeps" / "validation-trl.yaml")

    def key(case):
        d = case.setup.model_dump(mode="json")
        d.pop("recipe", None)
        return case.model, case.gpu, tuple(sorted(d.items()))

    plain = {key(c) for c in loop.cases if c.setup.recipe.value == "loop"}
    assert {c.setup.recipe.value for c in trl.cases} == {"trl-sft", "trainer"}
    assert all(key(c) in plain for c in trl.cases), [c.id for c in trl.cases if key(c) not in plain]
    assert not {c.id for c in trl.cases} & {c.id for c in loop.cases}
    assert trl.spec.measure == loop.spec.measure and trl.spec.train_tokens == loop.spec.train_tokens
