"""Issue 32, the whole run: loading, training, evaluation and saving, each with its GPU and host peak
(``estimate/run.py``, ``estimate/host.py``), the verdict naming the phase that decides, and bad input
refused."""

from __future__ import annotations

import json

import pytest

from reportgen import catalog
from reportgen.cli import main
from reportgen.estimate import estimate
from reportgen.estimate import params as P
from reportgen.estimate.dtypes import dtypes_for
from reportgen.setup import SetupError, TrainingSetup

M = catalog.load_model("llama-3.1-8b")
RTX4090 = catalog.load_gpu("rtx-4090")
A100 = catalog.load_gpu("a100-80gb")


def run_of(gpu=RTX4090, **fields):
    return estimate(M, gpu, TrainingSetup(**fields), reverse=False)


def test_loading_qlora_holds_the_largest_linear_in_16_bit_beside_the_4_bit_weights():
    """bitsandbytes quantizes each weight on the GPU as from_pretrained places it: the largest linear of
    Llama 3.1 8B (gate/up, 4,096 x 14,336) is there in bf16 for a moment: 117,440,512 bytes."""
    e = run_of(method="qlora", grad_ckpt=True)
    load = e.run.phases["load"]
    resident = e.memory.terms["weights"] + e.memory.terms["quant_constants"]
    assert load.gpu_allocated - resident == 4096 * 14336 * 2 == 117_440_512
    assert load.host_terms == {}  # device_map: no host copy
    assert e.run.deciding == "train" and e.judgement.phase == "train"


def test_loading_on_the_host_holds_one_model_per_process_or_one_on_rank_0():
    whole = P.weights_bytes(M, TrainingSetup(method="full"), dtypes_for(TrainingSetup(method="full")))
    assert whole == M.total_params * 4  # fp32 master weights under bf16 autocast
    cpu = run_of(A100, method="full", grad_ckpt=True, gpus=4, sharding="ddp", load="cpu")
    assert cpu.run.phases["load"].host_terms == {"model_copies": 4 * whole}
    rank0 = run_of(A100, method="full", grad_ckpt=True, gpus=4, sharding="fsdp")  # default: cpu-rank0
    assert rank0.run.phases["load"].host_terms == {"model_copy_rank0": whole}


def test_generation_at_evaluation_keeps_every_layers_keys_and_values():
    """DynamicCache: 2 x 32 layers x 8 KV heads x 128 x 2 bytes per token, for 2 x (1,024 + 128) tokens;
    each decoding step's last logits in fp32 (2 x 128,256 x 4)."""
    loss_only = run_of(method="lora", grad_ckpt=True, eval_batch=2, eval_seq=1024).run.phases["eval"]
    gen = run_of(method="lora", grad_ckpt=True, eval_batch=2, eval_seq=1024, eval_generate=128).run.phases["eval"]
    kv = 2 * 32 * 8 * 128 * 2 * 2 * (1024 + 128)
    assert kv == 301_989_888
    from reportgen.estimate.logits import logits_memory

    loss_logits = logits_memory(M, dtypes_for(TrainingSetup(method="lora")), 2 * 1024).forward_live
    assert gen.gpu_allocated - loss_only.gpu_allocated == kv + 2 * 128_256 * 4 - loss_logits


def test_an_evaluation_larger_than_the_step_decides_the_verdict(capsys):
    """Eight 4,096-token samples with labels: the fp32 loss over 32,768 x 128,256 logits needs far more
    than the QLoRA step; the verdict says it runs out of memory at evaluation."""
    e = run_of(method="qlora", grad_ckpt=True, eval_batch=8, eval_seq=4096)
    assert e.run.deciding == "eval" and e.verdict == "does not fit"
    assert e.judgement.demand == e.run.phases["eval"].gpu_demand > e.run.phases["train"].gpu_demand
    assert e.judgement.text().startswith("does not fit: needs ") and " GiB at evaluation, short by " in e.judgement.text()
    small = run_of(method="qlora", grad_ckpt=True, eval_batch=1, eval_seq=512)
    assert small.run.deciding == "train" and small.judgement.demand == small.memory.card_demand


def test_saves_copy_what_they_write_to_the_host():
    lora = run_of(method="lora", grad_ckpt=True)
    dt = dtypes_for(TrainingSetup(method="lora"))
    assert lora.run.phases["save"].host_terms == {"adapter_copy": P.adapter_bytes(M, lora.setup, dt)}
    fsdp = run_of(A100, method="full", grad_ckpt=True, gpus=8, sharding="fsdp")
    assert fsdp.run.phases["save"].host_terms["full_state_dict_rank0"] == M.total_params * 4
    z3 = run_of(A100, method="full", grad_ckpt=True, gpus=2, sharding="zero3")
    assert z3.run.phases["save"].host_terms["consolidated_16bit_rank0"] == M.total_params * 2
    assert "save" not in run_of(method="lora", save="none").run.phases


def test_zero3_optimizer_offload_host_ram_itemised_beside_deepspeeds_own_count(capsys):
    """Issue 32's case: Llama 3.1 8B, full fine-tuning, ZeRO-3 with the optimizer offloaded, two GPUs.
    Per parameter of the node: fp32 master 4 + Adam 8 + fp32 gradients 4 + the bf16 gradient partition
    buffer 2 = 18 bytes, where DeepSpeed's estimate_zero3_model_states_mem_needs counts 16 x 1.5."""
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--method", "full", "--grad-ckpt",
                 "--gpus", "2", "--sharding", "zero3", "--offload", "optimizer", "--host-memory", "128GiB",
                 "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    train = d["run"]["phases"]["train"]
    n = M.total_params
    assert train["host_terms"] == {"master_weights": 4 * n, "optimizer_states": 8 * n, "gradients": 4 * n,
                                   "gradient_partition_buffer": 2 * n}
    assert any("estimate_zero3_model_states_mem_needs: " + f"{int(n * 16 * 1.5) / 2**30:.1f} GiB" in x
               for x in d["notes"])
    assert d["run"]["host_phase"] == "save" and d["run"]["host_capacity"] == 128 * 2**30
    assert d["run"]["host_fits"] is False  # 18 bytes x 8.03 B parameters pass 128 GiB
    assert {"load", "train", "save"} <= set(d["run"]["phases"]) and d["verdict_phase"] == "train"
    for phase in d["run"]["phases"].values():
        assert {"gpu_allocated", "gpu_demand", "host", "host_terms"} <= set(phase)


def test_the_terminal_shows_the_run_and_judges_host_ram(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one table row a line
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--method", "full", "--grad-ckpt",
                 "--offload", "optimizer", "--host-memory", "64GiB"]) == 0
    out = capsys.readouterr().out
    assert "the whole run" in out and "train step (decides)" in out
    out = " ".join(out.split())
    assert "does not fit in 64.00 GiB (--host-memory): peak at" in out and "not counted" in out
    # the verdict lines say it too, not only the table: a run the GPU holds still fails on the host
    assert "the host does not fit: the run needs" in out and "more than the 64.00 GiB of --host-memory" in out


def test_a_host_that_holds_the_run_adds_no_warning(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--offload", "optimizer",
                 "--host-memory", "256GiB"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fits in 256.00 GiB (--host-memory)" in out and "the host does not fit" not in out


@pytest.mark.parametrize("args, message", [
    (["--eval-batch", "0"], "eval-batch"),
    (["--eval-seq", "512"], "eval_batch"),
    (["--method", "full", "--save", "adapter"], "adapter"),
    (["--method", "qlora", "--load", "cpu"], "device_map"),
    (["--load", "cpu-rank0"], "FSDP"),
    (["--save", "fsdp-full"], "FSDP"),
    (["--host-memory", "lots"], "host memory"),
    (["--host-memory", "0GiB"], "more than zero"),
    (["--host-memory", "999TiB"], "64 TiB"),
])
def test_bad_run_input_is_one_error_line(capsys, args, message):
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_run_fields_leave_a_default_setup_as_stored():
    """Added after result files were stored: left out of the dump at their defaults, so ids and hashes
    of every stored case stay."""
    d = TrainingSetup().model_dump()
    assert not {"eval_batch", "eval_seq", "eval_generate", "save", "load"} & set(d)
    with pytest.raises(SetupError):
        TrainingSetup(eval_generate=16)


def test_evaluation_logits_follow_what_each_recipe_runs_without_gradients():
    """TRL's prediction_step scores with its fused head (no full logits); Liger's fused loss is a training-only
    path, so evaluation materializes the logits as the standard loss does; torchtune's chunked loss stays
    chunked."""
    def eval_of(**fields):
        e = run_of(method="qlora", grad_ckpt=True, eval_batch=8, eval_seq=2048, **fields)
        return e.run.phases["eval"].gpu_allocated - e.memory.terms["optimizer"] - e.memory.terms["weights"]

    standard, fused = eval_of(), eval_of(loss="fused")
    assert fused == standard
    assert eval_of(loss="chunked") < standard and eval_of(recipe="trl-sft") < eval_of(loss="chunked")


def test_an_evaluation_shorter_than_the_training_mean_is_estimated_not_refused(capsys):
    """Variable lengths with a mean of 900 tokens and evaluation cut at 512: the evaluation's batches are
    padded batches of at most 512 tokens (the mean past its cut was refused as a setup error)."""
    assert main(["estimate", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--seq", "2048", "--seq-mean", "900",
                 "--eval-batch", "2", "--eval-seq", "512", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["run"]["phases"]["eval"]["gpu_allocated"] > 0
