"""``reportgen profile-gpu``: measure, in about a minute, the rates the time model prices a step with,
on the user's own card and host, and write them as a profile (``gpu_profile.py`` reads it back).

What is measured, and how (each a micro-benchmark of the kind the time model has a term for,
``estimate/time.py``):

* **host dispatch** (``host_s_per_op``): host seconds per small ATen op on a CPU tensor, the
  dispatcher's cost that every launched kernel pays; with a GPU also ``host_s_per_launch``, the
  host seconds per tiny CUDA op queued without synchronizing (Python, the dispatcher and
  ``cudaLaunchKernel``; TaxBreak, arXiv 2603.12465, finds host single-thread speed first-order for
  host-bound steps);
* **kernel device time** (``kernel_device_s``): device seconds per tiny kernel, from a CUDA graph of
  them replayed (no host in the loop), CUDA events around it;
* **GEMM rate** (``matmul_tflops``) per compute dtype at the shapes of a model's linear layers
  (``tokens x in -> out``, ``torch.nn.functional.linear``), FLOP-weighted over the shapes; fp32 with
  TF32 off, as PyTorch's default;
* **memory bandwidth** (``copy_bandwidth_gbs``): ``dst.copy_(src)`` at working sets of 2 MiB, 16 MiB
  and 1 GiB (bytes read + written per second); the first two can stay in the L2 cache
  (``l2_bytes``), the last cannot, so their ratio is the card's L2 reuse;
* **host link** (``host_link_gbs``): pinned host-to-device and device-to-host copies of 256 MiB;
* **host optimizer** (``cpu_adam_params_per_s``): ``torch.optim.AdamW`` (fused on the CPU where
  this torch has it, as torchao's ``CPUOffloadOptimizer`` runs it) over 32 M fp32 parameters;
* **memory**: the card's total, what was free when the profile started (other processes, e.g. a
  desktop's display, hold the rest) and the CUDA context (NVML's figure for this process minus what
  PyTorch's allocator reserved).

Without a GPU (``--device cpu``), only the host's figures are measured; the GPU's stay null, and
the time model uses the datasheet's for them, saying so.
"""

from __future__ import annotations

import time

#: the compute dtypes whose GEMM rate is measured (the datasheet columns the time model divides by)
DTYPES = ("bf16", "fp16", "fp32")
#: rows of the activations multiplied in the GEMM benchmark (a micro-batch of 4 x 1,024 tokens)
GEMM_TOKENS = 4096
MIB = 2**20


def _timed(torch, device: str, fn, repeat: int) -> float:
    """Seconds per call of ``fn`` (after one warm-up call): CUDA events around ``repeat`` calls on a
    GPU, the wall clock on the CPU."""
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / repeat
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


def host_dispatch(torch, device: str, ops: int = 20_000) -> dict:
    """``host_s_per_op`` (a CPU tensor's in-place add, dispatcher and a trivial kernel) and, on a GPU,
    ``host_s_per_launch`` (a CUDA tensor's, the wall clock before synchronizing: queueing only)."""
    out = {}
    x = torch.zeros(64)
    for _ in range(1000):
        x.add_(1.0)
    t0 = time.perf_counter()
    for _ in range(ops):
        x.add_(1.0)
    out["host_s_per_op"] = (time.perf_counter() - t0) / ops
    if device == "cuda":
        y = torch.zeros(64, device="cuda")
        for _ in range(1000):
            y.add_(1.0)
        torch.cuda.synchronize()
        n = 2000  # below the launch queue's depth would not matter: the device runs a tiny add faster
        t0 = time.perf_counter()
        for _ in range(n):
            y.add_(1.0)
        out["host_s_per_launch"] = (time.perf_counter() - t0) / n
        torch.cuda.synchronize()
    return out


def graph_timed(torch, fn, calls: int) -> float | None:
    """Device seconds per call of ``fn``: ``calls`` of them captured in one CUDA graph, replayed and
    timed with CUDA events, so that the host's launches are out of the loop. None where capture fails."""
    stream = torch.cuda.Stream()
    try:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm-up on a side stream, as capture requires
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    return _timed(torch, "cuda", graph.replay, 10) / calls


def kernel_device_s(torch, kernels: int = 1000) -> float | None:
    """Device seconds per tiny kernel (an add of 64 floats): launch latency, ramp-up and tail."""
    y = torch.zeros(64, device="cuda")
    return graph_timed(torch, lambda: y.add_(1.0), kernels)


def gemm_shapes(model) -> list[tuple[int, int]]:
    """The distinct ``(in, out)`` of the model's decoder-layer linears (``ModelSpec.layer_linears``)
    and its head's ``(hidden, vocab)``."""
    shapes = {(lin.in_features, lin.out_features) for lin in model.layer_linears()}
    shapes.add((model.hidden_size, model.vocab_size))
    return sorted(shapes)


def gemm_rates(torch, model, dtypes=DTYPES, budget_s: float = 1.5) -> tuple[dict, list[dict]]:
    """``({dtype: TFLOP/s over all shapes}, [per shape])``: ``F.linear`` of ``GEMM_TOKENS`` rows at
    each shape, timed with CUDA events; fp32 with TF32 off (PyTorch's default)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    summary, rows, shapes = {}, [], gemm_shapes(model)
    for name in dtypes:
        flops = seconds = 0.0
        for k, n in shapes:
            x = torch.randn(GEMM_TOKENS, k, device="cuda", dtype=names[name])
            w = torch.randn(n, k, device="cuda", dtype=names[name])
            once = _timed(torch, "cuda", lambda: torch.nn.functional.linear(x, w), 1)
            repeat = max(2, min(50, int(budget_s / len(shapes) / max(once, 1e-6))))
            s = _timed(torch, "cuda", lambda: torch.nn.functional.linear(x, w), repeat)
            f = 2.0 * GEMM_TOKENS * k * n
            rows.append({"dtype": name, "tokens": GEMM_TOKENS, "in": k, "out": n, "tflops": f / s / 1e12})
            flops, seconds = flops + f, seconds + s
        summary[name] = flops / seconds / 1e12
    torch.cuda.empty_cache()
    return summary, rows


def copy_bandwidths(torch) -> dict:
    """Bytes read + written per second by ``dst.copy_(src)`` at working sets (src + dst) of 2 MiB,
    16 MiB (in a CUDA graph) and 1 GiB."""
    out = {}
    for label, total in (("2MiB", 2 * MIB), ("16MiB", 16 * MIB), ("1GiB", 1024 * MIB)):
        src = torch.empty(total // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy = lambda: dst.copy_(src)  # noqa: E731
        # a small copy lasts less than its launch: time it in a CUDA graph, without the host
        s = (graph_timed(torch, copy, 200) if total < 64 * MIB else None) or _timed(torch, "cuda", copy, 30)
        out[label] = total / s / 1e9
    torch.cuda.empty_cache()
    return out


def host_link(torch, size: int = 256 * MIB) -> dict:
    """GB/s of pinned host-to-device and device-to-host copies of ``size`` bytes."""
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    h2d = _timed(torch, "cuda", lambda: dev.copy_(host, non_blocking=True), 10)
    d2h = _timed(torch, "cuda", lambda: host.copy_(dev, non_blocking=True), 10)
    return {"h2d": size / h2d / 1e9, "d2h": size / d2h / 1e9}


def cpu_adam(torch, params: int = 32 * 2**20, tensors: int = 8) -> dict:
    """Parameters per second of a host AdamW step (fused on the CPU where this torch has it, else
    foreach), over ``params`` fp32 parameters in ``tensors`` tensors with gradients set."""
    ps = [torch.zeros(params // tensors, requires_grad=True) for _ in range(tensors)]
    for p in ps:
        p.grad = torch.randn_like(p)
    kind = "fused"
    try:
        opt = torch.optim.AdamW(ps, lr=1e-4, fused=True)
        opt.step()
    except (RuntimeError, TypeError, ValueError):
        kind = "foreach"
        opt = torch.optim.AdamW(ps, lr=1e-4, foreach=True)
    s = _timed(torch, "cpu", opt.step, 3)
    return {"cpu_adam_params_per_s": params / s, "cpu_adam_kind": kind, "cpu_threads": torch.get_num_threads()}


def memory_figures(torch, nvml_session, free_at_start: int, used_at_start: int | None) -> dict:
    """The card's total, the memory a new process could have had when the profile started (free then,
    plus what this process held), and the CUDA context (NVML's figure minus the allocator's)."""
    total = torch.cuda.mem_get_info()[1]
    used, source = nvml_session.process_used() if nvml_session else (None, "unavailable")
    context = None if used is None or source != "nvml-process" else max(0, used - torch.cuda.memory_reserved())
    return {"memory_total_bytes": int(total),
            "memory_free_bytes": int(free_at_start + (used_at_start or 0)),
            "cuda_context_bytes": None if context is None else int(context), "cuda_context_source": source}


def _card(env: dict, device: str, gpu: str | None) -> str:
    """The catalog card the profile is of: the device's own (``--gpu``, when given, must agree), or
    ``--gpu`` for a profile without a GPU."""
    from reportgen.errors import UserError

    if device == "cpu":
        if not gpu:
            raise UserError("profile-gpu --device cpu: name the card the profile is for with --gpu",
                            hint="e.g. reportgen profile-gpu --device cpu --gpu rtx-4090 (only the host is "
                                 "measured; the card's rates stay the datasheet's)")
        return gpu.partition("@")[0]
    found = env.get("gpu_catalog_key")
    if found is None:
        raise UserError(f"profile-gpu: this GPU ({env.get('gpu_name')}) is not in the GPU catalog",
                        hint="`reportgen gpus` lists the catalog; a profile is of a catalog card")
    if gpu and gpu.partition("@")[0] != found:
        raise UserError(f"profile-gpu: --gpu {gpu}, but this machine's GPU is {env.get('gpu_name')} ({found})",
                        hint=f"leave --gpu out, or give --gpu {found}")
    return found


def profile(device: str, gpu: str | None, model, step=lambda name: None) -> dict:
    """The profile document (``gpu_profile.py`` reads it): every figure of the module docstring that
    ``device`` allows, the environment, the card, the model whose GEMM shapes were timed. ``step``
    is called with each benchmark's name before it runs (a progress line)."""
    import torch

    from reportgen.errors import UserError
    from reportgen.measure.environment import collect_environment

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("profile-gpu: no CUDA device here", hint="--device cpu --gpu CARD profiles the host alone")
    start = time.perf_counter()
    env = collect_environment(device)
    card = _card(env, device, gpu)
    measured: dict = {}
    session = used_at_start = free_at_start = None
    if device == "cuda":
        torch.cuda.init()
        free_at_start = torch.cuda.mem_get_info()[0]
        session = _nvml()
        used_at_start = session.process_used()[0] if session else None
    step("host dispatch")
    measured.update(host_dispatch(torch, device))
    step("host optimizer (CPU AdamW)")
    measured.update(cpu_adam(torch))
    if device == "cuda":
        step("kernel launch on the device")
        measured["kernel_device_s"] = kernel_device_s(torch)
        step(f"GEMMs at {model.name}'s shapes")
        measured["matmul_tflops"], measured["matmul_shapes"] = gemm_rates(torch, model)
        step("memory bandwidth")
        measured["copy_bandwidth_gbs"] = copy_bandwidths(torch)
        measured["l2_bytes"] = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)) or None
        step("host link")
        measured["host_link_gbs"] = host_link(torch)
        measured.update(memory_figures(torch, session, free_at_start, used_at_start))
    return {"kind": "gpu-profile", "schema_version": 1, "card": card, "device": device, "model": model.name,
            "measured": measured, "seconds": round(time.perf_counter() - start, 1), "environment": env}


def _nvml():
    try:
        from reportgen.measure.nvml import Nvml

        return Nvml()
    except Exception:  # noqa: BLE001 - no NVML (no driver library, no pynvml): the context stays unmeasured
        return None
