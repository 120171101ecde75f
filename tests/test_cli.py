"""The CLI contract: `estimate --format json` prints exactly one JSON object with the documented keys."""

import json
import subprocess
import sys

import pytest

from reportgen.cli import main


def run_json(capsys, *args):
    assert main(["estimate", *args, "--format", "json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)  # exactly one object: json.loads fails on trailing data


def test_estimate_json_contract(capsys):
    d = run_json(capsys, "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--method", "qlora", "--grad-ckpt")
    assert set(d["params"]) >= {"total", "trainable"}
    assert d["params"]["total"] == 8_030_261_248
    for key in ("weights", "gradients", "optimizer", "activations", "logits", "peak_allocated", "peak_reserved",
                "device_total"):
        assert isinstance(d["memory"][key], int), key
    for key in ("model_flops_per_token", "hardware_flops_per_token", "step_s", "tokens_per_s", "mfu", "hfu", "parts"):
        assert key in d["time"]
    assert isinstance(d["fits"], bool)
    assert "max_batch" in d and "max_seq" in d


def test_every_setup_flag_reaches_the_setup(capsys):
    d = run_json(capsys, "--model", "llama-3.2-1b", "--gpu", "a100-80gb", "--method", "qlora", "--precision", "bf16",
                 "--optimizer", "paged-adamw-8bit", "--batch", "3", "--seq", "1000", "--accum", "4", "--grad-ckpt",
                 "--attn", "eager", "--lora-rank", "32", "--lora-alpha", "64", "--lora-targets", "qv",
                 "--lora-dropout", "0.05", "--dora", "--quant", "fp4", "--double-quant", "--offload", "optimizer", "--gpus", "2",
                 "--sharding", "fsdp", "--loss", "fused", "--padding", "packed", "--seq-mean", "500",
                 "--keep-outputs", "next-step", "--act-offload", "--quant-head", "--kbit-prep", "none",
                 "--compile")
    expected = {"method": "qlora", "precision": "bf16", "optimizer": "paged-adamw-8bit", "batch": 3,
                "seq": 1000, "accum": 4, "grad_ckpt": True, "attn": "eager", "loss": "fused", "lora_rank": 32,
                "lora_alpha": 64, "lora_targets": "qv", "lora_dropout": 0.05, "dora": True, "quant": "fp4",
                "double_quant": True, "offload": "optimizer", "gpus": 2, "sharding": "fsdp", "padding": "packed",
                "seq_mean": 500, "keep_outputs": "next-step", "optimizer_in_backward": False, "act_offload": True,
                "quant_head": True, "frozen_dtype": "compute", "kbit_prep": "none",
                "compile": True}
    assert d["setup"] == expected
    from reportgen.setup import TrainingSetup

    default = TrainingSetup().model_dump(mode="json")
    assert set(expected) == set(TrainingSetup.model_fields)  # every field has a flag, tested here
    # ... with a value that is not its default (optimizer_in_backward excludes accumulation and offload,
    # frozen_dtype fp32 pure bf16: both are checked below)
    assert all(expected[k] != default[k] for k in expected if k not in ("optimizer_in_backward", "frozen_dtype"))
    d = run_json(capsys, "--model", "llama-3.2-1b", "--gpu", "a100-80gb", "--method", "lora", "--frozen-dtype", "fp32")
    assert d["setup"]["frozen_dtype"] == "fp32"
    d = run_json(capsys, "--model", "llama-3.2-1b", "--gpu", "a100-80gb", "--optimizer-in-backward")
    assert d["setup"]["optimizer_in_backward"] is True


def test_model_path_accepted(capsys, tmp_path):
    from reportgen import catalog

    path = tmp_path / "config.json"
    path.write_text(json.dumps(catalog.load_model("tinyllama-1.1b").config))
    d = run_json(capsys, "--model", str(path), "--gpu", "t4", "--precision", "fp16-mixed")
    assert d["params"]["total"] == 1_100_048_384


def test_table_output_mentions_the_totals(capsys):
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-3060", "--method", "lora"]) == 0
    out = capsys.readouterr().out
    assert "peak allocated" in out and "nvidia-smi" in out and "tokens/s" in out


@pytest.mark.parametrize("args,needle", [
    (["--model", "llama-9", "--gpu", "t4"], "unknown model"),
    (["--model", "llama-3.2-1b", "--gpu", "h800"], "unknown GPU"),
    (["--model", "llama-3.2-1b", "--gpu", "t4", "--gpus", "2"], "sharding"),
    (["--model", "llama-3.2-1b", "--gpu", "t4", "--batch", "0"], "--batch"),
])
def test_bad_input_exits_2_with_a_clear_message(args, needle):
    proc = subprocess.run([sys.executable, "-m", "reportgen", "estimate", *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_models_and_gpus_list(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "mixtral-8x7b" in out and "46,702,792,704" in out
    assert main(["gpus"]) == 0
    assert "h100-sxm" in capsys.readouterr().out


def test_the_table_ends_with_what_was_measured_of_this_setup(capsys, monkeypatch):
    """Issue 19: every ``estimate`` ended "compare with measured cases on the validation page", also
    for setups nobody measured. It now names the measurement of this exact setup on this card (the
    committed H100 runs under results/validation/measured/) or says there is none; and the verdict
    line carries its margin and band."""
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # results/ of the repository
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--method", "lora"]) == 0
    out = capsys.readouterr().out
    assert "validation page" not in out
    assert "measured too: device total" in out and "reportgen show llama-3.1-8b.h100-sxm.lora.453de8e998c3" in out
    assert "\nfits: needs " in out and "GiB free, expected" in out
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--method", "lora"]) == 0
    out = capsys.readouterr().out  # measured on the H100 capped to 24 GiB: out of memory
    assert "measured too: out of memory" in out and "capped to the memory of rtx-4090" in " ".join(out.split())
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-3060", "--method", "qlora"]) == 0
    assert "estimate only: this setup (llama-3.2-1b.rtx-3060.qlora." in capsys.readouterr().out
