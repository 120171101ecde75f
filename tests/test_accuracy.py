"""The estimator's error against independent truth, with bounds just above today's figures, so that a
change that makes any number worse fails here (not a loose ceiling that only catches disasters).

* Our own CUDA measurements (``results/validation/measured/``, one H100, read from the measurement
  files alone as a fresh clone has them): peak allocated, peak reserved, the device total against
  NVML, and the step time where the provenance rule lets each count for the case's card; the
  out-of-memory run must be foreseen.
* The measurements other projects published (``reportgen compare-published``): memory per source and
  overall, median and signed median; tokens/s.

The figures when these bounds were set (in-sample: the time constants are fitted to these step times;
their leave-one-out error is ``scripts/calibrate.py``'s, 8.3 % median over these and the TRL cases then, 6.8 % today; refitted
2026-11-27 to 53 step times, 34 of them timed to today's stopping rule):

| quantity | n | median abs. | signed | worst |
|:--|--:|--:|--:|--:|
| peak allocated | 51 | 0.01 % | -0.01 % | 0.59 % |
| peak reserved | 51 | 0.57 % | -0.11 % | 4.56 % |
| device total | 51 | 0.54 % | -0.11 % | 4.02 % |
| step time, no offload | 48 | 6.7 % | +1.5 % | 35.8 % |
| step time, optimizer offload | 1 | | | -12.4 % (the host AdamW rate measured by ``profile-gpu``; +206 % assumed) |
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from reportgen import catalog, store
from reportgen.estimate import estimate
from reportgen.provenance import provenance_of
from reportgen.published.compare import compare, source_key
from reportgen.setup import TrainingSetup

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "results" / "validation"
CSV = ROOT / "data" / "published_measurements.csv"

#: (median |error|, |signed median|, worst |error|) bounds, a little above the figures in the docstring
BOUNDS = {"peak_allocated": (0.0003, 0.0003, 0.007), "peak_reserved": (0.0065, 0.002, 0.048),
          "device_total": (0.0065, 0.002, 0.043), "step_s": (0.07, 0.016, 0.37)}
#: the one measured optimizer-offload step: -12.4 % since the host AdamW rate is the H100 machine's measured
#: one (``reportgen profile-gpu``, constants.py) and the time constants were refitted; it was +206 % with the
#: assumed 1e9 parameters/s
OFFLOAD_STEP_MAX = 0.14


def _errors() -> tuple[dict[str, list[float]], list[float], list[str]]:
    errors = {q: [] for q in BOUNDS}
    offload, oom_verdicts = [], []
    for r in store.load_measured(MEASURED, warn=lambda m: None):
        m, case = r["measurement"], r["case"]
        setup = TrainingSetup.model_validate(case["setup"])
        e = estimate(catalog.load_model(case["model"]), catalog.load_gpu(case["gpu"]), setup, reverse=False)
        if m["status"] == "oom":
            oom_verdicts.append(e.verdict)
            continue
        f, prov = m["measurement"], provenance_of(m)
        if prov.memory_counts_for(case["gpu"]):
            errors["peak_allocated"].append(e.memory.peak_allocated / f["peak_allocated"] - 1)
            errors["peak_reserved"].append(e.memory.peak_reserved / f["peak_reserved"] - 1)
            errors["device_total"].append(e.memory.device_total / f["device_used"] - 1)
        if prov.speed_counts_for(case["gpu"]):
            (offload if setup.offload.value != "none" else errors["step_s"]).append(e.time.step_s / f["step_s"] - 1)
    return errors, offload, oom_verdicts


@pytest.fixture(scope="module")
def measured():
    return _errors()


@pytest.mark.parametrize("quantity", list(BOUNDS))
def test_error_against_our_h100_measurements_stays_within_todays_bounds(measured, quantity):
    errors = measured[0][quantity]
    median_bound, signed_bound, worst_bound = BOUNDS[quantity]
    assert len(errors) >= (48 if quantity == "step_s" else 51)  # every committed case that counts
    med = statistics.median(abs(x) for x in errors)
    signed = statistics.median(errors)
    worst = max(abs(x) for x in errors)
    assert med <= median_bound, f"{quantity}: median |error| {med:.2%} > {median_bound:.2%}"
    assert abs(signed) <= signed_bound, f"{quantity}: signed median {signed:+.2%}"
    assert worst <= worst_bound, f"{quantity}: worst |error| {worst:.2%} > {worst_bound:.2%}"


def test_the_measured_out_of_memory_is_foreseen_and_offload_is_bounded(measured):
    _, offload, oom_verdicts = measured
    assert oom_verdicts == ["does not fit"]
    assert len(offload) == 1 and abs(offload[0]) <= OFFLOAD_STEP_MAX


@pytest.fixture(scope="module")
def published():
    return compare(CSV)


def _by_source(rows: list[dict]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(source_key(r["source"]), []).append(r["rel_error"])
    return out


#: published memory rows per source: (rows, median |error|, |signed median|, worst |error|) bounds, a
#: little above today's (fsdp_qlora 19 rows 3.66 % / +3.14 % / 25.9 %, the reserved figures of 2-8 GPUs
#: with what loading and FSDP wrapping cached; litgpt 14 rows 2.56 % / -1.01 % / 6.4 %;
#: ml-cross-entropy's two loss-only rows exact)
PUBLISHED_MEMORY = {"AnswerDotAI/fsdp_qlora": (19, 0.04, 0.035, 0.27), "Lightning-AI/litgpt": (14, 0.03, 0.015, 0.07),
                    "apple/ml-cross-entropy": (2, 0.001, 0.001, 0.001)}


def test_published_memory_overall_and_per_source(published):
    """Median |error|, signed median and worst |error| of the published memory rows, overall (today:
    35 rows, 3.14 % / +0.41 % / 25.9 %), per source, and on the multi-GPU rows (19 rows, 3.66 % /
    +3.14 %)."""
    assert len(published["rows"]) == 35
    assert published["median_abs_rel_error"] <= 0.035
    assert abs(published["median_rel_error"]) <= 0.01
    assert max(abs(r["rel_error"]) for r in published["rows"]) <= 0.27
    by = _by_source(published["rows"])
    assert set(by) == set(PUBLISHED_MEMORY)
    for source, (n, med, signed, worst) in PUBLISHED_MEMORY.items():
        errors = by[source]
        assert len(errors) == n, source
        assert statistics.median(abs(e) for e in errors) <= med, source
        assert abs(statistics.median(errors)) <= signed, source
        assert max(abs(e) for e in errors) <= worst, source
        assert published["by_source"][source]["median_rel_error"] == pytest.approx(statistics.median(errors), abs=1e-4)
    multi = published["multi_gpu"]
    assert multi["memory_rows"] == 19
    assert multi["memory_median_abs_rel_error"] <= 0.04 and abs(multi["memory_median_rel_error"]) <= 0.035


def test_published_tokens_per_second(published):
    """The 33 fsdp_qlora rows with a rate (all on 2-8 GPUs; today median |error| 7.5 %, signed +2.1 %: their
    wall times include loading the model, so the estimate of the loop should be above them; worst +115 % and
    +112 %: R029 and R028, QLoRA of Llama-2 70B on 4 and 2 RTX 6000 Ada; then +69 %, R001, QLoRA with FSDP at
    batch 1 on the two RTX 3090s of a machine with 'slow PCI lanes', estimated on PCIe 3.0 x8), and the 15 rows
    of data/consumer_speed.csv that are mapped (whyNLP/tinyllama on 1 RTX 3090, 4090 and 1-8 A6000s,
    LLaMA-Factory runs on 1 and 4 RTX 4090s in IST-DASLab/llmq, both with Liger's or equal fused kernels,
    minimind on an RTX 3090 and RTX 2080 Tis, Axolotl's Qwen3-14B QLoRA example on a T4, -18 %: median 4.1 %,
    worst +27 %, minimind's batch-8 run on 2080 Tis); all 48 together median 5.9 %. The three fsdp_qlora rows on
    2-8 RTX A5000s joined on 2026-11-29 (they had been refused as "not in the catalog"), and with them Ampere GA10x
    got a GEMM rate of its own (0.5171, from them and whyNLP's A6000 rows; it borrowed GA100's 0.7041, which put
    the 8-card A6000 run at +39 %): all 45 before were at 6.8 %. They were 11.7 %, 12.8 % and
    12.3 % before three corrections of the model, none fitted to these rows: Liger's fused loss sums the head's
    gradient chunk by chunk (llmq's runs), the attention kernels' rate follows the card's GEMM rate, and a cast
    the setup does not need no longer moves bytes (``work._k``: every 4-bit linear of a bf16 QLoRA step was
    charged two casts' traffic); and 6.1 % and 7.5 % before llmq's rows were read as step 2's own seconds
    (``consumer.tqdm_step_seconds``) instead of tqdm's average that still carried step 1's warm-up."""
    speed = published["speed"]
    fsdp = [r["rel_error"] for r in speed["rows"] if r["id"].startswith("R")]
    consumer = [r["rel_error"] for r in speed["rows"] if r["id"].startswith("CS")]
    assert len(fsdp) == 33 and len(consumer) == 15
    assert statistics.median(abs(e) for e in fsdp) <= 0.09
    assert 0 <= statistics.median(fsdp) <= 0.06
    assert max(abs(e) for e in fsdp) <= 1.2
    assert sorted(abs(e) for e in fsdp)[-3] <= 0.7  # beyond the two RTX 6000 Ada rows, within 70 %
    assert statistics.median(abs(e) for e in consumer) <= 0.05 and max(abs(e) for e in consumer) <= 0.30
    assert speed["median_abs_rel_error"] <= 0.07
    multi = published["multi_gpu"]
    assert multi["speed_rows"] == 37 and multi["speed_median_abs_rel_error"] <= 0.08
