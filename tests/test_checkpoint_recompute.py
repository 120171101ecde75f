"""Gradient checkpointing's recomputed forward (issue 30: a checkpointed LoRA step of a 7B model
estimated 14% too slow): what a checkpointed decoder layer runs again in the backward, counted in a
tiny Llama on the CPU (transformers' non-reentrant checkpoint, as the harness and transformers 5
enable it) against ``work.layer_recompute_tail``, and what that does to the step's inventory."""

from __future__ import annotations

import pytest

from reportgen import catalog
from reportgen.estimate import work
from reportgen.estimate.dtypes import dtypes_for
from reportgen.estimate.memory import effective_attention
from reportgen.model import from_config
from reportgen.setup import TrainingSetup

#: a Llama small enough for the CPU: hidden, intermediate, heads, kv heads, vocab, tokens
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 128, "max_position_embeddings": 64}
TOKENS = 32


def _counted(method: str, mixed: bool, ckpt: bool, layers: int) -> tuple[tuple[int, float], tuple[int, float]]:
    """(kernels, bytes) of the forward and the backward of a tiny Llama step on the CPU, each ATen op
    classified as the tracer classifies it (``trace/work.py``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.op_count import op_counter

    Count = op_counter(gemm_flops=True)

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **TINY))
    model = model.to(torch.float32 if method == "full" and mixed else torch.bfloat16)
    model.config.use_cache = False
    inner = model
    if method != "full":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", use_dora=method == "dora"),
                               autocast_adapter_dtype=mixed)
        inner = model.base_model.model
        if ckpt:
            model.enable_input_require_grads()
    if ckpt:
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, TINY["vocab_size"], (1, TOKENS))
    fwd, bwd = Count(), Count()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed), fwd:
        loss = model(input_ids=ids, labels=ids).loss
    with bwd:
        loss.backward()
    return (fwd.kernels, fwd.bytes), (bwd.kernels, bwd.bytes)


@pytest.mark.parametrize("method", ["full", "lora", "dora"])
@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "bf16"])
def test_recompute_skips_what_the_early_stop_skips(method, mixed):
    """A layer's forward less what its recomputation runs (the backward of 3 layers less that of 2,
    with checkpointing and without) is what ``layer_recompute_tail`` prices, kernels exactly. Full
    fine-tuning skips the down projection's GEMM and the residual add (2 kernels), LoRA
    ``lora_B``'s GEMM, ``* scaling``, its add and the residual add (4), DoRA 5 (6 with fp32 adapters);
    bytes exactly but for DoRA's out-sized vector."""
    pytest.importorskip("peft")
    fwd = {n: _counted(method, mixed, False, n)[0] for n in (2, 3)}
    ckpt = {n: _counted(method, mixed, True, n)[1] for n in (2, 3)}
    plain = {n: _counted(method, mixed, False, n)[1] for n in (2, 3)}
    skipped = [(fwd[3][i] - fwd[2][i]) - ((ckpt[3][i] - ckpt[2][i]) - (plain[3][i] - plain[2][i])) for i in (0, 1)]
    prec = "bf16-mixed" if mixed else "bf16"
    setup = TrainingSetup(method="full" if method == "full" else "lora", precision=prec, lora_rank=4,
                          lora_targets="all-linear", dora=method == "dora", grad_ckpt=True)
    spec = from_config({"model_type": "llama", "num_hidden_layers": 3, **TINY}, name="tiny")
    tail = work.layer_recompute_tail(spec, setup, dtypes_for(setup), TOKENS)
    assert tail.kernels == skipped[0] == {"full": 2, "lora": 4, "dora": 6 if mixed else 5}[method]
    # DoRA's m/n * lora_result also reads the out-sized m/n vector (64 x 4 bytes here), left out
    assert tail.bytes == pytest.approx(skipped[1], abs=64 * 4 if method == "dora" else 0)


def test_checkpointed_step_recomputes_less_than_a_forward():
    """Llama 3.1 8B, seq 2048, checkpointed: LoRA bf16-mixed recomputes each layer's forward but
    ``lora_B``'s GEMM on the down projection (2 x (2048 x 16 + 16 x 4096 + 2048 x 4096)), its
    ``* scaling`` and add (4 + 2 + 2 + 2 bytes a value) and the residual add (6): 4 kernels and
    2048 x 4096 x 18 + 2 x 16 x 6144 bytes a layer fewer than a whole forward; full fine-tuning skips
    the down projection's GEMM, 2 x 2048 x 14336 x 4096 FLOPs a layer, and the residual add."""
    llama = catalog.load_model("llama-3.1-8b")
    lora = TrainingSetup(method="lora", seq=2048, grad_ckpt=True)
    attn = effective_attention(llama, lora)[0]
    f, _ = work.layer_work(llama, lora, dtypes_for(lora), attn, 1, 2048)
    w = work.step_work(llama, lora, attn)
    assert w.recompute_kernels == 32 * (f.kernels - 4)
    tail = work.layer_recompute_tail(llama, lora, dtypes_for(lora), 2048)
    assert tail.bytes == 2048 * 4096 * 18 + 2 * 16 * (2048 + 4096) == 151_191_552
    full = TrainingSetup(method="full", precision="bf16", seq=2048, grad_ckpt=True)
    tail = work.layer_recompute_tail(llama, full, dtypes_for(full), 2048)
    assert (tail.kernels, tail.matmul_flops, tail.bytes) == (2, 2 * 2048 * 14336 * 4096, 2048 * 4096 * 6)
