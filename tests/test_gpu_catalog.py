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


@pytest.mark.parametrize("key,figures", NEW_CARDS.items())
def test_new_cards_pinned_to_their_sources(key, figures):
    mem_gb, mem_type, bw, peaks, link, tdp, cc = figures
    gpu = catalog.load_gpu(key)
    assert (gpu.memory_gb, gpu.memory_type, gpu.memory_bandwidth_gbs) == (mem_gb, mem_type, bw)
    assert tuple(gpu.peak_tflops[d] for d in DTYPES) == peaks
    assert (gpu.host_link_gbs, gpu.tdp_w, gpu.compute_capability) == (link, tdp, cc)
    assert gpu.memory_bytes == NVIDIA_SMI_MIB[key] * MIB < mem_gb * GIB


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
