"""Variable-length data (reportgen/estimate/lengths.py): padded length, real tokens, and what they do
to time and memory; the harness's micro-batches follow the same distribution."""

import math

import pytest

from reportgen import catalog
from reportgen.estimate import estimate
from reportgen.estimate.lengths import expected_longest, exponential_scale, padded_length, real_tokens_per_step
from reportgen.setup import TrainingSetup


def test_exponential_scale_matches_the_mean():
    """mean 200, longest 512: theta solves theta (1 - exp(-512/theta)) = 200."""
    theta = exponential_scale(200, 512)
    assert theta * (1 - math.exp(-512 / theta)) == pytest.approx(200, rel=1e-9)
    assert math.isinf(exponential_scale(512, 512))


def test_expected_longest_worked_example():
    """b = 1 is the mean; the closed form theta * sum U^k/k equals a direct numerical integration of
    1 - (1 - exp(-x/theta))^b over [0, 512]; many samples approach the longest."""
    theta = exponential_scale(200, 512)
    assert expected_longest(200, 512, 1) == pytest.approx(200, rel=1e-9)
    n = 200_000
    integral = sum(1 - (1 - math.exp(-(i + 0.5) * 512 / n / theta)) ** 8 for i in range(n)) * 512 / n
    assert expected_longest(200, 512, 8) == pytest.approx(integral, rel=1e-6)
    assert 200 < expected_longest(200, 512, 8) < expected_longest(200, 512, 64) < 512


def test_padding_modes():
    base = dict(seq=512, seq_mean=200, batch=8, accum=2)
    longest, mx, packed = (TrainingSetup(padding=p, **base) for p in ("longest", "max", "packed"))
    assert padded_length(mx) == padded_length(packed) == 512 and 200 < padded_length(longest) < 512
    assert real_tokens_per_step(longest) == real_tokens_per_step(mx) == 8 * 2 * 200
    assert real_tokens_per_step(packed) == 8 * 2 * 512
    assert padded_length(TrainingSetup(seq=512)) == 512 and real_tokens_per_step(TrainingSetup(seq=512)) == 512


def test_time_counts_real_tokens_memory_the_longest_batch():
    m, g = catalog.load_model("llama-3.2-1b"), catalog.load_gpu("a100-80gb")
    full = estimate(m, g, TrainingSetup(method="lora", seq=512, batch=8), reverse=False)
    mx = estimate(m, g, TrainingSetup(method="lora", seq=512, batch=8, seq_mean=200, padding="max"), reverse=False)
    longest = estimate(m, g, TrainingSetup(method="lora", seq=512, batch=8, seq_mean=200), reverse=False)
    packed = estimate(m, g, TrainingSetup(method="lora", seq=512, batch=8, seq_mean=200, padding="packed"),
                      reverse=False)
    # padding to 512: the same step as fixed-length data but for the mask's k/v copies to every head (transformers'
    # repeat_kv, work.attention_core), 200 of every 512 tokens are data
    assert full.time.step_s < mx.time.step_s < 1.01 * full.time.step_s
    assert mx.time.tokens_per_s == pytest.approx(8 * 200 / mx.time.step_s)
    assert packed.time.tokens_per_s == pytest.approx(full.time.tokens_per_s)
    assert mx.time.tokens_per_s < longest.time.tokens_per_s < full.time.tokens_per_s
    # memory at the longest micro-batch. A padded SDPA batch passes a mask (activations.sdpa_masked_layers):
    # each of the 16 layers keeps SDPA's bf16 additive copy of it, 8 x 512^2 x 2 bytes, and k and v
    # repeated from 8 to 32 heads (transformers' repeat_kv instead of enable_gqa), 2 x 24 x 64 x 2
    # bytes per token of 8 x 512; the boolean mask itself dies with the forward
    assert packed.memory.peak_allocated == full.memory.peak_allocated
    assert mx.memory.peak_allocated - full.memory.peak_allocated == 16 * (8 * 512**2 * 2 + 2 * 24 * 64 * 2 * 8 * 512)
    assert any("variable lengths" in n for n in longest.notes)


def test_seq_mean_cannot_exceed_seq():
    from reportgen.setup import SetupError

    with pytest.raises(SetupError, match="cannot exceed seq"):
        TrainingSetup(seq=512, seq_mean=600)


def test_harness_batches_follow_the_distribution():
    torch = pytest.importorskip("torch")
    from reportgen.measure.data import IGNORE_INDEX, MicroBatches

    setup = TrainingSetup(seq=512, seq_mean=200, batch=8, accum=1)
    data = MicroBatches(setup, 1000, "cpu", torch.Generator().manual_seed(0))
    first = data.next_step(longest=True)
    ids, mask, labels = first[0]
    assert ids.shape == (8, 512) and mask[0].sum() == 512  # the first sample is the longest possible
    assert (labels[mask == 0] == IGNORE_INDEX).all()
    widths, real = [], []
    for _ in range(400):
        (ids, mask, _), = data.next_step()
        widths.append(ids.shape[1])
        real.append(int(mask.sum()))
    assert sum(real) / len(real) / 8 == pytest.approx(200, rel=0.05)  # the mean sample length
    assert sum(widths) / len(widths) == pytest.approx(expected_longest(200, 512, 8), rel=0.05)
