"""torchtune's own model (``setup.modeling`` torchtune, ``estimate/recipes.py``): its attention's k/v copies, no
mask on padded batches, its RoPE caches, and that ``--from`` a torchtune config says so. Found by tracing
torchtune 0.6.1's recipe on meta (``tests/test_trace_torchtune.py``, which needs torchtune installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reportgen import catalog
from reportgen.estimate import activations as act
from reportgen.estimate import recipes as RC
from reportgen.estimate.memory import estimate_memory
from reportgen.setup import SetupError, TrainingSetup

FIXTURE = Path(__file__).parent / "fixtures" / "configs" / "torchtune_llama3_2_1b_lora_single_device.yaml"
LLAMA_1B = catalog.load_model("llama-3.2-1b")
H100 = catalog.load_gpu("h100-sxm")
BASE = dict(method="lora", precision="bf16", batch=4, seq=2048, grad_ckpt=False, loss="chunked", lora_rank=64,
            lora_alpha=128, lora_targets="q,v,o,gate,up,down")


def test_rope_cache_worked_examples():
    """Llama 3.2 1B (head_dim 64, one shared cache at 131,072 positions): theta 32 x 4 + cache 131,072 x 64 x 4;
    Qwen2.5 7B instruct (head_dim 128, 28 layers, the builder's 32,768 positions): a cache per layer."""
    tt = TrainingSetup(modeling="torchtune", **BASE)
    assert RC.rope_cache_bytes(LLAMA_1B, tt) == 32 * 4 + 131072 * 64 * 4 == 33_554_560
    assert RC.rope_cache_bytes(LLAMA_1B, TrainingSetup(**BASE)) == 0  # transformers keeps a few hundred bytes
    qwen = catalog.load_model("qwen2.5-7b")
    instruct = tt.model_copy(update={"rope_positions": 32768})
    assert RC.rope_cache_bytes(qwen, instruct) == 28 * (64 * 4 + 32768 * 2 * 128 * 4) == 939_531_264


def test_torchtunes_attention_keeps_k_and_v_at_every_head():
    """Without checkpointing every layer's SDPA saves k and v copied to all 32 query heads instead of the 8 k/v
    heads: 16 layers x 2 x 8,192 tokens x (32 - 8) x 64 x 2 bytes more activations, 0.75 GiB."""
    hf = estimate_memory(LLAMA_1B, TrainingSetup(**BASE), H100)
    tt = estimate_memory(LLAMA_1B, TrainingSetup(modeling="torchtune", **BASE), H100)
    assert tt.terms["activations"] - hf.terms["activations"] == 16 * 2 * 8192 * 24 * 64 * 2 == 805_306_368
    assert tt.terms["weights"] - hf.terms["weights"] == 33_554_560
    assert tt.peak_allocated - hf.peak_allocated >= 805_306_368


def test_torchtunes_padded_batches_carry_no_mask():
    """``padded_collate_sft`` hands the model tokens and labels only: a padded batch runs the causal kernel."""
    padded = dict(BASE, seq_mean=700, padding="longest")
    assert act.sdpa_masked_layers(LLAMA_1B, TrainingSetup(**padded)) == 16
    assert act.sdpa_masked_layers(LLAMA_1B, TrainingSetup(modeling="torchtune", **padded)) == 0


def test_the_reader_says_torchtunes_model_and_its_builders_rope_length(tmp_path):
    from reportgen.configs import translate_file

    t = translate_file(FIXTURE)
    assert t.values["modeling"] == "torchtune" and t.values["rope_positions"] == 131072
    qwen = tmp_path / "qwen.yaml"
    qwen.write_text(FIXTURE.read_text().replace("torchtune.models.llama3_2.lora_llama3_2_1b",
                                                "torchtune.models.qwen2_5.lora_qwen2_5_7b_instruct"))
    assert translate_file(qwen).values["rope_positions"] == 32768  # the instruct builder's max_seq_len


@pytest.mark.parametrize("fields, field", [
    (dict(modeling="torchtune", recipe="trainer"), "modeling"),
    (dict(rope_positions=4096), "rope_positions"),
])
def test_torchtunes_model_fields_refuse_what_they_cannot_be(fields, field):
    with pytest.raises(SetupError) as err:
        TrainingSetup(**{**BASE, **fields})
    assert err.value.field == field
