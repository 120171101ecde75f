"""Peak reserved memory: the free blocks the caching allocator keeps and the segments it adds after the
peak (memory.cached_free_bytes), its release of them when the card is full
(memory.allocator_limited_reserved), and the agreement of both with the allocator simulation of the
committed traced cases and with the H100 measurements."""

import statistics
from pathlib import Path

import pytest

from reportgen import catalog
from reportgen.estimate import constants as K
from reportgen.estimate import estimate
from reportgen.estimate.memory import CACHE_SHARES, estimate_memory
from reportgen.setup import TrainingSetup

L2 = catalog.load_model("llama-2-7b")
RTX4090 = catalog.load_gpu("rtx-4090")
ROOT = Path(__file__).resolve().parent.parent


def qlora(batch: int) -> TrainingSetup:
    return TrainingSetup(method="qlora", precision="bf16-mixed", grad_ckpt=True, seq=2048, batch=batch)


H100 = catalog.load_gpu("h100-sxm")
L1 = catalog.load_model("llama-3.2-1b")  # vocabulary 128,256, hidden 2,048, tied embedding
L3 = catalog.load_model("llama-3.2-3b")  # hidden 3,072, intermediate 8,192, 28 layers, tied
MEASURED = ROOT / "results" / "validation" / "measured"


def shares(inputs: dict) -> int:
    return int(sum(getattr(K, c) * inputs[n] for n, c in CACHE_SHARES.items()))


def test_worked_example_full_fine_tuning_llama32_3b():
    """Llama-3.2-3B full, bf16-mixed, 2,048 tokens. The 16-bit head output, 2,048 x 128,256 x 2 =
    525,336,576 bytes, is cached at the loss backward. fp32 gradients larger than the largest activation
    block (2,048 x 8,192 x 2 = 33,554,432): q and o (3,072^2 x 4 = 37,748,736 each) and gate, up, down
    (3,072 x 8,192 x 4 = 100,663,296 each), 377,487,360 per layer, 10,569,646,080 in 28 layers, less
    what the loss's three fp32 blocks hold (3 x 2,048 x 128,256 x 4 = 3,152,019,456): 7,417,626,624.
    The embedding's fp32 gradient, 128,256 x 3,072 x 4 = 1,576,009,728, outgrows the head block: a
    segment of its own (the allocator simulation shows it, ``aten.embedding_dense_backward``)."""
    mem = estimate_memory(L3, TrainingSetup(method="full", precision="bf16-mixed", seq=2048), H100)
    c = mem.cache_inputs
    assert c["head_block"] == 525_336_576
    assert c["grad_excess"] == 7_417_626_624
    assert c["embed_grad_segment"] == 1_576_009_728
    assert c["stateless"] == 0 and c["optimizer_segments"] == 0 and c["scores"] == 0
    assert mem.peak_reserved - mem.peak_allocated == (shares(c) + 1_576_009_728 + K.ALLOCATOR_SEGMENTS_BYTES)


def test_pure_bf16_embedding_gradient_fits_the_head_block():
    """In pure bf16 the 1B's embedding gradient (128,256 x 2,048 x 2) is exactly the head block's size:
    no segment of its own."""
    mem = estimate_memory(L1, TrainingSetup(method="full", precision="bf16", seq=2048), H100)
    assert mem.cache_inputs["embed_grad_segment"] == 0


def test_adafactor_fp32_copies_worked_example():
    """transformers' Adafactor on a bf16 parameter holds four fp32 tensors of its size at once
    (grad.float(), p.float(), the squared update, the next update): for the 1B's tied embedding
    4 x 128,256 x 2,048 = 1,050,673,152 bytes each. The loss's fp32 blocks are as large (2,048 tokens
    x 128,256 x 4), and two of the three are whole when the step runs (the backward's first
    gradients split one): two new segments. SGD-like otherwise: Adafactor keeps almost no state, and
    as every bf16 gradient fits an activation block here (8,192 x 2,048 x 2 = 2,048 x 8,192 x 2), the
    free block no state takes is a loss block."""
    mem = estimate_memory(L1, TrainingSetup(method="full", precision="bf16", optimizer="adafactor", seq=2048), H100)
    assert mem.cache_inputs["optimizer_segments"] == 2 * 1_050_673_152
    assert mem.cache_inputs["stateless"] == 1_050_673_152
    mixed = estimate_memory(L1, TrainingSetup(method="full", precision="bf16-mixed", optimizer="adafactor",
                                              seq=2048), H100)
    assert mixed.cache_inputs["optimizer_segments"] == 0  # fp32 parameters: two copies, two whole blocks


@pytest.mark.parametrize("case_id", [
    "llama-3.2-1b.h100-sxm.full.f0333227",  # Adafactor: was +29.4 %
    "llama-3.2-1b.h100-sxm.full.a800cfa8",  # torchao CPU offload of the optimizer: was -12.0 %
    "llama-3.2-1b.h100-sxm.full.6af46f24",  # SGD: was -7.0 %
    "llama-3.2-3b.h100-sxm.full.ba7ba527",  # full bf16-mixed: was -8.4 %
    "tinyllama-1.1b.h100-sxm.full.ba7ba527",  # full bf16-mixed, 32k vocabulary: was -6.9 %
    "llama-3.2-1b.h100-sxm.lora.ca657bc0",  # eager attention: was +6.5 %
    "llama-3.2-1b.h100-sxm.lora.afb26703",  # fp32, SDPA's math path
    "llama-3.1-8b.h100-sxm.lora.aebaf781",  # releases its cache to fit 80 GB: was +7.9 %
])
def test_reserved_of_the_former_outliers_is_within_5_percent_of_the_h100(case_id):
    import json

    (path,) = MEASURED.glob(f"{case_id}.*.json")
    doc = json.loads(path.read_text())
    case, f = doc["case"], doc["measurement"]
    mem = estimate_memory(catalog.load_model(case["model"]), TrainingSetup.model_validate(case["setup"]),
                          catalog.load_gpu(case["gpu"]))
    assert mem.peak_reserved == pytest.approx(f["peak_reserved"], rel=0.05)
    assert mem.device_total == pytest.approx(f["device_used"], rel=0.05)


def test_a_step_that_releases_its_cache_reserves_little_more_than_its_peak():
    """At batch 8 the allocated peak (about 19 GiB) fits a 24 GiB card but the cached blocks would not:
    the allocator releases them and retries, and runs on afterwards with the allocated peak and
    ``CACHED_AFTER_RELEASE`` working sets cached; the point estimate does not count it as fitting
    without that (it asks the card for the unlimited figure), and the verdict is tight, not a no."""
    est = estimate(L2, RTX4090, qlora(8), reverse=False)
    mem = est.memory
    usable = RTX4090.memory_bytes - K.CUDA_CONTEXT_BYTES
    assert mem.peak_allocated < usable and mem.cache_released > 0
    expected = min(usable, mem.peak_allocated + int(K.CACHED_AFTER_RELEASE * mem.cache_inputs["working"])
                   + K.ALLOCATOR_SEGMENTS_BYTES)
    assert mem.peak_reserved == expected
    assert mem.card_demand == mem.peak_reserved + mem.cache_released + K.CUDA_CONTEXT_BYTES > RTX4090.memory_bytes
    assert est.fits is False and est.verdict == "tight"
    assert any("releases its cached blocks" in n for n in est.notes)


def test_largest_batch_does_not_count_on_releasing_the_cache():
    est = estimate(L2, RTX4090, qlora(1))
    best = estimate(L2, RTX4090, qlora(est.max_batch), reverse=False)
    over = estimate(L2, RTX4090, qlora(est.max_batch + 1), reverse=False)
    assert best.memory.cache_released == 0 and best.fits
    assert not over.fits


def test_a_step_whose_allocated_peak_does_not_fit_keeps_its_reserved():
    mem = estimate_memory(L2, qlora(16), RTX4090)
    assert mem.peak_allocated > RTX4090.memory_bytes
    assert mem.cache_released == 0 and mem.peak_reserved > mem.peak_allocated


def _calibrate():
    import importlib.util

    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "scripts" / "calibrate.py")
    cal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cal)
    return cal


def test_estimated_reserved_predicts_the_allocator_simulation_of_traced_cases_it_was_not_fitted_to():
    """The committed traced cases (sweeps/traced.yaml, replayed through trace/allocator.py), each
    predicted with the cached-free shares fitted to all the others (leave-one-out, the constants are
    fitted to these cases by scripts/calibrate.py): today a median 1.1 % from the simulation's
    reserved, signed -0.3 %, worst 8.9 % (141 cases). It was a median 3.9 % low, up to 16 % low, with
    a fixed 10 % share of the transient bytes. The figure out of sample is test_accuracy.py's: the H100
    measurements, to which the shares were not fitted."""
    cal = _calibrate()
    free, _ = cal.traced_samples(ROOT / "results")

    def gap(shares, s):
        return (s["allocated"] + sum(a * v for a, v in zip(shares, s["x"])) + s["other"] - s["reserved"]) / s["reserved"]

    held_out = [gap(cal.solve_cached_free(free[:i] + free[i + 1:]), s) for i, s in enumerate(free)]
    assert len(held_out) >= 130
    assert statistics.median(abs(g) for g in held_out) <= 0.013
    assert abs(statistics.median(held_out)) <= 0.005
    assert max(abs(g) for g in held_out) <= 0.095
    # and the shipped shares are the fit (a constant edited by hand, not refitted, fails here)
    shipped = [getattr(K, c) for c in CACHE_SHARES.values()]
    assert shipped == pytest.approx(cal.solve_cached_free(free), abs=6e-4)


def test_calibrate_recovers_the_cached_free_shares(capsys):
    """scripts/calibrate.py's least-squares fit gets back the shares that made synthetic samples."""
    cal = _calibrate()
    truth = [1.7, 0.4, 0.8, 0.9, 0.15]
    samples = []
    for i in range(9):
        x = [(i % 3 + 1) * 1e8, (i % 2) * 5e8, (i % 4) * 3e8, (i % 5 == 2) * 1e9, (i % 3 == 1) * (i + 1) * 1e9]
        alloc = 20e9 + i * 1e9
        samples.append({"allocated": alloc, "reserved": alloc + sum(a * v for a, v in zip(truth, x)) + 5e7,
                        "x": x, "other": 5e7})
    fit = cal.fit_cached_free(samples, "synthetic")
    assert fit == pytest.approx(truth)
    assert "held-out |error| of reserved median 0.0%" in capsys.readouterr().out
    assert cal.fit_cached_free(samples[:6], "thin") is None  # five shares need seven cases


def test_validation_compares_reserved_like_with_like():
    """The validation page's reserved gap: the estimate's demand (before releasing cached blocks) against
    an unlimited replay; the card-limited figures against a replay that was itself limited."""
    from reportgen.report.traced import comparison

    base = {"id": "x", "model": "m", "gpu": "g", "color": "c", "label": "l", "batch": 1, "seq": 8, "sweep": "s",
            "peak_allocated": 90, "peak_reserved": 100, "cache_released": 20}
    free = comparison({**base, "traced": {"peak_allocated": 90, "peak_reserved": 125, "cache_limited": False}})
    assert free["est_reserved"] == 120 and free["reserved_gap"] == pytest.approx(-0.04)
    limited = comparison({**base, "traced": {"peak_allocated": 90, "peak_reserved": 100, "cache_limited": True}})
    assert limited["est_reserved"] == 100 and limited["reserved_gap"] == 0
