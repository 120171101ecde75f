"""Issue 33: the loss variants and FSDP's gather dtype that torchtune's, unsloth's and Lightning's recipes use
(``estimate/logits.py``, ``estimate/sharding.py``), each pinned to a worked example, and the saved-tensor
measurement the compiled loss's formula rests on."""

from __future__ import annotations

import shutil

import pytest

from reportgen import catalog
from reportgen.cli import main
from reportgen.estimate import params as P
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.logits import COMPILED_ROW_STATS, loss_logits_memory
from reportgen.estimate.memory import estimate_memory
from reportgen.setup import SetupError, TrainingSetup

LLAMA = catalog.load_model("llama-3.1-8b")  # V = 128,256
H100 = catalog.load_gpu("h100-sxm")


def _lm(loss: str, precision: str = "bf16"):
    return loss_logits_memory(LLAMA, dtypes_for(TrainingSetup(precision=precision)), 2048, loss)


def test_compiled_chunked_loss_worked_example():
    """2,048 tokens, V = 128,256, bf16: the compiled chunks keep their bf16 logits (2V), the int64 labels and
    two fp32 row numbers: 2,048 x (256,512 + 8 + 8) = 525,369,344 bytes, forward and saved alike; the backward
    adds one chunk's (256 tokens') bf16 gradient, 256 x 256,512 = 65,667,072. The eager chunked loss keeps the
    fp32 log-softmax instead (4V per token): twice the saved bytes."""
    lm = _lm("chunked-compiled")
    assert lm.saved == lm.forward_live == 525_369_344
    assert lm.backward_live == 525_369_344 + 65_667_072
    assert _lm("chunked").saved == 2048 * (4 * 128_256 + 8) + 4 == 1_050_689_540


def test_no_upcast_loss_worked_example():
    """2,048 tokens, V = 128,256, bf16 logits without ``.float()``: log_softmax saves its bf16 output (2V) with
    the labels: 2,048 x 256,520 + 2 = 525,352,962; the forward also holds the logits (+ 2,048 x 256,512); the
    backward three bf16 tensors of V per token: 2,048 x (3 x 256,512 + 8) = 1,576,026,112 (standard: 12V + 8
    per token, 3,152,035,840)."""
    lm = _lm("no-upcast")
    assert lm.saved == 525_352_962
    assert lm.forward_live == 525_352_962 + 525_336_576
    assert lm.backward_live == 1_576_026_112
    assert _lm("standard").backward_live == 3_152_035_840


def test_the_torchtune_compiled_recipe_estimates_below_the_eager_one():
    """What a user of torchtune's compile: true sees: the step's peak falls by the fp32 log-softmax the eager
    chunked loss keeps (2,048 tokens x (4V - 2V - 8) bytes at the loss), everything else the same."""
    base = dict(method="lora", precision="bf16", batch=1, seq=2048, grad_ckpt=True, compile=True)
    eager = estimate_memory(LLAMA, TrainingSetup(loss="chunked", **base), H100)
    compiled = estimate_memory(LLAMA, TrainingSetup(loss="chunked-compiled", **base), H100)
    assert compiled.terms["logits"] < eager.terms["logits"]
    assert compiled.peak_allocated < eager.peak_allocated
    assert eager.terms["activations"] == compiled.terms["activations"]


def test_fsdp_fp32_gather_keeps_one_16bit_copy_of_the_weights():
    """Lightning's FSDP bf16-mixed (param_dtype float32 under autocast): the forward's end holds autocast's cached
    bf16 copy of every layer's weights and the head's (Llama 3.1 8B: 32 x 218,103,808 + 525,336,576 params x 2
    bytes), none under FSDP's bf16 gather; the gathered layers weigh twice as much (fp32)."""
    base = dict(method="full", precision="bf16-mixed", gpus=8, sharding="fsdp", batch=1, seq=2048, grad_ckpt=True)
    bf16 = estimate_memory(LLAMA, TrainingSetup(**base), H100)
    fp32 = estimate_memory(LLAMA, TrainingSetup(fsdp_param_dtype="fp32", **base), H100)
    setup, dt = TrainingSetup(**base), dtypes_for(TrainingSetup(**base))
    copies = 32 * P.autocast_copy_bytes_per_layer(LLAMA, setup, dt) + P.autocast_copy_bytes_head(LLAMA, setup, dt)
    assert copies == (32 * 218_103_808 + 525_336_576) * 2
    assert bf16.terms.get("autocast_copies", 0) == 0 and fp32.terms["autocast_copies"] == copies
    assert fp32.terms["fsdp_unsharded"] == pytest.approx(2 * bf16.terms["fsdp_unsharded"], rel=1e-6)
    assert fp32.peak_allocated - bf16.peak_allocated >= copies


@pytest.mark.parametrize("kw, field", [
    (dict(loss="no-upcast", precision="fp32"), "loss"),
    (dict(fsdp_param_dtype="fp32"), "fsdp_param_dtype"),
    (dict(fsdp_param_dtype="fp32", gpus=2, sharding="ddp"), "fsdp_param_dtype"),
    (dict(fsdp_param_dtype="fp32", gpus=2, sharding="fsdp", precision="bf16"), "fsdp_param_dtype"),
    (dict(fsdp_param_dtype="fp32", gpus=2, sharding="fsdp", method="lora"), "fsdp_param_dtype"),
    (dict(loss="chunked-compiled", recipe="trl-sft"), "loss"),
])
def test_combinations_that_mean_nothing_are_refused(kw, field):
    with pytest.raises(SetupError) as exc:
        TrainingSetup(**kw)
    assert exc.value.field == field


def test_the_flags_reach_the_estimate_and_a_bad_one_exits_2(capsys):
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--loss", "chunked-compiled",
                 "--format", "json"]) == 0
    assert '"chunked-compiled"' in capsys.readouterr().out
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--fsdp-param-dtype", "fp32"]) == 2
    assert "--fsdp-param-dtype: is the dtype FSDP gathers" in capsys.readouterr().err


def _saved_bytes(fn, compile_it: bool) -> list[tuple[tuple, object]]:
    import torch
    import torch.nn.functional as F  # noqa: F401

    x = torch.randn(64, 1024, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, 1024, (64,))
    saved: list = []
    f = torch.compile(fn) if compile_it else fn
    with torch.autograd.graph.saved_tensors_hooks(lambda s: saved.append((tuple(s.shape), s.dtype)) or s, lambda s: s):
        loss = f(x, t)
    loss.backward()
    return saved


def _ce(x, t):  # CEWithChunkedOutputLoss.compute_cross_entropy
    import torch.nn.functional as F

    return F.cross_entropy(x.float(), t, reduction="sum")


def test_what_the_eager_and_the_compiled_chunk_save():
    """The measurement behind ``chunked-compiled``: eager saves the fp32 log-softmax (64 x 1024 fp32), the
    compiled chunk its bf16 input, the labels and ``COMPILED_ROW_STATS`` fp32 numbers per row, no fp32 logits."""
    import torch

    eager = _saved_bytes(_ce, False)
    assert ((64, 1024), torch.float32) in eager
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("torch.compile's CPU backend needs a C compiler")
    compiled = _saved_bytes(_ce, True)
    big = [dt for shape, dt in compiled if shape == (64, 1024)]
    assert big == [torch.bfloat16]
    assert sum(1 for shape, dt in compiled if shape in ((64, 1), (64,)) and dt == torch.float32) == COMPILED_ROW_STATS


def test_a_litgpt_bf16_mixed_fsdp_row_is_mapped_with_the_fp32_gather():
    """compare-published maps a litgpt row run with --precision bf16-mixed on several GPUs by the recipe Lightning's
    code documents (FSDPPrecision: param_dtype float32 under autocast), and one of pure bf16 as before."""
    from reportgen.published.mapping import map_row

    row = {"id": "X1", "source": "github.com/Lightning-AI/litgpt/blob/main/config_hub/finetune/README.md row "
           "tiny-llama/full.yaml", "model": "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
           "technique": "full fine-tune, bf16-mixed", "lora_rank": "", "lora_targets": "", "batch": "4",
           "gpus": "4", "gpu_type": "A100-SXM4 80GB", "peak_mem_gb": "20.0", "notes": ""}
    m = map_row(row)
    assert (m.setup.precision.value, m.setup.fsdp_param_dtype.value, m.setup.sharding.value) == (
        "bf16-mixed", "fp32", "fsdp")
    m = map_row({**row, "technique": "full fine-tune, pure bf16 (bf16-true)"})
    assert (m.setup.precision.value, m.setup.fsdp_param_dtype.value) == ("bf16", "compute")
