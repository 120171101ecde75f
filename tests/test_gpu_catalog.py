"""The GPU catalog's conventions (gpus.yaml header) hold for every entry, and the figures copied from
datasheets and nvidia-smi pastes stay what the cited sources say."""

import pytest

from reportgen import catalog
from reportgen.hardware import GIB, MIB

DTYPES = ("fp32", "tf32", "fp16", "bf16")


@pytest.mark.parametrize("key", catalog.gpu_names())
def test_every_entry_cites_sources(key):
    gpu = catalog.load_gpu(key)
    assert gpu.sources, key
    assert all(isinstance(s, str) and s.startswith("http") for s in gpu.sources), key
    assert len(set(gpu.sources)) == len(gpu.sources), f"{key}: a source is listed twice"
    assert gpu.notes.strip(), key


@pytest.mark.parametrize("key", catalog.gpu_names())
def test_peaks_are_dense_columns_and_derived_ones_are_explained(key):
    gpu = catalog.load_gpu(key)
    assert set(gpu.peak_tflops) == set(DTYPES), key
    for d in gpu.derived:
        assert d in DTYPES, f"{key}: derived column {d!r} is not a peak_tflops column"
        assert gpu.peak_tflops[d] is not None, f"{key}: derived {d} has no value"
        assert d in gpu.notes.lower(), f"{key}: derived {d} is not explained in the notes"
    if gpu.derived:
        assert "derived" in gpu.notes.lower(), key


@pytest.mark.parametrize("key", catalog.gpu_names())
def test_price_has_source_and_date_or_none_of_them(key):
    entry = catalog.gpu_entry(key)
    priced = entry.get("price_usd_per_hour") is not None
    assert priced == bool(entry.get("price_source")) == bool(entry.get("price_date")), key


@pytest.mark.parametrize("key", catalog.gpu_names())
def test_nvidia_smi_total_is_plausible_and_explained(key):
    """Where the driver-reported total is known it replaces the marketed size: it sits a little under
    the marketed GiB (ECC on GDDR6 takes 1/16), never above, and the notes say where it was read."""
    gpu = catalog.load_gpu(key)
    mib = gpu.nvidia_smi_total_mib
    if mib is None:
        assert gpu.memory_bytes == int(gpu.memory_gb * GIB)
        return
    assert isinstance(mib, int), key
    assert 0.9 * gpu.memory_gb * 1024 <= mib <= gpu.memory_gb * 1024, (key, mib)
    assert gpu.memory_bytes == mib * MIB
    assert "nvidia_smi_total_mib" in gpu.notes and str(mib) in gpu.notes, key


# nvidia-smi totals read from the pastes cited in each entry (driver and ECC state in the notes)
NVIDIA_SMI_MIB = {
    "t4": 15360,
    "rtx-3060": 12288,
    "rtx-3090": 24576,
    "rtx-4090": 24564,
    "a10g": 23028,
    "l4": 23034,
    "a100-40gb": 40960,
    "a100-80gb": 81920,
    "rtx-a6000": 49140,  # ECC off; 46068 with ECC on
    "rtx-6000-ada": 49140,
    "l40s": 46068,
    "rtx-4060-ti-16gb": 16380,
    "rtx-5090": 32607,
    "h100-nvl": 95830,
    "b200": 183359,
    "h100-pcie": None,  # no citable paste found: marketed size
    "h100-sxm": 81559,
    "h200": 143771,
    # issue 30
    "rtx-4080-super": 16376,  # utkuozdemir/nvidia_gpu_exporter capture, driver 595.71.05
    "rtx-3090-ti": 24564,  # noonghunna/club-3090#353, driver 580.159.03
    "rtx-a4000": 16376,  # geerlingguy/raspberry-pi-pcie-devices#791, ECC off, driver 580.95.05
    "a10": 23028,  # mayooot/detect-gpu#3, NVML 24146608128 bytes, driver 535.129.03
    "titan-rtx": None,  # no citable paste found for these: marketed size
    "rtx-4080": None,
    "rtx-3080": None,
    "rtx-3080-12gb": None,
    "rtx-5060-ti-16gb": None,
    "rtx-5070-ti": None,
    "rtx-5080": None,
    "rtx-a5000": None,
    "rtx-pro-6000": None,
    "rtx-2080-ti": None,  # pastes show 11264MiB, none citable: the marketed 11 GiB, the same figure
}


@pytest.mark.parametrize("key,mib", NVIDIA_SMI_MIB.items())
def test_usable_memory_is_the_driver_total(key, mib):
    gpu = catalog.load_gpu(key)
    assert gpu.nvidia_smi_total_mib == mib
    assert gpu.memory_bytes == (mib * MIB if mib else int(gpu.memory_gb * GIB))


def test_issue_examples_t4_and_a10g():
    """Issue 9: a T4 shows about 15,360 MiB and an A10G 23,028 MiB, not 16 and 24 GiB."""
    assert catalog.load_gpu("t4").memory_bytes == 15360 * MIB
    assert catalog.load_gpu("a10g").memory_bytes == 23028 * MIB


# Cards added for issue 9: (memory_gb, memory type, bandwidth GB/s, dense fp32/tf32/fp16/bf16 TFLOPS with
# FP32 accumulate, host link GB/s per direction, TDP W, compute capability), as the entries' sources give them.
NEW_CARDS = {
    "rtx-a6000": (48, "GDDR6", 768, (38.7, 77.4, 154.8, 154.8), 32, 300, "8.6"),
    "rtx-6000-ada": (48, "GDDR6", 960, (91.1, 182.0, 364.0, 364.0), 32, 300, "8.9"),
    "l40s": (48, "GDDR6", 864, (91.6, 183.0, 362.05, 362.05), 32, 350, "8.9"),
    "rtx-4060-ti-16gb": (16, "GDDR6", 288, (22.06, 22.06, 44.13, 44.13), 16, 165, "8.9"),
    "rtx-5090": (32, "GDDR7", 1792, (104.8, 104.8, 209.5, 209.5), 64, 575, "12.0"),
    "h100-nvl": (94, "HBM3", 3900, (60.0, 417.5, 835.5, 835.5), 64, 400, "9.0"),
    "b200": (180, "HBM3e", 7700, (75.0, 1100.0, 2250.0, 2250.0), 64, 1000, "10.0"),
}


def _pinned(key: str, figures: tuple):
    """The catalog card ``key``, its figures checked against ``figures`` (``NEW_CARDS``' columns)."""
    mem_gb, mem_type, bw, peaks, link, tdp, cc = figures
    gpu = catalog.load_gpu(key)
    assert (gpu.memory_gb, gpu.memory_type, gpu.memory_bandwidth_gbs) == (mem_gb, mem_type, bw)
    assert tuple(gpu.peak_tflops[d] for d in DTYPES) == peaks
    assert (gpu.host_link_gbs, gpu.tdp_w, gpu.compute_capability) == (link, tdp, cc)
    return gpu


@pytest.mark.parametrize("key,figures", NEW_CARDS.items())
def test_new_cards_pinned_to_their_sources(key, figures):
    gpu = _pinned(key, figures)
    assert gpu.memory_bytes == NVIDIA_SMI_MIB[key] * MIB < figures[0] * GIB


def test_workstation_cards_are_not_geforce():
    """FP32-accumulate tensor math runs at full rate on the RTX A6000 and RTX 6000 Ada (the time model
    uses the data-center matmul efficiency for them), unlike the GeForce cards of the same dies."""
    for key in ("rtx-a6000", "rtx-6000-ada"):
        gpu = catalog.load_gpu(key)
        assert not gpu.is_consumer
        assert gpu.peak_tflops["bf16"] == gpu.peak_tflops["fp16"] == 2 * gpu.peak_tflops["tf32"]


def test_geforce_entries_use_the_fp32_accumulate_rate():
    """GeForce tensor math with FP32 accumulate is half the FP16-accumulate rate; the catalog carries the
    former (RTX 5090 209.5, not 419) and says which columns reportgen derived."""
    gpu = catalog.load_gpu("rtx-5090")
    assert gpu.is_consumer and gpu.is_hopper_or_newer  # cc 12.0 >= 9.0: the Hopper-era cuBLAS workspace
    assert gpu.peak_tflops["bf16"] == 209.5 and gpu.derived == ("tf32",)
    small = catalog.load_gpu("rtx-4060-ti-16gb")
    assert small.is_consumer and set(small.derived) == {"tf32", "fp16", "bf16"}
    # the derivation the notes state: 512 FLOP/clk/SM x 34 SMs x 2.535 GHz
    assert round(512 * 34 * 2.535e9 / 1e12, 2) == small.peak_tflops["bf16"]


def test_datacenter_dense_peaks_are_half_the_sparse_datasheet_figures():
    """The H100 NVL and B200 datasheets print tensor figures with sparsity; the catalog halves them."""
    nvl, b200 = catalog.load_gpu("h100-nvl"), catalog.load_gpu("b200")
    assert (nvl.peak_tflops["tf32"], nvl.peak_tflops["bf16"]) == (835 / 2, 1671 / 2)
    assert (b200.peak_tflops["tf32"], b200.peak_tflops["bf16"]) == (2200 / 2, 4500 / 2)
    assert not nvl.derived and not b200.derived


def test_the_t4_trains_at_its_power_capped_clock_not_its_boost_peak():
    """Issue 19: a 70 W T4 was estimated 1.8x faster than an RTX 3060 for llama-3.2-1b LoRA because the
    catalog gave it the datasheet's 65 TFLOPS, a boost-clock figure it cannot hold under continuous
    matmuls (NVIDIA forum thread 264462: ~24 TFLOPS measured, "power capping ... expected"). Its fp16
    peak is 320 tensor cores x 128 FLOP/clk x 585 MHz (the datasheet's base clock), marked derived."""
    from reportgen.estimate import estimate
    from reportgen.setup import TrainingSetup

    t4 = catalog.load_gpu("t4")
    assert t4.peak_tflops["fp16"] == pytest.approx(320 * 128 * 585e6 / 1e12, abs=0.05) and "fp16" in t4.derived
    model = catalog.load_model("llama-3.2-1b")
    t4_tps = estimate(model, t4, TrainingSetup(method="lora", precision="fp16-mixed"), reverse=False).time.tokens_per_s
    rtx = estimate(model, catalog.load_gpu("rtx-3060"), TrainingSetup(method="lora"), reverse=False).time.tokens_per_s
    assert t4_tps < rtx


# Cards added for issue 30, as their entries' sources give them (same columns as NEW_CARDS).
ISSUE_30_CARDS = {
    "titan-rtx": (24, "GDDR6", 672, (16.3, None, 130.5, None), 16, 280, "7.5"),
    "rtx-4080": (16, "GDDR6X", 716.8, (48.7, 48.7, 97.5, 97.5), 32, 320, "8.9"),
    "rtx-4080-super": (16, "GDDR6X", 736, (52.0, 52.0, 104.5, 104.5), 32, 320, "8.9"),
    "rtx-3080": (10, "GDDR6X", 760, (29.8, 29.8, 59.5, 59.5), 32, 320, "8.6"),
    "rtx-3080-12gb": (12, "GDDR6X", 912, (30.64, 30.64, 61.3, 61.3), 32, 350, "8.6"),
    "rtx-3090-ti": (24, "GDDR6X", 1008, (40.0, 40.0, 80.0, 80.0), 32, 450, "8.6"),
    "rtx-5060-ti-16gb": (16, "GDDR7", 448, (23.7, 23.7, 47.41, 47.41), 32, 180, "12.0"),
    "rtx-5070-ti": (16, "GDDR7", 896, (43.94, 43.94, 87.88, 87.88), 64, 300, "12.0"),
    "rtx-5080": (16, "GDDR7", 960, (56.28, 56.28, 112.55, 112.55), 64, 360, "12.0"),
    "rtx-a4000": (16, "GDDR6", 448, (19.2, 38.35, 76.7, 76.7), 32, 140, "8.6"),
    "rtx-a5000": (24, "GDDR6", 768, (27.8, 55.54, 111.08, 111.08), 32, 230, "8.6"),
    "rtx-pro-6000": (96, "GDDR7", 1792, (125.0, 251.9, 503.8, 503.8), 64, 600, "12.0"),
    "a10": (24, "GDDR6", 600, (31.2, 62.5, 125.0, 125.0), 32, 150, "8.6"),
}


@pytest.mark.parametrize("key,figures", ISSUE_30_CARDS.items())
def test_issue_30_cards_pinned_to_their_sources(key, figures):
    gpu = _pinned(key, figures)
    assert gpu.peer_p2p == (not gpu.is_consumer) and gpu.l2_cache_bytes > 0


def test_geforce_half_rate_worked_example_rtx_4080():
    """GeForce tensor math with FP32 accumulate runs at half rate: 512 FLOP per clock per SM, the RTX 4090's
    whitepaper 165.2 TFLOPS over 128 SMs at 2.52 GHz. The RTX 4080 (76 SMs, 2.505 GHz) gets 97.5, half the
    FP16-accumulate 195 that lamonoai/gpumap transcribes, marked derived; its tf32 is its fp32 rate."""
    per_sm = 165.2e12 / (128 * 2.52e9)
    assert round(per_sm) == 512
    gpu = catalog.load_gpu("rtx-4080")
    assert gpu.is_consumer and gpu.generation == "ada-geforce" and not gpu.peer_p2p
    assert gpu.peak_tflops["fp16"] == gpu.peak_tflops["bf16"] == round(512 * 76 * 2.505e9 / 1e12, 1) == 97.5
    assert gpu.peak_tflops["tf32"] == gpu.peak_tflops["fp32"] and set(gpu.derived) == {"tf32", "fp16", "bf16"}
    # the Blackwell GeForce cards use the RTX 5090's per-SM rate: 209.5 / (170 x 2.407 GHz) = 512 as well
    assert round(209.5e12 / (170 * 2.407e9)) == 512
    assert catalog.load_gpu("rtx-5080").peak_tflops["bf16"] == round(512 * 84 * 2.617e9 / 1e12, 2)


def test_workstation_full_rate_worked_example():
    """Workstation cards do not halve: 1,024 FLOP per clock per SM (RTX A6000: 154.8 / (84 SMs x 1.8 GHz)).
    The RTX A4000's datasheet 153.4 TFLOPS with sparsity halves to 76.7 = 48 SMs x 1,024 x 1.56 GHz; the RTX
    PRO 6000's whitepaper 503.8 = 188 SMs x 1,024 x 2.617 GHz. TF32 is half of FP16 on these parts."""
    assert round(154.8e12 / (84 * 1.8e9)) == 1024
    a4000, pro = catalog.load_gpu("rtx-a4000"), catalog.load_gpu("rtx-pro-6000")
    assert a4000.peak_tflops["fp16"] == 153.4 / 2 == round(48 * 1024 * 1.56e9 / 1e12, 1)
    assert pro.peak_tflops["bf16"] == round(188 * 1024 * 2.617e9 / 1e12, 1)
    for gpu in (a4000, pro, catalog.load_gpu("rtx-a5000")):
        assert not gpu.is_consumer and gpu.peer_p2p
        assert gpu.peak_tflops["tf32"] == pytest.approx(gpu.peak_tflops["fp16"] / 2, abs=0.01)
    assert (a4000.generation, pro.generation) == ("ampere-ga10x", "blackwell")


def test_titan_rtx_is_a_full_rate_turing_card_not_geforce():
    """TITAN RTX: 576 tensor cores x 128 FLOP/clk x 1.77 GHz = 130.5 TFLOPS with FP32 accumulate (GA102
    whitepaper, as quoted in arXiv 2212.14034), where the GeForce RTX 2080 Ti runs at half its FP16-accumulate
    rate (56.9 of 113.8, Turing whitepaper): it is no consumer card to the time model, and has no bf16/tf32."""
    from dataclasses import replace

    titan = catalog.load_gpu("titan-rtx")
    assert titan.peak_tflops["fp16"] == round(576 * 128 * 1.77e9 / 1e12, 1) == 130.5
    assert (titan.peak_tflops["bf16"], titan.peak_tflops["tf32"], titan.supports_bf16) == (None, None, False)
    assert not titan.is_consumer and titan.generation == "turing" and titan.peer_p2p
    geforce = replace(titan, name="NVIDIA GeForce RTX 2080 Ti")
    assert geforce.is_consumer and geforce.generation == "turing-geforce"


def _estimate_json(capsys, gpu: str) -> dict:
    import json

    from reportgen.cli import main

    assert main(["estimate", "--model", "tinyllama-1.1b", "--gpu", gpu, "--method", "lora", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_new_card_answers_and_says_whose_rates_it_uses(capsys):
    """Issue 30: `reportgen estimate --gpu rtx-4080` answered "unknown GPU". It now answers, and its notes say
    the GEMM rate is another card's: the GeForce cards' pooled fit to published RTX 2080 Ti/3090/4090 runs; a Blackwell GeForce
    card borrows that fit, a Blackwell workstation card Hopper's (our H100)."""
    notes = " ".join(_estimate_json(capsys, "rtx-4080")["notes"])
    assert "NVIDIA GeForce RTX 4080: its GEMM rate" in notes and "the GeForce cards' pooled fit to" in notes
    assert "3090s and 4090s" in notes
    notes = " ".join(_estimate_json(capsys, "rtx-5080")["notes"])
    assert "its GEMM rate is estimated from Ada GeForce's" in notes and "Blackwell GeForce card" in notes
    notes = " ".join(_estimate_json(capsys, "rtx-pro-6000")["notes"])
    assert "its GEMM rate is estimated from Hopper's" in notes and "a Blackwell card" in notes


def test_estimate_capacity_is_the_driver_total_where_one_was_read(capsys):
    """The RTX 4080 SUPER's cited nvidia-smi total (16,376 MiB) is the capacity the verdict uses, 8 MiB under
    the marketed 16 GiB that the RTX 4080 (no citable paste) keeps."""
    sup, plain = _estimate_json(capsys, "rtx-4080-super"), _estimate_json(capsys, "rtx-4080")
    assert sup["capacity"] == 16376 * MIB and plain["capacity"] == 16 * GIB
    assert plain["margin"] - sup["margin"] == pytest.approx(8 * MIB, abs=1)


def test_rtx_2080_ti_pinned_to_its_sources():
    """The RTX 2080 Ti as its entry's sources give it (same columns as ISSUE_30_CARDS): 616 GB/s GDDR6, PCIe 3.0
    x16, 250 W reference board, 5.5 MB L2 (deviceQuery's 5,767,168 bytes), no bf16 or tf32 (Turing)."""
    gpu = _pinned("rtx-2080-ti", (11, "GDDR6", 616, (13.4, None, 53.8, None), 16, 250, "7.5"))
    assert gpu.l2_cache_bytes == 5767168 and gpu.memory_bytes == 11 * GIB and not gpu.supports_bf16
    assert gpu.is_consumer and not gpu.peer_p2p and gpu.generation == "turing-geforce"


def test_rtx_2080_ti_half_rate_at_the_reference_clock():
    """GeForce Turing halves FP16 tensor math with FP32 accumulate: 544 tensor cores x 128 FLOP/clk x 1.545 GHz
    (reference boost) / 2 = 53.8 TFLOPS, the whitepaper's Founders Edition 56.9 (of 113.8 with FP16 accumulate)
    scaled from 1,635 to 1,545 MHz; per SM that is 512 FLOP/clk, half the TITAN RTX's 1,024 on the same die."""
    gpu, titan = catalog.load_gpu("rtx-2080-ti"), catalog.load_gpu("titan-rtx")
    assert gpu.peak_tflops["fp16"] == round(544 * 128 * 1.545e9 / 2 / 1e12, 1) == round(56.9 * 1545 / 1635, 1)
    assert round(113.8 / 56.9) == 2 and gpu.derived == ("fp32", "fp16")
    assert gpu.peak_tflops["fp32"] == round(4352 * 2 * 1.545e9 / 1e12, 1)
    assert round(gpu.peak_tflops["fp16"] * 1e12 / (68 * 1.545e9)) == 512
    assert round(titan.peak_tflops["fp16"] * 1e12 / (72 * 1.77e9)) == 1024


def test_rtx_2080_ti_estimate_uses_the_geforce_fit_and_says_so(capsys):
    """`reportgen estimate --gpu rtx-2080-ti --precision fp16-mixed` answers with the GeForce Turing peak (53.8
    TFLOPS, the hardware-FLOP utilisation's denominator) and the GeForce GEMM fit, whose rows now include
    RTX 2080 Ti runs (``constants.MATMUL_EVIDENCE['turing-geforce']``)."""
    import json

    from reportgen.cli import main
    from reportgen.estimate import constants as K

    assert K.MATMUL_EFFICIENCY["turing-geforce"] == K.MATMUL_EFFICIENCY["ampere-ga10x-geforce"]
    argv = ["estimate", "--model", "tinyllama-1.1b", "--gpu", "rtx-2080-ti", "--method", "lora",
            "--precision", "fp16-mixed", "--format", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    notes = " ".join(out["notes"])
    assert "NVIDIA GeForce RTX 2080 Ti: its GEMM rate" in notes and "RTX 2080 Tis" in notes
    t = out["time"]
    assert t["peak_dtype"] == "fp16"
    assert t["hardware_flops_per_token"] * t["tokens_per_s"] / t["hfu"] == pytest.approx(53.8e12)
    assert out["capacity"] == 11 * GIB
