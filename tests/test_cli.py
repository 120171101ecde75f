"""The CLI contract: `estimate --format json` prints exactly one JSON object with the documented keys."""

import json

import pytest

from reportgen.cli import main


def run_json(capsys, *args):
    assert main(["estimate", *args, "--format", "json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)  # exactly one object: json.loads fails on trailing data


def test_estimate_json_contract(capsys):
    """Llama 3.1 8B QLoRA (all-linear r16) with checkpointing on an RTX 4090, worked by hand:

    * trainable: 16 x (4,096 + 4,096) for q and o, 16 x (4,096 + 1,024) for k and v, 16 x (4,096 +
      14,336) for gate, up and down: 1,310,720 per layer, 41,943,040 in 32 layers;
    * weights: the 6,979,321,856 decoder-layer linear weights packed two per byte (3,489,660,928
      bytes) and the rest, the untied embedding and head (2 x 128,256 x 4,096) and the norms (65 x
      4,096), 1,050,939,392 parameters in fp32 (peft's k-bit preparation upcasts them): 4,203,757,568;
      7,693,418,496 bytes;
    * model FLOPs per token (PaLM): 4 x 7,504,658,432 matmul weights + 6 x 41,943,040 adapters + 12 x
      32 layers x 32 heads x 128 x 2,048 = 33,491,517,440; MFU that over the card's 165.2 TFLOP/s."""
    d = run_json(capsys, "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--method", "qlora", "--grad-ckpt")
    assert d["params"] == {"total": 8_030_261_248, "trainable": 41_943_040}
    assert d["memory"]["weights"] == 7_693_418_496
    for key in ("weights", "gradients", "optimizer", "activations", "logits", "peak_allocated", "peak_reserved",
                "device_total"):
        assert isinstance(d["memory"][key], int), key
    t = d["time"]
    assert t["model_flops_per_token"] == 33_491_517_440
    assert t["tokens_per_s"] == pytest.approx(2048 / t["step_s"], rel=1e-12)
    assert t["mfu"] == pytest.approx(33_491_517_440 * t["tokens_per_s"] / 165.2e12, rel=1e-12)
    assert {"hardware_flops_per_token", "hfu", "parts"} <= set(t)
    # the verdict reads the band's high end against the card
    assert d["capacity"] == 24_564 * 2**20  # nvidia-smi's total of an RTX 4090 (GPU catalog)
    assert d["verdict"] == "fits" and d["fits"] is True and d["band"]["demand_range"][1] <= d["capacity"]
    assert d["max_batch"] >= 1 and d["max_seq"] >= 2048


def test_every_setup_flag_reaches_the_setup(capsys):
    d = run_json(capsys, "--model", "llama-3.2-1b", "--gpu", "a100-80gb", "--method", "qlora", "--precision", "bf16",
                 "--optimizer", "paged-adamw-8bit", "--batch", "3", "--seq", "1000", "--accum", "4", "--grad-ckpt",
                 "--attn", "eager", "--lora-rank", "32", "--lora-alpha", "64", "--lora-targets", "qv",
                 "--lora-dropout", "0.05", "--dora", "--quant", "fp4", "--double-quant", "--offload", "optimizer", "--gpus", "2",
                 "--sharding", "fsdp", "--loss", "fused", "--padding", "packed", "--seq-mean", "500",
                 "--keep-outputs", "next-step", "--act-offload", "--quant-head", "--kbit-prep", "none",
                 "--compile", "--eval-batch", "2", "--eval-seq", "512", "--eval-generate", "64", "--save", "fsdp-full",
                 "--load", "cpu-rank0", "--kernels", "liger")
    expected = {"method": "qlora", "precision": "bf16", "optimizer": "paged-adamw-8bit", "batch": 3,
                "seq": 1000, "accum": 4, "grad_ckpt": True, "attn": "eager", "loss": "fused", "lora_rank": 32,
                "lora_alpha": 64, "lora_targets": "qv", "lora_dropout": 0.05, "dora": True, "quant": "fp4",
                "double_quant": True, "offload": "optimizer", "gpus": 2, "sharding": "fsdp", "padding": "packed",
                "seq_mean": 500, "keep_outputs": "next-step", "optimizer_in_backward": False, "act_offload": True,
                "quant_head": True, "frozen_dtype": "compute", "kbit_prep": "none",
                "compile": True, "eval_batch": 2, "eval_seq": 512, "eval_generate": 64, "save": "fsdp-full",
                "load": "cpu-rank0", "kernels": "liger"}
    assert d["setup"] == expected
    from reportgen.setup import TrainingSetup

    default = TrainingSetup().model_dump(mode="json")
    # every field has a flag, tested here (recipe below: trl-sft refuses a fused loss and kept outputs; seq_padded
    # below: it needs padding longest, the packed rows here have none; recipe grpo's fields in tests/test_grpo.py)
    # fsdp_param_dtype below: fp32 gathers need a full fine-tune under FSDP with mixed precision; modeling and
    # rope_positions below: torchtune's attention is SDPA
    assert (set(expected) | {"recipe", "seq_padded", "fsdp_param_dtype", "modeling", "rope_positions"}
            | set(TrainingSetup.GRPO_FIELDS) == set(TrainingSetup.model_fields))
    # ... with a value that is not its default (optimizer_in_backward excludes accumulation and offload,
    # frozen_dtype fp32 pure bf16: both are checked below)
    assert all(expected[k] != default.get(k) for k in expected if k not in ("optimizer_in_backward", "frozen_dtype"))
    d = run_json(capsys, "--model", "llama-3.2-1b", "--gpu", "a100-80gb", "--method", "lora", "--modeling", "torchtune",
                 "--rope-positions", "4096")
    assert (d["setup"]["modeling"], d["setup"]["rope_positions"]) == ("torchtune", 4096)
    d = run_json(capsys, "--model", "llama-3.2-1b", "--gpu", "a100-80gb", "--method", "lora", "--frozen-dtype", "fp32")
    assert d["setup"]["frozen_dtype"] == "fp32"
    d = run_json(capsys, "--model", "llama-3.2-1b", "--gpu", "a100-80gb", "--method", "lora", "--recipe", "trl-sft")
    assert d["setup"]["recipe"] == "trl-sft"
    d = run_json(capsys, "--model", "llama-3.2-1b", "--gpu", "a100-80gb", "--optimizer-in-backward")
    assert d["setup"]["optimizer_in_backward"] is True
    d = run_json(capsys, "--model", "llama-3.2-1b", "--gpu", "a100-80gb", "--seq", "1000", "--seq-mean", "400",
                 "--seq-padded", "700")
    assert d["setup"]["seq_padded"] == 700
    d = run_json(capsys, "--model", "llama-3.2-1b", "--gpu", "a100-80gb", "--method", "full", "--precision", "bf16-mixed",
                 "--gpus", "2", "--sharding", "fsdp", "--fsdp-param-dtype", "fp32")
    assert d["setup"]["fsdp_param_dtype"] == "fp32"


def test_model_path_accepted(capsys, tmp_path):
    from reportgen import catalog

    path = tmp_path / "config.json"
    path.write_text(json.dumps(catalog.load_model("tinyllama-1.1b").config))
    d = run_json(capsys, "--model", str(path), "--gpu", "t4", "--precision", "fp16-mixed")
    assert d["params"]["total"] == 1_100_048_384


def test_table_shows_the_estimates_numbers(capsys):
    """The terminal table prints the estimate's own figures, in GiB of 2^30 bytes, ms, % and tokens/s
    with thousands separators (formatted here by hand, not with the code's formatters)."""
    from reportgen import catalog
    from reportgen.estimate import estimate
    from reportgen.setup import TrainingSetup

    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-3060", "--method", "lora"]) == 0
    out = capsys.readouterr().out
    est = estimate(catalog.load_model("llama-3.2-1b"), catalog.load_gpu("rtx-3060"), TrainingSetup(method="lora"))
    rows = [(cells[0].strip(), cells[1].strip()) for line in out.splitlines()
            if line.startswith("│") and len(cells := line.split("│")[1:-1]) >= 2]

    def shown(label: str) -> str:  # the value beside the first row whose label starts so (rich wraps labels)
        return next(value for name, value in rows if name.startswith(label))

    m, t = est.memory, est.time
    assert shown("peak allocated") == f"{m.peak_allocated / 2**30:.2f}"
    assert shown("peak reserved") == f"{m.peak_reserved / 2**30:.2f}"
    assert shown("device total") == f"{m.device_total / 2**30:.2f}"
    assert shown("activations") == f"{m.terms['activations'] / 2**30:.2f}"
    assert shown("verdict") == est.verdict
    assert shown("step time") == f"{t.step_s * 1000:.0f} ms" and t.step_s < 1
    assert shown("tokens/s") == f"{t.tokens_per_s:,.0f}" and t.tokens_per_s >= 1000
    assert shown("MFU") == f"{100 * t.mfu:.1f}%"
    lo, hi = est.judgement.range
    assert f"{lo / 2**30:.2f}-{hi / 2**30:.2f}" in out


@pytest.mark.parametrize("args,needle", [
    (["--model", "llama-9", "--gpu", "t4"], "unknown model"),
    (["--model", "llama-3.2-1b", "--gpu", "h800"], "unknown GPU"),
    (["--model", "llama-3.2-1b", "--gpu", "t4", "--gpus", "2"], "sharding"),
    (["--model", "llama-3.2-1b", "--gpu", "t4", "--batch", "0"], "--batch"),
])
def test_bad_input_exits_2_with_a_clear_message(capsys, args, needle):
    # in-process (an exception would fail the test); the `python -m reportgen` entry is run in a
    # fresh process by tests/test_configs.py::test_no_traceback_from_the_command_line
    try:
        code = main(["estimate", *args])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert code == 2
    assert needle in err
    assert "Traceback" not in err


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
