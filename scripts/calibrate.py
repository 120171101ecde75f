#!/usr/bin/env python3
"""Fit the estimator's calibration constants to measured results, with held-out error.

    python scripts/calibrate.py [--published=data/published_measurements.csv | --no-published] [--no-traced]
                                [results/validation ...]

First it fits ``MATMUL_EFFICIENCY`` per GPU class to the tokens/s that other projects published
(``reportgen.published.speed``: rates stated or implied by the source, each row estimated with its
recipe's documented defaults), over the rows whose estimated step is at least ``COMPUTE_SHARE_MIN``
compute, with the leave-one-out error of the resulting tokens/s.

Then it fits the shares of ``memory.cached_free_bytes`` (``memory.CACHE_SHARES``: ``CACHED_WORKING_SETS``,
``CACHED_SCORES``, ``CACHED_HEAD_BLOCK``, ``CACHED_STATELESS_BLOCK``, ``CACHED_GRAD_EXCESS``: the free
blocks the caching allocator keeps, reserved but not allocated) to the allocator simulation of every
current traced case under ``results/`` (``reportgen sweep sweeps/traced.yaml --trace``: the harness's
real step replayed through PyTorch's caching-allocator rules), by least squares on the relative error
of reserved, with the leave-one-out error; and ``CACHED_AFTER_RELEASE`` to the traced cases whose
replay had to release the cache to fit the card, once there are enough.

Reads every sweep directory given (default: all under ``results/``) through ``reportgen.store``
(measurement files joined to their estimates) and uses a measured quantity only where the
provenance rule (``reportgen.provenance``) lets it count for the case's card: memory from a run on
that card or on a larger card capped to it, speed only from a run on that card; nothing from a CPU
run. It fits, each from at least parameters + 2 cases or not at all:

* ``CUDA_CONTEXT_BYTES``: median of (NVML device_used - torch peak_reserved);
* the ``cached_free_bytes`` shares: the same least-squares fit on measured allocated and reserved
  peaks (where a measurement exists, it is the ground truth);
* ``MATMUL_EFFICIENCY`` per GPU class, over cases the estimator calls compute-bound: the measured
  step time less every other term of the estimated step (``TimeEstimate.parts``: memory-bound
  time, dequantization, optimizer, transfers and the fixed per-step and per-micro-batch overheads,
  each counted once) is the compute time; efficiency = hardware FLOPs / (peak x that time).

Each fit is reported with its leave-one-out error (fit on all other cases, predict the held-out
one with the estimator itself): the number to quote, since the in-sample error flatters. The
script prints; it never edits ``constants.py``. A changed constant cites this script's output.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reportgen import catalog, store  # noqa: E402
from reportgen.estimate import constants as K  # noqa: E402
from reportgen.estimate import estimate  # noqa: E402
from reportgen.estimate.memory import CACHE_SHARES  # noqa: E402
from reportgen.estimate.time import estimate_time  # noqa: E402
from reportgen.provenance import provenance_of  # noqa: E402
from reportgen.setup import TrainingSetup  # noqa: E402

#: published rows fit the matmul efficiency only where the estimated compute is at least this share of
#: the estimated step: elsewhere the step is mostly host-link transfers (FSDP over PCIe, CPU offload),
#: whose own models would be absorbed into the efficiency
COMPUTE_SHARE_MIN = 0.9
#: most fits here have one parameter (the cached-free fit has one per share); a fit needs at least parameters + 2 cases
PARAMETERS = 1


def measured_cases(dirs: list[Path]) -> list[dict]:
    """``[{"result", "figures", "memory": bool, "speed": bool}]``: successful measurements with the
    quantities the provenance rule lets count for the case's card."""
    out = []
    for d in dirs:
        for r in store.load_sweep(d):
            m = r.get("measurement")
            if not m or m.get("status") != "ok" or not isinstance(m.get("measurement"), dict):
                continue
            prov = provenance_of(m)
            gpu = r["case"]["gpu"]
            if prov.valid_quantities(gpu):
                out.append({"result": r, "figures": m["measurement"], "memory": prov.memory_counts_for(gpu),
                            "speed": prov.speed_counts_for(gpu)})
    return out


def loo(values: list[float], predict) -> tuple[float, list[float]]:
    """Median fit and leave-one-out relative errors of ``predict(fit, i)``."""
    errors = [predict(statistics.median(values[:i] + values[i + 1:]), i) for i in range(len(values))]
    return statistics.median(values), errors


def describe(name: str, current, fit, errors: list[float], unit: str = "") -> None:
    med = statistics.median(abs(e) for e in errors)
    worst = max(abs(e) for e in errors)
    print(f"{name}: current {current}{unit}, fit {fit:.4g}{unit} from {len(errors)} cases; "
          f"held-out |error| median {100 * med:.1f}%, worst {100 * worst:.1f}%")


def enough(name: str, n: int, parameters: int = PARAMETERS) -> bool:
    if n < parameters + 2:
        print(f"{name}: not fitted, {n} usable case(s); a fit of {parameters} parameter(s) needs at least "
              f"{parameters + 2}")
        return False
    return True


def fit_context(cases: list[dict]) -> None:
    ctx = [c["figures"]["device_used"] - c["figures"]["peak_reserved"] for c in cases
           if c["memory"] and c["figures"].get("device_used") and c["figures"].get("peak_reserved")]
    if enough("CUDA_CONTEXT_BYTES", len(ctx)):
        fit, errs = loo(ctx, lambda f, i: (f - ctx[i]) / ctx[i])
        describe("CUDA_CONTEXT_BYTES", f"{K.CUDA_CONTEXT_BYTES / 2**20:.0f}", fit / 2**20, errs, " MiB")


def cached_free_sample(allocated: int, reserved: int, m) -> dict | None:
    """One observation of the cached free bytes: what ``reserved`` holds beyond ``allocated``, with the
    sizes that ``memory.cached_free_bytes`` scales by a fitted share (``x``, in ``CACHE_SHARES`` order)
    and the rest of the estimate's reserved (``other``: allocator segments, FSDP's unshard-stream pool,
    the segments counted whole). None for a step the estimate (``m``, its ``MemoryEstimate``) says
    only fits by releasing the cache (fitted apart, ``fit_after_release``)."""
    if m.cache_released:
        return None
    x = [m.cache_inputs.get(name, 0) for name in CACHE_SHARES]
    shared = sum(getattr(K, const) * v for const, v in zip(CACHE_SHARES.values(), x))
    other = m.peak_reserved - m.peak_allocated - int(shared)
    return {"allocated": allocated, "reserved": reserved, "x": x, "other": other}


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting; a column without information gets 0."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-30:
            continue
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col and m[r][col]:
                f = m[r][col] / m[col][col]
                m[r] = [u - f * v for u, v in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] if abs(m[i][i]) >= 1e-30 else 0.0 for i in range(n)]


def solve_cached_free(samples: list[dict]) -> list[float]:
    """The shares of ``memory.cached_free_bytes`` (``CACHE_SHARES`` order) by least squares on the
    relative error of reserved: minimise sum((sum_k a_k x_k - (reserved - allocated - other))^2 /
    reserved^2). A size that is zero in every sample keeps its share at 0."""
    n = len(CACHE_SHARES)
    ata = [[0.0] * n for _ in range(n)]
    aty = [0.0] * n
    for s in samples:
        r2 = float(s["reserved"]) ** 2
        y = s["reserved"] - s["allocated"] - s["other"]
        for i in range(n):
            aty[i] += s["x"][i] * y / r2
            for j in range(n):
                ata[i][j] += s["x"][i] * s["x"][j] / r2
    return _solve(ata, aty)


def fit_cached_free(samples: list[dict], source: str) -> list[float] | None:
    """Fit ``memory.cached_free_bytes``'s shares to ``samples`` and print the fit with the leave-one-out
    error of the estimated reserved (allocated + sum a_k x_k + other against reserved)."""
    names = ", ".join(CACHE_SHARES.values())
    name = f"{source}: {names}"
    if not enough(name, len(samples), parameters=len(CACHE_SHARES)):
        return None

    def error(fit, s):
        pred = s["allocated"] + sum(a * v for a, v in zip(fit, s["x"])) + s["other"]
        return (pred - s["reserved"]) / s["reserved"]

    held_out = [error(solve_cached_free(samples[:i] + samples[i + 1:]), s) for i, s in enumerate(samples)]
    fit = solve_cached_free(samples)
    current_shares = [getattr(K, c) for c in CACHE_SHARES.values()]
    current = [error(current_shares, s) for s in samples]
    worst = max(range(len(held_out)), key=lambda i: abs(held_out[i]))
    print(f"{name}: current {', '.join(f'{v:g}' for v in current_shares)}; fit "
          f"{', '.join(f'{v:.3f}' for v in fit)} from {len(samples)} cases; held-out |error| of reserved median "
          f"{100 * statistics.median(abs(e) for e in held_out):.1f}%, signed {100 * statistics.median(held_out):+.1f}%, "
          f"worst {100 * held_out[worst]:+.1f}%{samples[worst].get('id') and ' (' + samples[worst]['id'] + ')' or ''} "
          f"(current constants: median {100 * statistics.median(abs(e) for e in current):.1f}%, "
          f"signed {100 * statistics.median(current):+.1f}%, worst {100 * max(abs(e) for e in current):.1f}%)")
    return fit


def fit_after_release(samples: list[dict], source: str) -> float | None:
    """``CACHED_AFTER_RELEASE``: the working sets a step keeps cached after the allocator released its
    cache to fit the card (``memory.allocator_limited_reserved``); the median of (reserved - allocated
    - segments) / working over the cache-limited samples, with its leave-one-out error."""
    name = f"{source}: CACHED_AFTER_RELEASE"
    ratios = [(s["reserved"] - s["allocated"] - K.ALLOCATOR_SEGMENTS_BYTES) / s["working"] for s in samples
              if s["working"]]
    if not enough(name, len(ratios)):
        print(f"  cache-limited cases so far keep {', '.join(f'{r:.2f}' for r in ratios)} working sets")
        return None

    def predict(f, i):
        s = samples[i]
        pred = s["allocated"] + K.ALLOCATOR_SEGMENTS_BYTES + f * s["working"]
        return (pred - s["reserved"]) / s["reserved"]

    fit, errs = loo(ratios, predict)
    describe(name, K.CACHED_AFTER_RELEASE, fit, errs)
    return fit


def fit_fragmentation(cases: list[dict], ests: list) -> None:
    samples = []
    for c, e in zip(cases, ests):
        if c["memory"] and c["figures"].get("peak_reserved") and c["figures"].get("peak_allocated"):
            s = cached_free_sample(c["figures"]["peak_allocated"], c["figures"]["peak_reserved"], e.memory)
            if s:
                samples.append({**s, "id": c["result"]["id"]})
    fit_cached_free(samples, "measured")


def traced_samples(results_dir: Path) -> tuple[list[dict], list[dict]]:
    """The allocator simulation's allocated and reserved peaks (``reportgen trace``: the harness's
    step replayed through ``trace/allocator.py``) of every current traced case under ``results_dir``,
    each with its estimate: ``(unlimited, cache_limited)``. A case the simulation fitted only by
    releasing the cache (a replay limited to the card) goes to the second list, with the estimate's
    working set."""
    from reportgen.estimate.memory import estimate_memory
    from reportgen.traced_results import cache_limited, load_traced

    free, limited = [], []
    for doc in load_traced(results_dir).values():
        case, mem = doc["case"], doc["memory"]
        setup = TrainingSetup.model_validate(case["setup"])
        est = estimate_memory(catalog.load_model(case["model"]), setup, catalog.load_gpu(case["gpu"]))
        if cache_limited(doc):
            limited.append({"allocated": mem["peak_allocated"], "reserved": mem["peak_reserved"],
                            "working": est.cache_inputs.get("working", 0), "id": doc.get("id", "")})
            continue
        sample = cached_free_sample(mem["peak_allocated"], mem["peak_reserved"], est)
        if sample:
            free.append({**sample, "id": doc.get("id", "")})
    return free, limited


def compute_time_of(t, measured_step_s: float) -> float | None:
    """The measured step less every non-compute term of the estimated step, each once
    (``TimeEstimate.parts``); None when what is left does not exceed the memory-bound time (the
    case is not compute-bound as measured, so it says nothing about matmul efficiency)."""
    p = t.parts
    rest = p["dequant"] + p["optimizer"] + p["transfer"] + p["overhead"] + p.get("compile", 0.0)
    compute = measured_step_s - rest
    return compute if compute > p["memory"] else None


def fit_efficiency(cases: list[dict], ests: list) -> None:
    for cls in ("datacenter", "consumer"):
        effs, idx = [], []
        for i, (c, e) in enumerate(zip(cases, ests)):
            gpu = catalog.load_gpu(e.gpu)
            step = c["figures"].get("step_s")
            if (cls == "consumer") != gpu.is_consumer or not c["speed"] or e.time.bound != "compute" or not step:
                continue
            compute = compute_time_of(e.time, step)
            if compute is None:
                continue
            peak = gpu.peak_flops(e.time.peak_dtype)
            effs.append(e.time.hardware_flops_per_token * e.setup.tokens_per_step / (peak * e.setup.gpus * compute))
            idx.append(i)
        name = f"MATMUL_EFFICIENCY[{cls}]"
        if not enough(name, len(effs)):
            continue

        def predict(f, j):
            e, m = ests[idx[j]], cases[idx[j]]["figures"]
            model, gpu = catalog.load_model(cases[idx[j]]["result"]["case"]["model"]), catalog.load_gpu(e.gpu)
            t = estimate_time(model, e.setup, gpu, e.memory.terms["activations"], e.memory.terms["logits"],
                              matmul_efficiency=f)
            return (t.tokens_per_s - m["tokens_per_s"]) / m["tokens_per_s"]

        fit, errs = loo(effs, predict)
        describe(name, K.MATMUL_EFFICIENCY[cls], fit, errs)


def published_speed_cases(csv_path: Path) -> list[dict]:
    """``[{"id", "model", "gpu", "setup", "time", "tokens_per_s"}]``: the published rows whose tokens/s the
    source states or implies (``reportgen.published.speed``), each estimated with its recipe's defaults.
    Speed counts only for the card that ran it: each row is its own card, as the source names it."""
    from reportgen.published.mapping import FSDP_QLORA_LIBS, read_rows
    from reportgen.published.speed import SpeedRow, map_speed_row
    from reportgen.estimate.memory import estimate_memory

    out = []
    for raw in read_rows(csv_path):
        m = map_speed_row(raw)
        if not isinstance(m, SpeedRow):
            continue
        model, gpu = catalog.load_model(m.model), catalog.load_gpu(m.gpu)
        mem = estimate_memory(model, m.setup, gpu, libs=FSDP_QLORA_LIBS)
        t = estimate_time(model, m.setup, gpu, mem.terms["activations"], mem.terms["logits"],
                          offloaded_bytes=mem.offloaded_activations)
        out.append({"id": m.row_id, "model": model, "gpu": gpu, "setup": m.setup, "mem": mem, "time": t,
                    "tokens_per_s": m.published_tokens_per_s})
    return out


def fit_efficiency_published(rows: list[dict]) -> dict[str, float]:
    """``MATMUL_EFFICIENCY`` per GPU class from published tokens/s: the measured step
    (tokens per step / tokens/s) less the estimate's other terms, as ``fit_efficiency``, over rows whose
    estimated compute is at least ``COMPUTE_SHARE_MIN`` of the step; the fit is the median, its error
    the leave-one-out error of the estimator's tokens/s. Returns the fits made."""
    fits = {}
    for cls in ("datacenter", "consumer"):
        effs, idx = [], []
        for i, r in enumerate(rows):
            t, setup, gpu = r["time"], r["setup"], r["gpu"]
            if (cls == "consumer") != gpu.is_consumer or t.bound != "compute" or not t.step_s:
                continue
            if t.parts["compute"] < COMPUTE_SHARE_MIN * t.step_s:
                continue  # communication/offload-dominated: the fit would absorb those models' errors
            compute = compute_time_of(r["time"], setup.tokens_per_step / r["tokens_per_s"])
            if compute is None:
                continue
            peak = gpu.peak_flops(t.peak_dtype)
            effs.append(t.hardware_flops_per_token * setup.tokens_per_step / (peak * setup.gpus * compute))
            idx.append(i)
        name = f"published tokens/s: MATMUL_EFFICIENCY[{cls}]"
        if not enough(name, len(effs)):
            continue

        def predict(f, j):
            r = rows[idx[j]]
            t = estimate_time(r["model"], r["setup"], r["gpu"], r["mem"].terms["activations"],
                              r["mem"].terms["logits"], matmul_efficiency=f,
                              offloaded_bytes=r["mem"].offloaded_activations)
            return (t.tokens_per_s - r["tokens_per_s"]) / r["tokens_per_s"]

        fit, errs = loo(effs, predict)
        describe(name, K.MATMUL_EFFICIENCY[cls], fit, errs)
        per_row = ", ".join(f"{rows[i]['id']} {e:.3f}" for i, e in zip(idx, effs))
        print(f"  efficiency per row: {per_row}")
        fits[cls] = fit
    return fits


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    published = next((Path(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--published=")),
                     Path("data/published_measurements.csv"))
    if "--no-published" not in sys.argv and published.is_file():
        rows = published_speed_cases(published)
        print(f"{len(rows)} published rows with tokens/s read from {published}")
        fit_efficiency_published(rows)
    if "--no-traced" not in sys.argv:
        free, limited = traced_samples(Path("results"))
        fit_cached_free(free, "traced (allocator simulation)")
        fit_after_release(limited, "traced (allocator simulation, limited to the card)")
    dirs = [Path(a) for a in args] or sorted(p for p in Path("results").iterdir() if p.is_dir())
    cases = measured_cases(dirs)
    if not cases:
        print(f"no GPU measurement with status ok that counts for its case under {', '.join(map(str, dirs))}: "
              "nothing to fit")
        return 0
    ests = []
    for c in cases:
        case = c["result"]["case"]
        setup = TrainingSetup.model_validate(case["setup"])
        ests.append(estimate(catalog.load_model(case["model"]), catalog.load_gpu(case["gpu"]), setup, reverse=False))
    fit_context(cases)
    fit_fragmentation(cases, ests)
    fit_efficiency(cases, ests)
    print(f"{len(cases)} measured cases read from {', '.join(map(str, dirs))} "
          f"({sum(c['memory'] for c in cases)} with memory, {sum(c['speed'] for c in cases)} with speed that count)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
