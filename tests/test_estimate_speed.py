"""Guards of issue 9's speed targets that do not depend on the machine's load: how much work one
estimate does (Python function calls, counted by cProfile), and the CLI's catalog parse. Wall-clock
figures are reported by ``scripts/bench_estimate.py``, not tested."""

import cProfile
import pstats

import yaml

from reportgen import catalog
from reportgen.estimate import estimate
from reportgen.setup import TrainingSetup

#: measured 342 and 7,878 calls (llama-3.1-8b, rtx-4090, QLoRA + checkpointing) when these limits were
#: set, at ~11,500 bare and ~1,750 searching estimates/s: a regression past them costs the targets.
#: The bare limit was 500 until ``estimate_memory`` was split at its seams (placement, activations,
#: timeline, reserved memory: about a dozen helper calls) and the recipe field added its check: 499
#: calls run alone, 505 inside the whole suite (6 more there, as before the split), so 520; then the whole
#: run's phases (issue 32, ``estimate/run.py``: load, save and their host terms, part of every verdict)
#: added 79: 578 alone, 585 in the suite, so 600; then the GEMM rate per GPU generation and the L2 term
#: (issue 30, ``time.memory_bandwidth``) and the recipe losses' dispatch (issue 33): 596 alone, ~603 in the
#: suite, so 615; then the host CPU's dispatch (issue 30, ``estimate/dispatch.py``, its catalog lookups cached):
#: 604 alone. 608 alone since; it read 616 in the whole suite when an earlier test (tests/test_render.py) had
#: left equal-but-not-identical keys in the lru caches, whose lookups then call the dataclasses' ``__eq__``:
#: ``calls`` now clears every cache first, so the count is the same wherever the test runs.
BARE_CALLS_MAX = 615
REVERSE_CALLS_MAX = 11_000


def _clear_caches() -> None:
    """Every ``functools`` cache of reportgen's modules, emptied: what an earlier test left in them must
    not change the count (an equal key that is not the same object costs an ``__eq__`` a lookup)."""
    import sys

    for name, module in list(sys.modules.items()):
        if name.startswith("reportgen"):
            for value in list(vars(module).values()):
                if callable(getattr(value, "cache_clear", None)):
                    value.cache_clear()


def calls(reverse: bool) -> int:
    _clear_caches()
    m, g = catalog.load_model("llama-3.1-8b"), catalog.load_gpu("rtx-4090")
    s = TrainingSetup(method="qlora", grad_ckpt=True)
    estimate(m, g, s, reverse=reverse)  # warm the per-model caches, as a sweep or search does
    prof = cProfile.Profile()
    prof.enable()
    estimate(m, g, s, reverse=reverse)
    prof.disable()
    return pstats.Stats(prof).total_calls


def test_a_bare_estimate_stays_light():
    assert calls(reverse=False) <= BARE_CALLS_MAX


def test_an_estimate_with_both_searches_stays_light():
    assert calls(reverse=True) <= REVERSE_CALLS_MAX


def test_the_gpu_catalog_is_parsed_by_libyaml_where_available(monkeypatch):
    """The pure-Python YAML parse of gpus.yaml was 0.1 s of a 0.25 s CLI call."""
    seen = []
    real = yaml.load
    monkeypatch.setattr(yaml, "load", lambda text, Loader: seen.append(Loader) or real(text, Loader=Loader))
    catalog._gpu_table.cache_clear()
    try:
        assert "h100-sxm" in catalog._gpu_table()
    finally:
        catalog._gpu_table.cache_clear()
    assert seen == [getattr(yaml, "CSafeLoader", yaml.SafeLoader)]
