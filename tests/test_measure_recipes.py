"""`reportgen measure` of recipes trainer and trl-sft on the CPU: the case runs through the real
transformers Trainer / TRL SFTTrainer (measure/sft.py) in the harness's isolated worker, with TRL's
version in the environment. The CUDA figures of these cases need a GPU (none measured yet)."""

from __future__ import annotations

import pytest

from tests.measure_helpers import measure_json, tiny_config

pytest.importorskip("trl")

FAST = ["--gpu", "h100-sxm", "--device", "cpu", "--batch", "2", "--seq", "32", "--warmup", "1", "--steps", "2",
        "--max-steps", "2"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(tiny_config(tmp_path_factory.mktemp("cfg")))


@pytest.mark.parametrize("recipe, method, note", [("trl-sft", "qlora", "TRL SFTTrainer"),
                                                  ("trl-sft", "full", "TRL SFTTrainer"),
                                                  ("trainer", "lora", "transformers Trainer")])
def test_a_recipe_is_measured_through_its_trainer(capsys, tiny, recipe, method, note):
    rc, d = measure_json(capsys, "--model", tiny, *FAST, "--method", method, "--recipe", recipe, "--grad-ckpt")
    assert rc == 0 and d["status"] == "ok", d["error"]
    m = d["measurement"]
    assert f"measured through {note}" in m["notes"]
    assert m["loss_finite"] is True and len(m["step_times_s"]) == 2
    assert d["case"]["setup"]["recipe"] == recipe
    assert d["environment"]["versions"]["trl"]
    if method == "qlora":
        assert m["adapter_dtype"] == "bf16"  # sft_trainer.py casts a 4-bit model's adapters to bf16


def test_a_recipe_on_several_gpus_is_refused_before_any_process_starts(capsys, tiny):
    """Refused by the parent (isolate.refusal): no torchrun, no rank imports torch only to refuse."""
    from reportgen.cli import main
    from reportgen.measure.isolate import refusal
    from reportgen.measure.protocol import MeasureRequest

    # `reportgen measure`: exit 2 before running, no answer written as if a run had failed (issue 29)
    assert main(["measure", "--model", tiny, *FAST, "--method", "lora", "--recipe", "trl-sft", "--gpus", "2",
                 "--sharding", "ddp", "--format", "json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "the trainer is measured on one GPU" in " ".join(captured.err.split())
    # a sweep stores the same refusal as the case's answer, made by the parent
    setup = {"method": "lora", "recipe": "trl-sft", "gpus": 2, "sharding": "ddp", "batch": 2, "seq": 32}
    d = refusal(MeasureRequest(model=tiny, gpu="h100-sxm", setup=setup, device="cpu"))
    assert d["status"] == "error" and "the trainer is measured on one GPU" in d["error"]
    assert d["environment"]["source"] == "parent" and d["wall_s"] == 0
    assert d["measurement"]["failed_in"] == "setup" and d["measurement"]["tokens_per_step"] == 2 * 32 * 2
