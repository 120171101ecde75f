"""``reportgen trace --recipe torchtune --from FILE``: torchtune 0.6.1's own ``lora_finetune_single_device`` recipe
on the meta device (``trace/torchtune_recipe.py``) beside the estimate of the same file; what it refuses and what
it says when torchtune cannot be imported. The traced tests need torchtune 0.6.1 with a torchao that still has
``torchao.dtypes.nf4tensor`` (0.10-0.12): they are skipped where it does not import."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reportgen import catalog
from reportgen.cli import main
from reportgen.setup import TrainingSetup
from reportgen.trace.agreement import TOLERANCE, torchtune_agreement

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
LLAMA_1B = str(FIXTURES / "torchtune_llama3_2_1b_lora_single_device.yaml")
#: torchtune's own 1B LoRA config at a short length: the traced step takes seconds
SMALL = ["--gpu", "h100-sxm", "--seq", "256", "--batch", "2", "--accum", "1"]


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, says", [
    ([], "add --from CONFIG.yaml"),
    (["--from", str(FIXTURES / "torchtune_qlora_single_device.yaml")], "QLoRA is estimated only"),
    (["--from", str(FIXTURES / "torchtune_lora_single_device.yaml")], "compile: true is estimated only"),
    (["--from", str(FIXTURES / "torchtune_lora_single_device.yaml"), "--no-compile", "--loss", "chunked"],
     "enable_activation_offloading is estimated only"),
    (["--from", LLAMA_1B, "--seq", "256", "--padding", "packed"], "dataset.packed: true is estimated only"),
    (["--from", LLAMA_1B, "--seq", "256", "--method", "full"], "full fine-tuning (full_finetune_*.py) is estimated"),
    (["--from", LLAMA_1B, "--seq", "256", "--gpus", "2"], "the distributed recipes (FSDP2) are estimated only"),
    (["--from", str(FIXTURES / "trl_qlora.yaml")], "is a trl config, not torchtune's"),
    (["--from", LLAMA_1B, "--seq", "256", "--lora-targets", "q,v,gate"], "the whole MLP (apply_lora_to_mlp"),
])
def test_what_the_recipe_trace_does_not_run_is_refused_with_its_reason(capsys, argv, says):
    code, out, err = _run(capsys, "trace", "--recipe", "torchtune", "--gpu", "h100-sxm", *argv)
    assert code == 2 and out == ""
    assert says in err and "Traceback" not in err


def test_without_torchtune_the_command_says_what_to_install(capsys, monkeypatch):
    """torchtune 0.6.1 does not import beside torchao 0.13+ (``torchao.dtypes.nf4tensor`` moved): exit 2, the pins."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    monkeypatch.setitem(sys.modules, "torchtune", None)  # import torchtune raises ImportError
    code, out, err = _run(capsys, "trace", "--recipe", "torchtune", "--from", LLAMA_1B, *SMALL)
    assert code == 2 and out == ""
    assert "needs torchtune 0.6.1" in err and "pip install torchtune==0.6.1 torchao==0.10.0" in err


def test_each_torchtune_recipe_says_whether_it_is_traced_or_estimated():
    from reportgen.trace.torchtune_recipe import recipe_status

    assert recipe_status(TrainingSetup(method="lora", precision="bf16")) == "traced"
    assert recipe_status(TrainingSetup(method="qlora", precision="bf16")).startswith("estimated (")
    assert recipe_status(TrainingSetup(method="full", precision="bf16")).startswith("estimated (")


def test_the_recipe_trace_has_its_own_hash_and_leaves_the_loops_alone():
    from reportgen import fingerprint as F

    assert "trace/torchtune_recipe.py" in F.RECIPE_TRACE_SOURCES["torchtune"]
    assert "trace/torchtune_recipe.py" in F._RECIPE_ONLY  # not in the loop's hash: stored traces stay current
    assert F.trace_hash("torchtune") not in (F.trace_hash(), F.trace_hash("grpo"))


def test_lora_targets_beside_the_file_become_torchtunes_modules():
    from reportgen.trace.torchtune_recipe import _targets

    assert _targets(TrainingSetup(method="lora", lora_targets="q,v")) == (["q_proj", "v_proj"], False, False)
    assert _targets(TrainingSetup(method="lora", lora_targets="all-linear")) == (
        ["q_proj", "k_proj", "v_proj", "output_proj"], True, False)
    assert _targets(TrainingSetup(method="lora", lora_targets="o,gate,up,down,lm_head")) == (["output_proj"], True, True)
    # a phi3/phi4 file reads as HF Phi-3's fused modules (configs/torchtune.py): refused with the reason, not a hint
    # to write gate,up,down
    from reportgen.errors import UserError

    with pytest.raises(UserError, match="fused qkv_proj and gate_up_proj"):
        _targets(TrainingSetup(method="lora", lora_targets="q,v,o,gate_up,down"))


def test_agreement_gaps_are_estimate_over_trace():
    mem = {"peak_allocated": 1000, "peak_reserved": 1200, "device_total": 2000}
    est = {"peak_allocated": 965, "peak_reserved": 1200, "device_total": 2100}
    g = torchtune_agreement(mem, est, "traced")
    assert g["memory"]["peak_allocated"]["gap"] == pytest.approx(-0.035) and not g["agrees"]
    assert g["memory"]["device_total"]["gap"] == pytest.approx(0.05)
    assert torchtune_agreement(mem, {**est, "peak_allocated": 980}, "traced")["agrees"]


def _torchtune():
    pytest.importorskip("torch")
    pytest.importorskip("torchtune")
    from reportgen.errors import UserError
    from reportgen.trace.torchtune_recipe import import_recipe

    try:
        import_recipe()
    except UserError as exc:
        pytest.skip(exc.message)


def test_torchtunes_recipe_with_checkpointing_is_traced_and_agrees_with_the_estimate(capsys):
    """The shipped 1B LoRA config (chunked loss, fused AdamW) with checkpointing: the recipe's own step runs on meta
    through every phase, names its emulations, and the estimate of the same file is within 3% of its peak."""
    _torchtune()
    code, out, _ = _run(capsys, "trace", "--recipe", "torchtune", "--from", LLAMA_1B, *SMALL, "--grad-ckpt",
                        "--format", "json")
    assert code == 0
    d = json.loads(out)
    from reportgen.fingerprint import trace_hash

    assert d["kind"] == "traced" and d["trace_hash"] == trace_hash("torchtune")
    assert d["environment"]["torchtune"] == "0.6.1"
    names = {e["name"] for e in d["emulations"]}
    assert {"tt_checkpoint_on_meta", "tt_token_rows", "tt_no_logging_or_saving", "tt_rope_cache_on_meta",
            "sdpa_flash"} <= names
    assert {"forward", "loss-backward", "optimizer-step", "zero-grad"} <= set(d["timeline"])
    assert any("lora_finetune_single_device" in n for n in d["notes"])
    assert d["params"]["trainable"] > 0 and d["memory"]["lora_adapters"] > 0 and d["memory"]["optimizer"] > 0
    g = d["torchtune"]
    assert g["status"] == "traced"
    assert abs(g["memory"]["peak_allocated"]["gap"]) <= TOLERANCE and g["agrees"]


def test_without_checkpointing_torchtunes_kv_copies_are_estimated():
    """Without checkpointing torchtune keeps every layer's k and v copied to all query heads (0.19 GiB here): the
    estimate of torchtune's model (``modeling`` torchtune, ``estimate/recipes.py``) is within 0.5 % of the traced
    peak, where transformers' model is more than 3 % below it."""
    _torchtune()
    from reportgen.estimate import estimate
    from reportgen.trace.result import trace_case
    from reportgen.trace.torchtune_recipe import torchtune_dict, torchtune_trace

    spec, gpu = catalog.load_model("llama-3.2-1b"), catalog.load_gpu("h100-sxm")
    setup = TrainingSetup(method="lora", precision="bf16", batch=2, seq=1024, grad_ckpt=False, loss="chunked",
                          lora_rank=64, lora_alpha=128, lora_targets="q,v,o,gate,up,down", optimizer="adamw")
    with torchtune_trace(setup, Path(LLAMA_1B)):
        d = torchtune_dict(spec, gpu, setup, trace_case(spec, gpu, setup).as_dict())
    g = d["torchtune"]["memory"]["peak_allocated"]
    assert abs(g["gap"]) <= 0.005
    transformers = estimate(spec, gpu, setup, reverse=False).memory.peak_allocated
    assert transformers / g["traced"] - 1 < -TOLERANCE


def _traced(path, setup, model):
    from reportgen.trace.result import trace_case
    from reportgen.trace.torchtune_recipe import torchtune_dict, torchtune_trace

    spec, gpu = catalog.load_model(model), catalog.load_gpu("h100-sxm")
    with torchtune_trace(setup, Path(path)):
        return torchtune_dict(spec, gpu, setup, trace_case(spec, gpu, setup).as_dict())


def test_dora_runs_its_magnitude_init_on_meta_and_agrees(tmp_path):
    _torchtune()
    path = tmp_path / "dora.yaml"
    path.write_text(Path(LLAMA_1B).read_text().replace("lora_dropout: 0.0", "lora_dropout: 0.0\n  use_dora: True"))
    setup = TrainingSetup(method="lora", dora=True, precision="bf16", batch=2, seq=512, accum=2, grad_ckpt=False,
                          loss="chunked", lora_rank=64, lora_alpha=128, lora_targets="q,v,o,gate,up,down")
    d = _traced(path, setup, "llama-3.2-1b")
    assert "tt_dora_magnitude_on_meta" in {e["name"] for e in d["emulations"]}
    assert d["torchtune"]["agrees"]


def test_lora_qwen2_keeps_a_rope_cache_per_layer(tmp_path):
    """torchtune 0.6.1's ``lora_qwen2`` builds a ``Qwen2RotaryPositionalEmbeddings`` in every layer
    (``lora_qwen2_self_attention``): for Qwen2.5 7B 28 caches of 32,768 positions x (cos, sin of 128) fp32 and
    their 64 fp32 frequencies (``qwen2/_positional_embeddings.py`` ``build_rope_cache``): 0.88 GiB, more than the
    tolerance, which the estimate of torchtune's model counts (``recipes.rope_cache_bytes``)."""
    _torchtune()
    path = tmp_path / "qwen.yaml"
    path.write_text(Path(LLAMA_1B).read_text().replace("torchtune.models.llama3_2.lora_llama3_2_1b",
                                                       "torchtune.models.qwen2_5.lora_qwen2_5_7b_instruct"))
    setup = TrainingSetup(method="lora", precision="bf16", batch=1, seq=256, accum=1, grad_ckpt=True,
                          loss="chunked", lora_rank=64, lora_alpha=128, lora_targets="q,v,o,gate,up,down",
                          modeling="torchtune", rope_positions=32768)  # the instruct builder's max_seq_len
    d = _traced(path, setup, "qwen2.5-7b")
    assert d["at_peak"]["buffers"] == 28 * (32768 * 2 * 128 * 4 + 64 * 4)
    assert d["torchtune"]["agrees"] and abs(d["torchtune"]["memory"]["peak_allocated"]["gap"]) <= 0.005


def test_the_configs_page_says_per_recipe_traced_or_estimated_and_what_to_install():
    from reportgen.report import render
    from reportgen.report.configs import config_pages
    from reportgen.trace.torchtune_recipe import INSTALL_HINT

    (page,) = config_pages(None)
    text = render.environment().get_template(page.template).render(**page.context)
    assert INSTALL_HINT.split("  ")[0] in text
    assert "| `lora_finetune_single_device` (LoRA or DoRA, bf16 or fp32) | traced" in text
    for recipe in ("`full_finetune_single_device` | estimated", "`full_finetune_distributed` | estimated"):
        assert recipe in text
