#!/usr/bin/env python3
"""Fit the estimator's calibration constants to measured results, with held-out error.

    python scripts/calibrate.py [--published=data/published_measurements.csv | --no-published] [--no-traced]
                                [--verbose] [results/validation ...]

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

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reportgen import catalog, store  # noqa: E402
from reportgen.estimate import constants as K  # noqa: E402
from reportgen.estimate import estimate  # noqa: E402
from reportgen.estimate.libraries import CURRENT, Libraries  # noqa: E402
from reportgen.estimate.memory import CACHE_SHARES  # noqa: E402
from reportgen.estimate.time import estimate_time  # noqa: E402
from reportgen.provenance import provenance_of  # noqa: E402
from reportgen.setup import TrainingSetup  # noqa: E402

#: published rows fit the matmul efficiency only where the GPU's own work is at least this share of the
#: estimated step: elsewhere the step is mostly exposed host-link transfers (FSDP over PCIe, CPU
#: offload) or host dispatch, whose own models would be absorbed into the efficiency
COMPUTE_SHARE_MIN = 0.9
#: the GPU generation our measurements fit the time model's constants on (``constants.py``: the H100
#: machine); measured step times of other generations fit only their GEMM efficiency
FIT_GENERATION = "hopper"
#: most fits here have one parameter (the cached-free fit has one per share); a fit needs at least parameters + 2 cases
PARAMETERS = 1


def measured_cases(dirs: list[Path]) -> list[dict]:
    """``[{"result", "figures", "memory": bool, "speed": bool}]``: successful measurements with the
    quantities the provenance rule lets count for the case's card."""
    out = []
    for d in dirs:
        for r in store.load_measured(d):
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


#: the sweep whose traced cases the cached-free shares are fitted to. The validation sweep's traces
#: (``results/validation/traced/``) are left out: they replay the measured cases, whose measured
#: reserved memory is the shares' out-of-sample check (``tests/test_accuracy.py``)
FIT_SWEEP = "traced"


def traced_samples(results_dir: Path, sweep: str = FIT_SWEEP) -> tuple[list[dict], list[dict]]:
    """The allocator simulation's allocated and reserved peaks (``reportgen trace``: the harness's
    step replayed through ``trace/allocator.py``) of every current traced case of ``sweep`` under
    ``results_dir``, each with its estimate: ``(unlimited, cache_limited)``. A case the simulation
    fitted only by releasing the cache (a replay limited to the card) goes to the second list, with the
    estimate's working set."""
    from reportgen.estimate.memory import estimate_memory
    from reportgen.traced_results import cache_limited, load_traced

    free, limited = [], []
    for doc in load_traced(results_dir).values():
        if doc.get("sweep") != sweep:
            continue
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


#: the time model's fitted constants (``time.TimeConstants``), in the order ``constants.py`` lists them
#: the fit's loss on the log ratio: soft L1 (Huber-like beyond 10 %), so that a few steps slowed by the
#: measuring host (5-step medians with up to 50 % spread) do not pull the constants for all others
LOSS = "soft_l1"
#: upper bounds other than 1: the L2's share of memory-bound traffic below 1 (its bandwidth is finite);
#: no efficiency above 1 of the datasheet figure it multiplies
UPPER = {"l2_reuse": 0.9}
TIME_CONSTANTS = ("matmul_efficiency", "attention_efficiency", "dram_efficiency", "l2_reuse", "kernel_device_s",
                  "host_s_per_kernel", "host_s_per_call", "host_s_per_autocast_kernel")
TIME_NAMES = {"matmul_efficiency": "MATMUL_EFFICIENCY[hopper]", "attention_efficiency": "ATTENTION_EFFICIENCY",
              "dram_efficiency": "DRAM_EFFICIENCY", "l2_reuse": "L2_REUSE", "kernel_device_s": "KERNEL_DEVICE_S",
              "host_s_per_kernel": "HOST_S_PER_KERNEL", "host_s_per_call": "HOST_S_PER_CALL",
              "host_s_per_autocast_kernel": "HOST_S_PER_AUTOCAST_KERNEL"}


def time_sample(model, gpu, setup: TrainingSetup, measured_step_s: float, label: str) -> dict | None:
    """What ``time.estimate_time`` prices, independent of the fitted constants (the step's inventory,
    the card, the peak's dtype), with the terms that do not depend on them (transfers, compile);
    None for a step that has no datasheet peak."""
    from reportgen.estimate.lengths import padded_length
    from reportgen.estimate.memory import effective_attention
    from reportgen.estimate.time import estimate_time, hidden_state_bytes, peak_dtype
    from reportgen.estimate.work import step_work

    t = estimate_time(model, setup, gpu)
    if t.step_s is None:
        return None
    from reportgen.estimate.dispatch import host_dispatch

    extra = t.parts["transfer"] + t.parts["compile"]  # DoRA's kernels are in the inventory (parts["dora"] reports them)
    return {"work": step_work(model, setup, effective_attention(model, setup)[0]), "gpu": gpu,
            "host_factor": host_dispatch(gpu).factor,
            "dtype": peak_dtype(setup, gpu)[0], "layers": model.num_layers, "extra": extra,
            "measured": measured_step_s, "label": label,
            "working": hidden_state_bytes(model, setup, padded_length(setup))}


def predict_step(x: dict, c) -> float:
    """The step time ``estimate_time`` gives ``x`` with constants ``c`` (``time.TimeConstants``: the H100
    machine's dispatch, scaled to the case's host as ``TimeConstants.current`` scales it, ``dispatch.py``)."""
    from reportgen.estimate.time import pipeline_seconds, step_phases

    c = c.on_host(x["host_factor"])
    return pipeline_seconds(step_phases(x["work"], x["gpu"], x["dtype"], c, x["working"]), x["layers"]) + x["extra"]


#: extra starting points of the time fit: the pipeline's max() makes the loss piecewise smooth, with
#: local minima where cases switch between host-bound and device-bound; the best of the starts wins
STARTS = ((0.6, 0.4, 0.9, 0.1, 5e-6, 1e-5, 4e-5, 1e-5), (0.5, 0.5, 1.0, 0.3, 2e-6, 2e-5, 2e-5, 2e-6),
          (0.7, 0.3, 0.7, 0.0, 1e-5, 5e-6, 6e-5, 2e-5))


def solve_time(samples: list[dict], start, free: tuple[str, ...] = TIME_CONSTANTS, multistart: bool = True):
    """The constants in ``free`` minimising the soft-L1 loss of the predicted step's log error over
    ``samples`` (the others as in ``start``): efficiencies within [0.05, 1], the L2 share within
    [0, ``UPPER``], times >= 0; from ``start`` and, with ``multistart``, from each of ``STARTS``."""
    import dataclasses

    from scipy.optimize import least_squares

    lo = [0.05 if n.endswith("efficiency") else 0.0 for n in free]
    hi = [UPPER.get(n, 1.0) for n in free]

    def consts(v):
        return dataclasses.replace(start, **dict(zip(free, map(float, v))))

    def residuals(v):
        c = consts(v)
        return [math.log(predict_step(x, c) / x["measured"]) for x in samples]

    starts = [[getattr(start, n) for n in free]]
    if multistart:
        starts += [[dict(zip(TIME_CONSTANTS, s))[n] for n in free] for s in STARTS]
    best = None
    for x0 in starts:
        x0 = [min(max(v, 1e-3 if n == "l2_reuse" else 1e-7), h) for n, v, h in zip(free, x0, hi)]
        sol = least_squares(residuals, x0, bounds=(lo, hi), x_scale=x0, loss=LOSS, f_scale=0.1, ftol=1e-12,
                            xtol=1e-12, gtol=1e-12, max_nfev=2000)
        if best is None or sol.cost < best.cost:
            best = sol
    return consts(best.x)


def time_errors(samples: list[dict], c) -> list[float]:
    return [predict_step(x, c) / x["measured"] - 1 for x in samples]


def summary(errors: list[float]) -> str:
    a = [abs(e) for e in errors]
    return (f"median {100 * statistics.median(a):.1f}%, signed {100 * statistics.median(errors):+.1f}%, "
            f"worst {100 * max(a):.1f}%, {sum(x > 0.25 for x in a)} of {len(a)} beyond 25%")


def fit_time(samples: list[dict], verbose: bool = False):
    """All the time constants at once on the measured step times (data-center cards), with the
    leave-one-out error of the step time: each case predicted by constants fitted without it."""
    from reportgen.estimate.time import TimeConstants

    name = "time model (" + ", ".join(TIME_NAMES[n] for n in TIME_CONSTANTS) + ")"
    if not enough(name, len(samples), parameters=len(TIME_CONSTANTS)):
        return None
    start = TimeConstants.current(samples[0]["gpu"]).on_host(1 / samples[0]["host_factor"])  # the H100 machine's
    fit = solve_time(samples, start)
    held_out = [predict_step(x, solve_time(samples[:i] + samples[i + 1:], fit, multistart=False)) / x["measured"] - 1
                for i, x in enumerate(samples)]
    print(f"{name}: fit from {len(samples)} measured step times")
    for n in TIME_CONSTANTS:
        print(f"  {TIME_NAMES[n]}: current {getattr(start, n):.4g}, fit {getattr(fit, n):.4g}")
    print(f"  held-out |error| of the step time: {summary(held_out)}")
    print(f"  in-sample with the fit: {summary(time_errors(samples, fit))}; "
          f"with the current constants: {summary(time_errors(samples, start))}")
    if verbose:
        for x, e, cur in sorted(zip(samples, held_out, time_errors(samples, start)), key=lambda t: t[1]):
            print(f"    {x['label']:45s} measured {1e3 * x['measured']:8.1f} ms  held-out {100 * e:+6.1f}%  "
                  f"current {100 * cur:+6.1f}%")
    return fit


def traced_time_errors(cases: list[dict], dirs: list[Path]) -> None:
    """The second step time: the same constants priced on the traced step's own inventory (stored by
    ``reportgen sweep FILE --trace``, ``traced_results.traced_time``) against the measured step, for the
    measured cases that have a current traced file. Nothing is fitted to it."""
    from reportgen.traced_results import traced_time, load_traced

    traced = {}
    for d in dirs:
        traced.update(load_traced(d.parent if d.name != "results" else d, warn=lambda m: None))
    errors, analytic = [], []
    for c in cases:
        doc = traced.get(c["result"]["id"])
        step = c["figures"].get("step_s")
        if not doc or not c["speed"] or not step:
            continue
        t = traced_time(doc)
        if t is None or not t.step_s:
            continue
        errors.append(t.step_s / step - 1)
        case = c["result"]["case"]
        e = estimate(catalog.load_model(case["model"]), catalog.load_gpu(case["gpu"]),
                     TrainingSetup.model_validate(case["setup"]), reverse=False)
        analytic.append(e.time.step_s / step - 1)
    if not errors:
        print("traced step time: no measured case has a current traced file with its inventory "
              "(reportgen sweep sweeps/validation.yaml --trace stores them)")
        return
    print(f"traced step time (the constants above on the traced step's inventory) against {len(errors)} measured "
          f"steps: {summary(errors)}; the analytic inventory on the same cases: {summary(analytic)}")


def speed_case(c: dict, gpu, setup: TrainingSetup) -> bool:
    """A measured step time the time fits may use: speed that counts for the case's card (the provenance rule),
    one GPU and no offload (the host-link models are not fitted here), and the tensor cores of its precision
    (a bf16 step on a card without bf16 runs at another rate, ``time.peak_dtype``)."""
    from reportgen.estimate.time import peak_dtype

    return (c["speed"] and setup.gpus == 1 and setup.offload.value == "none"
            and peak_dtype(setup, gpu)[0] == setup.compute_dtype)


def fit_efficiency(cases: list[dict], ests: list, verbose: bool = False) -> None:
    """The time constants from the measured step times that count for their card, on cards of
    ``FIT_GENERATION`` (one GPU, no offload: the host-link models are not fitted here). Other
    generations' step times fit their own GEMM efficiency (``measured_speed_rows``)."""
    samples = []
    for c, e in zip(cases, ests):
        gpu = catalog.load_gpu(e.gpu)
        step = c["figures"].get("step_s")
        if not step or not speed_case(c, gpu, e.setup) or gpu.generation != FIT_GENERATION:
            continue
        case = c["result"]["case"]
        x = time_sample(catalog.load_model(case["model"]), gpu, e.setup, step, c["result"]["id"])
        if x:
            samples.append(x)
    fit_time(samples, verbose)



def published_speed_cases(csv_path: Path) -> list[dict]:
    """``[{"id", "model", "gpu", "setup", "time", "tokens_per_s"}]``: the published rows whose tokens/s the
    source states or implies (``reportgen.published.speed``), and the mapped rows of
    ``consumer_speed.csv`` beside the CSV (``reportgen.published.consumer``), each estimated with its
    recipe's defaults. Speed counts only for the card that ran it: each row is its own card, as the
    source names it."""
    from reportgen.published.consumer import consumer_speed_rows
    from reportgen.published.mapping import read_rows
    from reportgen.published.speed import SpeedRow, map_speed_row

    mapped = [(csv_path.name, map_speed_row(raw)) for raw in read_rows(csv_path)] + [
        ("consumer_speed.csv", m) for m in consumer_speed_rows(csv_path.parent)]
    return [speed_row(m.row_id, catalog.load_model(m.model), m.card(), m.setup, m.published_tokens_per_s,
                      source_of(m.source), file, libs=m.libs, slowest=m.card(slowest=True) if m.link else None)
            for file, m in mapped if isinstance(m, SpeedRow)]


def speed_row(row_id: str, model, gpu, setup: TrainingSetup, tokens_per_s: float, source: str, file: str,
              libs: Libraries = CURRENT, slowest=None) -> dict:
    """One row of the per-generation GEMM fit: the case, its estimate's memory and time (shipped constants),
    the tokens/s it was seen at and the source it belongs to (leave-one-source-out holds a source out whole).
    ``slowest``: the card on the slowest link we take its source's words to mean, where the source does not
    state its link (``speed.StatedLink``): the time there too ("slowest_time"), for ``compute_bound``."""
    from reportgen.estimate.memory import estimate_memory

    mem = estimate_memory(model, setup, gpu, libs=libs)

    def time_on(card):
        return estimate_time(model, setup, card, mem.terms["activations"], mem.terms["logits"],
                             offloaded_bytes=mem.offloaded_activations, libs=libs)
    return {"id": row_id, "model": model, "gpu": gpu, "setup": setup, "mem": mem, "libs": libs, "time": time_on(gpu),
            "slowest_time": time_on(slowest) if slowest else None,
            "tokens_per_s": tokens_per_s, "source": source, "file": file}


def measured_speed_rows(cases: list[dict]) -> list[dict]:
    """Our own harness's step times on cards outside ``FIT_GENERATION`` (``reportgen measure`` or a sweep's
    ``--measure`` on a user's RTX 4090, L4, A100...: one GPU, no offload, speed that counts for the case's
    card by the provenance rule) as rows of the per-generation GEMM fit beside the published ones
    (``fit_efficiency_published``). One physical card (its CUDA UUID; else its results and card) is one
    source of the leave-one-source-out error."""
    out = []
    for c in cases:
        r, tokens_per_s = c["result"], c["figures"].get("tokens_per_s")
        gpu, setup = catalog.load_gpu(r["case"]["gpu"]), TrainingSetup.model_validate(r["case"]["setup"])
        if not tokens_per_s or not speed_case(c, gpu, setup) or gpu.generation == FIT_GENERATION:
            continue
        env = (r.get("measurement") or {}).get("environment") or {}
        card = env.get("gpu_uuid") or f"{r.get('sweep') or 'results'} {gpu.key}"
        out.append(speed_row(r["id"], catalog.load_model(r["case"]["model"]), gpu, setup, tokens_per_s,
                             f"reportgen measurements on {env.get('gpu_name') or gpu.name} ({card})", "measured"))
    return out


def source_of(text: str) -> str:
    """The document a published row comes from (its tables are one source): the address up to the file."""
    return text.split(" ", 1)[0].split("'", 1)[0]


def _published_error(r: dict, f: float) -> float:
    """Relative error of the estimator's tokens/s for published row ``r`` at GEMM efficiency ``f``."""
    t = estimate_time(r["model"], r["setup"], r["gpu"], matmul_efficiency=f, offloaded_bytes=r["mem"].offloaded_activations,
                      libs=r["libs"])
    return (t.tokens_per_s - r["tokens_per_s"]) / r["tokens_per_s"]


def compute_bound(r: dict) -> bool:
    """At least ``COMPUTE_SHARE_MIN`` of the row's estimated step is work on the GPU, on the link the estimate
    assumes and, where the source does not state its link, on the slowest one we take its words to mean
    (``speed.StatedLink``): a row whose step hinges on an unknown link cannot say how fast the card's GEMMs run."""
    def bound(t) -> bool:
        return bool(t.step_s) and t.parts["transfer"] + t.parts["host_exposed"] <= (1 - COMPUTE_SHARE_MIN) * t.step_s
    return bound(r["time"]) and (r.get("slowest_time") is None or bound(r["slowest_time"]))


def fit_efficiency_published(rows: list[dict]) -> dict[str, float]:
    """``MATMUL_EFFICIENCY`` per GPU generation (``GpuSpec.generation``) from published tokens/s, over rows
    whose estimated step is at least ``COMPUTE_SHARE_MIN`` work on the GPU (exposed transfers and host
    dispatch at most the rest: their own models would be absorbed, and the choice must not depend on the
    efficiency being fitted, or the fit would not be a fixed point): each row's efficiency is the one
    at which the estimator reproduces its tokens/s, the fit is their median (robust to the rows whose
    wall time is mostly loading), its error the leave-one-out error of the estimator's tokens/s. Then the
    leave-one-source-out error per generation (``loso_published``). Returns the fits made."""
    from scipy.optimize import minimize_scalar

    from reportgen.estimate.time import matmul_efficiency_of

    effs: dict[int, float] = {}
    for j, r in enumerate(rows):
        if compute_bound(r):
            effs[j] = minimize_scalar(lambda f: math.log1p(_published_error(r, f)) ** 2, bounds=(0.02, 1.0),
                                      method="bounded", options={"xatol": 1e-5}).x
    fits = {}
    for gen in sorted({rows[j]["gpu"].generation for j in effs}):
        idx = [j for j in effs if rows[j]["gpu"].generation == gen]
        name = f"published tokens/s: MATMUL_EFFICIENCY[{gen}]"
        if not enough(name, len(idx)):
            continue
        fit, errs = loo([effs[j] for j in idx], lambda f, k: _published_error(rows[idx[k]], f))
        describe(name, matmul_efficiency_of(gen)[0], fit, errs)
        print("  efficiency per row: " + ", ".join(f"{rows[j]['id']} {effs[j]:.3f}" for j in idx))
        fits[gen] = fit
    geforce = [j for j in effs if rows[j]["gpu"].is_consumer]
    name = "published tokens/s: MATMUL_EFFICIENCY[GeForce pooled]"
    if enough(name, len(geforce)):  # what constants.py ships for the GeForce generations (see its comment)
        fit, errs = loo([effs[j] for j in geforce], lambda f, k: _published_error(rows[geforce[k]], f))
        describe(name, K.MATMUL_EFFICIENCY["ada-geforce"], fit, errs)
        fits["geforce"] = fit
    print_link_bound(rows, effs)
    loso_published(rows, effs)
    return fits


def print_link_bound(rows: list[dict], effs: dict[int, float]) -> None:
    """The rows left out of the fits whose source does not state its link (``speed.StatedLink``): still
    compared (``reportgen compare-published``), their error at the shipped constants printed here, so the
    fits' errors are not read as the error on every row."""
    out = [j for j, r in enumerate(rows) if r.get("slowest_time") is not None and j not in effs]
    if out:
        errs = [rows[j]["time"].tokens_per_s / rows[j]["tokens_per_s"] - 1 for j in out]
        print(f"published tokens/s, not fitted, their step hinging on a link their source does not state "
              f"({', '.join(rows[j]['id'] for j in out)}), at the shipped constants: " + _error_summary(errs))


def loso_published(rows: list[dict], effs: dict[int, float]) -> dict[str, list[float]]:
    """Leave-one-source-out: each source's rows predicted by the per-generation fits made without any of
    its rows (a generation left without enough rows borrows, ``time.matmul_efficiency_of``; Hopper's own
    efficiency comes from our measurements, not from published rows), and by the GeForce fit as shipped (one
    efficiency pooled over the GeForce generations, ``constants.py``): the |error| of tokens/s by generation."""
    from reportgen.estimate.time import matmul_efficiency_of

    def per_generation(kept: list[int]):
        fits = {"hopper": K.MATMUL_EFFICIENCY["hopper"]}
        for gen in {rows[k]["gpu"].generation for k in kept}:
            same = [effs[k] for k in kept if rows[k]["gpu"].generation == gen]
            if len(same) >= PARAMETERS + 2 and gen != "hopper":  # enough()'s rule, without its message
                fits[gen] = statistics.median(same)
        return lambda j: matmul_efficiency_of(rows[j]["gpu"].generation, fits)[0]

    def pooled(kept: list[int]):
        f = statistics.median([effs[k] for k in kept]) if len(kept) >= PARAMETERS + 2 else None
        return lambda j: f

    sources = len({rows[j]["source"] for j in effs})
    errors = _held_out_by_source(rows, list(effs), per_generation)
    for gen, errs in sorted(errors.items()):
        print(f"published tokens/s, leave-one-source-out ({sources} sources), {gen}: " + _error_summary(errs))
    geforce = [j for j in effs if rows[j]["gpu"].is_consumer]
    for gen, errs in sorted(_held_out_by_source(rows, geforce, pooled).items()):
        print(f"published tokens/s, leave-one-source-out ({sources} sources), GeForce pooled, {gen}: " + _error_summary(errs))
    return errors


def _held_out_by_source(rows: list[dict], members: list[int], fit) -> dict[str, list[float]]:
    """Each source's rows among ``members`` at the GEMM efficiency ``fit(kept)(j)`` fitted once per source on the
    other sources' members ``kept`` (None: too few to fit, not predicted): the relative errors of tokens/s by
    generation."""
    errors: dict[str, list[float]] = {}
    for src in sorted({rows[j]["source"] for j in members}):
        efficiency = fit([k for k in members if rows[k]["source"] != src])
        for j in (j for j in members if rows[j]["source"] == src):
            f = efficiency(j)
            if f is not None:
                errors.setdefault(rows[j]["gpu"].generation, []).append(_published_error(rows[j], f))
    return errors


def _error_summary(errs: list[float]) -> str:
    a = [abs(e) for e in errs]
    return (f"{len(a)} rows, |error| median {100 * statistics.median(a):.1f}%, signed "
            f"{100 * statistics.median(errs):+.1f}%, worst {100 * max(a):.1f}%")


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    published = next((Path(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--published=")),
                     Path("data/published_measurements.csv"))
    dirs = [Path(a) for a in args] or sorted(p for p in Path("results").iterdir() if p.is_dir())
    cases = measured_cases(dirs)
    rows = []
    if "--no-published" not in sys.argv and published.is_file():
        rows = published_speed_cases(published)
        beside = sum(r["file"] != published.name for r in rows)
        print(f"{len(rows) - beside} published rows with tokens/s read from {published}, {beside} from "
              f"consumer_speed.csv beside it (the rows its mapping compares)")
    mine = measured_speed_rows(cases)
    if mine:
        print(f"{len(mine)} measured step times on cards outside {FIT_GENERATION} join them (one source per card: "
              + ", ".join(sorted({r["source"] for r in mine})) + ")")
    if rows or mine:
        fit_efficiency_published(rows + mine)
    if "--no-traced" not in sys.argv:
        free, limited = traced_samples(Path("results"))
        fit_cached_free(free, "traced (allocator simulation)")
        fit_after_release(limited, "traced (allocator simulation, limited to the card)")
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
    fit_efficiency(cases, ests, verbose="--verbose" in sys.argv)
    if "--no-traced" not in sys.argv:
        traced_time_errors(cases, dirs)
    print(f"{len(cases)} measured cases read from {', '.join(map(str, dirs))} "
          f"({sum(c['memory'] for c in cases)} with memory, {sum(c['speed'] for c in cases)} with speed that count)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
