"""Issue 30: the time model's rates per GPU generation, and the L2 cache as a term of the model."""

import pytest

from reportgen import catalog
from reportgen.estimate import constants as K
from reportgen.estimate.time import TimeConstants, attention_efficiency_for, matmul_efficiency_of, memory_bandwidth

MIB = 2**20


def test_each_card_belongs_to_its_generation():
    """Compute capability (NVIDIA's CUDA GPUs table) and the GeForce line decide the generation."""
    expected = {"t4": "turing", "rtx-3090": "ampere-ga10x-geforce", "rtx-a6000": "ampere-ga10x", "a10g": "ampere-ga10x",
                "a100-80gb": "ampere-ga100", "rtx-4090": "ada-geforce", "l4": "ada", "rtx-6000-ada": "ada",
                "h100-sxm": "hopper", "h200": "hopper", "rtx-5090": "blackwell-geforce", "b200": "blackwell-dc",
                # issue 30: the TITAN RTX is not GeForce (full-rate tensor math), nor are the workstation cards
                "titan-rtx": "turing", "rtx-3080": "ampere-ga10x-geforce", "rtx-3090-ti": "ampere-ga10x-geforce",
                "rtx-4080": "ada-geforce", "rtx-4080-super": "ada-geforce", "rtx-5080": "blackwell-geforce",
                "rtx-5070-ti": "blackwell-geforce", "rtx-5060-ti-16gb": "blackwell-geforce", "rtx-a4000": "ampere-ga10x",
                "rtx-a5000": "ampere-ga10x", "rtx-pro-6000": "blackwell", "a10": "ampere-ga10x",
                # the GeForce RTX 2080 Ti (half-rate FP32 accumulate) is, unlike the TITAN RTX of the same die
                "rtx-2080-ti": "turing-geforce"}
    assert {k: catalog.load_gpu(k).generation for k in expected} == expected


def test_every_card_gets_a_named_efficiency():
    """Every catalog card's generation has a fit of its own or a named one it borrows (``BORROWS_FROM``, not the
    silent fall-through to Hopper), and a name for the estimate's note ("estimated from Hopper's")."""
    for key in catalog.gpu_names():
        gen = catalog.load_gpu(key).generation
        assert gen in K.MATMUL_EFFICIENCY or gen in K.BORROWS_FROM, (key, gen)
        assert gen.removesuffix("-geforce") in K.GENERATION_NAMES, (key, gen)
    assert matmul_efficiency_of("blackwell") == (K.MATMUL_EFFICIENCY["hopper"], "hopper")


def test_every_card_has_an_l2_size_from_its_whitepaper():
    sizes = {k: catalog.load_gpu(k).l2_cache_bytes // MIB for k in catalog.gpu_names()}
    assert all(sizes.values()), sizes
    assert (sizes["rtx-3090"], sizes["rtx-4090"], sizes["h100-sxm"], sizes["a100-80gb"], sizes["t4"]) == (6, 72, 50, 40, 4)


def test_no_fitted_efficiency_exceeds_the_datasheet():
    """Every efficiency multiplies a datasheet peak (none above 1: the L2's reuse is its own term, no
    longer folded into a bandwidth efficiency above the datasheet); the L2's share is below 1."""
    assert all(0 < e <= 1 for e in K.MATMUL_EFFICIENCY.values())
    assert 0 < K.ATTENTION_EFFICIENCY <= 1 and 0 < K.DRAM_EFFICIENCY <= 1 and 0 <= K.L2_REUSE < 1


def test_memory_bound_kernels_gain_from_an_l2_that_holds_their_tensors():
    """Worked example: a 16 MiB hidden state fits the RTX 4090's 72 MB L2, so L2_REUSE of the traffic
    costs no DRAM time: 1,008 GB/s x DRAM_EFFICIENCY / (1 - L2_REUSE). A 64 MiB one on the RTX 3090's 6 MB
    L2 is held 6/64 of the time: / (1 - L2_REUSE x 6/64). Streamed weights (no working set): DRAM alone."""
    r4090, r3090 = catalog.load_gpu("rtx-4090"), catalog.load_gpu("rtx-3090")
    import dataclasses

    c = dataclasses.replace(TimeConstants.current(r4090), l2_reuse=0.2)  # the shipped share is about 0
    share = 0.2
    assert memory_bandwidth(r4090, c, 16 * MIB) == pytest.approx(1008e9 * K.DRAM_EFFICIENCY / (1 - share))
    assert memory_bandwidth(r3090, c, 64 * MIB) == pytest.approx(936e9 * K.DRAM_EFFICIENCY / (1 - share * 6 / 64))
    assert memory_bandwidth(r3090, c) == pytest.approx(936e9 * K.DRAM_EFFICIENCY)
    # a larger tensor is held less of the time, never more than the whole share
    assert memory_bandwidth(r4090, c, 720 * MIB) < memory_bandwidth(r4090, c, 72 * MIB) == memory_bandwidth(r4090, c, MIB)


def test_a_generation_without_evidence_borrows_a_named_one():
    """``BORROWS_FROM`` is followed until a fitted generation; a loop (two generations that borrow from
    each other, both without rows) ends at Hopper's, measured on our H100."""
    assert matmul_efficiency_of("hopper") == (K.MATMUL_EFFICIENCY["hopper"], "hopper")
    assert matmul_efficiency_of("blackwell-geforce") == (K.MATMUL_EFFICIENCY["ada-geforce"], "ada-geforce")
    only_hopper = {"hopper": 0.7}
    assert matmul_efficiency_of("ada-geforce", only_hopper) == (0.7, "hopper")
    assert matmul_efficiency_of("turing-geforce", only_hopper) == (0.7, "hopper")
    assert matmul_efficiency_of("unknown", only_hopper) == (0.7, "hopper")
    # a GPU's estimate takes its own generation's fit
    for key in ("rtx-3090", "rtx-4090", "a100-80gb", "h100-sxm"):
        gpu = catalog.load_gpu(key)
        assert TimeConstants.current(gpu).matmul_efficiency == K.MATMUL_EFFICIENCY[gpu.generation]


def test_attention_reaches_the_share_of_the_peak_the_cards_gemms_reach_times_hoppers_ratio():
    """``attention_efficiency_for`` (inlined in ``TimeConstants.current``): the H100 keeps the fitted 0.3982;
    an RTX 4090 on the GeForce rate 0.9165 gets 0.3982 x 0.9165 / 0.7411 = 0.4924, as a profile scales it."""
    h100, rtx = (TimeConstants.current(catalog.load_gpu(k)) for k in ("h100-sxm", "rtx-4090"))
    assert h100.attention_efficiency == pytest.approx(K.ATTENTION_EFFICIENCY)
    assert rtx.attention_efficiency == pytest.approx(attention_efficiency_for(rtx.matmul_efficiency))
    assert attention_efficiency_for(0.9165) == pytest.approx(0.4924, abs=1e-4)
    assert attention_efficiency_for(1.0) < 1.0 and attention_efficiency_for(2.0) == 1.0  # never above the peak
