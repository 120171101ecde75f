"""The time model's per-step figures turned into what a user reads, by their definitions: MFU against
the peak of every GPU used (PaLM, appendix B: model FLOPs per second / peak of the hardware), tokens/s
of data (padding is not data), dollars for every GPU rented. Each is checked on a two-GPU FSDP case
with variable-length data, where forgetting the GPU count or the padding changes the figure."""

from __future__ import annotations

import pytest

from reportgen import catalog
from reportgen.estimate import estimate
from reportgen.setup import TrainingSetup

H100 = catalog.load_gpu("h100-sxm")
L8 = catalog.load_model("llama-3.1-8b")
SETUP = TrainingSetup(method="full", precision="bf16-mixed", gpus=2, sharding="fsdp", batch=2, seq=2048,
                      seq_mean=1024, padding="longest", accum=2)


@pytest.fixture(scope="module")
def t():
    return estimate(L8, H100, SETUP, reverse=False).time


def test_tokens_per_second_count_data_not_padding(t):
    # 2 GPUs x 2 micro-batches x 2 rows x 1,024 tokens of data (the 2,048-long rows are half padding)
    assert t.tokens_per_s * t.step_s == pytest.approx(2 * 2 * 2 * 1024, rel=1e-9)


def test_mfu_is_against_the_peak_of_both_gpus(t):
    peak = H100.peak_flops(t.peak_dtype)
    assert t.mfu == pytest.approx(t.model_flops_per_token * t.tokens_per_s / (2 * peak), rel=1e-9)
    assert 0.05 < t.mfu < 0.8  # a datacenter card's real training MFU, not twice it


def test_dollars_pay_for_both_gpus(t):
    assert t.train_hours == pytest.approx(t.train_tokens / t.tokens_per_s / 3600, rel=1e-9)
    assert t.train_dollars == pytest.approx(t.train_hours * H100.price_usd_per_hour * 2, rel=1e-9)


def test_moe_multiplies_only_the_routed_experts():
    """A mixture-of-experts layer sends each token through ``experts_per_token`` of its experts
    (Mixtral: 2 of 8, Jiang et al. 2024, "Mixtral of Experts", section 2.1): its FLOPs count the
    active parameters, about 12.9B of Mixtral 8x7B's 46.7B with the embeddings. By hand per layer:
    q, o 4096 x 4096, k, v 4096 x 1024, two experts' gate, up, down 3 x 4096 x 14336 each and the
    router 4096 x 8: 394,297,344, times 32 layers."""
    from reportgen.estimate.time import layer_matmul_params_per_token

    mixtral = catalog.load_model("mixtral-8x7b")
    assert layer_matmul_params_per_token(mixtral) == 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024
                                                           + 2 * 3 * 4096 * 14336 + 4096 * 8)
