"""Variable-length data: how long a padded micro-batch is, and how many of its tokens are real.

Fine-tuning sets hold samples of different lengths. A setup gives the longest (``seq``, after
truncation) and, optionally, the mean (``seq_mean``), and how batches are formed (``padding``):

* ``max``: every sample padded to ``seq`` (``padding="max_length"`` in a tokenizer call);
* ``longest``: padded to the longest sample of its micro-batch (transformers'
  ``DataCollatorWithPadding``/``DataCollatorForSeq2Seq`` and TRL's collators, ``padding=True``);
* ``packed``: samples concatenated into rows of exactly ``seq`` tokens (TRL ``packing=True``,
  torchtune ``packed=True``): no padding.

**Memory** follows the longest micro-batch of the run, which every setup here reaches: with a
sample of ``seq`` tokens in the data, some micro-batch is ``seq`` long. So memory is estimated at
``seq`` whatever the padding. **Time** follows the padded length the kernels really process, and
**throughput** counts real tokens only (padding is computed and thrown away).

The mean alone does not fix the distribution, so lengths are modelled by the maximum-entropy
distribution of a positive quantity with a given mean, the exponential (Jaynes 1957), truncated at
``seq`` (longer samples are cut): ``L = min(seq, X)``, ``X ~ Exp(theta)``, with ``theta`` solving
``E[L] = theta (1 - exp(-seq/theta)) = seq_mean``. The expected longest of ``b`` samples is

    E[max(L_1..L_b)] = integral_0^seq 1 - (1 - exp(-x/theta))^b dx = theta * sum_{k=1..b} U^k / k,
    with U = 1 - exp(-seq/theta)

(substitute ``u = 1 - exp(-x/theta)`` and expand ``(1 - u^b)/(1 - u)``); for ``b = 1`` it is the
mean, and it tends to ``seq`` as ``b`` grows.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache
from itertools import accumulate

from reportgen.errors import UserError
from reportgen.setup import Padding, SetupError, TrainingSetup


@lru_cache(maxsize=4096)
def exponential_scale(mean: float, longest: float) -> float:
    """``theta`` with ``theta (1 - exp(-longest/theta)) = mean`` (bisection; the left side grows with
    theta from 0 to ``longest``). ``inf`` when the mean is the longest length (every sample full)."""
    if mean >= longest:
        return math.inf
    lo, hi = 1e-9 * longest, longest
    while hi * (1 - math.exp(-longest / hi)) < mean:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid * (1 - math.exp(-longest / mid)) < mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def expected_longest(mean: float, longest: float, batch: int) -> float:
    """Expected length of the longest of ``batch`` samples (module docstring)."""
    theta = exponential_scale(mean, longest)
    if math.isinf(theta):
        return float(longest)
    u = 1 - math.exp(-longest / theta)
    return min(float(longest), theta * sum(u ** k / k for k in range(1, batch + 1)))


def padded_length(setup: TrainingSetup) -> float:
    """Tokens per row the kernels process (padding included), on average over micro-batches: the
    dataset's own figure when its lengths are known (``seq_padded``, ``empirical_longest``)."""
    if setup.seq_mean is None or setup.padding != Padding.longest:
        return float(setup.seq)
    if setup.seq_padded is not None:
        return float(setup.seq_padded)
    return expected_longest(setup.seq_mean, setup.seq, setup.batch)


def empirical_longest(values, counts, cap: int, batch: int) -> float:
    """Expected longest of ``batch`` samples drawn at random from a dataset's length histogram, each cut
    at ``cap`` tokens: with ``F`` the histogram's cumulative share, ``E[max] = sum_x x (F(x)^b - F(x-)^b)``
    over its distinct truncated lengths ``x`` (the maximum of ``b`` independent draws has the
    distribution ``F^b``)."""
    total = sum(counts)
    hist: dict[int, int] = {}
    for v, c in zip(values, counts):
        hist[min(v, cap)] = hist.get(min(v, cap), 0) + c
    out, below = 0.0, 0
    for x in sorted(hist):
        f_before, below = below / total, below + hist[x]
        out += x * ((below / total) ** batch - f_before ** batch)
    return out


def apply_lengths(setup, lengths, seq_given: bool):
    """The setup with a dataset's lengths (``datalengths.Lengths``): ``seq`` the cut (``--seq`` or the
    config's when given, else the dataset's longest sample), ``seq_mean`` the mean after the cut, and
    with padding to the longest sample ``seq_padded``, the expected longest of a micro-batch
    (``empirical_longest``); a setup the lengths make invalid is the user's error, naming the file."""
    cap = setup.seq if seq_given else lengths.longest
    update = {"seq": cap, "seq_mean": max(1, round(lengths.mean(cap))), "seq_padded": None}
    if setup.padding == Padding.longest:
        update["seq_padded"] = round(empirical_longest(lengths.values, lengths.counts, cap, setup.batch))
    try:
        return setup.model_copy(update=update)
    except SetupError as exc:
        raise UserError(f"--lengths {lengths.source}: {exc.message}",
                        hint="--seq sets the length samples are cut at") from None


#: the most samples ``grouped_padded_length`` arranges (a larger dataset is drawn from, with a fixed seed)
GROUPED_SAMPLES_MAX = 100_000


def grouped_padded_length(lengths, cap: int, batch: int, seed: int = 0) -> float:
    """The mean padded row length of micro-batches formed by transformers' ``group_by_length``
    (``trainer_pt_utils.get_length_grouped_indices``, 5.24: the samples randomly permuted, cut into mega-batches
    of ``min(50, n // (4 batch)) x batch``, each sorted by length, then taken ``batch`` at a time), each padded to
    its longest sample, samples cut at ``cap``. Its random permutation is ``random.Random(seed)``'s, over at most
    ``GROUPED_SAMPLES_MAX`` samples (drawn from the histogram beyond that). Worked example
    (``tests/test_lengths_file.py``): lengths 10, 10, 10 and 100, batch 2: mega-batches of 1 x 2 samples (4 // 8
    is 0), so whatever the permutation one pair holds the 100: (2 x 100 + 2 x 10) / 4 = 55 tokens per row."""
    rng = random.Random(seed)
    if lengths.n <= GROUPED_SAMPLES_MAX:
        xs = [min(v, cap) for v, c in zip(lengths.values, lengths.counts) for _ in range(c)]
        rng.shuffle(xs)
    else:
        xs = [min(v, cap) for v in rng.choices(lengths.values, weights=lengths.counts, k=GROUPED_SAMPLES_MAX)]
    mega = max(1, min(len(xs) // (batch * 4), 50)) * batch
    padded = 0
    for i in range(0, len(xs), mega):
        group = sorted(xs[i:i + mega], reverse=True)
        padded += sum(max(group[j:j + batch]) * len(group[j:j + batch]) for j in range(0, len(group), batch))
    return padded / len(xs)


def dataset_report(lengths, setup: TrainingSetup) -> dict:
    """What a dataset's lengths (``datalengths.Lengths``) mean for the setup: truncation, padding waste
    under its padding and under packing, and the length that would cut only 0.5 % of the samples."""
    cap = setup.seq
    mean = lengths.mean(cap)
    padded = {"max": float(cap), "packed": mean, "longest": empirical_longest(lengths.values, lengths.counts, cap,
                                                                               setup.batch)}
    p995 = lengths.percentile(0.995)
    if setup.padding == Padding.longest and setup.batch > 1:  # transformers' group_by_length (grouped_padded_length)
        padded["grouped"] = grouped_padded_length(lengths, cap, setup.batch)
    return {"samples": lengths.n, "longest": lengths.longest, "mean": mean, "cap": cap,
            "cut_share": lengths.share_over(cap), "padded_length": padded[setup.padding.value],
            "padding_waste": 1 - mean / padded[setup.padding.value], "waste_by_padding": {
                k: 1 - mean / v for k, v in padded.items()},
            "p99_5": p995, "p99_5_cut_share": lengths.share_over(p995)}


def real_tokens_per_step(setup: TrainingSetup) -> float:
    """Tokens of data per optimizer step over all GPUs (padding left out): a packed row is all data."""
    if setup.seq_mean is None or setup.padding == Padding.packed:
        return float(setup.tokens_per_step)
    return float(setup.batch * setup.accum * setup.gpus * setup.seq_mean)


#: the step the growth of reserved memory is reported at (``reserved_growth``)
GROWTH_STEP = 500


def longest_of(values, counts, cap: int, rows: int, q: float = 0.5) -> int:
    """The ``q``-quantile of the longest of ``rows`` samples drawn from a length histogram, each cut at
    ``cap``: the smallest length ``x`` with ``F(x)^rows >= q`` (the longest of ``rows`` independent draws
    has the distribution ``F^rows``)."""
    total, seen = sum(counts), 0
    for v, c in sorted(zip(values, counts)):
        seen += c
        if (seen / total) ** rows >= q:
            return min(v, cap)
    return cap


def at_length(setup: TrainingSetup, seq: int, batch: int | None = None, **update) -> TrainingSetup:
    """``setup`` as a micro-batch of ``seq`` tokens (and ``batch`` samples): still a padded batch where it was
    one (its SDPA mask, ``memory.sdpa_mask_bytes``), its samples no longer than its longest, its padded
    length its own; ``update``: more fields changed in the same copy."""
    mean = None if setup.seq_mean is None else min(setup.seq_mean, seq)
    return setup.model_copy(update={"seq": seq, "seq_mean": mean, "seq_padded": None, "batch": batch or setup.batch,
                                    **update})


#: the shortest micro-batch priced or traced: a floor on a one- or two-token batch, no measured figure
SHORTEST = 8


def padded_to_longest(longest: int, cap: int) -> int:
    """A micro-batch's length when padded to its longest sample (``padding="longest"``, the collators of the
    module docstring): that sample cut at ``cap``, no shorter than ``SHORTEST``."""
    return max(SHORTEST, min(longest, cap))


def draw_step_lengths(lengths, setup: TrainingSetup, steps: int, seed: int = 0) -> list[tuple[int, ...]]:
    """The padded length of each micro-batch of ``steps`` optimizer steps: ``batch`` samples per micro-batch,
    ``accum`` micro-batches per step, drawn at random with replacement from the histogram (``random.Random(seed)``,
    so a seed gives one run) and padded to their longest (``padded_to_longest``). Independent draws are the
    model ``longest_of`` prices, and a shuffled epoch's when the data holds many more samples than a batch."""
    rng, cum = random.Random(seed), list(accumulate(lengths.counts))
    out = []
    for _ in range(steps):
        out.append(tuple(padded_to_longest(max(rng.choices(lengths.values, cum_weights=cum, k=setup.batch)),
                                           setup.seq) for _ in range(setup.accum)))
    return out


def reserved_growth(model, setup: TrainingSetup, gpu, lengths, steps: int = GROWTH_STEP) -> dict:
    """Reserved memory as the run goes on, with batches padded to their longest sample: PyTorch's caching
    allocator keeps the blocks of the largest step it has run (``torch.cuda.max_memory_reserved`` grows and
    does not come back without ``empty_cache``), so the reserve follows the longest micro-batch seen so far.
    The median longest sample of the first optimizer step (its ``batch x accum`` samples: the reserve after
    it follows its longest micro-batch) and of the ``batch x accum x steps`` samples by ``steps``, each priced
    as a step of that length (``memory.estimate_memory``). The fragmentation that blocks of many sizes add on
    top is not in this formula: ``reportgen trace --lengths`` replays the steps through the traced allocator
    (``trace/multistep.py``) and prints the two side by side."""
    from reportgen.estimate.memory import estimate_memory

    out = {}
    for label, rows in (("first", setup.batch * setup.accum), (str(steps), setup.batch * setup.accum * steps)):
        length = padded_to_longest(longest_of(lengths.values, lengths.counts, setup.seq, rows), setup.seq)
        out[label] = {"longest": length,
                      "peak_reserved": estimate_memory(model, at_length(setup, length), gpu).peak_reserved}
    return out
